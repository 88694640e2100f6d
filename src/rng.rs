//! A small seeded random number generator (xoshiro256** seeded by SplitMix64). rumus uses it
//! wherever randomness must be reproducible: parameter initializers, shuffling, dropout masks on
//! the CPU. Same seed, same numbers, on every platform.

/// Seeded, reproducible generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// One step of SplitMix64: a good 64-bit mix of `x`, also used to hash (seed, index) pairs.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 32-bit integer hash (Chris Wellons' lowbias32); cheap in WGSL, which has no 64-bit integers.
pub fn hash32(v: u32) -> u32 {
    let mut x = v;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The 32-bit stream key of a dropout op's 64-bit seed.
pub fn dropout_seed(seed: u64) -> u32 {
    hash32(seed as u32 ^ hash32((seed >> 32) as u32))
}

/// Whether dropout with probability `p` keeps element `i` at training step `step`. Every backend
/// computes exactly this (the WGSL mirror is in `codegen::expr`): the top 24 bits of
/// `hash32(i ^ hash32(step ^ key))` as a uniform in [0, 1), kept when >= p.
pub fn dropout_keep(seed: u64, step: u64, i: usize, p: f32) -> bool {
    let h = hash32(i as u32 ^ hash32(step as u32 ^ dropout_seed(seed)));
    (h >> 8) as f32 * (1.0 / 16_777_216.0) >= p
}

/// The largest magnitude [`Rng::normal`] can return: its radius `sqrt(-2 ln u)` at the smallest
/// `u`, 2^-53, is `sqrt(106 ln 2)`, about 8.5716 (and the cosine is at most 1). An initializer
/// `normal(mean, std)` stays within `|mean| + NORMAL_BOUND · std`.
pub const NORMAL_BOUND: f64 = 8.5717;

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut s = [0u64; 4];
        for v in &mut s {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            *v = splitmix64(x);
        }
        Rng { s }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, 1)` as f32, with 24 random bits: every value a multiple of 2^-24, so
    /// none rounds up to 1 (`uniform() as f32` does, for draws within 2^-25 of 1).
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform integer in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift; the tiny bias is irrelevant for shuffling data.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal by Box-Muller; never larger in magnitude than [`NORMAL_BOUND`].
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn uniform_f32_stays_below_one() {
        // A generator whose next draw is all ones: the largest value either form can give.
        let mut top = Rng { s: [0; 4] };
        top.s[1] = 0x4fc7_1c71_c71c_71c7; // next_u64() == u64::MAX for this state
        assert_eq!(Rng { ..top.clone() }.next_u64(), u64::MAX);
        assert_eq!(Rng { ..top.clone() }.uniform() as f32, 1.0, "the f64 draw rounds up");
        assert_eq!(top.uniform_f32(), 1.0 - f32::EPSILON / 2.0);
    }

    #[test]
    fn normal_bound_holds_at_the_smallest_uniform() {
        // `1 - uniform()` is at least 2^-53, where the radius is largest.
        let radius = (-2.0 * (1.0f64 / (1u64 << 53) as f64).ln()).sqrt();
        assert!(radius <= NORMAL_BOUND && NORMAL_BOUND - radius < 1e-3, "{radius}");
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(1);
        let xs: Vec<f64> = (0..100_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
    }
}
