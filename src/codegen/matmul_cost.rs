//! The cost model behind each product's kernel choice ([`super::matmul::MatmulTile::choose_split`]):
//! estimated microseconds of a product on a tile, split into slices of K or not, with the
//! cooperative kernels' pre-passes and the split-K sum, on an H200-class GPU (132
//! multiprocessors).
//!
//! A cooperative kernel's blocks run in waves of one a multiprocessor; a wave costs `c0 + c1 ·
//! K` (K of one slice; below K = 256 the fixed part shrinks with K), and a grid a little over a wave costs two (the 144 128x128 blocks of a
//! 3072x768 product take twice the time of 108). The SIMT kernel's tiles cost the longer of a
//! block's walk of K (later waves partly overlapping) and their flops at what a GPU full of
//! their blocks sustains (`simt_rate`); the template's fp32 tiles are throughput-bound once
//! their grid has enough blocks and slower in proportion below that. The constants are fitted to `rumus bench --profile` of
//! gpt-small and gpt-medium on the H200 (2026-12-01, BENCHMARKS.md), per dispatch: e.g.
//! `high` 128x128 products of K = 768 take 60 µs a wave and of K = 4096 240 µs; the 64x128
//! tile does half the work a block at 0.8x (`high`) and 0.65x (`medium`) of the time. The
//! profile's own overhead (about 13 µs a dispatch) is taken out.
//!
//! The register tiles' threads each walk all of K, so a product with few of them (a skinny one)
//! costs at least 0.2 µs a step of K; the dot kernel for skinny products is priced by its
//! workgroups' rate and its threads' steps, fitted to the `mlp` model's products forced onto it.
//!
//! Bandwidth-bound work (the conversion pre-pass of the cooperative kernels, the
//! split-K partials and their sum) costs its bytes at `BYTES_PER_US` plus `DISPATCH_US` a
//! dispatch.
//!
//! `DISPATCH_US` is what a dispatch costs the GPU inside a step: profiled with 5 and with 50
//! back-to-back copies of each dispatch of the `mlp` step on the H200 (2026-12-01,
//! BENCHMARKS.md), the smallest kernels (a 128x1024 split-K sum, reduce stages) took 3.5 to
//! 5 µs each, and the submission around them about 70 µs, the profile's "13 µs a dispatch"
//! at 5 copies. The host's encoding of a dispatch (about 10 µs of the `mlp` step's 0.61 ms
//! for 34 dispatches, which take the GPU about 0.27 ms) is not part of the model.

use super::matmul::{MatmulSpec, MatmulTile};
use super::matmul_coop::{CoopKernel, CoopMode, CoopTile, WIDE_MEDIUM_TILE};
use super::matmul_simt::SimtTile;

/// Bytes a microsecond of a bandwidth-bound kernel (LayerNorm measured 3.2 TB/s on the H200).
const BYTES_PER_US: f64 = 2.5e6;
/// A dispatch's fixed cost to the GPU inside one compute pass on the H200 (3.5 to 5 µs
/// measured for the smallest kernels, see above).
pub const DISPATCH_US: f64 = 4.0;
/// Multiprocessors of the target class.
const MULTIPROCESSORS: f64 = 132.0;

/// How one kernel's time grows with its blocks and K.
enum Rate {
    /// Waves of `slots` blocks, each `c0 · min(1, K / 256) + c1 · K` microseconds; a partial
    /// wave costs a whole one (large blocks, one a multiprocessor: the cooperative tiles). The
    /// fixed part grows with K up to 256: `high` products of K = 128 and 196 on the half tile
    /// (the `mlp` model's) took 8 and 11 µs a wave, where `c0 + c1 · K` gives 20 and 22.
    /// Below `min_k` the tile is not priced (measured slower there than the others).
    Waves { slots: f64, c0: f64, c1: f64, min_k: u32 },
    /// The longer of a block's walk of K, `c0 + c1 · K`, with each wave of `slots` blocks
    /// past the first adding `1 / overlap` of it, and the flops of the whole blocks at
    /// `tflops.0 + tflops.1 · K` TFLOP/s (the SIMT tiles: [`simt_rate`]).
    Resident { slots: f64, c0: f64, c1: f64, overlap: f64, tflops: (f64, f64) },
    /// `c0` plus the flops of the product's whole blocks (a block past M or N computes, or
    /// idles in, its whole tile) at `flops_per_us`, scaled down while the grid has fewer
    /// than `saturation` blocks (the fp32 kernels, bound by more than the multiprocessors'
    /// count: the SIMT kernel reaches its 24.5 TFLOP/s from about 64 blocks on), or plus
    /// `step` a step of K where that is longer (a thread of the register tiles walks all of K
    /// one load after another: a skinny product's few threads are bound by that latency).
    Throughput { saturation: f64, flops_per_us: f64, c0: f64, step: f64 },
    /// `step` for each step of K a thread takes and `reduce` for adding the threads' sums, or
    /// where that is shorter, `block + block_step · steps` for each block: the workgroups' rate
    /// through the GPU (the dot kernel).
    Lanes { step: f64, reduce: f64, block: f64, block_step: f64 },
}

/// The rate of a cooperative tile: measured for the two sizes the model chooses between
/// (128x128 and 64x128) and `medium`'s tile for long products, scaled by block area for other
/// tiles (overrides and tests).
fn coop_rate(mode: CoopMode, t: &CoopTile) -> Rate {
    if mode == CoopMode::Medium && *t == WIDE_MEDIUM_TILE {
        // Two blocks a multiprocessor, a wave `40 + 0.039 · K` µs: fitted to gpt-medium's
        // products of K 768 to 4096 on the H200 (2026-12-01, BENCHMARKS.md), whose epilogues it
        // includes. Not priced below K = 2048: at K 768 it took 258 µs where the 128x128x64
        // tile took 199 (4096x3072x768, half with a GELU-gradient epilogue).
        return Rate::Waves { slots: 2.0 * MULTIPROCESSORS, c0: 40.0, c1: 0.039, min_k: 2048 };
    }
    let ((c0, c1), (h0, h1)) = match mode {
        CoopMode::High => ((20.0, 0.055), (14.0, 0.043)),
        CoopMode::Medium => ((30.0, 0.022), (20.0, 0.016)),
    };
    let area = f64::from(t.bm * t.bn) / (128.0 * 128.0);
    let (c0, c1) = if area >= 1.0 {
        (c0 * area, c1 * area)
    } else {
        // Halving the block keeps the half tile's cost; below that, proportional.
        let f = area * 2.0;
        (h0 * f.max(0.25), h1 * f)
    };
    Rate::Waves { slots: MULTIPROCESSORS, c0, c1, min_k: 0 }
}

/// The rate of a SIMT tile: the longer of
/// - latency: one block walks K in `c0 + c1 · K` µs, and each wave of 132 blocks past the
///   first adds `1 / overlap` of that (blocks sharing a multiprocessor overlap: the 128x64
///   tile's 128 threads more than the 128x256 tile's 256 with twice the registers);
/// - throughput: the flops of the whole blocks at `t0 + t1 · K` TFLOP/s, what a GPU full of
///   the tile's blocks sustains: the 128x256 tile 29 TFLOP/s at K = 192 rising to 42 at
///   4096, the 128x64 tile 30 at any K.
///
/// Fitted to every product of gpt-medium's and gpt-small's `highest` steps forced onto each
/// tile unsplit and split in 2 and 4 (`RUMUS_MATMUL_TILE`, `RUMUS_MATMUL_SPLIT_K`,
/// `--profile`) and to 4096³, on the H200 (2026-12-02, BENCHMARKS.md): a root-mean-square
/// error of 8 % (128x256) and 13 % (128x64). A block alone runs at about 0.3 TFLOP/s and one
/// of many sharing the GPU at 0.22-0.25, which the single-wave model this replaced could not
/// tell apart (it split 4096x768x3072 in two, 768 µs, where 128x64 unsplit took 576). Other
/// tiles (tests) are priced by area.
fn simt_rate(t: &SimtTile) -> Rate {
    let (c0, c1, overlap, t0, t1) = match (t.bm, t.bn) {
        (128, 256) => (34.2, 0.198, 1.14, 28.8, 0.0031),
        (128, 64) => (19.3, 0.075, 1.81, 30.2, 0.0),
        _ => {
            let area = f64::from(t.bm * t.bn) / 16384.0;
            (25.0 * area, 0.13 * area, 1.4, 29.0, 0.0)
        }
    };
    Rate::Resident { slots: MULTIPROCESSORS, c0, c1, overlap, tflops: (t0, t1) }
}

fn rate(tile: MatmulTile) -> Rate {
    let template = |tflops: f64| Rate::Throughput {
        saturation: 2.0 * MULTIPROCESSORS,
        flops_per_us: tflops * 1e6,
        c0: 2.0,
        step: 0.2,
    };
    match tile {
        MatmulTile::Coop(k) => coop_rate(k.mode, &k.tile),
        MatmulTile::Simt(t) => simt_rate(&t),
        // 64x64 blocks: 768x2304x4096 took 1.66 ms on 432 of them.
        MatmulTile::Register | MatmulTile::Small => template(9.0),
        MatmulTile::Register8 | MatmulTile::Large => template(12.0),
        // 128x10x1024 (96 blocks of 4 steps) took 2 µs, 1024x10x128 (768 of 1) 5 µs,
        // 1024x1024x128 (65536 of 1) 548 µs and 128x1024x784 (8192 of 4) 146 µs, a dispatch's
        // cost taken out; with B's K contiguous 128x1024x1024 took 60 µs, without 172.
        MatmulTile::Dot => Rate::Lanes { step: 0.3, reduce: 1.3, block: 0.003, block_step: 0.004 },
    }
}

/// Microseconds of the product `spec` (a split's partial products: `batch` slices) on `tile`.
pub fn product_us(tile: MatmulTile, spec: &MatmulSpec) -> f64 {
    let (bm, bn) = tile.block();
    let blocks =
        f64::from(spec.m.div_ceil(bm)) * f64::from(spec.n.div_ceil(bn)) * f64::from(spec.batch);
    let us = match rate(tile) {
        Rate::Waves { min_k, .. } if spec.k < min_k => return f64::INFINITY,
        Rate::Waves { slots, c0, c1, .. } => {
            let k = f64::from(spec.k);
            (blocks / slots).ceil() * (c0 * (k / 256.0).min(1.0) + c1 * k)
        }
        Rate::Resident { slots, c0, c1, overlap, tflops } => {
            let k = f64::from(spec.k);
            let latency = (c0 + c1 * k) * (1.0 + ((blocks / slots).ceil() - 1.0) / overlap);
            let flops = blocks * f64::from(bm) * f64::from(bn) * 2.0 * k;
            latency.max(flops / ((tflops.0 + tflops.1 * k) * 1e6))
        }
        Rate::Throughput { saturation, flops_per_us, c0, step } => {
            let flops = blocks * f64::from(bm) * f64::from(bn) * 2.0 * f64::from(spec.k);
            let rate = flops / (flops_per_us * (blocks / saturation).min(1.0));
            c0 + rate.max(step * f64::from(spec.k))
        }
        Rate::Lanes { step, reduce, block, block_step } => {
            let (_, _, lanes, ..) = tile.shape();
            let steps = f64::from(spec.k.div_ceil(lanes));
            (steps * step + reduce).max(blocks * (block + block_step * steps))
        }
    };
    us + DISPATCH_US
}

/// Microseconds of a cooperative kernel's conversion pre-pass for `spec`: it reads A and B as
/// f32 (twice, the second time from cache) and writes them as f16 (`high`: hi and lo).
pub fn prepass_us(k: &CoopKernel, spec: &MatmulSpec) -> f64 {
    let elems = |batch_stride: u32, rows: u32, cols: u32| {
        let planes = if batch_stride == 0 { 1 } else { spec.batch };
        f64::from(planes) * f64::from(rows) * f64::from(cols)
    };
    let s = spec;
    let n = elems(s.a.batch_stride, s.m, s.k) + elems(s.b.batch_stride, s.k, s.n);
    let written = if k.mode == CoopMode::High { 4.0 } else { 2.0 };
    DISPATCH_US + n * (4.0 + written) / BYTES_PER_US
}

/// Microseconds that splitting `m x n` into `splits` slices of K adds: the partial products'
/// extra writes and the sum's reads and write, at memory speed (the sum reads and writes
/// `vec4`s, [`super::matmul::split_k_sum`]; its scalar predecessor took 3x this).
pub fn split_us(m: u32, n: u32, splits: u32) -> f64 {
    let mn = f64::from(m) * f64::from(n);
    DISPATCH_US + 4.0 * mn * (2.0 * f64::from(splits)) / BYTES_PER_US
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::matmul::Operand;
    use crate::codegen::matmul_coop::{HIGH_TILE, WIDE_MEDIUM_TILE};
    use crate::codegen::matmul_simt::{NARROW_TILE, SIMT_TILE};

    /// The fitted rates give back the profiled products they were fitted to, within 25 %
    /// (µs of the product dispatch on the H200, the profile's overhead taken out).
    #[test]
    fn the_model_reproduces_the_profiled_products() {
        let high = MatmulTile::Coop(CoopKernel {
            mode: CoopMode::High,
            tile: HIGH_TILE,
            subgroup: 32,
            emulate: false,
        });
        let wide = MatmulTile::Coop(CoopKernel {
            mode: CoopMode::Medium,
            tile: WIDE_MEDIUM_TILE,
            subgroup: 32,
            emulate: false,
        });
        let c = MatmulSpec::contiguous;
        let t = |m, n, k| MatmulSpec { a: Operand::transposed(m, k), ..c(1, m, n, k) };
        let simt = MatmulTile::Simt;
        for (tile, spec, measured) in [
            (high, c(1, 768, 2304, 4096), 213.0),
            // gpt-medium's products and 4096x3072x3072 (bias epilogue), `medium`.
            (wide, c(1, 4096, 768, 3072), 184.0),
            (wide, t(768, 3072, 4096), 197.0),
            (wide, t(3072, 768, 4096), 217.0),
            (wide, c(1, 4096, 768, 2304), 127.0),
            (wide, c(1, 4096, 3072, 3072), 483.0),
            (high, c(1, 4096, 3072, 768), 387.0),
            (high, c(1, 4096, 768, 768), 128.0),
            (high, c(1, 4096, 768, 3072), 412.0),
            // Products of gpt-medium's and gpt-small's `highest` steps forced onto each SIMT
            // tile unsplit, and 4096³ (2026-12-02).
            (simt(SIMT_TILE), c(1, 4096, 768, 3072), 709.0),
            (simt(SIMT_TILE), c(1, 4096, 3072, 768), 649.0),
            (simt(SIMT_TILE), c(1, 4096, 768, 768), 192.0),
            (simt(SIMT_TILE), c(1, 4096, 256, 256), 77.0),
            (simt(SIMT_TILE), t(3072, 768, 4096), 824.0),
            (simt(SIMT_TILE), c(1, 4096, 4096, 4096), 3304.0),
            (simt(NARROW_TILE), c(1, 4096, 768, 3072), 576.0),
            (simt(NARROW_TILE), c(1, 4096, 3072, 768), 606.0),
            (simt(NARROW_TILE), c(1, 4096, 768, 768), 160.0),
            (simt(NARROW_TILE), c(1, 4096, 2304, 768), 461.0),
            (simt(NARROW_TILE), c(1, 4096, 256, 256), 35.0),
            (simt(NARROW_TILE), t(3072, 768, 4096), 709.0),
            (simt(NARROW_TILE), c(1, 4096, 4096, 4096), 4581.0),
            (MatmulTile::Register, c(1, 768, 2304, 4096), 1664.0),
            (MatmulTile::Register, c(1, 4096, 256, 768), 194.0),
            // The `mlp` model's products (profiled with 50 copies a dispatch, 2026-12-01).
            (MatmulTile::Register, c(8, 128, 10, 128), 32.4),
            (MatmulTile::Register, t(1024, 10, 128), 32.2),
            (MatmulTile::Register, c(1, 128, 1024, 10), 9.7),
            (MatmulTile::Register, t(1024, 1024, 128), 38.6),
            (MatmulTile::Dot, c(1, 128, 10, 1024), 6.1),
            (MatmulTile::Dot, t(1024, 10, 128), 9.0),
            (MatmulTile::Dot, c(1, 128, 1024, 784), 150.6),
            (MatmulTile::Dot, t(1024, 1024, 128), 552.0),
        ] {
            let est = product_us(tile, &spec);
            let ratio = est / measured;
            assert!((0.8..1.25).contains(&ratio), "{} {spec:?}: {est} against {measured}", tile.name());
        }
    }

    /// The kernel and the slices of K the model gives GPT-shaped products on an H200-class
    /// cooperative adapter, per mode: (mode, spec, "tile split"). `t` is a backward dW product
    /// (A transposed).
    #[test]
    fn gpt_shapes_get_their_tiles_and_splits() {
        use crate::codegen::program::Target;
        use crate::codegen::{MatmulOptions, MatmulPrecision};
        use MatmulPrecision::*;
        let c = MatmulSpec::contiguous;
        let t = |m, n, k| MatmulSpec { a: Operand::transposed(m, k), ..c(1, m, n, k) };
        let got = |mode: MatmulPrecision, spec: MatmulSpec| {
            let matmul = MatmulOptions { precision: mode, ..MatmulOptions::DEFAULT };
            let target = Target { matmul, ..Target::COOPERATIVE };
            let (tile, splits) = MatmulTile::choose_split(&spec, &target);
            let name = match tile {
                MatmulTile::Coop(k) => format!("{} {}", tile.name(), k.tile.name()),
                _ => tile.name().to_string(),
            };
            format!("{name} split {splits}")
        };
        let table = [
            // The SIMT tile and split the model prices lowest, against the best measured of
            // both tiles unsplit and split in 2 and 4 (µs a product on the H200, 2026-12-02):
            // gpt-medium `highest` 86.9 -> 82.8 ms against the three-tile wave model.
            (Highest, t(768, 2304, 4096), "simt split 2"), // 449 (128x64 split 4: 574)
            (Highest, t(768, 768, 4096), "simt-128x64 split 8"), // 225 (split 4: 208)
            // Measured 738 where split 4 took 590: the transposed operand's slices of 2048
            // are slow on this tile, which the model does not see.
            (Highest, t(3072, 768, 4096), "simt-128x64 split 2"),
            (Highest, c(1, 4096, 768, 3072), "simt-128x64 split 1"), // 576 (was 768)
            (Highest, c(1, 4096, 768, 768), "simt-128x64 split 1"), // 160
            (Highest, c(1, 4096, 3072, 768), "simt split 1"), // 649 (128x64: 606)
            (Highest, c(1, 4096, 4096, 4096), "simt split 1"), // 3304 (128x64: 4581)
            (Highest, c(1, 4096, 256, 256), "simt-128x64 split 1"), // 35
            // 144 or 192 blocks of 128x128 are two waves of 132: split K to fill them.
            (High, t(768, 3072, 4096), "coop-high 128x128x32 w4x2 split 4"),
            (High, c(1, 4096, 768, 3072), "coop-high 128x128x32 w4x2 split 2"),
            (High, t(768, 2304, 4096), "coop-high 128x128x32 w4x2 split 1"),
            (High, c(1, 4096, 4096, 4096), "coop-high 128x128x32 w4x2 split 1"),
            // 32 blocks of 128x128: the half tile fills twice as many multiprocessors.
            (High, c(1, 4096, 256, 768), "coop-high 64x128x32 w2x4 split 1"),
            (Medium, c(1, 4096, 256, 256), "coop-medium 64x128x64 w2x4 split 1"),
            // A long K and a wave of blocks: medium's tile for long products.
            (Medium, t(768, 3072, 4096), "coop-medium 128x128x32 w2x2 split 1"),
            (Medium, c(1, 4096, 768, 3072), "coop-medium 128x128x32 w2x2 split 1"),
            (Medium, c(1, 4096, 4096, 4096), "coop-medium 128x128x32 w2x2 split 1"),
            // Below a wave of its blocks (108 here) or K below 2048: the 128x128x64 tile.
            (Medium, t(768, 2304, 4096), "coop-medium 128x128x64 w2x4 split 1"),
            (Medium, c(1, 4096, 3072, 768), "coop-medium 128x128x64 w2x4 split 1"),
            (Medium, t(768, 768, 4096), "coop-medium 128x128x64 w2x4 split 2"),
            // Batched, K = 64: a wave of the half tile costs little more than its pre-passes.
            (High, c(12, 256, 256, 64), "coop-high 64x128x32 w2x4 split 1"),
            // Too small to pay a cooperative product's two pre-passes; skinny or K too long for
            // one thread of the register tile to walk alone (it took 0.2 µs a step of K).
            (Medium, c(1, 64, 10, 784), "dot split 1"),
            (High, c(1, 17, 33, 45), "dot split 1"),
            // Skinny products (the `mlp` model's head, its gradients, one row or column): K
            // across a workgroup, not one thread walking all of it; a short K stays on the
            // register tile.
            (High, c(1, 128, 10, 1024), "dot split 1"),
            (High, t(1024, 10, 128), "dot split 1"),
            (Highest, c(1, 128, 10, 1024), "dot split 1"),
            (High, c(1, 128, 1024, 10), "register split 1"),
            (Highest, c(1, 1, 1024, 1024), "dot split 1"),
            (Highest, c(1, 4096, 1, 4096), "dot split 1"),
            // More 4x4 blocks than a grid's axis allows (half as many rows would take dot).
            (Highest, c(2, 300_000, 1, 256), "register8 split 1"),
            (Highest, c(2, 150_000, 1, 256), "dot split 1"),
            (High, c(1, 128, 1024, 1024), "coop-high 64x128x32 w2x4 split 8"),
        ];
        let wrong: Vec<String> = table
            .into_iter()
            .map(|(mode, spec, want)| (mode, spec, want, got(mode, spec)))
            .filter(|(.., want, got)| want != got)
            .map(|(mode, s, want, got)| {
                format!("{mode} {}x{}x{}: {got}, want {want}", s.m, s.n, s.k)
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
