//! Initial values of parameters and state. Every backend initializes through [`init_values`], so
//! the CPU and GPU backends start from identical numbers. A value's random stream is seeded from
//! the graph seed and the value's name (not its position), so adding a layer does not change the
//! initial values of the others.

use super::build::fans;
use super::ir::Init;
use crate::rng::{splitmix64, Rng};

/// Seed of the random stream for the value called `name` under graph seed `seed` (FNV-1a of the
/// name, mixed with the seed).
pub fn value_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    splitmix64(h ^ splitmix64(seed))
}

/// The initial contents of a value of `shape` (the caller has checked the element count).
pub fn init_values(init: &Init, shape: &[usize], seed: u64, name: &str) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(value_seed(seed, name));
    let (fan_in, fan_out) = fans(shape);
    match *init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Fill(v) => vec![v; n],
        Init::Normal { mean, std } => {
            (0..n).map(|_| (mean as f64 + std as f64 * rng.normal()) as f32).collect()
        }
        Init::Uniform { low, high } => (0..n)
            .map(|_| (low as f64 + (high as f64 - low as f64) * rng.uniform()) as f32)
            .collect(),
        Init::Xavier => {
            let a = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
            (0..n).map(|_| ((2.0 * rng.uniform() - 1.0) * a) as f32).collect()
        }
        Init::Kaiming => {
            let std = (2.0 / fan_in.max(1) as f64).sqrt();
            (0..n).map(|_| (std * rng.normal()) as f32).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_by_name_and_reproducible() {
        let a = init_values(&Init::Xavier, &[4, 3], 1, "fc.weight");
        assert_eq!(a, init_values(&Init::Xavier, &[4, 3], 1, "fc.weight"));
        assert_ne!(a, init_values(&Init::Xavier, &[4, 3], 1, "fc2.weight"));
        assert_ne!(a, init_values(&Init::Xavier, &[4, 3], 2, "fc.weight"));
        let bound = (6.0f32 / 7.0).sqrt();
        assert!(a.iter().all(|v| v.abs() <= bound));
    }
}
