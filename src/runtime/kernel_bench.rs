//! Throughput of the matmul and LayerNorm kernels alone (`rumus bench --kernels`): codegen's programs on
//! buffers of their own, timed in one submission; the matmul of a precision mode also checked
//! against an f64 reference on sampled elements.

use super::device::{Dispatch, Gpu};
use super::launch::prepare;
use crate::codegen::layer_norm::{self, Backward, Forward};
use crate::codegen::matmul::{self, MatmulSpec, MatmulTile};
use crate::codegen::program::scratch_words;
use crate::codegen::{MatmulOptions, Resource};
use crate::err;
use crate::error::Result;
use crate::rng::Rng;
use std::time::Instant;

/// What [`bench_matmul_mode`] measures.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulBench {
    /// The kernel the product ran on (`simt`, `coop-high`, ...).
    pub tile: String,
    /// Every dispatch of the product counted (a cooperative kernel's conversion included).
    pub tflops: f64,
    /// The product's last dispatch alone, repeated on operands already prepared (the same as
    /// `tflops` for a kernel of one dispatch).
    pub product_tflops: f64,
    /// Median and largest of `|c - ref| / Σ_k |a_ik b_kj|` over the sampled elements.
    pub error_median: f64,
    pub error_max: f64,
}

/// Elements of C checked against the f64 reference.
const SAMPLES: usize = 256;

/// The product `n × n × n` (normal random operands) on the kernel codegen chooses with
/// `options` (the precision mode, its tile, emulation): TFLOP/s over `iters` products in one
/// submission after one warm-up, all its dispatches (pre-passes included) and the product's
/// dispatch alone, and its error on sampled elements against an f64 reference computed on the
/// CPU.
pub fn bench_matmul_mode(
    gpu: &Gpu,
    n: u32,
    iters: u32,
    options: MatmulOptions,
) -> Result<MatmulBench> {
    let spec = MatmulSpec::contiguous(1, n, n, n);
    let target = gpu.target(options);
    // A forced tile the device cannot run is an error here as in a plan, not fp32 figures
    // reported under the tile's name.
    matmul::check_forced_coop_tile(&target)?;
    let tile = MatmulTile::choose(&spec, &target);
    let len = n as usize * n as usize;
    let mut rng = Rng::new(11);
    let a: Vec<f32> = (0..len).map(|_| rng.normal() as f32).collect();
    let b: Vec<f32> = (0..len).map(|_| rng.normal() as f32).collect();
    let buffers =
        [gpu.upload_f32("bench a", &a)?, gpu.upload_f32("bench b", &b)?, gpu.storage("bench c", len)?];
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let programs = matmul::programs("bench", &spec, tile, None, operands)?;
    let scratch = scratch_words(programs.iter())
        .iter()
        .map(|&w| gpu.storage("bench scratch", w.max(1) as usize))
        .collect::<Result<Vec<_>>>()?;
    let bound: Vec<&wgpu::Buffer> = buffers.iter().collect();
    let dispatches = programs
        .iter()
        .map(|p| prepare(gpu, p, &bound, &scratch.iter().collect::<Vec<_>>()))
        .collect::<Result<Vec<_>>>()?;
    let one: Vec<&Dispatch> = dispatches.iter().collect();
    let iters = iters.max(1);
    let all: Vec<&Dispatch> = (0..iters).flat_map(|_| one.iter().copied()).collect();
    let secs = time(gpu, &one, &all)?;
    let c = gpu.read_f32(&buffers[2])?;
    let Some(&product) = one.last() else {
        return Err(err!(Invariant, "the matmul benchmark has no dispatch"));
    };
    let alone: Vec<&Dispatch> = (0..iters).map(|_| product).collect();
    let product_secs = time(gpu, &[product], &alone)?;
    let nn = n as usize;
    let mut errors: Vec<f64> = (0..SAMPLES.min(len))
        .map(|_| {
            let (i, j) = (rng.below(u64::from(n)) as usize, rng.below(u64::from(n)) as usize);
            let (mut dot, mut size) = (0.0f64, 0.0f64);
            for k in 0..nn {
                let p = f64::from(a[i * nn + k]) * f64::from(b[k * nn + j]);
                dot += p;
                size += p.abs();
            }
            let err = (f64::from(c[i * nn + j]) - dot).abs() / size.max(f64::MIN_POSITIVE);
            if err.is_nan() { f64::INFINITY } else { err }
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    Ok(MatmulBench {
        tile: tile.name().to_string(),
        tflops: spec.flops() * f64::from(iters) / secs / 1e12,
        product_tflops: spec.flops() * f64::from(iters) / product_secs / 1e12,
        error_median: errors.get(errors.len() / 2).copied().unwrap_or(0.0),
        error_max: errors.last().copied().unwrap_or(0.0),
    })
}

/// Time `all` in one submission after one warm-up run of `warm`; seconds.
fn time(gpu: &Gpu, warm: &[&Dispatch], all: &[&Dispatch]) -> Result<f64> {
    gpu.run(warm)?;
    let start = Instant::now();
    gpu.run(all)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Throughput of the matmul program with `tile` on `n × n × n` (contiguous, f32), in TFLOP/s:
/// one warm-up submission, then `iters` dispatches in one compute pass and one submission,
/// timed to completion.
pub fn bench_matmul(gpu: &Gpu, n: u32, iters: u32, tile: MatmulTile) -> Result<f64> {
    let spec = MatmulSpec::contiguous(1, n, n, n);
    let target = gpu.target(MatmulOptions::default());
    if let MatmulTile::Simt(t) = tile {
        if !MatmulTile::simt_fits(&t, &spec, &target) {
            return Err(err!(
                Device,
                "the {} matmul does not fit this adapter's workgroup limits",
                t.name()
            ));
        }
    }
    let len = n as usize * n as usize;
    let data: Vec<f32> = (0..len).map(|i| (i % 13) as f32 * 0.01 - 0.06).collect();
    let a = gpu.upload_f32("bench a", &data)?;
    let b = gpu.upload_f32("bench b", &data)?;
    let c = gpu.storage("bench c", len)?;
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let p = matmul::program(&spec, tile, None, operands)?;
    let d = prepare(gpu, &p, &[&a, &b, &c], &[])?;
    let iters = iters.max(1);
    let all: Vec<&Dispatch> = (0..iters).map(|_| &d).collect();
    let secs = time(gpu, &[&d], &all)?;
    Ok(spec.flops() * f64::from(iters) / secs / 1e12)
}

/// Effective bandwidth of layer-norm forward + backward on `[rows, d]` (f32), in GB/s counting
/// 5·rows·d·4 bytes (read x, write y; read x, dy, write dx), as PyTorch's figure in
/// `scripts/bench/torch_baselines.py`
/// does: one warm-up submission, then `iters` (forward, backward) rounds in one submission.
pub fn bench_layer_norm(gpu: &Gpu, rows: usize, d: usize, iters: u32) -> Result<f64> {
    let n = rows * d;
    let data: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
    let ones = vec![1.0f32; d];
    let buffers = [
        gpu.upload_f32("bench x", &data)?,
        gpu.upload_f32("bench dy", &data)?,
        gpu.upload_f32("bench weight", &ones)?,
        gpu.upload_f32("bench bias", &ones)?,
        gpu.storage("bench y", n)?,
        gpu.storage("bench dx", n)?,
        gpu.storage("bench stats", rows * 2)?,
        gpu.storage("bench dparams", 2 * d)?,
        gpu.storage("bench scratch", layer_norm::scratch_len(rows, d, 2))?,
    ];
    let [x, dy, w, b, y, dx, stats, dwb, scratch] =
        [0, 1, 2, 3, 4, 5, 6, 7, 8].map(Resource::Buffer);
    let fwd = layer_norm::forward(
        rows,
        d,
        1e-5,
        Forward { x: x.clone(), weight: w.clone(), bias: b, y, stats: stats.clone() },
    )?;
    let bwd = layer_norm::backward(
        rows,
        d,
        Backward {
            x,
            weight: w,
            stats,
            dy,
            dx,
            partial: scratch,
            dparams: dwb,
            accumulate_dx: false,
            accumulate_params: false,
            addend: None,
            col_sum: None,
        },
    )?;
    let bound: Vec<&wgpu::Buffer> = buffers.iter().collect();
    let fwd = prepare(gpu, &fwd, &bound, &[])?;
    let [rows_p, params_p] = bwd;
    let bw_rows = prepare(gpu, &rows_p, &bound, &[])?;
    let bw_params = prepare(gpu, &params_p, &bound, &[])?;
    let iters = iters.max(1);
    let all: Vec<&Dispatch> = (0..iters).flat_map(|_| [&fwd, &bw_rows, &bw_params]).collect();
    let secs = time(gpu, &[&fwd, &bw_rows, &bw_params], &all)?;
    Ok(5.0 * n as f64 * 4.0 * f64::from(iters) / secs / 1e9)
}
