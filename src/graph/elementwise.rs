//! The elementwise op table: one row per unary and binary op, holding everything every layer
//! knows about it.
//!
//! A row gives the op's variant; its name as the language spells it; `language` if the model
//! language exposes it, or `helper` for a gradient helper that only autodiff builds; its value,
//! one Rust expression generic over [`Scalar`] with no branches (comparisons and choices are
//! `Scalar` methods returning values); and its backward rule, one of
//!
//! - `local: |g, x, y| …`, the local derivative (the input gradient is `dy · local`);
//! - `grad: |g, x, y, dy| …` (unary) or `grad: |g, a, b, y, dy| …` (binary, the gradients of both
//!   operands at the output's shape), the input gradients themselves;
//! - `none`: gradients do not flow (the op is differentiable exactly when it has a rule).
//!
//! Rules build graph nodes with the builder (`x`, `a`, `b` the inputs, `y` the output, `dy` its
//! gradient; `?` is allowed). The value is the op's only definition: the CPU interpreter
//! evaluates it in f32 and f64, and codegen evaluates it on a symbolic scalar that writes the
//! WGSL expression (`codegen::trace`), so the table holds no WGSL and the two backends cannot
//! compute different formulas. The CPU interpreter, autodiff, codegen and the language read this
//! table, so adding an activation is one row here plus its test cases (the op-table walks in the
//! tests name any row without one).

use super::ir::{Graph, NodeId};
use super::scalar::Scalar;
use crate::error::Result;

/// The number of token trees given (the rows of a table).
macro_rules! count {
    () => { 0usize };
    ($head:tt $($tail:tt)*) => { 1usize + count!($($tail)*) };
}

/// The input gradient of one unary row's rule (`None` for `none`).
macro_rules! unary_rule {
    (($g:ident, $x:ident, $y:ident, $dy:ident) none) => {
        None
    };
    (($g:ident, $x:ident, $y:ident, $dy:ident)
        local: |$rg:ident, $rx:ident, $ry:ident| $rule:expr) => {{
        let ($rg, $rx, $ry) = ($g, $x, $y);
        let local = $rule;
        Some($rg.mul($dy, local)?)
    }};
    (($g:ident, $x:ident, $y:ident, $dy:ident)
        grad: |$rg:ident, $rx:ident, $ry:ident, $rdy:ident| $rule:expr) => {{
        let ($rg, $rx, $ry, $rdy) = ($g, $x, $y, $dy);
        Some($rule)
    }};
}

/// The operand gradients of one binary row's rule (`None` for `none`).
macro_rules! binary_rule {
    (($g:ident, $a:ident, $b:ident, $y:ident, $dy:ident) none) => {
        None
    };
    (($g:ident, $a:ident, $b:ident, $y:ident, $dy:ident)
        grad: |$rg:ident, $ra:ident, $rb:ident, $ry:ident, $rdy:ident| $rule:expr) => {{
        let ($rg, $ra, $rb, $ry, $rdy) = ($g, $a, $b, $y, $dy);
        Some($rule)
    }};
}

/// Whether a row has a backward rule.
macro_rules! has_rule {
    (none) => {
        false
    };
    ($($rule:tt)+) => {
        true
    };
}

/// Whether a row is exposed to the model language.
macro_rules! exposed {
    (language) => {
        true
    };
    (helper) => {
        false
    };
}

/// Declares `UnaryOp` from its rows.
macro_rules! unary_ops {
    ($(
        $(#[doc = $doc:literal])*
        $v:ident $name:literal $exposed:ident {
            value: |$x:ident| $value:expr,
            $($rule:tt)+
        }
    )*) => {
        /// Elementwise unary ops: the rows of the unary table.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp {
            $($(#[doc = $doc])* $v,)*
        }

        impl UnaryOp {
            /// Every unary op, in table order.
            pub const ALL: [UnaryOp; count!($($v)*)] = [$(UnaryOp::$v),*];

            /// The op's name, as the language spells it.
            pub fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$v => $name,)*
                }
            }

            /// Whether a model may call the op (gradient helpers are built by autodiff only).
            pub fn is_language_op(self) -> bool {
                match self {
                    $(UnaryOp::$v => exposed!($exposed),)*
                }
            }

            /// Whether gradients flow through the op.
            pub fn is_differentiable(self) -> bool {
                match self {
                    $(UnaryOp::$v => has_rule!($($rule)+),)*
                }
            }

            /// The op's value at `x`: a number on the CPU, a WGSL expression in codegen.
            pub fn eval<T: Scalar>(self, x: T) -> T {
                match self {
                    $(UnaryOp::$v => {
                        let $x = x;
                        $value
                    })*
                }
            }

            /// Append the nodes of the input gradient, given the input `x`, the output `y` and
            /// the output's gradient `dy`; `None` for a non-differentiable op.
            #[allow(unused_variables)]
            pub fn backward(
                self,
                g: &mut Graph,
                x: NodeId,
                y: NodeId,
                dy: NodeId,
            ) -> Result<Option<NodeId>> {
                Ok(match self {
                    $(UnaryOp::$v => unary_rule!((g, x, y, dy) $($rule)+),)*
                })
            }
        }
    };
}

/// Declares `BinaryOp` from its rows.
macro_rules! binary_ops {
    ($(
        $(#[doc = $doc:literal])*
        $v:ident $name:literal $exposed:ident {
            value: |$a:ident, $b:ident| $value:expr,
            $($rule:tt)+
        }
    )*) => {
        /// Elementwise binary ops, with NumPy broadcasting: the rows of the binary table.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp {
            $($(#[doc = $doc])* $v,)*
        }

        impl BinaryOp {
            /// Every binary op, in table order.
            pub const ALL: [BinaryOp; count!($($v)*)] = [$(BinaryOp::$v),*];

            /// The op's name, as the language spells it.
            pub fn name(self) -> &'static str {
                match self {
                    $(BinaryOp::$v => $name,)*
                }
            }

            /// Whether a model may call the op (gradient helpers are built by autodiff only).
            pub fn is_language_op(self) -> bool {
                match self {
                    $(BinaryOp::$v => exposed!($exposed),)*
                }
            }

            /// Whether gradients flow through the op.
            pub fn is_differentiable(self) -> bool {
                match self {
                    $(BinaryOp::$v => has_rule!($($rule)+),)*
                }
            }

            /// The op's value at `(a, b)`: a number on the CPU, a WGSL expression in codegen.
            pub fn eval<T: Scalar>(self, a: T, b: T) -> T {
                match self {
                    $(BinaryOp::$v => {
                        let ($a, $b) = (a, b);
                        $value
                    })*
                }
            }

            /// Append the nodes of both operands' gradients at the output's shape (before any
            /// reduction to an operand's own shape), given the operands, the output `y` and the
            /// output's gradient `dy`; `None` for a non-differentiable op.
            #[allow(unused_variables)]
            pub fn backward(
                self,
                g: &mut Graph,
                a: NodeId,
                b: NodeId,
                y: NodeId,
                dy: NodeId,
            ) -> Result<Option<(NodeId, NodeId)>> {
                Ok(match self {
                    $(BinaryOp::$v => binary_rule!((g, a, b, y, dy) $($rule)+),)*
                })
            }
        }
    };
}

impl UnaryOp {
    /// The unary op called `name`, helpers included.
    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|u| u.name() == name)
    }
}

impl BinaryOp {
    /// The binary op called `name`, helpers included.
    pub fn from_name(name: &str) -> Option<BinaryOp> {
        BinaryOp::ALL.into_iter().find(|b| b.name() == name)
    }
}

unary_ops! {
    /// -x.
    Neg "neg" language {
        value: |x| -x,
        grad: |g, x, y, dy| g.neg(dy)?
    }
    /// eˣ.
    Exp "exp" language {
        value: |x| x.exp(),
        local: |g, x, y| y
    }
    /// Natural logarithm.
    Log "log" language {
        value: |x| x.ln(),
        grad: |g, x, y, dy| g.div(dy, x)?
    }
    /// Square root.
    Sqrt "sqrt" language {
        value: |x| x.sqrt(),
        grad: |g, x, y, dy| { let two_y = g.scale(y, 2.0)?; g.div(dy, two_y)? }
    }
    /// 1 / √x.
    Rsqrt "rsqrt" language {
        value: |x| x.rsqrt(),
        // −y³/2 · dy, taken as ((dy·y)·y)·y: y³ alone underflows for x above ~1e26 (batch
        // norm's rsqrt of a variance of 1e28: the variance term of its gradient vanished) and
        // overflows below ~1e-26 (a tiny eps over a constant channel: inf · 0, NaN), where
        // the product with dy does neither.
        grad: |g, x, y, dy| {
            let a = g.mul(dy, y)?;
            let b = g.mul(a, y)?;
            let c = g.mul(b, y)?;
            g.scale(c, -0.5)?
        }
    }
    /// |x|.
    Abs "abs" language {
        value: |x| x.abs(),
        local: |g, x, y| g.unary(UnaryOp::Sign, x)?
    }
    /// x².
    Square "square" language {
        value: |x| x * x,
        local: |g, x, y| g.scale(x, 2.0)?
    }
    /// Hyperbolic tangent.
    Tanh "tanh" language {
        value: |x| x.tanh(),
        local: |g, x, y| { let y2 = g.square(y)?; let one = g.constant(1.0); g.sub(one, y2)? }
    }
    /// σ(x) = 1 / (1 + e⁻ˣ).
    Sigmoid "sigmoid" language {
        value: |x| x.sigmoid(),
        local: |g, x, y| { let one = g.constant(1.0); let omy = g.sub(one, y)?; g.mul(y, omy)? }
    }
    /// max(x, 0); NaN passes through and -0 stays -0 (`max_nan` keeps the first on ties). The
    /// gradient reads the output (y > 0 exactly where x > 0), so the pre-activation has one use
    /// and can stay in registers of its matmul.
    Relu "relu" language {
        value: |x| x.max_nan(T::zero()),
        local: |g, x, y| { let zero = g.constant(0.0); g.binary(BinaryOp::Greater, y, zero)? }
    }
    /// GELU, exact form: x·Φ(x).
    Gelu "gelu" language {
        value: |x| x.gelu(),
        local: |g, x, y| g.unary(UnaryOp::GeluGrad, x)?
    }
    /// GELU, tanh approximation (GPT-2's).
    GeluTanh "gelu_tanh" language {
        value: |x| x.gelu_tanh(),
        local: |g, x, y| g.unary(UnaryOp::GeluTanhGrad, x)?
    }
    /// x·σ(x).
    Silu "silu" language {
        value: |x| x.silu(),
        local: |g, x, y| g.unary(UnaryOp::SiluGrad, x)?
    }
    /// log(1 + eˣ) (PyTorch's), as max(x, 0) + log(1 + e^-|x|), which cannot overflow.
    Softplus "softplus" language {
        value: |x| x.max_nan(T::zero()) + (-x.abs()).exp().ln_1p(),
        local: |g, x, y| g.unary(UnaryOp::Sigmoid, x)?
    }
    /// log σ(x) = -softplus(-x), as min(x, 0) - log(1 + e^-|x|), which cannot overflow.
    LogSigmoid "log_sigmoid" language {
        value: |x| x.min_nan(T::zero()) - (-x.abs()).exp().ln_1p(),
        local: |g, x, y| { let nx = g.neg(x)?; g.unary(UnaryOp::Sigmoid, nx)? }
    }
    /// sign(x) ∈ {-1, 0, 1} (NaN stays NaN, -0 gives 0); gradient helper for `abs`.
    Sign "sign" helper {
        value: |x| x.isnan().select(x, x.greater(T::zero()) - T::zero().greater(x)),
        none
    }
    /// d gelu / dx; gradient helper.
    GeluGrad "gelu_grad" helper {
        value: |x| x.gelu_grad(),
        none
    }
    /// d gelu_tanh / dx; gradient helper.
    GeluTanhGrad "gelu_tanh_grad" helper {
        value: |x| x.gelu_tanh_grad(),
        none
    }
    /// d silu / dx; gradient helper.
    SiluGrad "silu_grad" helper {
        value: |x| x.silu_grad(),
        none
    }
}

binary_ops! {
    /// a + b.
    Add "add" language {
        value: |a, b| a + b,
        grad: |g, a, b, y, dy| (dy, dy)
    }
    /// a - b.
    Sub "sub" language {
        value: |a, b| a - b,
        grad: |g, a, b, y, dy| (dy, g.neg(dy)?)
    }
    /// a · b.
    Mul "mul" language {
        value: |a, b| a * b,
        grad: |g, a, b, y, dy| (g.mul(dy, b)?, g.mul(dy, a)?)
    }
    /// a / b.
    Div "div" language {
        value: |a, b| a / b,
        grad: |g, a, b, y, dy| {
            let da = g.div(dy, b)?;
            let yb = g.div(y, b)?;
            let t = g.mul(dy, yb)?;
            (da, g.neg(t)?)
        }
    }
    /// C `pow` (`powf`) semantics for NaN, zeros, infinities and negative bases.
    Pow "pow" language {
        value: |a, b| a.powf(b),
        // d/da a^b = b·a^(b−1); d/db a^b = a^b·ln a
        grad: |g, a, b, y, dy| {
            let one = g.constant(1.0);
            let bm1 = g.sub(b, one)?;
            let p = g.pow(a, bm1)?;
            let local_a = g.mul(b, p)?;
            let la = g.log(a)?;
            let local_b = g.mul(y, la)?;
            (g.mul(dy, local_a)?, g.mul(dy, local_b)?)
        }
    }
    /// The larger; NaN if either is NaN.
    Maximum "maximum" language {
        value: |a, b| a.max_nan(b),
        grad: |g, a, b, y, dy| winner_takes_gradient(g, a, b, (a, b), dy)?
    }
    /// The smaller; NaN if either is NaN.
    Minimum "minimum" language {
        value: |a, b| a.min_nan(b),
        grad: |g, a, b, y, dy| winner_takes_gradient(g, a, b, (b, a), dy)?
    }
    /// 1.0 where a > b else 0.0; gradient helper (not differentiable).
    Greater "greater" helper {
        value: |a, b| a.greater(b),
        none
    }
    /// 1.0 where a == b else 0.0; gradient helper (not differentiable).
    Equal "equal" helper {
        value: |a, b| a.equal(b),
        none
    }
}

/// The gradients of `maximum` / `minimum`: the operand that wins (`hi > lo`, `a` being `hi` for
/// maximum) takes `dy`, ties split it evenly.
fn winner_takes_gradient(
    g: &mut Graph,
    a: NodeId,
    b: NodeId,
    (hi, lo): (NodeId, NodeId),
    dy: NodeId,
) -> Result<(NodeId, NodeId)> {
    let a_wins = g.binary(BinaryOp::Greater, hi, lo)?;
    let ties = g.binary(BinaryOp::Equal, a, b)?;
    let half_ties = g.scale(ties, 0.5)?;
    let ma = g.add(a_wins, half_ties)?;
    let one = g.constant(1.0);
    let mb = g.sub(one, ma)?;
    Ok((g.mul(dy, ma)?, g.mul(dy, mb)?))
}
