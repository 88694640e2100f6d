//! [`Float`]: the element types the CPU interpreter runs in (f32 and f64), and their
//! [`Scalar`] primitives, which the op table's rows (`super::elementwise`) are evaluated with.
//!
//! Everything here is IEEE arithmetic in a fixed order (no fused multiply-add, no fast-math), so
//! results are reproducible bit for bit from run to run. exp, ln, tanh and pow come from
//! Rust's std (the platform's libm), so across operating systems they may differ in the last
//! bit; erf is `libm`'s and does not.

use super::scalar::Scalar;
use std::fmt::{Debug, Display};
use std::ops::AddAssign;

/// A floating-point element type of the interpreter: `f32` (what the GPU computes in) or `f64`
/// (what gradient checks use).
pub trait Float:
    Scalar + Send + Sync + Default + Debug + Display + PartialEq + PartialOrd + AddAssign + 'static
{
    /// `"f32"` or `"f64"`.
    const NAME: &'static str;
    /// Exact widening (f32) or identity (f64).
    fn to_f64(self) -> f64;
}

/// 1 or 0 by `b`.
fn mask<T: Scalar>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

macro_rules! impl_float {
    ($t:ty, $name:literal, $erf:expr) => {
        impl Float for $t {
            const NAME: &'static str = $name;
            fn to_f64(self) -> f64 {
                self as f64
            }
        }

        impl Scalar for $t {
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
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
            fn max_nan(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    <$t>::NAN
                } else if other > self {
                    other
                } else {
                    self
                }
            }
            fn min_nan(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    <$t>::NAN
                } else if other < self {
                    other
                } else {
                    self
                }
            }
            fn greater(self, other: Self) -> Self {
                mask(self > other)
            }
            fn equal(self, other: Self) -> Self {
                mask(self == other)
            }
            fn isnan(self) -> Self {
                mask(self.is_nan())
            }
            fn select(self, then: Self, otherwise: Self) -> Self {
                if self != 0.0 {
                    then
                } else {
                    otherwise
                }
            }
        }
    };
}

impl_float!(f32, "f32", |x| erf_f64(x as f64) as f32);
impl_float!(f64, "f64", erf_f64);

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
}
