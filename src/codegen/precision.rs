//! [`MatmulPrecision`]: how accurately the matrix products of a plan are computed, with
//! PyTorch's names (`torch.set_float32_matmul_precision`).
//!
//! `highest` is IEEE fp32 (the SIMT kernels). `high` and `medium` run on 16x16x16 f16
//! cooperative matrices (tensor cores) with f32 accumulation: `high` splits each operand into
//! f16 hi + lo parts and sums three products (fp32-class accuracy), `medium` rounds each operand
//! to f16 once. Both scale each operand by a power of two from its max-abs first, so f16's
//! range does not clip activations of 1e5 or flush gradients of 1e-8. Adapters without
//! cooperative matrices compute every mode as `highest`.

use crate::err;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// How accurately matrix products are computed (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MatmulPrecision {
    /// IEEE fp32 products and sums.
    #[default]
    Highest,
    /// Each operand split into f16 hi + lo; hi·hi + hi·lo + lo·hi on cooperative matrices, f32
    /// accumulation.
    High,
    /// Operands rounded to f16, one product on cooperative matrices, f32 accumulation.
    Medium,
}

impl MatmulPrecision {
    /// The names `FromStr` accepts, most accurate first.
    pub const NAMES: [&'static str; 3] = ["highest", "high", "medium"];

    /// Whether the mode runs on cooperative matrices.
    pub fn is_cooperative(self) -> bool {
        self != MatmulPrecision::Highest
    }

    /// The mode an adapter runs when `requested` (`None`: the default) is asked for, and
    /// whether it had to fall back: the default is `high` where the adapter has cooperative
    /// matrices, `highest` elsewhere; `high` or `medium` without them become `highest`.
    pub fn resolve(requested: Option<MatmulPrecision>, cooperative: bool) -> (Self, bool) {
        match requested {
            None if cooperative => (MatmulPrecision::High, false),
            None => (MatmulPrecision::Highest, false),
            Some(p) if p.is_cooperative() && !cooperative => (MatmulPrecision::Highest, true),
            Some(p) => (p, false),
        }
    }
}

impl FromStr for MatmulPrecision {
    type Err = Error;

    fn from_str(s: &str) -> Result<MatmulPrecision> {
        match s.trim().to_ascii_lowercase().as_str() {
            "highest" => Ok(MatmulPrecision::Highest),
            "high" => Ok(MatmulPrecision::High),
            "medium" => Ok(MatmulPrecision::Medium),
            _ => Err(err!(
                InvalidArgument,
                "unknown matmul precision `{s}` (valid choices: {})",
                MatmulPrecision::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatmulPrecision::Highest => "highest",
            MatmulPrecision::High => "high",
            MatmulPrecision::Medium => "medium",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MatmulPrecision::*;

    #[test]
    fn names_round_trip_and_errors_list_the_choices() {
        for p in [Highest, High, Medium] {
            assert_eq!(p.to_string().parse::<MatmulPrecision>().unwrap(), p);
        }
        assert_eq!(" HIGH ".parse::<MatmulPrecision>().unwrap(), High);
        let e = "fast".parse::<MatmulPrecision>().unwrap_err();
        assert_eq!(
            e.message,
            "unknown matmul precision `fast` (valid choices: highest, high, medium)"
        );
    }

    #[test]
    fn resolve_defaults_to_high_with_cooperative_matrices_and_falls_back_without() {
        let cases = [
            (None, true, (High, false)),
            (None, false, (Highest, false)),
            (Some(Medium), true, (Medium, false)),
            (Some(Medium), false, (Highest, true)),
            (Some(High), false, (Highest, true)),
            (Some(Highest), true, (Highest, false)),
            (Some(Highest), false, (Highest, false)),
        ];
        for (requested, coop, expected) in cases {
            assert_eq!(MatmulPrecision::resolve(requested, coop), expected, "{requested:?} {coop}");
        }
    }
}
