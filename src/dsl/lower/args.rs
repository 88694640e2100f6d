//! Op calls: static folding of a few math ops on numbers, then the op's own lowering (see
//! [`crate::dsl::ops`]) over [`Args`], typed access to the call's arguments that reports a
//! wrong kind of argument by the parameter's name, at the argument.

use super::{f32_at, num, Lowerer, Value, MAX_DIM};
use crate::dsl::ops::{self, ArgKind, Lowering, OpSig};
use crate::err;
use crate::error::{Error, Result, Span};
use crate::graph::{Graph, NodeId};
use crate::tensor::checked_numel;

impl Lowerer<'_> {
    /// Lowers one op call; `slots` are its bound arguments, one per parameter.
    pub(super) fn op(
        &mut self,
        sig: &OpSig,
        slots: Vec<Option<(Value, Span)>>,
        span: Span,
        prefix: &str,
    ) -> Result<Value> {
        let args: Vec<Option<(Value, Span)>> = sig
            .params
            .iter()
            .zip(slots)
            .map(|(p, slot)| slot.or_else(|| p.default.map(|d| (default_value(d), span))))
            .collect();
        // Static folding, so `1.0 / sqrt(hd)` stays a number.
        if let (Lowering::Unary(u), [Some((v @ (Value::Int(_) | Value::Float(_)), _))]) =
            (sig.lower, &args[..])
        {
            if let Some(f) = ops::fold(u) {
                let x = num(v);
                let r = f(x);
                if !r.is_finite() {
                    let x = crate::num::show(x);
                    return Err(err!(Name, "`{}({x})` is not a finite number", sig.name).at(span));
                }
                return Ok(Value::Float(r));
            }
        }
        let mut a = Args { lw: self, args, sig, span, prefix };
        let id = match sig.lower {
            Lowering::Unary(op) => a.tensor(0).and_then(|x| a.g().unary(op, x)),
            Lowering::Binary(op) => {
                let (x, y) = (a.tensor(0)?, a.tensor(1)?);
                let divisor = match op {
                    crate::graph::BinaryOp::Div => super::nonzero_divisor(a.g(), y),
                    _ => Ok(()),
                };
                divisor.and_then(|()| a.g().binary(op, x, y))
            }
            Lowering::Node(f) => f(&mut a),
        };
        let id = id.map_err(|e| e.at(span))?;
        // A model's inputs have no empty axis, so only an op can make one (an empty slice): a
        // mean over it would be 0/0 and a loss of it NaN, so it is refused where it is made.
        let shape = self.g.shape(id);
        if shape.contains(&0) {
            let e = err!(
                Shape,
                "{} gives {}, an empty axis: a model's values need every dimension at least 1",
                sig.name,
                crate::tensor::fmt_shape(shape)
            );
            return Err(e.at(span));
        }
        Ok(Value::Tensor(id))
    }
}

fn default_value(d: ops::Default) -> Value {
    match d {
        ops::Default::Int(v) => Value::Int(v),
        ops::Default::Float(v) => Value::Float(v),
        ops::Default::Bool(v) => Value::Bool(v),
    }
}

/// An op call's arguments, one per parameter of its signature, with typed access for its
/// lowering. Every accessor's error names the parameter and points at the argument.
pub(crate) struct Args<'a, 'm> {
    lw: &'a mut Lowerer<'m>,
    args: Vec<Option<(Value, Span)>>,
    sig: &'a OpSig,
    span: Span,
    /// The dotted scope of the call (`bn1.`), for the state values an op declares.
    prefix: &'a str,
}

impl Args<'_, '_> {
    /// The graph, with the call's span set for the nodes it makes.
    pub(crate) fn g(&mut self) -> &mut Graph {
        self.lw.g.set_span(self.span);
        &mut self.lw.g
    }

    /// The call's dotted scope (`""` at a model's root, else ending in `.`).
    pub(crate) fn prefix(&self) -> &str {
        self.prefix
    }

    /// The shape of a node.
    pub(crate) fn shape_of(&self, x: NodeId) -> &[usize] {
        self.lw.g.shape(x)
    }

    /// The op's name, for messages.
    pub(crate) fn sig_name(&self) -> &'static str {
        self.sig.name
    }

    /// Where argument `i` stands (the call, for a default).
    pub(crate) fn span_of(&self, i: usize) -> Span {
        self.lw.span(self.get(i).map_or(self.span, |a| a.1))
    }

    fn get(&self, i: usize) -> Option<&(Value, Span)> {
        self.args.get(i).and_then(Option::as_ref)
    }

    /// Argument `i`, the list `list`, has an entry `bad` of the wrong kind: the message shows
    /// the list and the entry (a dimension of 4.0 read as "got a list" said nothing of why).
    fn wrong_entry(&self, i: usize, want: &str, list: &[Value], bad: &Value) -> Error {
        let pname = self.sig.params.get(i).map_or("?", |p| p.name);
        let why = match bad {
            Value::Float(_) => format!("{} is a float, not an integer", bad.show()),
            other => format!("an entry is {}", other.kind()),
        };
        err!(
            Name,
            "argument `{pname}` of `{}` must be {want}, got {}, where {why}",
            self.sig.name,
            Value::List(list.to_vec()).show()
        )
        .at(self.span_of(i))
    }

    fn wrong(&self, i: usize, want: &str) -> Error {
        let got = self.get(i).map_or("nothing", |a| a.0.kind());
        let pname = self.sig.params.get(i).map_or("?", |p| p.name);
        err!(Name, "argument `{pname}` of `{}` must be {want}, got {got}", self.sig.name)
            .at(self.span_of(i))
    }

    /// A tensor; a static number becomes a scalar constant.
    pub(crate) fn tensor(&mut self, i: usize) -> Result<NodeId> {
        debug_assert_eq!(self.sig.params[i].kind, ArgKind::Tensor);
        match self.get(i).map(|a| a.0.clone()) {
            Some(Value::Tensor(t)) => Ok(t),
            Some(v @ (Value::Int(_) | Value::Float(_))) => {
                let c = f32_at(&v, self.span_of(i))?;
                Ok(self.g().constant(c))
            }
            _ => Err(self.wrong(i, "a tensor")),
        }
    }

    /// A non-empty list of tensors.
    pub(crate) fn tensors(&self, i: usize) -> Result<Vec<NodeId>> {
        match self.get(i).map(|a| &a.0) {
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
        match self.get(i).map(|a| &a.0) {
            Some(Value::Int(v)) => Ok(*v),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    /// A non-negative integer.
    pub(crate) fn index(&self, i: usize) -> Result<usize> {
        let v = self.int(i)?;
        usize::try_from(v).map_err(|_| {
            err!(Shape, "{}: expected a non-negative integer, got {v}", self.sig.name)
                .at(self.span_of(i))
        })
    }

    /// Two non-negative integers (height, width): `n` for `[n, n]`, or `[h, w]`; at least
    /// `min` each.
    pub(crate) fn pair(&self, i: usize, min: usize) -> Result<[usize; 2]> {
        let ints: Vec<i64> = match self.get(i).map(|a| &a.0) {
            Some(Value::Int(v)) => vec![*v, *v],
            Some(Value::List(vs)) if vs.len() == 2 => vs
                .iter()
                .map(|v| match v {
                    Value::Int(x) => Ok(*x),
                    _ => Err(self.wrong_entry(i, "an integer or a list of two", vs, v)),
                })
                .collect::<Result<_>>()?,
            _ => return Err(self.wrong(i, "an integer or a list of two")),
        };
        let pname = self.sig.params.get(i).map_or("?", |p| p.name);
        let mut out = [0; 2];
        for (o, v) in out.iter_mut().zip(&ints) {
            *o = usize::try_from(*v)
                .ok()
                .filter(|&v| v >= min && v <= MAX_DIM as usize)
                .ok_or_else(|| {
                    err!(
                        Shape,
                        "{}: `{pname}` must be between {min} and {MAX_DIM}, got {v}",
                        self.sig.name
                    )
                    .at(self.span_of(i))
                })?;
        }
        Ok(out)
    }

    /// A tensor, or none for the number 0 (an absent bias).
    pub(crate) fn optional_tensor(&mut self, i: usize) -> Result<Option<NodeId>> {
        match self.get(i).map(|a| &a.0) {
            Some(Value::Int(0)) => Ok(None),
            Some(Value::Float(v)) if *v == 0.0 => Ok(None),
            Some(Value::Tensor(t)) => Ok(Some(*t)),
            _ => Err(self.wrong(i, "a tensor, or 0 for none")),
        }
    }

    /// A static number.
    pub(crate) fn float(&self, i: usize) -> Result<f64> {
        match self.get(i).map(|a| &a.0) {
            Some(v @ (Value::Int(_) | Value::Float(_))) => Ok(num(v)),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    /// A static number as the f32 the graph stores.
    pub(crate) fn f32(&self, i: usize) -> Result<f32> {
        match self.get(i).map(|a| &a.0) {
            Some(v @ (Value::Int(_) | Value::Float(_))) => f32_at(v, self.span_of(i)),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    /// `true` or `false`.
    pub(crate) fn bool(&self, i: usize) -> Result<bool> {
        match self.get(i).map(|a| &a.0) {
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

    /// An axis of a tensor of rank `rank` (negative counts from the end).
    pub(crate) fn axis(&self, i: usize, rank: usize) -> Result<usize> {
        let v = self.int(i)?;
        self.axis_value(v, rank, i)
    }

    /// A list of axes (or one axis) of a tensor of rank `rank`.
    pub(crate) fn axes(&self, i: usize, rank: usize) -> Result<Vec<usize>> {
        match self.get(i).map(|a| &a.0) {
            Some(Value::List(vs)) => vs
                .iter()
                .map(|v| match v {
                    Value::Int(x) => self.axis_value(*x, rank, i),
                    _ => Err(self.wrong_entry(i, "a list of integers", vs, v)),
                })
                .collect(),
            Some(Value::Int(x)) => Ok(vec![self.axis_value(*x, rank, i)?]),
            _ => Err(self.wrong(i, "a list of integers")),
        }
    }

    /// A shape list; with `numel`, one `-1` entry is inferred.
    pub(crate) fn shape(&self, i: usize, numel: Option<usize>) -> Result<Vec<usize>> {
        let Some(Value::List(vs)) = self.get(i).map(|a| &a.0) else {
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
                _ => return Err(self.wrong_entry(i, "a list of dimensions", vs, v)),
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
