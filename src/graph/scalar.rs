//! [`Scalar`]: the backend-neutral scalar the op table's rows (`super::elementwise`) are written
//! over, and the definitions of the functions with more than one step (sigmoid, GELU and their
//! derivatives, ...).
//!
//! A row's value is one generic Rust expression over `Scalar`. The CPU interpreter runs it on
//! `f32` and `f64` (`super::float`); codegen runs it on a symbolic scalar whose operations write
//! WGSL, so the kernels compute the formula the interpreter computes and no WGSL lives in the
//! graph. Everything a row may do is a method here, written without branches: a comparison is a
//! value (1 or 0, [`Scalar::greater`]), a choice is [`Scalar::select`]. How a backend spells a
//! primitive (a NaN-propagating `max`, an overflow-safe `tanh`) is the backend's business.

use std::ops::{Add, Div, Mul, Neg, Sub};

/// √(2/π), the constant of GELU's tanh approximation.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of GELU's tanh approximation.
const GELU_TANH_CUBIC: f64 = 0.044715;
/// 1/√(2π), the peak of the standard normal density.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// A scalar the elementwise rows compute with: a number on the CPU, an expression in codegen.
///
/// The required methods are the primitives each backend spells; the provided ones are defined
/// from them once, here. A backend may spell a provided function its own way only where that is
/// the same formula ([`Scalar::composite`] lets codegen call it as a WGSL function).
pub trait Scalar:
    Copy
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// The constant `x`, rounded to the type.
    fn from_f64(x: f64) -> Self;
    /// Natural exponential.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// ln(1 + x), without rounding 1 + x first (exact to a few ulps for small x).
    fn ln_1p(self) -> Self;
    /// Square root (NaN below 0).
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// `self` raised to a real power (C `pow`: NaN, zeros, infinities and negative bases).
    fn powf(self, e: Self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// The larger of two values (the first on ties); NaN if either is NaN (an oracle should not
    /// hide NaNs).
    fn max_nan(self, other: Self) -> Self;
    /// The smaller of two values (the first on ties); NaN if either is NaN.
    fn min_nan(self, other: Self) -> Self;
    /// 1 where `self > other`, else 0 (0 if either is NaN).
    fn greater(self, other: Self) -> Self;
    /// 1 where `self == other`, else 0 (0 if either is NaN).
    fn equal(self, other: Self) -> Self;
    /// 1 where `self` is NaN, else 0.
    fn isnan(self) -> Self;
    /// `then` where `self` is nonzero (NaN counts as nonzero), else `otherwise`.
    fn select(self, then: Self, otherwise: Self) -> Self;

    /// 0.
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    /// 1.
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    /// 1 / √x.
    fn rsqrt(self) -> Self {
        Self::one() / self.sqrt()
    }
    /// `definition` applied to `self`, `name` being what the function is called. Numbers just
    /// apply it; codegen writes the definition once as a WGSL function `name` and calls it.
    fn composite(self, name: &'static str, definition: fn(Self) -> Self) -> Self {
        let _ = name;
        definition(self)
    }

    // ---- the functions with more than one step, shared by forward ops and gradient helpers ----

    /// σ(x) = 1 / (1 + e⁻ˣ).
    fn sigmoid(self) -> Self {
        self.composite("sigmoid", |x| Self::one() / (Self::one() + (-x).exp()))
    }
    /// SiLU: x·σ(x).
    fn silu(self) -> Self {
        self.composite("silu", |x| x * x.sigmoid())
    }
    /// d/dx of SiLU: σ(x)·(1 + x·(1 − σ(x))).
    fn silu_grad(self) -> Self {
        self.composite("silu_grad", |x| {
            let s = x.sigmoid();
            s * (Self::one() + x * (Self::one() - s))
        })
    }
    /// Exact GELU: x·Φ(x) = 0.5·x·(1 + erf(x/√2)).
    fn gelu(self) -> Self {
        self.composite("gelu", |x| {
            let half = Self::from_f64(0.5);
            half * x * (Self::one() + (x * Self::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf())
        })
    }
    /// d/dx of exact GELU: Φ(x) + x·φ(x), φ(x) = e^(-x²/2)/√(2π).
    fn gelu_grad(self) -> Self {
        self.composite("gelu_grad", |x| {
            let half = Self::from_f64(0.5);
            let frac = Self::from_f64(std::f64::consts::FRAC_1_SQRT_2);
            let cdf = half * (Self::one() + (x * frac).erf());
            let pdf = Self::from_f64(INV_SQRT_2PI) * (-half * x * x).exp();
            cdf + x * pdf
        })
    }
    /// GPT-2's GELU: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
    fn gelu_tanh(self) -> Self {
        self.composite("gelu_tanh", |x| {
            let c = Self::from_f64(SQRT_2_OVER_PI);
            let u = c * (x + Self::from_f64(GELU_TANH_CUBIC) * x * x * x);
            Self::from_f64(0.5) * x * (Self::one() + u.tanh())
        })
    }
    /// d/dx of [`Scalar::gelu_tanh`]: 0.5·(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²),
    /// t = tanh(u).
    fn gelu_tanh_grad(self) -> Self {
        self.composite("gelu_tanh_grad", |x| {
            let half = Self::from_f64(0.5);
            let c = Self::from_f64(SQRT_2_OVER_PI);
            let a = Self::from_f64(GELU_TANH_CUBIC);
            let t = (c * (x + a * x * x * x)).tanh();
            let du = c * (Self::one() + Self::from_f64(3.0) * a * x * x);
            half * (Self::one() + t) + half * x * (Self::one() - t * t) * du
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivative_helpers_are_derivatives() {
        type F = fn(f64) -> f64;
        let fd = |f: F, x: f64| (f(x + 1e-6) - f(x - 1e-6)) / 2e-6;
        let pairs: [(F, F); 3] = [
            (|x| x.gelu(), |x| x.gelu_grad()),
            (|x| x.gelu_tanh(), |x| x.gelu_tanh_grad()),
            (|x| x.silu(), |x| x.silu_grad()),
        ];
        for x in [-3.0, -1.2, -0.3, 0.0, 0.4, 1.0, 2.5] {
            for (f, df) in pairs {
                let (a, b) = (fd(f, x), df(x));
                assert!((a - b).abs() < 1e-8, "x = {x}: fd {a} vs {b}");
            }
        }
    }
}
