//! The op table as the language sees it: every op's name and parameters, in order, with their
//! kinds and defaults. `resolve` checks arity and named arguments against it; `lower` maps each
//! op to the graph builder.

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

/// The signature of an op.
#[derive(Clone, Copy, Debug)]
pub struct OpSig {
    pub name: &'static str,
    pub params: &'static [OpParam],
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

use ArgKind::*;

const UNARY: &[OpParam] = &[p("x", Tensor)];
const BINARY: &[OpParam] = &[p("a", Tensor), p("b", Tensor)];
const REDUCE: &[OpParam] =
    &[p("x", Tensor), p("axes", Ints), d("keepdim", Bool, Default::Bool(false))];
const SOFTMAX: &[OpParam] = &[p("x", Tensor), d("axis", Int, Default::Int(-1))];

/// Every op callable from the language.
pub const OPS: &[OpSig] = &[
    OpSig { name: "add", params: BINARY },
    OpSig { name: "sub", params: BINARY },
    OpSig { name: "mul", params: BINARY },
    OpSig { name: "div", params: BINARY },
    OpSig { name: "pow", params: BINARY },
    OpSig { name: "maximum", params: BINARY },
    OpSig { name: "minimum", params: BINARY },
    OpSig { name: "where", params: &[p("cond", Tensor), p("a", Tensor), p("b", Tensor)] },
    OpSig { name: "neg", params: UNARY },
    OpSig { name: "exp", params: UNARY },
    OpSig { name: "log", params: UNARY },
    OpSig { name: "sqrt", params: UNARY },
    OpSig { name: "rsqrt", params: UNARY },
    OpSig { name: "abs", params: UNARY },
    OpSig { name: "square", params: UNARY },
    OpSig { name: "tanh", params: UNARY },
    OpSig { name: "sigmoid", params: UNARY },
    OpSig { name: "relu", params: UNARY },
    OpSig { name: "silu", params: UNARY },
    OpSig { name: "gelu", params: UNARY },
    OpSig { name: "gelu_tanh", params: UNARY },
    OpSig { name: "sum", params: REDUCE },
    OpSig { name: "mean", params: REDUCE },
    OpSig { name: "max", params: REDUCE },
    OpSig { name: "reshape", params: &[p("x", Tensor), p("shape", Ints)] },
    OpSig { name: "permute", params: &[p("x", Tensor), p("perm", Ints)] },
    OpSig { name: "transpose", params: &[p("x", Tensor), p("a", Int), p("b", Int)] },
    OpSig { name: "broadcast_to", params: &[p("x", Tensor), p("shape", Ints)] },
    OpSig {
        name: "slice",
        params: &[p("x", Tensor), p("axis", Int), p("start", Int), p("end", Int)],
    },
    OpSig { name: "concat", params: &[p("xs", Tensors), p("axis", Int)] },
    OpSig { name: "matmul", params: BINARY },
    OpSig { name: "softmax", params: SOFTMAX },
    OpSig { name: "log_softmax", params: SOFTMAX },
    OpSig { name: "causal_mask", params: UNARY },
    OpSig {
        name: "layer_norm",
        params: &[
            p("x", Tensor),
            p("weight", Tensor),
            p("bias", Tensor),
            d("eps", Float, Default::Float(1e-5)),
        ],
    },
    OpSig { name: "embedding", params: &[p("weight", Tensor), p("idx", Tensor)] },
    OpSig { name: "cross_entropy", params: &[p("logits", Tensor), p("targets", Tensor)] },
    OpSig { name: "mse", params: BINARY },
    OpSig { name: "dropout", params: &[p("x", Tensor), p("p", Float), p("seed", Int)] },
];

/// The op of this name.
pub fn op(name: &str) -> Option<&'static OpSig> {
    OPS.iter().find(|o| o.name == name)
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
