//! The elementwise op table: one row per unary and binary op, holding everything every layer
//! knows about it.
//!
//! A row gives the op's variant; its name as the language spells it; `language` if the model
//! language exposes it, or `helper` for a gradient helper that only autodiff builds; its value in
//! Rust, generic over [`Float`] (the CPU interpreter runs it in f32 and f64); its WGSL expression,
//! a format string over the operands' expressions `{x}` (unary) or `{a}` and `{b}` (binary),
//! which may call the math helpers of `codegen::expr::MATH_WGSL`; and its backward rule, one of
//!
//! - `local: |g, x, y| …`, the local derivative (the input gradient is `dy · local`);
//! - `grad: |g, x, y, dy| …` (unary) or `grad: |g, a, b, y, dy| …` (binary, the gradients of both
//!   operands at the output's shape), the input gradients themselves;
//! - `none`: gradients do not flow (the op is differentiable exactly when it has a rule).
//!
//! Rules build graph nodes with the builder (`x`, `a`, `b` the inputs, `y` the output, `dy` its
//! gradient; `?` is allowed). The CPU interpreter, autodiff, codegen and the language read this
//! table, so adding an activation is one row here plus its test cases (the op-table walks in the
//! tests name any row without one). The WGSL expressions here are the only WGSL outside
//! `codegen/` and `shaders/`: an op's definition stays in one row.

use super::float::Float;
use super::float::{gelu, gelu_grad, gelu_tanh, gelu_tanh_grad, sigmoid, sign, silu, silu_grad};
use super::ir::{Graph, NodeId};
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
            cpu: |$x:ident| $cpu:expr,
            wgsl: $wgsl:literal,
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

            /// The op's value at `x`.
            pub fn eval<T: Float>(self, x: T) -> T {
                match self {
                    $(UnaryOp::$v => {
                        let $x = x;
                        $cpu
                    })*
                }
            }

            /// The WGSL expression of the op applied to the WGSL expression `x`.
            pub fn wgsl(self, x: &str) -> String {
                match self {
                    $(UnaryOp::$v => format!($wgsl, x = x),)*
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
            cpu: |$a:ident, $b:ident| $cpu:expr,
            wgsl: $wgsl:literal,
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

            /// The op's value at `(a, b)`.
            pub fn eval<T: Float>(self, a: T, b: T) -> T {
                match self {
                    $(BinaryOp::$v => {
                        let ($a, $b) = (a, b);
                        $cpu
                    })*
                }
            }

            /// The WGSL expression of the op applied to the WGSL expressions `a` and `b`.
            pub fn wgsl(self, a: &str, b: &str) -> String {
                match self {
                    $(BinaryOp::$v => format!($wgsl, a = a, b = b),)*
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
        cpu: |x| -x,
        wgsl: "(-{x})",
        grad: |g, x, y, dy| g.neg(dy)?
    }
    /// eˣ.
    Exp "exp" language {
        cpu: |x| x.exp(),
        wgsl: "exp({x})",
        local: |g, x, y| y
    }
    /// Natural logarithm.
    Log "log" language {
        cpu: |x| x.ln(),
        wgsl: "log({x})",
        grad: |g, x, y, dy| g.div(dy, x)?
    }
    /// Square root.
    Sqrt "sqrt" language {
        cpu: |x| x.sqrt(),
        wgsl: "sqrt({x})",
        grad: |g, x, y, dy| { let two_y = g.scale(y, 2.0)?; g.div(dy, two_y)? }
    }
    /// 1 / √x.
    Rsqrt "rsqrt" language {
        cpu: |x| T::one() / x.sqrt(),
        wgsl: "inverseSqrt({x})",
        local: |g, x, y| { let y2 = g.square(y)?; let y3 = g.mul(y2, y)?; g.scale(y3, -0.5)? }
    }
    /// |x|.
    Abs "abs" language {
        cpu: |x| x.abs(),
        wgsl: "abs({x})",
        local: |g, x, y| g.unary(UnaryOp::Sign, x)?
    }
    /// x².
    Square "square" language {
        cpu: |x| x * x,
        wgsl: "({x} * {x})",
        local: |g, x, y| g.scale(x, 2.0)?
    }
    /// Hyperbolic tangent.
    Tanh "tanh" language {
        cpu: |x| x.tanh(),
        wgsl: "tanh_({x})",
        local: |g, x, y| { let y2 = g.square(y)?; let one = g.constant(1.0); g.sub(one, y2)? }
    }
    /// σ(x) = 1 / (1 + e⁻ˣ).
    Sigmoid "sigmoid" language {
        cpu: |x| sigmoid(x),
        wgsl: "sigmoid({x})",
        local: |g, x, y| { let one = g.constant(1.0); let omy = g.sub(one, y)?; g.mul(y, omy)? }
    }
    /// max(x, 0); NaN passes through (NaN < 0 is false; an OpenGL compiler would turn the bare
    /// WGSL comparison into max(x, 0)). The gradient reads the output (y > 0 exactly where
    /// x > 0), so the pre-activation has one use and can stay in registers of its matmul.
    Relu "relu" language {
        cpu: |x| if x < T::zero() { T::zero() } else { x },
        wgsl: "select({x}, 0.0, {x} < 0.0 && !is_nan_({x}))",
        local: |g, x, y| { let zero = g.constant(0.0); g.binary(BinaryOp::Greater, y, zero)? }
    }
    /// GELU, exact form: x·Φ(x).
    Gelu "gelu" language {
        cpu: |x| gelu(x),
        wgsl: "gelu({x})",
        local: |g, x, y| g.unary(UnaryOp::GeluGrad, x)?
    }
    /// GELU, tanh approximation (GPT-2's).
    GeluTanh "gelu_tanh" language {
        cpu: |x| gelu_tanh(x),
        wgsl: "gelu_tanh({x})",
        local: |g, x, y| g.unary(UnaryOp::GeluTanhGrad, x)?
    }
    /// x·σ(x).
    Silu "silu" language {
        cpu: |x| silu(x),
        wgsl: "({x} * sigmoid({x}))",
        local: |g, x, y| g.unary(UnaryOp::SiluGrad, x)?
    }
    /// log(1 + eˣ) (PyTorch's), as max(x, 0) + log(1 + e^-|x|), which cannot overflow.
    Softplus "softplus" language {
        cpu: |x| x.max_nan(T::zero()) + (T::one() + (-x.abs()).exp()).ln(),
        wgsl: "(max_({x}, 0.0) + log(1.0 + exp(-abs({x}))))",
        local: |g, x, y| g.unary(UnaryOp::Sigmoid, x)?
    }
    /// sign(x) ∈ {-1, 0, 1}; gradient helper for `abs`.
    Sign "sign" helper {
        cpu: |x| sign(x),
        wgsl: "sign_({x})",
        none
    }
    /// d gelu / dx; gradient helper.
    GeluGrad "gelu_grad" helper {
        cpu: |x| gelu_grad(x),
        wgsl: "gelu_grad({x})",
        none
    }
    /// d gelu_tanh / dx; gradient helper.
    GeluTanhGrad "gelu_tanh_grad" helper {
        cpu: |x| gelu_tanh_grad(x),
        wgsl: "gelu_tanh_grad({x})",
        none
    }
    /// d silu / dx; gradient helper.
    SiluGrad "silu_grad" helper {
        cpu: |x| silu_grad(x),
        wgsl: "silu_grad({x})",
        none
    }
}

binary_ops! {
    /// a + b.
    Add "add" language {
        cpu: |a, b| a + b,
        wgsl: "({a} + {b})",
        grad: |g, a, b, y, dy| (dy, dy)
    }
    /// a - b.
    Sub "sub" language {
        cpu: |a, b| a - b,
        wgsl: "({a} - {b})",
        grad: |g, a, b, y, dy| (dy, g.neg(dy)?)
    }
    /// a · b.
    Mul "mul" language {
        cpu: |a, b| a * b,
        wgsl: "({a} * {b})",
        grad: |g, a, b, y, dy| (g.mul(dy, b)?, g.mul(dy, a)?)
    }
    /// a / b.
    Div "div" language {
        cpu: |a, b| a / b,
        wgsl: "({a} / {b})",
        grad: |g, a, b, y, dy| {
            let da = g.div(dy, b)?;
            let yb = g.div(y, b)?;
            let t = g.mul(dy, yb)?;
            (da, g.neg(t)?)
        }
    }
    /// C `pow` (`powf`) semantics for NaN, zeros, infinities and negative bases.
    Pow "pow" language {
        cpu: |a, b| a.powf(b),
        wgsl: "pow_({a}, {b})",
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
        cpu: |a, b| a.max_nan(b),
        wgsl: "max_({a}, {b})",
        grad: |g, a, b, y, dy| winner_takes_gradient(g, a, b, (a, b), dy)?
    }
    /// The smaller; NaN if either is NaN.
    Minimum "minimum" language {
        cpu: |a, b| a.min_nan(b),
        wgsl: "min_({a}, {b})",
        grad: |g, a, b, y, dy| winner_takes_gradient(g, a, b, (b, a), dy)?
    }
    /// 1.0 where a > b else 0.0; gradient helper (not differentiable).
    Greater "greater" helper {
        cpu: |a, b| if a > b { T::one() } else { T::zero() },
        wgsl: "select(0.0, 1.0, {a} > {b})",
        none
    }
    /// 1.0 where a == b else 0.0; gradient helper (not differentiable).
    Equal "equal" helper {
        cpu: |a, b| if a == b { T::one() } else { T::zero() },
        wgsl: "select(0.0, 1.0, {a} == {b})",
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
