//! The op table as the language sees it: every op's name and parameters, in order, with their
//! kinds and defaults, and its lowering to the graph builder. `resolve` checks calls against the
//! parameters; `lower` binds the arguments and runs the lowering. The graph's elementwise ops
//! come from the graph's own table (`UnaryOp::ALL`, `BinaryOp::ALL`), so a new activation needs
//! no row here; every other op is one row of `OTHERS`.

use super::lower::Args;
use crate::err;
use crate::error::Result;
use crate::graph::{BatchNorm, BinaryOp, Conv2d, NodeId, ReduceOp, UnaryOp};

/// What a parameter of an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// A tensor (a static number is turned into a constant where the op allows).
    Tensor,
    /// A static integer (an axis may be negative).
    Int,
    /// A static number.
    Float,
    /// A static boolean.
    Bool,
    /// A list of static integers, e.g. `[B, T, D]`.
    Ints,
    /// A list of tensors.
    Tensors,
}

/// A default value of an op parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Default {
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// One parameter of an op.
#[derive(Clone, Copy, Debug)]
pub struct OpParam {
    pub name: &'static str,
    pub kind: ArgKind,
    pub default: Option<Default>,
}

/// How an op call becomes a graph node.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lowering {
    /// An elementwise op of the graph on one tensor.
    Unary(UnaryOp),
    /// An elementwise op of the graph on two tensors, broadcast.
    Binary(BinaryOp),
    /// Any other op: a function of the call's arguments.
    Node(fn(&mut Args) -> Result<NodeId>),
}

/// The signature of an op, and how it lowers.
#[derive(Clone, Copy, Debug)]
pub struct OpSig {
    pub name: &'static str,
    pub params: &'static [OpParam],
    pub(crate) lower: Lowering,
}

impl OpSig {
    /// Number of parameters without a default.
    pub fn required(&self) -> usize {
        self.params.iter().filter(|p| p.default.is_none()).count()
    }

    /// `name(a, b, c = 1)` for messages.
    pub fn usage(&self) -> String {
        let ps: Vec<String> = self
            .params
            .iter()
            .map(|p| match p.default {
                None => p.name.to_string(),
                Some(Default::Int(v)) => format!("{} = {v}", p.name),
                Some(Default::Float(v)) => format!("{} = {v:?}", p.name),
                Some(Default::Bool(v)) => format!("{} = {v}", p.name),
            })
            .collect();
        format!("{}({})", self.name, ps.join(", "))
    }
}

const fn p(name: &'static str, kind: ArgKind) -> OpParam {
    OpParam { name, kind, default: None }
}

const fn d(name: &'static str, kind: ArgKind, default: Default) -> OpParam {
    OpParam { name, kind, default: Some(default) }
}

const fn row(
    name: &'static str,
    params: &'static [OpParam],
    lower: fn(&mut Args) -> Result<NodeId>,
) -> OpSig {
    OpSig { name, params, lower: Lowering::Node(lower) }
}

use ArgKind::*;

const UNARY: &[OpParam] = &[p("x", Tensor)];
const BINARY: &[OpParam] = &[p("a", Tensor), p("b", Tensor)];
const REDUCE: &[OpParam] =
    &[p("x", Tensor), p("axes", Ints), d("keepdim", Bool, Default::Bool(false))];
const SOFTMAX: &[OpParam] = &[p("x", Tensor), d("axis", Int, Default::Int(-1))];

/// The ops that are not elementwise ops of the graph, one row each: name, parameters, lowering.
const OTHERS: &[OpSig] = &[
    row("where", &[p("cond", Tensor), p("a", Tensor), p("b", Tensor)], |a| {
        let (c, x, y) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
        a.g().select(c, x, y)
    }),
    row("sum", REDUCE, |a| reduce(a, ReduceOp::Sum)),
    row("mean", REDUCE, |a| reduce(a, ReduceOp::Mean)),
    row("max", REDUCE, |a| reduce(a, ReduceOp::Max)),
    row("reshape", &[p("x", Tensor), p("shape", Ints)], |a| {
        let x = a.tensor(0)?;
        let numel = a.shape_of(x).iter().product();
        let shape = a.shape(1, Some(numel))?;
        a.g().reshape(x, &shape)
    }),
    row("permute", &[p("x", Tensor), p("perm", Ints)], |a| {
        let x = a.tensor(0)?;
        let perm = a.axes(1, a.shape_of(x).len())?;
        a.g().permute(x, &perm)
    }),
    row("transpose", &[p("x", Tensor), p("a", Int), p("b", Int)], |a| {
        let x = a.tensor(0)?;
        let rank = a.shape_of(x).len();
        let (p, q) = (a.axis(1, rank)?, a.axis(2, rank)?);
        a.g().transpose(x, p, q)
    }),
    row("broadcast_to", &[p("x", Tensor), p("shape", Ints)], |a| {
        let x = a.tensor(0)?;
        let shape = a.shape(1, None)?;
        a.g().broadcast_to(x, &shape)
    }),
    row("slice", &[p("x", Tensor), p("axis", Int), p("start", Int), p("end", Int)], |a| {
        let x = a.tensor(0)?;
        let shape = a.shape_of(x).to_vec();
        let axis = a.axis(1, shape.len())?;
        let (start, end) = (a.index(2)?, a.index(3)?);
        if start == 0 && end == shape[axis] {
            return Ok(x);
        }
        a.g().slice(x, axis, start, end)
    }),
    row("concat", &[p("xs", Tensors), p("axis", Int)], |a| {
        let xs = a.tensors(0)?;
        let rank = xs.first().map_or(0, |&x| a.shape_of(x).len());
        let axis = a.axis(1, rank)?;
        a.g().concat(&xs, axis)
    }),
    row("matmul", BINARY, |a| {
        let (x, y) = (a.tensor(0)?, a.tensor(1)?);
        a.g().matmul(x, y)
    }),
    row("softmax", SOFTMAX, |a| {
        let x = last_axis(a)?;
        a.g().softmax(x)
    }),
    row("log_softmax", SOFTMAX, |a| {
        let x = last_axis(a)?;
        a.g().log_softmax(x)
    }),
    row("causal_mask", UNARY, |a| {
        let x = a.tensor(0)?;
        a.g().causal_mask(x)
    }),
    row(
        "layer_norm",
        &[
            p("x", Tensor),
            p("weight", Tensor),
            p("bias", Tensor),
            d("eps", Float, Default::Float(1e-5)),
        ],
        |a| {
            let (x, w, b) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
            let eps = eps_arg(a, "layer_norm", 3)?;
            a.g().layer_norm(x, w, b, eps)
        },
    ),
    row("attention", &[p("q", Tensor), p("k", Tensor), p("v", Tensor)], |a| {
        let (q, k, v) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
        a.g().attention(q, k, v)
    }),
    row("embedding", &[p("weight", Tensor), p("idx", Tensor)], |a| {
        let (w, i) = (a.tensor(0)?, a.tensor(1)?);
        a.g().embedding(w, i)
    }),
    row("cross_entropy", &[p("logits", Tensor), p("targets", Tensor)], |a| {
        let (x, t) = (a.tensor(0)?, a.tensor(1)?);
        a.g().cross_entropy(x, t, None)
    }),
    row("mse", BINARY, |a| {
        let (x, y) = (a.tensor(0)?, a.tensor(1)?);
        a.g().mse(x, y)
    }),
    row("dropout", &[p("x", Tensor), p("p", Float), p("seed", Int)], |a| {
        let x = a.tensor(0)?;
        let p = a.float(1)?;
        // Checked as the f32 it becomes: 0.99999999 is 1 there (the graph's check then said
        // "got 1" of a number the user did not write).
        let p32 = p as f32;
        if !(0.0..1.0).contains(&p32) {
            let rounded = match f64::from(p32) == p {
                true => String::new(),
                false => format!(", which is {p32} as an f32"),
            };
            return Err(err!(
                InvalidArgument,
                "dropout probability must be in [0, 1), got {p}{rounded}"
            )
            .at(a.span_of(1)));
        }
        let seed = a.index(2)? as u64;
        a.g().dropout(x, p32, seed)
    }),
    row(
        "conv2d",
        &[
            p("x", Tensor),
            p("weight", Tensor),
            d("bias", Tensor, Default::Int(0)),
            d("stride", Ints, Default::Int(1)),
            d("padding", Ints, Default::Int(0)),
            d("dilation", Ints, Default::Int(1)),
            d("groups", Int, Default::Int(1)),
        ],
        |a| {
            let (x, w) = (a.tensor(0)?, a.tensor(1)?);
            let bias = a.optional_tensor(2)?;
            let (stride, padding, dilation) = (a.pair(3, 1)?, a.pair(4, 0)?, a.pair(5, 1)?);
            let groups = a.index(6)?;
            if groups == 0 {
                return Err(err!(Shape, "conv2d: `groups` must be at least 1, got 0")
                    .at(a.span_of(6)));
            }
            a.g().conv2d(x, w, bias, Conv2d { stride, padding, dilation, groups })
        },
    ),
    row("max_pool2d", POOL, |a| pool(a, true)),
    row("avg_pool2d", POOL, |a| pool(a, false)),
    row("flatten", &[p("x", Tensor), d("start", Int, Default::Int(1))], |a| {
        let x = a.tensor(0)?;
        let start = a.axis(1, a.shape_of(x).len())?;
        a.g().flatten(x, start)
    }),
    row(
        "batch_norm",
        &[
            p("x", Tensor),
            p("weight", Tensor),
            p("bias", Tensor),
            d("momentum", Float, Default::Float(0.1)),
            d("eps", Float, Default::Float(1e-5)),
        ],
        |a| {
            let (x, w, b) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
            let momentum = a.f32(3)?;
            if !(0.0..=1.0).contains(&momentum) {
                return Err(err!(InvalidArgument, "batch_norm: `momentum` must be in [0, 1], got {momentum}")
                    .at(a.span_of(3)));
            }
            let eps = eps_arg(a, "batch_norm", 4)?;
            let c = a.shape_of(x).get(1).copied().unwrap_or(0);
            let prefix = a.prefix().to_string();
            let running = a.g().batch_norm_state(&prefix, c)?;
            a.g().batch_norm(x, w, b, running, BatchNorm { momentum, eps })
        },
    ),
];

/// Argument `i`, an `eps` of op `op`: a normal f32 ([`crate::num::eps_f32`]), read as written
/// (1e-50 is named as 1e-50, not as the 0 it rounds to in f32).
fn eps_arg(a: &mut Args, op: &str, i: usize) -> Result<f32> {
    let eps = a.float(i)?;
    crate::num::eps_f32(eps)
        .map_err(|m| err!(InvalidArgument, "{op}: `eps` {m}").at(a.span_of(i)))
}

const POOL: &[OpParam] =
    &[p("x", Tensor), p("kernel", Ints), p("stride", Ints), d("padding", Ints, Default::Int(0))];

/// `max_pool2d` or `avg_pool2d`.
fn pool(a: &mut Args, max: bool) -> Result<NodeId> {
    let x = a.tensor(0)?;
    let (kernel, stride, padding) = (a.pair(1, 1)?, a.pair(2, 1)?, a.pair(3, 0)?);
    if max {
        a.g().max_pool2d(x, kernel, stride, padding)
    } else {
        a.g().avg_pool2d(x, kernel, stride, padding)
    }
}

fn reduce(a: &mut Args, op: ReduceOp) -> Result<NodeId> {
    let x = a.tensor(0)?;
    let axes = a.axes(1, a.shape_of(x).len())?;
    let keepdim = a.bool(2)?;
    a.g().reduce(op, x, &axes, keepdim)
}

/// Argument 0 of `softmax`/`log_softmax`, after checking that `axis` is its last.
fn last_axis(a: &mut Args) -> Result<NodeId> {
    let x = a.tensor(0)?;
    let rank = a.shape_of(x).len();
    if rank > 0 && a.axis(1, rank)? != rank - 1 {
        let name = a.sig_name();
        return Err(err!(Shape, "{name}: only the last axis is supported").at(a.span_of(1)));
    }
    Ok(x)
}

/// Every op callable from the language: the graph's elementwise ops (named as the graph names
/// them), then the other ops' rows.
pub fn all() -> impl Iterator<Item = OpSig> {
    let binary = BinaryOp::ALL.into_iter().filter(|o| o.is_language_op()).map(|o| OpSig {
        name: o.name(),
        params: BINARY,
        lower: Lowering::Binary(o),
    });
    let unary = UnaryOp::ALL.into_iter().filter(|o| o.is_language_op()).map(|o| OpSig {
        name: o.name(),
        params: UNARY,
        lower: Lowering::Unary(o),
    });
    binary.chain(unary).chain(OTHERS.iter().copied())
}

/// The op of this name.
pub fn op(name: &str) -> Option<OpSig> {
    all().find(|o| o.name == name)
}

/// The math a unary op does on a static number, for the ops the language folds (so
/// `1.0 / sqrt(hd)` stays a number); other ops of a number make a constant node.
pub(crate) fn fold(op: UnaryOp) -> Option<fn(f64) -> f64> {
    match op {
        UnaryOp::Sqrt => Some(f64::sqrt),
        UnaryOp::Exp => Some(f64::exp),
        UnaryOp::Log => Some(f64::ln),
        UnaryOp::Neg => Some(|x| -x),
        _ => None,
    }
}

/// The initializers a `param` may use, with their argument names.
pub const INITS: &[(&str, &[&str])] = &[
    ("zeros", &[]),
    ("ones", &[]),
    ("normal", &["mean", "std"]),
    ("uniform", &["low", "high"]),
    ("xavier", &[]),
    ("kaiming", &[]),
];

/// "zeros, ones, normal(mean, std), ..." for messages.
pub fn init_usage() -> String {
    let v: Vec<String> = INITS
        .iter()
        .map(|(n, a)| if a.is_empty() { n.to_string() } else { format!("{n}({})", a.join(", ")) })
        .collect();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Op;
    use crate::source::Source;

    /// The language's ops, pinned: an op joining the graph's elementwise table joins the
    /// language too (a gradient helper, a `helper` row of the table, is left out).
    #[test]
    fn the_language_has_these_ops() {
        let names: Vec<&str> = all().map(|o| o.name).collect();
        assert_eq!(
            names.join(" "),
            "add sub mul div pow maximum minimum neg exp log sqrt rsqrt abs square tanh sigmoid \
             relu gelu gelu_tanh silu softplus log_sigmoid where sum mean max reshape permute transpose broadcast_to \
             slice concat matmul softmax log_softmax causal_mask layer_norm attention embedding \
             cross_entropy mse dropout conv2d max_pool2d avg_pool2d flatten batch_norm"
        );
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn every_elementwise_op_lowers_to_its_graph_op() {
        for sig in all() {
            let (call, want) = match sig.lower {
                Lowering::Unary(u) => (format!("{}(x)", sig.name), Op::Unary(u)),
                Lowering::Binary(b) => (format!("{}(x, x)", sig.name), Op::Binary(b)),
                Lowering::Node(_) => continue,
            };
            let text = format!("model m(x: f32[2, 3]) {{\n    return {call}\n}}\n");
            let src = Source::new("m.rms", text);
            let g = crate::dsl::load(&src)
                .and_then(|m| crate::dsl::lower(&m, "m", &[], None))
                .unwrap_or_else(|e| panic!("{call}: {e}"));
            let out = g.output("output").unwrap_or_else(|| panic!("{call}: no output"));
            assert_eq!(g.node(out).op, want, "{call}");
            assert_eq!(g.shape(out), &[2, 3], "{call}");
        }
    }
}
