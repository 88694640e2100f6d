//! Statements and expressions: assignments, `repeat`, `return`, `param` declarations and their
//! initializers, and expression values (static arithmetic is checked and folded; anything next
//! to a tensor becomes a node).

use super::{f32_at, num, Frame, Lowerer, Value, MAX_DIM};
use crate::dsl::ast::*;
use crate::dsl::ops;
use crate::err;
use crate::error::{Result, Span};
use crate::graph::{Init, NodeId, Op};
use crate::tensor::checked_numel;

/// The `return` of a body: its expressions with their values, and its span.
pub(super) type Returned<'a> = (Vec<(&'a Expr, Value)>, Span);

impl Lowerer<'_> {
    /// Runs statements; returns the `return` expressions and their values when one is reached.
    pub(super) fn body<'a>(
        &mut self,
        stmts: &'a [Stmt],
        frame: &mut Frame,
    ) -> Result<Option<Returned<'a>>> {
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
                    self.repeat(count, name.as_ref(), body, *span, frame)?;
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

    /// `repeat count [as name] { body }`: iteration i runs in scope `<name>.<i>`.
    fn repeat(
        &mut self,
        count: &Expr,
        name: Option<&Ident>,
        body: &[Stmt],
        span: Span,
        frame: &mut Frame,
    ) -> Result<()> {
        let n = match self.expr(count, frame)? {
            Value::Int(n) if n > 0 => n,
            v => {
                let shown = match v {
                    Value::Int(n) => n.to_string(),
                    // 2.0 printed as 2 read as the integer it was not.
                    Value::Float(_) => {
                        format!("the float {}: an integer has no decimal point", v.show())
                    }
                    other => other.kind().to_string(),
                };
                return Err(err!(Name, "repeat count must be a positive integer, got {shown}")
                    .at(self.span(count.span)));
            }
        };
        // Named by place, as anonymous calls are: the k-th anonymous `repeat` of its scope (a
        // count of every `repeat` run named a nested one by how often its outer one had run).
        let short = match name {
            Some(id) => id.name.clone(),
            None => frame.anonymous("repeat"),
        };
        let nspan = name.map_or(span, |i| i.span);
        self.claim(format!("{}{short}", frame.prefix), nspan, &short)?;
        let base = std::mem::take(&mut frame.prefix);
        for i in 0..n {
            // A step a pass: an empty body ran 2^63 times with one step for them all.
            let r = self.step(span).and_then(|()| {
                frame.prefix = format!("{base}{short}.{i}.");
                self.body(body, frame)
            });
            if let Err(e) = r {
                frame.prefix = base;
                return Err(e);
            }
        }
        frame.prefix = base;
        Ok(())
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

    /// A dotted name: the parameter of that full name, declared earlier in the model. Using
    /// it again shares the one parameter (weight tying); autodiff sums the gradients of its uses.
    fn param_ref(&self, name: &str, span: Span) -> Result<NodeId> {
        match self.g.persistent_named(name) {
            Some(id) if matches!(self.g.node(id).op, Op::Parameter { .. }) => Ok(id),
            _ => Err(err!(
                Name,
                "no parameter `{name}` declared before this point; a dotted name refers to a parameter by its full name, as `rumus graph --params` lists it"
            )
            .at(span)),
        }
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
                v @ (Value::Int(_) | Value::Float(_)) => nums.push(f32_at(&v, at)?),
                other => {
                    return Err(err!(
                        Name,
                        "initializer arguments must be numbers, got {}",
                        other.kind()
                    )
                    .at(at))
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

    pub(super) fn expr(&mut self, e: &Expr, frame: &mut Frame) -> Result<Value> {
        self.step(e.span)?;
        let span = self.span(e.span);
        Ok(match &e.kind {
            ExprKind::Int(v) => Value::Int(*v),
            ExprKind::Float(v) => Value::Float(*v),
            ExprKind::Bool(v) => Value::Bool(*v),
            ExprKind::Name(n) if n.contains('.') => Value::Tensor(self.param_ref(n, span)?),
            ExprKind::Name(n) => match frame.env.get(n) {
                Some(v) => {
                    // A list is copied: its size in steps (this expression's one taken).
                    self.steps_of(v.size() - 1, e.span)?;
                    v.clone()
                }
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
            ExprKind::Binary(op, ea, eb) => {
                let a = self.expr(ea, frame)?;
                let b = self.expr(eb, frame)?;
                if let (BinOp::Div, Value::Int(x), Value::Int(y)) = (op, &a, &b) {
                    if x.checked_rem(*y).is_some_and(|r| r != 0) {
                        return Err(inexact(ea, eb, *x, *y).at(span));
                    }
                }
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
                        // `%` itself overflows on i64::MIN / -1 (a panic in any build).
                        match x.checked_rem(y) {
                            Some(0) => x.checked_div(y),
                            Some(_) => {
                                return Err(err!(Name, "`{x} / {y}` is not a whole number").at(span))
                            }
                            None => None,
                        }
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
                    let (x, y) = (crate::num::show(x), crate::num::show(y));
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
                    BinOp::Div => super::nonzero_divisor(&self.g, y).and_then(|()| self.g.div(x, y)),
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
            Value::Int(_) | Value::Float(_) => Ok(self.g.constant(f32_at(v, span)?)),
            other => Err(err!(Name, "expected a tensor, got {}", other.kind()).at(span)),
        }
    }
}

/// The error of an inexact division, naming the values divided when they are names: "`D /
/// heads` is `8 / 3`, not a whole number" (inside a standard-library block the position is the
/// caller's, so the names are what points at the argument).
fn inexact(a: &Expr, b: &Expr, x: i64, y: i64) -> crate::error::Error {
    let text = |e: &Expr| match &e.kind {
        ExprKind::Name(n) => Some(n.clone()),
        ExprKind::Int(v) => Some(v.to_string()),
        _ => None,
    };
    match (text(a), text(b)) {
        (Some(ta), Some(tb)) if format!("{ta} / {tb}") != format!("{x} / {y}") => {
            err!(Name, "`{ta} / {tb}` is `{x} / {y}`, not a whole number")
        }
        _ => err!(Name, "`{x} / {y}` is not a whole number"),
    }
}
