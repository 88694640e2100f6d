//! Text → [`Program`]: a cheap pre-scan over [`super::scan`]'s tokens (size, nesting depth,
//! unterminated comments), the pest parse of `grammar/rumus.pest`, and the walk from pest pairs
//! to the spanned AST.
//!
//! Nothing here recurses deeper than the bracket nesting the pre-scan allowed: operator chains
//! and runs of unary minus are folded with loops, and the depth of every expression tree is
//! capped, so later passes that recurse over the AST cannot overflow the stack either.

use super::ast::*;
use super::scan::{Piece, Scanner};
use crate::err;
use crate::error::{Error, Result, Source, Span};
use crate::tensor::DType;
use pest::iterators::Pair;
use pest::Parser;
use std::sync::Arc;

/// Largest model source accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Deepest bracket nesting (`(`, `[`, `{` together) accepted.
pub const MAX_NESTING: usize = 48;
/// Deepest expression tree accepted (operators and calls, counted from the leaves).
pub const MAX_EXPR_DEPTH: usize = 200;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/rumus.pest"]
struct RumusParser;

/// Parse a standalone model file. Spans are byte offsets into `src.text`.
pub fn parse(src: &Arc<Source>) -> Result<Program> {
    parse_text(&src.text).map_err(|e| e.in_source(src))
}

/// Parse model text (errors carry spans but no source; see [`parse`]).
pub fn parse_text(text: &str) -> Result<Program> {
    let unclosed = prescan(text)?;
    let mut pairs =
        RumusParser::parse(Rule::file, text).map_err(|e| pest_error(text, e, unclosed))?;
    let file = pairs.next().ok_or_else(|| Error::invariant("pest returned no file"))?;
    let mut items = Vec::new();
    for pair in file.into_inner() {
        match pair.as_rule() {
            Rule::model_def => items.push(item(pair, ItemKind::Model)?),
            Rule::block_def => items.push(item(pair, ItemKind::Block)?),
            _ => {}
        }
    }
    Ok(Program { items })
}

/// Checks size, nesting depth and comments without recursion. Returns the innermost bracket left
/// open at the end of the text (reported when the parse then fails at end of input).
fn prescan(text: &str) -> Result<Option<(char, usize)>> {
    if text.len() > MAX_SOURCE_BYTES {
        return Err(err!(
            Parse,
            "source is {} bytes; the limit is {} bytes",
            text.len(),
            MAX_SOURCE_BYTES
        )
        .at(Span::new(0, 0)));
    }
    let mut open: Vec<(char, usize)> = Vec::new();
    // A run of unary minus signs nests like brackets; stop it here, cheaply. Spaces and
    // comments continue a run: (count, start).
    let mut minus_run = (0, 0);
    for t in Scanner::new(text) {
        match t.piece {
            Piece::BlockComment { closed: false } => {
                return Err(err!(Parse, "unterminated comment").at(Span::new(t.start, t.start + 2)))
            }
            Piece::Code(c @ (b'(' | b'[' | b'{')) => {
                open.push((c as char, t.start));
                if open.len() > MAX_NESTING {
                    return Err(err!(Parse, "brackets nested deeper than {MAX_NESTING} levels")
                        .at(Span::new(t.start, t.end)));
                }
            }
            Piece::Code(b')' | b']' | b'}') => {
                open.pop();
            }
            Piece::Code(b'-') => {
                if minus_run.0 == 0 {
                    minus_run.1 = t.start;
                }
                minus_run.0 += 1;
                if minus_run.0 > MAX_EXPR_DEPTH {
                    return Err(err!(
                        Parse,
                        "expression is nested deeper than {MAX_EXPR_DEPTH} levels"
                    )
                    .at(Span::new(minus_run.1, minus_run.1 + 1)));
                }
                continue;
            }
            Piece::Code(c) if c.is_ascii_whitespace() => continue,
            Piece::LineComment | Piece::BlockComment { .. } => continue,
            Piece::Code(_) | Piece::Str { .. } => {}
        }
        minus_run.0 = 0;
    }
    Ok(open.last().copied())
}

/// A pest syntax error as an [`Error`] that reads in words: "unexpected `x`, expected ...".
fn pest_error(text: &str, e: pest::error::Error<Rule>, unclosed: Option<(char, usize)>) -> Error {
    use pest::error::{ErrorVariant, InputLocation};
    let pos = match e.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    };
    if pos >= text.len() {
        if let Some((c, at)) = unclosed {
            return err!(Parse, "unclosed `{c}`").at(Span::new(at, at + 1));
        }
    }
    let (found, len) = describe_token(text, pos);
    let expected = match &e.variant {
        ErrorVariant::ParsingError { positives, .. } => expected_list(positives),
        ErrorVariant::CustomError { message } => message.clone(),
    };
    let message = if expected.is_empty() {
        format!("unexpected {found}")
    } else {
        format!("unexpected {found}, expected {expected}")
    };
    err!(Parse, "{message}").at(Span::new(pos, pos + len))
}

/// The token at `pos`, in words, and its length in bytes.
fn describe_token(text: &str, pos: usize) -> (String, usize) {
    let rest = &text[pos.min(text.len())..];
    let Some(c) = rest.chars().next() else {
        return ("end of input".into(), 0);
    };
    if c.is_ascii_alphanumeric() || c == '_' {
        let len =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        return (format!("`{}`", &rest[..len]), len);
    }
    if rest.starts_with("...") {
        return ("`...`".into(), 3);
    }
    let shown = if c.is_control() || c.is_whitespace() {
        c.escape_debug().to_string()
    } else {
        c.to_string()
    };
    (format!("`{shown}`"), c.len_utf8())
}

/// "`)`, `,` or an expression" from pest's expected rules.
fn expected_list(positives: &[Rule]) -> String {
    const EXPR_START: &[Rule] = &[
        Rule::neg,
        Rule::kw_param,
        Rule::callee,
        Rule::ops_prefix,
        Rule::ident,
        Rule::name,
        Rule::call,
        Rule::lbracket,
        Rule::list,
        Rule::bool,
        Rule::kw_true,
        Rule::kw_false,
        Rule::float,
        Rule::int,
        Rule::lparen,
        Rule::paren,
        Rule::expr,
    ];
    let is_expr = positives.iter().any(|r| matches!(r, Rule::int | Rule::float | Rule::expr))
        && positives.iter().any(|r| matches!(r, Rule::neg | Rule::expr));
    let mut words: Vec<String> = Vec::new();
    for &r in positives {
        let w = if is_expr && EXPR_START.contains(&r) {
            "an expression".to_string()
        } else {
            rule_word(r)
        };
        if !words.contains(&w) {
            words.push(w);
        }
    }
    match words.len() {
        0 => String::new(),
        1 => words.remove(0),
        n => format!("{} or {}", words[..n - 1].join(", "), words[n - 1]),
    }
}

/// How a rule reads in an error message.
fn rule_word(r: Rule) -> String {
    let s = match r {
        Rule::EOI => "end of input",
        Rule::file => "`block`, `model` or end of input",
        Rule::ident | Rule::name | Rule::callee => "a name",
        Rule::int => "an integer",
        Rule::float => "a number",
        Rule::expr => "an expression",
        Rule::dtype => "`f32` or `i32`",
        Rule::dim_pat => "a dimension",
        Rule::model_def | Rule::kw_model => "`model`",
        Rule::block_def | Rule::kw_block => "`block`",
        Rule::kw_param | Rule::param_decl => "`param`",
        Rule::kw_const | Rule::const_stmt => "`const`",
        Rule::kw_repeat | Rule::repeat_stmt => "`repeat`",
        Rule::kw_return | Rule::return_stmt => "`return`",
        Rule::kw_as => "`as`",
        Rule::kw_true => "`true`",
        Rule::kw_false => "`false`",
        Rule::kw_f32 => "`f32`",
        Rule::kw_i32 => "`i32`",
        Rule::lparen | Rule::signature | Rule::paren => "`(`",
        Rule::rparen => "`)`",
        Rule::lbracket | Rule::list | Rule::tensor_type => "`[`",
        Rule::rbracket => "`]`",
        Rule::lbrace | Rule::body => "`{`",
        Rule::rbrace => "`}`",
        Rule::comma => "`,`",
        Rule::colon => "`:`",
        Rule::semicolon => "`;`",
        Rule::assign => "`=`",
        Rule::ellipsis => "`...`",
        Rule::plus => "`+`",
        Rule::minus | Rule::neg => "`-`",
        Rule::star => "`*`",
        Rule::slash => "`/`",
        Rule::at => "`@`",
        Rule::assign_stmt => "a statement",
        other => return format!("{other:?}").replace('_', " "),
    };
    s.to_string()
}

fn span_of(p: &Pair<Rule>) -> Span {
    let s = p.as_span();
    Span::new(s.start(), s.end())
}

/// Punctuation and keyword pairs carry no information once the parse succeeded.
fn is_token(r: Rule) -> bool {
    matches!(
        r,
        Rule::lparen
            | Rule::rparen
            | Rule::lbracket
            | Rule::rbracket
            | Rule::lbrace
            | Rule::rbrace
            | Rule::comma
            | Rule::colon
            | Rule::semicolon
            | Rule::assign
            | Rule::kw_model
            | Rule::kw_block
            | Rule::kw_param
            | Rule::kw_const
            | Rule::kw_repeat
            | Rule::kw_return
            | Rule::kw_as
    )
}

/// The meaningful children of a pair.
fn children(p: Pair<Rule>) -> Vec<Pair<Rule>> {
    p.into_inner().filter(|c| !is_token(c.as_rule())).collect()
}

fn ident(p: Pair<Rule>) -> Ident {
    Ident { name: p.as_str().to_string(), span: span_of(&p) }
}

fn missing(what: &str) -> Error {
    Error::invariant(format!("parse tree lacks {what}"))
}

fn item(p: Pair<Rule>, kind: ItemKind) -> Result<Item> {
    let span = span_of(&p);
    let mut it = children(p).into_iter();
    let name = ident(it.next().ok_or_else(|| missing("a name"))?);
    let sig = it.next().ok_or_else(|| missing("a signature"))?;
    let body_pair = it.next().ok_or_else(|| missing("a body"))?;
    let params = children(sig).into_iter().map(sig_param).collect::<Result<_>>()?;
    Ok(Item { kind, name, params, body: body(body_pair)?, span })
}

fn sig_param(p: Pair<Rule>) -> Result<SigParam> {
    let span = span_of(&p);
    let rule = p.as_rule();
    let mut it = children(p).into_iter();
    let name = ident(it.next().ok_or_else(|| missing("a parameter name"))?);
    if rule == Rule::hyper_param {
        let default = it.next().map(expr).transpose()?;
        return Ok(SigParam::Hyper { name, default });
    }
    let ty = it.next().ok_or_else(|| missing("a type"))?;
    let mut ty = children(ty).into_iter();
    let dtype = match ty.next().map(|d| d.as_str().to_string()).as_deref() {
        Some("f32") => DType::F32,
        Some("i32") => DType::I32,
        _ => return Err(missing("a dtype")),
    };
    let mut dims = Vec::new();
    for d in ty {
        let d = d.into_inner().next().ok_or_else(|| missing("a dimension"))?;
        let dspan = span_of(&d);
        dims.push(match d.as_rule() {
            Rule::ellipsis => DimPat::Ellipsis(dspan),
            Rule::ident => DimPat::Name(ident(d)),
            _ => DimPat::Size(int_literal(d.as_str(), dspan)?, dspan),
        });
    }
    Ok(SigParam::Tensor { name, dtype, dims, span })
}

fn int_literal(s: &str, span: Span) -> Result<i64> {
    s.parse::<i64>().map_err(|_| err!(Parse, "integer literal `{s}` is too large").at(span))
}

fn body(p: Pair<Rule>) -> Result<Vec<Stmt>> {
    children(p).into_iter().map(stmt).collect()
}

fn stmt(p: Pair<Rule>) -> Result<Stmt> {
    let span = span_of(&p);
    let rule = p.as_rule();
    if rule == Rule::param_decl {
        return Ok(Stmt::Param(param_decl(p)?));
    }
    let mut it = children(p).into_iter();
    Ok(match rule {
        Rule::assign_stmt | Rule::const_stmt => {
            let name = ident(it.next().ok_or_else(|| missing("a name"))?);
            let value = expr(it.next().ok_or_else(|| missing("a value"))?)?;
            if rule == Rule::const_stmt {
                Stmt::Const { name, value }
            } else {
                Stmt::Assign { name, value }
            }
        }
        Rule::repeat_stmt => {
            let count = expr(it.next().ok_or_else(|| missing("a count"))?)?;
            let mut name = None;
            let mut stmts = Vec::new();
            for c in it {
                match c.as_rule() {
                    Rule::ident => name = Some(ident(c)),
                    _ => stmts = body(c)?,
                }
            }
            Stmt::Repeat { count, name, body: stmts, span }
        }
        Rule::return_stmt => Stmt::Return { values: it.map(expr).collect::<Result<_>>()?, span },
        other => return Err(missing(&format!("a statement, found {other:?}"))),
    })
}

fn param_decl(p: Pair<Rule>) -> Result<ParamDecl> {
    Ok(param_decl_depth(p)?.0)
}

fn param_decl_depth(p: Pair<Rule>) -> Result<(ParamDecl, usize)> {
    let span = span_of(&p);
    let mut kids = children(p);
    let (init, mut depth) = expr_depth(kids.pop().ok_or_else(|| missing("an initializer"))?)?;
    let mut it = kids.into_iter();
    let name = ident(it.next().ok_or_else(|| missing("a parameter name"))?);
    let mut shape = Vec::new();
    for c in it {
        let (e, d) = expr_depth(c)?;
        depth = depth.max(d);
        shape.push(e);
    }
    Ok((ParamDecl { name, shape, init, span }, depth + 1))
}

/// An expression, with operator precedence applied by a loop (shunting-yard), not recursion.
fn expr(p: Pair<Rule>) -> Result<Expr> {
    let (e, _) = expr_depth(p)?;
    Ok(e)
}

fn expr_depth(p: Pair<Rule>) -> Result<(Expr, usize)> {
    let span = span_of(&p);
    let mut operands: Vec<(Expr, usize)> = Vec::new();
    let mut ops: Vec<BinOp> = Vec::new();
    let mut negs: Vec<Span> = Vec::new();
    fn reduce(operands: &mut Vec<(Expr, usize)>, op: BinOp) -> Result<()> {
        let (r, rd) = operands.pop().ok_or_else(|| missing("an operand"))?;
        let (l, ld) = operands.pop().ok_or_else(|| missing("an operand"))?;
        let span = l.span.join(r.span);
        let kind = ExprKind::Binary(op, Box::new(l), Box::new(r));
        operands.push((Expr { kind, span }, ld.max(rd) + 1));
        Ok(())
    }
    for c in p.into_inner() {
        let op = match c.as_rule() {
            Rule::neg => {
                negs.push(span_of(&c));
                continue;
            }
            Rule::plus => BinOp::Add,
            Rule::minus => BinOp::Sub,
            Rule::star => BinOp::Mul,
            Rule::slash => BinOp::Div,
            Rule::at => BinOp::Matmul,
            _ => {
                let (mut e, mut d) = primary(c)?;
                while let Some(ns) = negs.pop() {
                    d += 1;
                    if d > MAX_EXPR_DEPTH {
                        break;
                    }
                    let s = ns.join(e.span);
                    e = Expr { kind: ExprKind::Neg(Box::new(e)), span: s };
                }
                negs.clear();
                operands.push((e, d));
                continue;
            }
        };
        while let Some(&top) = ops.last() {
            if top.precedence() < op.precedence() {
                break;
            }
            ops.pop();
            reduce(&mut operands, top)?;
        }
        ops.push(op);
        if operands.last().is_some_and(|(_, d)| *d > MAX_EXPR_DEPTH) {
            break;
        }
    }
    while let Some(op) = ops.pop() {
        if operands.len() < 2 {
            break;
        }
        reduce(&mut operands, op)?;
    }
    let (e, d) = operands.pop().ok_or_else(|| missing("an operand"))?;
    if d > MAX_EXPR_DEPTH
        || !operands.is_empty() && operands.iter().any(|(_, d)| *d > MAX_EXPR_DEPTH)
    {
        // A flat chain `a + b + ... + z` nests too: each operator is a level of the tree.
        return Err(err!(
            Parse,
            "expression is nested deeper than {MAX_EXPR_DEPTH} levels (each operator of a \
             chain such as `a + b + c` is a level): split it with intermediate assignments"
        )
        .at(span));
    }
    Ok((e, d))
}

fn primary(p: Pair<Rule>) -> Result<(Expr, usize)> {
    let span = span_of(&p);
    let leaf = |kind| Ok((Expr { kind, span }, 1));
    match p.as_rule() {
        Rule::int => leaf(ExprKind::Int(int_literal(p.as_str(), span)?)),
        Rule::float => match p.as_str().parse::<f64>() {
            Ok(v) if v.is_finite() => leaf(ExprKind::Float(v)),
            _ => Err(err!(Parse, "float literal `{}` is out of range", p.as_str()).at(span)),
        },
        Rule::bool => leaf(ExprKind::Bool(p.as_str() == "true")),
        Rule::name => leaf(ExprKind::Name(p.as_str().to_string())),
        Rule::paren => {
            let inner = children(p).into_iter().next().ok_or_else(|| missing("an expression"))?;
            let (mut e, d) = expr_depth(inner)?;
            e.span = span;
            Ok((e, d))
        }
        Rule::list => {
            let mut items = Vec::new();
            let mut depth = 1;
            for c in children(p) {
                let (e, d) = expr_depth(c)?;
                depth = depth.max(d + 1);
                items.push(e);
            }
            Ok((Expr { kind: ExprKind::List(items), span }, depth))
        }
        Rule::param_decl => {
            let (decl, depth) = param_decl_depth(p)?;
            Ok((Expr { kind: ExprKind::Param(Box::new(decl)), span }, depth))
        }
        Rule::call => {
            let mut it = children(p).into_iter();
            let callee_pair = it.next().ok_or_else(|| missing("a callee"))?;
            let op_only = callee_pair.as_str().starts_with("ops.");
            let id = callee_pair
                .into_inner()
                .find(|c| c.as_rule() == Rule::ident)
                .ok_or_else(|| missing("a callee name"))?;
            let callee = ident(id);
            let mut args = Vec::new();
            let mut alias = None;
            let mut depth = 1;
            for c in it {
                match c.as_rule() {
                    Rule::arg => {
                        let mut kids = children(c);
                        let value_pair = kids.pop().ok_or_else(|| missing("an argument"))?;
                        let name = kids.pop().map(ident);
                        let (value, d) = expr_depth(value_pair)?;
                        depth = depth.max(d + 1);
                        args.push(Arg { name, value });
                    }
                    Rule::ident => alias = Some(ident(c)),
                    _ => {}
                }
            }
            let kind = ExprKind::Call(Call { callee, op_only, args, alias });
            Ok((Expr { kind, span }, depth))
        }
        other => Err(missing(&format!("an operand, found {other:?}"))),
    }
}
