//! [`Float`]: the element types the CPU interpreter runs in (f32 and f64), and the scalar math
//! the op table's rows (`super::elementwise`) are written with, including the exact and tanh
//! forms of GELU and their derivatives.
//!
//! Everything here is IEEE arithmetic in a fixed order (no fused multiply-add, no fast-math), so
//! results are reproducible bit for bit from run to run. exp, ln, tanh and pow come from
//! Rust's std (the platform's libm), so across operating systems they may differ in the last
//! bit; erf is computed here and does not.

use std::fmt::{Debug, Display};
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// A floating-point element type of the interpreter: `f32` (what the GPU computes in) or `f64`
/// (what gradient checks use).
pub trait Float:
    Copy
    + Send
    + Sync
    + Default
    + Debug
    + Display
    + PartialEq
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + 'static
{
    /// `"f32"` or `"f64"`.
    const NAME: &'static str;
    /// Nearest value of this type.
    fn from_f64(x: f64) -> Self;
    /// Exact widening (f32) or identity (f64).
    fn to_f64(self) -> f64;
    /// Natural exponential.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root (NaN below 0).
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// `self` raised to a real power (C `pow`).
    fn powf(self, e: Self) -> Self;
    /// The error function (W. J. Cody's rational approximations; measured relative error below
    /// 5e-16 in f64, correctly rounded to within an ulp in f32).
    fn erf(self) -> Self;
    /// Whether this is NaN.
    fn is_nan(self) -> bool;

    /// 0.
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    /// 1.
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    /// The larger of two values; NaN if either is NaN (an oracle should not hide NaNs).
    fn max_nan(self, other: Self) -> Self {
        if self.is_nan() || other.is_nan() {
            Self::from_f64(f64::NAN)
        } else if other > self {
            other
        } else {
            self
        }
    }
    /// The smaller of two values; NaN if either is NaN.
    fn min_nan(self, other: Self) -> Self {
        if self.is_nan() || other.is_nan() {
            Self::from_f64(f64::NAN)
        } else if other < self {
            other
        } else {
            self
        }
    }
}

macro_rules! impl_float {
    ($t:ty, $name:literal, $erf:expr) => {
        impl Float for $t {
            const NAME: &'static str = $name;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            fn erf(self) -> Self {
                let f: fn($t) -> $t = $erf;
                f(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

impl_float!(f32, "f32", |x| erf_f64(x as f64) as f32);
impl_float!(f64, "f64", erf_f64);

// ---- the unary functions with more than one step, shared by forward and gradient helpers ----

/// 1 / (1 + e^-x).
pub fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

/// Exact GELU: x·Φ(x) = 0.5·x·(1 + erf(x/√2)).
pub fn gelu<T: Float>(x: T) -> T {
    let half = T::from_f64(0.5);
    half * x * (T::one() + (x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf())
}

/// d/dx of exact GELU: Φ(x) + x·φ(x), φ(x) = e^(-x²/2)/√(2π).
pub fn gelu_grad<T: Float>(x: T) -> T {
    let half = T::from_f64(0.5);
    let cdf = half * (T::one() + (x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf());
    let inv_sqrt_2pi = T::from_f64(0.398_942_280_401_432_7);
    let pdf = inv_sqrt_2pi * (-half * x * x).exp();
    cdf + x * pdf
}

/// √(2/π), the constant of the tanh approximation.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const GELU_TANH_CUBIC: f64 = 0.044715;

/// GPT-2's GELU: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
pub fn gelu_tanh<T: Float>(x: T) -> T {
    let c = T::from_f64(SQRT_2_OVER_PI);
    let u = c * (x + T::from_f64(GELU_TANH_CUBIC) * x * x * x);
    T::from_f64(0.5) * x * (T::one() + u.tanh())
}

/// d/dx of [`gelu_tanh`]: 0.5·(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(u).
pub fn gelu_tanh_grad<T: Float>(x: T) -> T {
    let half = T::from_f64(0.5);
    let c = T::from_f64(SQRT_2_OVER_PI);
    let a = T::from_f64(GELU_TANH_CUBIC);
    let t = (c * (x + a * x * x * x)).tanh();
    let du = c * (T::one() + T::from_f64(3.0) * a * x * x);
    half * (T::one() + t) + half * x * (T::one() - t * t) * du
}

/// SiLU: x·σ(x).
pub fn silu<T: Float>(x: T) -> T {
    x * sigmoid(x)
}

/// d/dx of SiLU: σ(x)·(1 + x·(1 − σ(x))).
pub fn silu_grad<T: Float>(x: T) -> T {
    let s = sigmoid(x);
    s * (T::one() + x * (T::one() - s))
}

/// -1, 0 or 1 by the sign of x (NaN stays NaN; -0 gives 0).
pub fn sign<T: Float>(x: T) -> T {
    if x > T::zero() {
        T::one()
    } else if x < T::zero() {
        -T::one()
    } else if x == T::zero() {
        T::zero()
    } else {
        x
    }
}

/// erf(x) in f64: `libm`'s port of FreeBSD's msun `erf` (under 1 ulp), so the reference
/// interpreter's exact GELU does not depend on a hand-written approximation.
pub fn erf_f64(x: f64) -> f64 {
    libm::erf(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        // Reference values to 17 significant digits (from mpmath).
        let cases = [
            (0.0, 0.0),
            (1e-10, 1.1283791670955126e-10),
            (0.1, 0.11246291601828488),
            (0.3, 0.32862675945912745),
            (0.46875, 0.49261347321793797),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.5, 0.9999992569016276),
            (4.5, 0.9999999998033839),
            (5.0, 0.9999999999984626),
            (-1.0, -0.8427007929497149),
            (30.0, 1.0),
        ];
        for (x, want) in cases {
            let got = erf_f64(x);
            assert!(
                (got - want).abs() <= 2.3e-16 * want.abs().max(1e-300),
                "erf({x}) = {got}, want {want}"
            );
        }
        assert!(erf_f64(f64::NAN).is_nan());
    }

    #[test]
    fn gradient_helpers_are_derivatives() {
        let fd = |f: fn(f64) -> f64, x: f64| (f(x + 1e-6) - f(x - 1e-6)) / 2e-6;
        for x in [-3.0, -1.2, -0.3, 0.0, 0.4, 1.0, 2.5] {
            for (f, df) in [
                (gelu::<f64> as fn(f64) -> f64, gelu_grad::<f64> as fn(f64) -> f64),
                (gelu_tanh::<f64>, gelu_tanh_grad::<f64>),
                (silu::<f64>, silu_grad::<f64>),
            ] {
                let (a, b) = (fd(f, x), df(x));
                assert!((a - b).abs() < 1e-8, "x = {x}: fd {a} vs {b}");
            }
        }
    }
}
