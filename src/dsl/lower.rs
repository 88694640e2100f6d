//! Resolved module → [`Graph`]: instantiates one model with hyperparameters and input
//! dimensions, evaluating static values (hyperparameters, dimensions, `4 * d`), matching tensor
//! patterns, naming parameters by scope (`blocks.0.attn.qkv.weight`), and building nodes through
//! the graph's checked builder, which reports shape mistakes at the current span.
//!
//! Every node carries the span of the user expression it came from; nodes made inside a
//! standard-library block carry the span of the user's call of that block, and errors raised
//! there are moved to that call too. Lowering is bounded: block calls nest at most
//! [`MAX_CALL_DEPTH`] deep and at most [`MAX_STEPS`] statements and expressions are evaluated,
//! so no model makes lowering hang.

use super::ast::*;
use super::ops::{self, ArgKind, OpSig};
use super::resolve::{Module, STD_NAME};
use crate::err;
use crate::error::{Error, Result, Source, Span};
use crate::graph::{BinaryOp, Graph, Init, NodeId, ReduceOp, UnaryOp};
use crate::tensor::{checked_numel, fmt_shape};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Deepest nesting of block calls.
pub const MAX_CALL_DEPTH: usize = 64;
/// Most statements and expressions one instantiation may evaluate.
pub const MAX_STEPS: usize = 200_000;
/// Largest dimension accepted.
pub const MAX_DIM: i64 = 1 << 31;

/// A value in the language: static (known while lowering) or a tensor (a graph node).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<Value>),
    Tensor(NodeId),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Bool(_) => "a boolean",
            Value::List(_) => "a list",
            Value::Tensor(_) => "a tensor",
        }
    }
}

/// Instantiate `model` from `module` into a graph. `bindings` set hyperparameters and the named
/// dimensions of the model's inputs (e.g. `B`, `T`); a dimension left unset takes `default_dim`
/// when given, and is an error otherwise.
pub fn lower(
    module: &Module,
    model: &str,
    bindings: &[(&str, Value)],
    default_dim: Option<i64>,
) -> Result<Graph> {
    let Some((item, src)) = module.item(model) else {
        return Err(err!(Name, "no model named `{model}`"));
    };
    if item.kind != ItemKind::Model {
        return Err(err!(Name, "`{model}` is a block, not a model"));
    }
    let mut lw = Lowerer {
        module,
        g: Graph::new(),
        steps: 0,
        depth: 0,
        claimed: HashSet::new(),
        outer_span: None,
    };
    lw.model(item, bindings, default_dim).map_err(|e| e.in_source(src))?;
    Ok(lw.g)
}

struct Lowerer<'m> {
    module: &'m Module,
    g: Graph,
    steps: usize,
    depth: usize,
    /// Dotted names taken by parameters and named scopes.
    claimed: HashSet<String>,
    /// While inside a standard-library block: the user's call span, used for every node/error.
    outer_span: Option<Span>,
}

/// Variables of one block or model activation.
struct Frame {
    env: HashMap<String, Value>,
    /// Dotted prefix of this scope ("" at the model's root, else ending in ".").
    prefix: String,
    /// Anonymous calls per (prefix, block), for `<block>_<k>` names.
    anon: HashMap<(String, String), usize>,
    n_repeats: usize,
}

impl Lowerer<'_> {
    fn span(&self, s: Span) -> Span {
        self.outer_span.unwrap_or(s)
    }

    fn step(&mut self, span: Span) -> Result<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(err!(Name, "model is too large to lower: more than {MAX_STEPS} steps")
                .at(self.span(span)));
        }
        Ok(())
    }

    fn claim(&mut self, name: String, span: Span, short: &str) -> Result<()> {
        if !self.claimed.insert(name) {
            return Err(err!(Name, "duplicate name `{short}`").at(self.span(span)));
        }
        Ok(())
    }

    fn model(
        &mut self,
        item: &Item,
        bindings: &[(&str, Value)],
        default_dim: Option<i64>,
    ) -> Result<()> {
        let mut given: HashMap<String, Value> = HashMap::new();
        let dim_names: HashSet<&str> = item
            .params
            .iter()
            .flat_map(|p| match p {
                SigParam::Tensor { dims, .. } => dims.iter().collect(),
                _ => Vec::new(),
            })
            .filter_map(|d| match d {
                DimPat::Name(n) => Some(n.name.as_str()),
                _ => None,
            })
            .collect();
        for (name, v) in bindings {
            let known = item
                .params
                .iter()
                .any(|p| matches!(p, SigParam::Hyper { name: n, .. } if n.name == *name));
            if !known && !dim_names.contains(name) {
                return Err(err!(
                    Name,
                    "model `{}` has no hyperparameter or dimension `{name}`",
                    item.name.name
                ));
            }
            given.insert(name.to_string(), v.clone());
        }
        let mut frame = Frame {
            env: HashMap::new(),
            prefix: String::new(),
            anon: HashMap::new(),
            n_repeats: 0,
        };
        // Hyperparameters: given values, else defaults, in order (defaults may use earlier ones).
        let dim_value = |name: &str, env: &HashMap<String, Value>| -> Option<Value> {
            given.get(name).cloned().or_else(|| env.get(name).cloned())
        };
        for p in &item.params {
            if let SigParam::Hyper { name, default } = p {
                let v = match (given.get(&name.name), default) {
                    (Some(v), _) => v.clone(),
                    (None, Some(e)) => self.expr(e, &mut frame)?,
                    (None, None) => {
                        return Err(err!(
                            Name,
                            "hyperparameter `{}` has no default and was not set",
                            name.name
                        )
                        .at(name.span))
                    }
                };
                frame.env.insert(name.name.clone(), v);
            }
        }
        for p in &item.params {
            let SigParam::Tensor { name, dtype, dims, .. } = p else {
                continue;
            };
            let mut shape = Vec::new();
            for d in dims {
                let (v, span) = match d {
                    DimPat::Size(v, s) => (*v, *s),
                    DimPat::Ellipsis(s) => {
                        return Err(err!(Name, "a model input cannot use `...`").at(*s))
                    }
                    DimPat::Name(n) => match dim_value(&n.name, &frame.env) {
                        Some(Value::Int(v)) => (v, n.span),
                        Some(other) => {
                            return Err(err!(
                                Name,
                                "dimension `{}` must be an integer, got {}",
                                n.name,
                                other.kind()
                            )
                            .at(n.span))
                        }
                        None => match default_dim {
                            Some(v) => (v, n.span),
                            None => {
                                return Err(err!(
                                    Name,
                                    "dimension `{}` of input `{}` is not set",
                                    n.name,
                                    name.name
                                )
                                .at(n.span))
                            }
                        },
                    },
                };
                if !(1..=MAX_DIM).contains(&v) {
                    return Err(
                        err!(Shape, "dimension must be between 1 and {MAX_DIM}, got {v}").at(span)
                    );
                }
                if let DimPat::Name(n) = d {
                    frame.env.insert(n.name.clone(), Value::Int(v));
                }
                shape.push(v as usize);
            }
            checked_numel(&shape).map_err(|e| e.at(name.span))?;
            self.g.set_span(name.span);
            let id = self.g.input(&name.name, &shape, *dtype)?;
            frame.env.insert(name.name.clone(), Value::Tensor(id));
        }
        let values = self.body(&item.body, &mut frame)?;
        let Some((exprs, _)) = values else {
            return Err(err!(Name, "model `{}` has no `return`", item.name.name).at(item.name.span));
        };
        let n = exprs.len();
        let mut names = HashSet::new();
        for (i, (e, v)) in exprs.into_iter().enumerate() {
            let name = match &e.kind {
                ExprKind::Name(n) => n.clone(),
                ExprKind::Call(Call { alias: Some(a), .. }) => a.name.clone(),
                _ if n == 1 => "output".to_string(),
                _ => format!("output_{i}"),
            };
            let Value::Tensor(id) = v else {
                return Err(
                    err!(Name, "output `{name}` must be a tensor, got {}", v.kind()).at(e.span)
                );
            };
            if !names.insert(name.clone()) {
                return Err(err!(Name, "duplicate output name `{name}`").at(e.span));
            }
            self.g.set_output(&name, id);
        }
        Ok(())
    }

    /// Runs statements; returns the `return` expressions and their values when one is reached.
    #[allow(clippy::type_complexity)]
    fn body<'a>(
        &mut self,
        stmts: &'a [Stmt],
        frame: &mut Frame,
    ) -> Result<Option<(Vec<(&'a Expr, Value)>, Span)>> {
        for s in stmts {
            match s {
                Stmt::Assign { name, value } | Stmt::Const { name, value } => {
                    self.step(name.span)?;
                    let v = self.expr(value, frame)?;
                    frame.env.insert(name.name.clone(), v);
                }
                Stmt::Param(decl) => {
                    self.step(decl.span)?;
                    self.param(decl, frame)?;
                }
                Stmt::Repeat { count, name, body, span } => {
                    self.step(*span)?;
                    let n = match self.expr(count, frame)? {
                        Value::Int(n) if n > 0 => n,
                        v => {
                            let shown = match v {
                                Value::Int(n) => n.to_string(),
                                Value::Float(f) => f.to_string(),
                                other => other.kind().to_string(),
                            };
                            return Err(err!(
                                Name,
                                "repeat count must be a positive integer, got {shown}"
                            )
                            .at(self.span(count.span)));
                        }
                    };
                    let short = match name {
                        Some(id) => id.name.clone(),
                        None => format!("repeat_{}", frame.n_repeats),
                    };
                    frame.n_repeats += 1;
                    let nspan = name.as_ref().map_or(*span, |i| i.span);
                    self.claim(format!("{}{short}", frame.prefix), nspan, &short)?;
                    let base = std::mem::take(&mut frame.prefix);
                    for i in 0..n {
                        frame.prefix = format!("{base}{short}.{i}.");
                        let r = self.body(body, frame);
                        if let Err(e) = r {
                            frame.prefix = base;
                            return Err(e);
                        }
                    }
                    frame.prefix = base;
                }
                Stmt::Return { values, span } => {
                    let mut out = Vec::new();
                    for e in values {
                        out.push((e, self.expr(e, frame)?));
                    }
                    return Ok(Some((out, *span)));
                }
            }
        }
        Ok(None)
    }

    fn param(&mut self, decl: &ParamDecl, frame: &mut Frame) -> Result<NodeId> {
        let mut shape = Vec::new();
        for e in &decl.shape {
            match self.expr(e, frame)? {
                Value::Int(v) if (1..=MAX_DIM).contains(&v) => shape.push(v as usize),
                Value::Int(v) => {
                    return Err(err!(Shape, "dimension must be between 1 and {MAX_DIM}, got {v}")
                        .at(self.span(e.span)))
                }
                other => {
                    return Err(err!(Name, "a dimension must be an integer, got {}", other.kind())
                        .at(self.span(e.span)))
                }
            }
        }
        checked_numel(&shape).map_err(|e| e.at(self.span(decl.span)))?;
        let init = self.init(&decl.init, frame)?;
        let full = format!("{}{}", frame.prefix, decl.name.name);
        self.claim(full.clone(), decl.name.span, &decl.name.name)?;
        self.g.set_span(self.span(decl.span));
        let id =
            self.g.parameter(&full, &shape, init).map_err(|e| e.at(self.span(decl.init.span)))?;
        frame.env.insert(decl.name.name.clone(), Value::Tensor(id));
        Ok(id)
    }

    fn init(&mut self, e: &Expr, frame: &mut Frame) -> Result<Init> {
        let bad =
            |s: Span| err!(Name, "bad initializer; expected one of {}", ops::init_usage()).at(s);
        let (name, args) = match &e.kind {
            ExprKind::Name(n) => (n.as_str(), &[][..]),
            ExprKind::Call(c) => (c.callee.name.as_str(), &c.args[..]),
            _ => return Err(bad(self.span(e.span))),
        };
        let mut nums = Vec::new();
        for a in args {
            let at = self.span(a.value.span);
            match self.expr(&a.value, frame)? {
                v @ (Value::Int(_) | Value::Float(_)) => nums.push(f32_at(num(&v), at)?),
                other => {
                    return Err(err!(
                        Name,
                        "initializer arguments must be numbers, got {}",
                        other.kind()
                    )
                    .at(self.span(a.value.span)))
                }
            }
        }
        let f = |i: usize| nums.get(i).copied().unwrap_or(0.0);
        Ok(match (name, nums.len()) {
            ("zeros", 0) => Init::Zeros,
            ("ones", 0) => Init::Ones,
            ("xavier", 0) => Init::Xavier,
            ("kaiming", 0) => Init::Kaiming,
            ("normal", 2) => Init::Normal { mean: f(0), std: f(1) },
            ("uniform", 2) => Init::Uniform { low: f(0), high: f(1) },
            _ => return Err(bad(self.span(e.span))),
        })
    }

    fn expr(&mut self, e: &Expr, frame: &mut Frame) -> Result<Value> {
        self.step(e.span)?;
        let span = self.span(e.span);
        Ok(match &e.kind {
            ExprKind::Int(v) => Value::Int(*v),
            ExprKind::Float(v) => Value::Float(*v),
            ExprKind::Bool(v) => Value::Bool(*v),
            ExprKind::Name(n) => match frame.env.get(n) {
                Some(v) => v.clone(),
                None => return Err(err!(Name, "unknown name `{n}`").at(span)),
            },
            ExprKind::List(items) => {
                let mut out = Vec::new();
                for x in items {
                    out.push(self.expr(x, frame)?);
                }
                Value::List(out)
            }
            ExprKind::Neg(x) => match self.expr(x, frame)? {
                Value::Int(v) => Value::Int(
                    v.checked_neg().ok_or_else(|| err!(Name, "integer overflow").at(span))?,
                ),
                Value::Float(v) => Value::Float(-v),
                Value::Tensor(t) => {
                    self.g.set_span(span);
                    Value::Tensor(self.g.neg(t)?)
                }
                other => return Err(err!(Name, "cannot negate {}", other.kind()).at(span)),
            },
            ExprKind::Binary(op, a, b) => {
                let a = self.expr(a, frame)?;
                let b = self.expr(b, frame)?;
                self.binary(*op, a, b, span)?
            }
            ExprKind::Param(decl) => Value::Tensor(self.param(decl, frame)?),
            ExprKind::Call(c) => self.call(c, e.span, frame)?,
        })
    }

    fn binary(&mut self, op: BinOp, a: Value, b: Value, span: Span) -> Result<Value> {
        use Value::{Float, Int, Tensor};
        let sym = op.symbol();
        match (&a, &b) {
            (Int(x), Int(y)) => {
                let (x, y) = (*x, *y);
                let r = match op {
                    BinOp::Add => x.checked_add(y),
                    BinOp::Sub => x.checked_sub(y),
                    BinOp::Mul => x.checked_mul(y),
                    BinOp::Div => {
                        if y == 0 {
                            return Err(err!(Name, "division by zero").at(span));
                        }
                        if x % y != 0 {
                            return Err(err!(Name, "`{x} / {y}` is not a whole number").at(span));
                        }
                        x.checked_div(y)
                    }
                    BinOp::Matmul => {
                        return Err(err!(Name, "`@` needs two tensors, got two integers").at(span))
                    }
                };
                r.map(Int).ok_or_else(|| err!(Name, "integer overflow in `{x} {sym} {y}`").at(span))
            }
            (Int(_) | Float(_), Int(_) | Float(_)) => {
                let (x, y) = (num(&a), num(&b));
                let r = match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Matmul => {
                        return Err(err!(Name, "`@` needs two tensors, got two numbers").at(span))
                    }
                };
                if !r.is_finite() {
                    return Err(err!(Name, "`{x} {sym} {y}` is not a finite number").at(span));
                }
                Ok(Float(r))
            }
            (Tensor(_) | Int(_) | Float(_), Tensor(_) | Int(_) | Float(_)) => {
                if op == BinOp::Matmul && !(matches!(a, Tensor(_)) && matches!(b, Tensor(_))) {
                    return Err(err!(Shape, "`@` needs two tensors").at(span));
                }
                self.g.set_span(span);
                let x = self.tensor(&a, span)?;
                let y = self.tensor(&b, span)?;
                let id = match op {
                    BinOp::Add => self.g.add(x, y),
                    BinOp::Sub => self.g.sub(x, y),
                    BinOp::Mul => self.g.mul(x, y),
                    BinOp::Div => self.g.div(x, y),
                    BinOp::Matmul => self.g.matmul(x, y),
                };
                Ok(Tensor(id.map_err(|e| e.at(span))?))
            }
            _ => Err(err!(Name, "`{sym}` cannot combine {} and {}", a.kind(), b.kind()).at(span)),
        }
    }

    /// A tensor operand: a node, or a static number as a scalar constant.
    fn tensor(&mut self, v: &Value, span: Span) -> Result<NodeId> {
        match v {
            Value::Tensor(t) => Ok(*t),
            Value::Int(_) | Value::Float(_) => Ok(self.g.constant(f32_at(num(v), span)?)),
            other => Err(err!(Name, "expected a tensor, got {}", other.kind()).at(span)),
        }
    }

    fn call(&mut self, c: &Call, span: Span, frame: &mut Frame) -> Result<Value> {
        let mut pos = Vec::new();
        let mut named = Vec::new();
        for a in &c.args {
            let v = self.expr(&a.value, frame)?;
            match &a.name {
                None => pos.push((v, a.value.span)),
                Some(n) => named.push((n.name.clone(), v, a.value.span)),
            }
        }
        let block = if c.op_only { None } else { self.module.callable(&c.callee.name) };
        if let Some((item, src)) = block {
            return self.block_call(c, item, src, span, pos, named, frame);
        }
        let Some(sig) = ops::op(&c.callee.name) else {
            return Err(
                err!(Name, "unknown op or block `{}`", c.callee.name).at(self.span(c.callee.span))
            );
        };
        // Slot arguments by position, then by name, then defaults.
        let mut slots: Vec<Option<(Value, Span)>> = vec![None; sig.params.len()];
        for (i, (v, s)) in pos.into_iter().enumerate() {
            match slots.get_mut(i) {
                Some(slot) => *slot = Some((v, s)),
                None => {
                    return Err(err!(
                        Name,
                        "`{}` takes {} arguments",
                        sig.usage(),
                        sig.params.len()
                    )
                    .at(self.span(s)))
                }
            }
        }
        for (n, v, s) in named {
            match sig.params.iter().position(|p| p.name == n) {
                Some(i) => slots[i] = Some((v, s)),
                None => {
                    return Err(
                        err!(Name, "`{}` has no parameter `{n}`", sig.usage()).at(self.span(s))
                    )
                }
            }
        }
        let mut args = Vec::new();
        for (p, slot) in sig.params.iter().zip(slots) {
            args.push(match (slot, p.default) {
                (Some(x), _) => x,
                (None, Some(ops::Default::Int(v))) => (Value::Int(v), span),
                (None, Some(ops::Default::Float(v))) => (Value::Float(v), span),
                (None, Some(ops::Default::Bool(v))) => (Value::Bool(v), span),
                (None, None) => {
                    return Err(err!(Name, "`{}` is missing argument `{}`", sig.usage(), p.name)
                        .at(self.span(span)))
                }
            });
        }
        self.op(sig, args, self.span(span))
    }

    #[allow(clippy::too_many_arguments)]
    fn block_call(
        &mut self,
        c: &Call,
        item: &Item,
        src: &Arc<Source>,
        span: Span,
        pos: Vec<(Value, Span)>,
        named: Vec<(String, Value, Span)>,
        frame: &mut Frame,
    ) -> Result<Value> {
        let call_span = self.span(span);
        if self.depth >= MAX_CALL_DEPTH {
            return Err(
                err!(Name, "block calls nested deeper than {MAX_CALL_DEPTH} levels").at(call_span)
            );
        }
        // Name the scope.
        let short = match &c.alias {
            Some(a) => a.name.clone(),
            None => {
                let k =
                    frame.anon.entry((frame.prefix.clone(), c.callee.name.clone())).or_insert(0);
                *k += 1;
                format!("{}_{}", c.callee.name, *k - 1)
            }
        };
        let alias_span = c.alias.as_ref().map_or(c.callee.span, |a| a.span);
        self.claim(format!("{}{short}", frame.prefix), alias_span, &short)?;
        let mut callee = Frame {
            env: HashMap::new(),
            prefix: format!("{}{short}.", frame.prefix),
            anon: HashMap::new(),
            n_repeats: 0,
        };
        let is_std = src.name == STD_NAME && self.outer_span.is_none();
        let saved = self.outer_span;
        if is_std {
            self.outer_span = Some(call_span);
        }
        self.depth += 1;
        let r = self.block_body(item, &mut callee, pos, named, call_span);
        self.depth -= 1;
        self.outer_span = saved;
        r.map_err(|mut e| {
            if is_std {
                e.message = format!("in `{}`: {}", item.name.name, e.message);
                e.span = Some(call_span);
            }
            e
        })
    }

    fn block_body(
        &mut self,
        item: &Item,
        callee: &mut Frame,
        pos: Vec<(Value, Span)>,
        named: Vec<(String, Value, Span)>,
        call_span: Span,
    ) -> Result<Value> {
        let mut args: Vec<Option<(Value, Span)>> = vec![None; item.params.len()];
        for (i, (v, s)) in pos.into_iter().enumerate() {
            match args.get_mut(i) {
                Some(slot) => *slot = Some((v, s)),
                None => {
                    return Err(err!(
                        Name,
                        "block `{}` takes {} arguments",
                        item.name.name,
                        item.params.len()
                    )
                    .at(self.span(s)))
                }
            }
        }
        for (n, v, s) in named {
            match item.params.iter().position(|p| p.name().name == n) {
                Some(i) => args[i] = Some((v, s)),
                None => {
                    return Err(err!(Name, "block `{}` has no parameter `{n}`", item.name.name)
                        .at(self.span(s)))
                }
            }
        }
        let hyper_names: HashSet<&str> = item.hyper_names().collect();
        // Given hyperparameters first, then tensor patterns, then defaults, then deferred checks.
        for (p, a) in item.params.iter().zip(&args) {
            if let (SigParam::Hyper { name, .. }, Some((v, _))) = (p, a) {
                callee.env.insert(name.name.clone(), v.clone());
            }
        }
        let mut deferred: Vec<(String, usize, Span, String)> = Vec::new();
        for (p, a) in item.params.iter().zip(&args) {
            let SigParam::Tensor { name, dtype, dims, .. } = p else {
                continue;
            };
            let Some((v, vspan)) = a else {
                return Err(err!(
                    Name,
                    "block `{}` is missing argument `{}`",
                    item.name.name,
                    name.name
                )
                .at(call_span));
            };
            let vspan = self.span(*vspan);
            let id = match v {
                Value::Tensor(t) => *t,
                other => {
                    return Err(err!(
                        Name,
                        "argument `{}` of `{}` must be a tensor, got {}",
                        name.name,
                        item.name.name,
                        other.kind()
                    )
                    .at(vspan))
                }
            };
            let shape = self.g.shape(id).to_vec();
            let got_dtype = self.g.dtype(id);
            if got_dtype != *dtype {
                return Err(err!(
                    Shape,
                    "argument `{}` of `{}` must be {dtype}, got {got_dtype}",
                    name.name,
                    item.name.name
                )
                .at(vspan));
            }
            let pattern = fmt_pattern(dims);
            let mismatch = || {
                err!(
                    Shape,
                    "argument `{}` of `{}` has shape {}, expected {pattern}",
                    name.name,
                    item.name.name,
                    fmt_shape(&shape)
                )
                .at(vspan)
            };
            let has_ellipsis = dims.iter().any(|d| matches!(d, DimPat::Ellipsis(_)));
            let fixed = dims.len() - usize::from(has_ellipsis);
            if shape.len() < fixed || (!has_ellipsis && shape.len() != fixed) {
                return Err(mismatch());
            }
            let mut k = 0;
            for d in dims {
                match d {
                    DimPat::Ellipsis(_) => k += shape.len() - fixed,
                    DimPat::Size(s, _) => {
                        if shape[k] as i64 != *s {
                            return Err(mismatch());
                        }
                        k += 1;
                    }
                    DimPat::Name(n) => {
                        let actual = shape[k] as i64;
                        if hyper_names.contains(n.name.as_str()) {
                            deferred.push((n.name.clone(), shape[k], vspan, pattern.clone()));
                        } else {
                            match callee.env.get(&n.name) {
                                Some(Value::Int(v)) if *v != actual => return Err(mismatch()),
                                _ => {
                                    callee.env.insert(n.name.clone(), Value::Int(actual));
                                }
                            }
                        }
                        k += 1;
                    }
                }
            }
            callee.env.insert(name.name.clone(), Value::Tensor(id));
        }
        for (p, a) in item.params.iter().zip(&args) {
            if let (SigParam::Hyper { name, default }, None) = (p, a) {
                let v = match default {
                    Some(e) => self.expr(e, callee)?,
                    None => {
                        return Err(err!(
                            Name,
                            "block `{}` is missing argument `{}`",
                            item.name.name,
                            name.name
                        )
                        .at(call_span))
                    }
                };
                callee.env.insert(name.name.clone(), v);
            }
        }
        for (n, actual, span, pattern) in deferred {
            if callee.env.get(&n) != Some(&Value::Int(actual as i64)) {
                return Err(err!(Shape, "dimension `{n}` is {actual} in the argument, but `{n}` is set to {}; expected {pattern}",
                    callee.env.get(&n).map_or("nothing".into(), |v| format!("{v:?}").to_lowercase())).at(span));
            }
        }
        match self.body(&item.body, callee)? {
            Some((mut vals, _)) if vals.len() == 1 => Ok(vals.remove(0).1),
            Some((_, rspan)) => Err(err!(Name, "a block returns one value").at(self.span(rspan))),
            None => Err(err!(Name, "block `{}` has no `return`", item.name.name).at(call_span)),
        }
    }

    /// Lowers one op call with arguments already slotted.
    fn op(&mut self, sig: &OpSig, args: Vec<(Value, Span)>, span: Span) -> Result<Value> {
        // Static folding of a few unary math ops, so `1.0 / sqrt(hd)` stays a number.
        if let [(v @ (Value::Int(_) | Value::Float(_)), _)] = &args[..] {
            let x = num(v);
            let r = match sig.name {
                "sqrt" => Some(x.sqrt()),
                "exp" => Some(x.exp()),
                "log" => Some(x.ln()),
                "neg" => Some(-x),
                _ => None,
            };
            if let Some(r) = r {
                if !r.is_finite() {
                    return Err(err!(Name, "`{}({x})` is not a finite number", sig.name).at(span));
                }
                return Ok(Value::Float(r));
            }
        }
        let mut a = Args { lw: self, args, sig, span };
        let name = sig.name;
        // The elementwise ops, by their names in the op table.
        if let Some(op) = BinaryOp::from_name(name) {
            let (x, y) = (a.tensor(0)?, a.tensor(1)?);
            return Ok(Value::Tensor(a.g().binary(op, x, y).map_err(|e| e.at(span))?));
        }
        if let Some(op) = UnaryOp::from_name(name) {
            let x = a.tensor(0)?;
            return Ok(Value::Tensor(a.g().unary(op, x).map_err(|e| e.at(span))?));
        }
        let id = match name {
            "where" => {
                let (c, x, y) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
                a.g().select(c, x, y)
            }
            "sum" | "mean" | "max" => {
                let x = a.tensor(0)?;
                let rank = a.lw.g.shape(x).len();
                let axes = a.axes(1, rank)?;
                let keepdim = a.bool(2)?;
                let op = match name {
                    "sum" => ReduceOp::Sum,
                    "mean" => ReduceOp::Mean,
                    _ => ReduceOp::Max,
                };
                a.g().reduce(op, x, &axes, keepdim)
            }
            "reshape" | "broadcast_to" => {
                let x = a.tensor(0)?;
                let numel: usize = a.lw.g.shape(x).iter().product();
                let shape = a.shape(1, if name == "reshape" { Some(numel) } else { None })?;
                if name == "reshape" {
                    a.g().reshape(x, &shape)
                } else {
                    a.g().broadcast_to(x, &shape)
                }
            }
            "permute" => {
                let x = a.tensor(0)?;
                let rank = a.lw.g.shape(x).len();
                let perm = a.axes(1, rank)?;
                a.g().permute(x, &perm)
            }
            "transpose" => {
                let x = a.tensor(0)?;
                let rank = a.lw.g.shape(x).len();
                let (p, q) = (a.axis(1, rank)?, a.axis(2, rank)?);
                a.g().transpose(x, p, q)
            }
            "slice" => {
                let x = a.tensor(0)?;
                let shape = a.lw.g.shape(x).to_vec();
                let axis = a.axis(1, shape.len())?;
                let (start, end) = (a.index(2)?, a.index(3)?);
                if start == 0 && end == shape[axis] {
                    Ok(x)
                } else {
                    a.g().slice(x, axis, start, end)
                }
            }
            "concat" => {
                let xs = a.tensors(0)?;
                let rank = xs.first().map_or(0, |&x| a.lw.g.shape(x).len());
                let axis = a.axis(1, rank)?;
                a.g().concat(&xs, axis)
            }
            "matmul" => {
                let (x, y) = (a.tensor(0)?, a.tensor(1)?);
                a.g().matmul(x, y)
            }
            "softmax" | "log_softmax" => {
                let x = a.tensor(0)?;
                let rank = a.lw.g.shape(x).len();
                if rank > 0 && a.axis(1, rank)? != rank - 1 {
                    return Err(
                        err!(Shape, "{name}: only the last axis is supported").at(a.span_of(1))
                    );
                }
                if name == "softmax" {
                    a.g().softmax(x)
                } else {
                    a.g().log_softmax(x)
                }
            }
            "causal_mask" => {
                let x = a.tensor(0)?;
                a.g().causal_mask(x)
            }
            "layer_norm" => {
                let (x, w, b) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
                let eps = f32_at(a.float(3)?, a.span_of(3))?;
                a.g().layer_norm(x, w, b, eps)
            }
            "embedding" => {
                let (w, i) = (a.tensor(0)?, a.tensor(1)?);
                a.g().embedding(w, i)
            }
            "cross_entropy" => {
                let (x, t) = (a.tensor(0)?, a.tensor(1)?);
                a.g().cross_entropy(x, t, None)
            }
            "mse" => {
                let (x, y) = (a.tensor(0)?, a.tensor(1)?);
                a.g().mse(x, y)
            }
            "dropout" => {
                let x = a.tensor(0)?;
                let p = a.float(1)?;
                if !(0.0..1.0).contains(&p) {
                    return Err(err!(Name, "dropout probability must be in [0, 1), got {p}")
                        .at(a.span_of(1)));
                }
                let seed = a.index(2)? as u64;
                a.g().dropout(x, p as f32, seed)
            }
            other => return Err(err!(Invariant, "op `{other}` has no lowering").at(span)),
        };
        Ok(Value::Tensor(id.map_err(|e| e.at(span))?))
    }
}

/// A static number as the f32 the graph stores: a finite number outside f32's range is an error
/// at `span`, as an out-of-range literal is.
fn f32_at(v: f64, span: Span) -> Result<f32> {
    crate::num::f32_of(v).map_err(|m| err!(Name, "{m}").at(span))
}

fn num(v: &Value) -> f64 {
    match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}

fn fmt_pattern(dims: &[DimPat]) -> String {
    let v: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DimPat::Ellipsis(_) => "...".to_string(),
            DimPat::Name(n) => n.name.clone(),
            DimPat::Size(s, _) => s.to_string(),
        })
        .collect();
    format!("[{}]", v.join(", "))
}

/// Typed access to an op call's slotted arguments.
struct Args<'a, 'm> {
    lw: &'a mut Lowerer<'m>,
    args: Vec<(Value, Span)>,
    sig: &'a OpSig,
    span: Span,
}

impl Args<'_, '_> {
    fn g(&mut self) -> &mut Graph {
        self.lw.g.set_span(self.span);
        &mut self.lw.g
    }

    fn span_of(&self, i: usize) -> Span {
        self.lw.span(self.args.get(i).map_or(self.span, |a| a.1))
    }

    fn wrong(&self, i: usize, want: &str) -> Error {
        let got = self.args.get(i).map_or("nothing", |a| a.0.kind());
        let pname = self.sig.params.get(i).map_or("?", |p| p.name);
        err!(Name, "argument `{pname}` of `{}` must be {want}, got {got}", self.sig.name)
            .at(self.span_of(i))
    }

    fn tensor(&mut self, i: usize) -> Result<NodeId> {
        debug_assert_eq!(self.sig.params[i].kind, ArgKind::Tensor);
        match self.args.get(i).map(|a| a.0.clone()) {
            Some(Value::Tensor(t)) => Ok(t),
            Some(v @ (Value::Int(_) | Value::Float(_))) => {
                self.lw.g.set_span(self.span);
                Ok(self.lw.g.constant(f32_at(num(&v), self.span_of(i))?))
            }
            _ => Err(self.wrong(i, "a tensor")),
        }
    }

    fn tensors(&mut self, i: usize) -> Result<Vec<NodeId>> {
        match self.args.get(i).map(|a| a.0.clone()) {
            Some(Value::List(vs)) if !vs.is_empty() => vs
                .iter()
                .map(|v| match v {
                    Value::Tensor(t) => Ok(*t),
                    _ => Err(self.wrong(i, "a non-empty list of tensors")),
                })
                .collect(),
            _ => Err(self.wrong(i, "a non-empty list of tensors")),
        }
    }

    fn int(&self, i: usize) -> Result<i64> {
        match self.args.get(i).map(|a| &a.0) {
            Some(Value::Int(v)) => Ok(*v),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    fn index(&self, i: usize) -> Result<usize> {
        let v = self.int(i)?;
        usize::try_from(v).map_err(|_| {
            err!(Shape, "{}: expected a non-negative integer, got {v}", self.sig.name)
                .at(self.span_of(i))
        })
    }

    fn float(&self, i: usize) -> Result<f64> {
        match self.args.get(i).map(|a| &a.0) {
            Some(v @ (Value::Int(_) | Value::Float(_))) => Ok(num(v)),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    fn bool(&self, i: usize) -> Result<bool> {
        match self.args.get(i).map(|a| &a.0) {
            Some(Value::Bool(b)) => Ok(*b),
            _ => Err(self.wrong(i, "`true` or `false`")),
        }
    }

    /// An axis in `-rank..rank`, made non-negative.
    fn axis_value(&self, v: i64, rank: usize, i: usize) -> Result<usize> {
        let r = rank as i64;
        if v < -r || v >= r {
            return Err(err!(
                Shape,
                "{}: axis {v} is out of range for a tensor of rank {rank}",
                self.sig.name
            )
            .at(self.span_of(i)));
        }
        Ok(if v < 0 { (v + r) as usize } else { v as usize })
    }

    fn axis(&self, i: usize, rank: usize) -> Result<usize> {
        let v = self.int(i)?;
        self.axis_value(v, rank, i)
    }

    fn axes(&self, i: usize, rank: usize) -> Result<Vec<usize>> {
        match self.args.get(i).map(|a| &a.0) {
            Some(Value::List(vs)) => vs
                .iter()
                .map(|v| match v {
                    Value::Int(x) => self.axis_value(*x, rank, i),
                    _ => Err(self.wrong(i, "a list of integers")),
                })
                .collect(),
            Some(Value::Int(x)) => Ok(vec![self.axis_value(*x, rank, i)?]),
            _ => Err(self.wrong(i, "a list of integers")),
        }
    }

    /// A shape list; with `numel`, one `-1` entry is inferred.
    fn shape(&self, i: usize, numel: Option<usize>) -> Result<Vec<usize>> {
        let Some(Value::List(vs)) = self.args.get(i).map(|a| &a.0) else {
            return Err(self.wrong(i, "a list of dimensions"));
        };
        let mut out = Vec::new();
        let mut infer = None;
        for (k, v) in vs.iter().enumerate() {
            match v {
                Value::Int(-1) if numel.is_some() && infer.is_none() => {
                    infer = Some(k);
                    out.push(1);
                }
                Value::Int(d) if (1..=MAX_DIM).contains(d) => out.push(*d as usize),
                Value::Int(d) => {
                    return Err(err!(
                        Shape,
                        "{}: dimension must be between 1 and {MAX_DIM}, got {d}",
                        self.sig.name
                    )
                    .at(self.span_of(i)))
                }
                _ => return Err(self.wrong(i, "a list of dimensions")),
            }
        }
        let known = checked_numel(&out).map_err(|e| e.at(self.span_of(i)))?;
        if let (Some(k), Some(n)) = (infer, numel) {
            if known == 0 || n % known != 0 {
                return Err(err!(Shape, "{}: cannot infer `-1` for {n} elements", self.sig.name)
                    .at(self.span_of(i)));
            }
            out[k] = n / known;
        }
        Ok(out)
    }
}
