//! Launcher for `shaders/layer_norm.wgsl` (forward) and `shaders/layer_norm_bw.wgsl` (backward)
//! over the last axis of a contiguous `[rows, d]` tensor.
//!
//! The forward writes `y` and per-row stats `[rows, 2]` = (mean, rstd), which the backward
//! reads. The backward is two dispatches: `rows` (grad-input, plus per-row-group partial sums of
//! grad-weight and grad-bias into a scratch buffer of [`LayerNorm::scratch_len`] elements) and
//! `params` (sums the partials into grad-weight and grad-bias).

use super::{LAYER_NORM, LAYER_NORM_BW};
use crate::err;
use crate::error::Result;
use crate::runtime::{Dispatch, Gpu};
use std::time::Instant;

/// Threads per workgroup of both layer-norm shaders (`WG` in the WGSL).
const WG: usize = 256;
/// Most columns a thread holds in registers; so `d` is at most `WG * MAX_CPT`.
const MAX_CPT: usize = 32;
/// Columns per workgroup of the `params` entry point (`PC` in the WGSL).
const PC: usize = 8;
/// The backward aims at this many row groups (workgroups of the `rows` entry point).
const TARGET_GROUPS: usize = 1024;

/// Buffers of a forward pass. `x`, `y`: `[rows, d]`; `weight`, `bias`: `[d]`; `stats`: `[rows, 2]`.
pub struct LayerNormForward<'a> {
    pub x: &'a wgpu::Buffer,
    pub weight: &'a wgpu::Buffer,
    pub bias: &'a wgpu::Buffer,
    pub y: &'a wgpu::Buffer,
    pub stats: &'a wgpu::Buffer,
}

/// Buffers of a backward pass. `scratch` holds [`LayerNorm::scratch_len`] elements (f32, any
/// contents). `dparams` is `[2, d]`: dweight in row 0, dbias in row 1. With `accumulate_dx` the
/// result is added to `dx`, with `accumulate_params` to `dparams`; otherwise they are
/// overwritten and never read.
pub struct LayerNormBackward<'a> {
    pub x: &'a wgpu::Buffer,
    pub weight: &'a wgpu::Buffer,
    pub stats: &'a wgpu::Buffer,
    pub dy: &'a wgpu::Buffer,
    pub dx: &'a wgpu::Buffer,
    pub dparams: &'a wgpu::Buffer,
    pub scratch: &'a wgpu::Buffer,
    pub accumulate_dx: bool,
    pub accumulate_params: bool,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FwdParams {
    rows: u32,
    d: u32,
    eps: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BwdParams {
    rows: u32,
    d: u32,
    rows_per_group: u32,
    flags: u32,
}

/// Layer-norm pipelines compiled for one width `d` (the last axis). Cloning shares them.
#[derive(Clone)]
pub struct LayerNorm {
    d: usize,
    forward: wgpu::ComputePipeline,
    backward_rows: wgpu::ComputePipeline,
    backward_params: wgpu::ComputePipeline,
}

impl LayerNorm {
    /// Compile forward and backward for rows of `d` elements (`1 <= d <= 8192`).
    pub fn new(gpu: &Gpu, d: usize) -> Result<LayerNorm> {
        if d == 0 || d > WG * MAX_CPT {
            return Err(err!(
                Device,
                "layer_norm: last axis of {d} is outside the supported 1..={}",
                WG * MAX_CPT
            ));
        }
        let cpt = d.div_ceil(WG).to_string();
        let fwd = LAYER_NORM.fill(&[("CPT", &cpt)])?;
        let bwd = LAYER_NORM_BW.fill(&[("CPT", &cpt)])?;
        Ok(LayerNorm {
            d,
            forward: gpu.pipeline("layer_norm", &fwd, "main")?,
            backward_rows: gpu.pipeline("layer_norm_bw rows", &bwd, "rows")?,
            backward_params: gpu.pipeline("layer_norm_bw params", &bwd, "params")?,
        })
    }

    pub fn d(&self) -> usize {
        self.d
    }

    /// Rows each workgroup of the backward handles for `rows` rows.
    pub fn rows_per_group(rows: usize) -> usize {
        rows.div_ceil(TARGET_GROUPS).max(1)
    }

    /// Elements of the backward's scratch buffer for `rows` rows.
    pub fn scratch_len(&self, rows: usize) -> usize {
        rows.div_ceil(LayerNorm::rows_per_group(rows)) * self.d * 2
    }

    /// The forward dispatch over `rows` rows.
    pub fn forward(
        &self,
        gpu: &Gpu,
        rows: usize,
        eps: f32,
        buf: &LayerNormForward,
    ) -> Result<Dispatch> {
        let d = self.d;
        check_len("x", buf.x, rows * d)?;
        check_len("y", buf.y, rows * d)?;
        check_len("weight", buf.weight, d)?;
        check_len("bias", buf.bias, d)?;
        check_len("stats", buf.stats, rows * 2)?;
        let rows32 = to_u32(rows)?;
        let params = FwdParams { rows: rows32, d: d as u32, eps, pad: 0 };
        let uniform = gpu.uniform("layer_norm params", bytemuck::bytes_of(&params))?;
        let bind_group = gpu.bind_group(
            "layer_norm",
            &self.forward,
            &[&uniform, buf.x, buf.weight, buf.bias, buf.y, buf.stats],
        )?;
        Ok(Dispatch {
            label: format!("layer_norm [{rows}, {d}]"),
            pipeline: self.forward.clone(),
            bind_group,
            workgroups: gpu.dispatch_dims(rows32),
            owned: vec![uniform],
        })
    }

    /// The two backward dispatches over `rows` rows, to be run in order.
    pub fn backward(
        &self,
        gpu: &Gpu,
        rows: usize,
        buf: &LayerNormBackward,
    ) -> Result<[Dispatch; 2]> {
        let d = self.d;
        check_len("x", buf.x, rows * d)?;
        check_len("dy", buf.dy, rows * d)?;
        check_len("dx", buf.dx, rows * d)?;
        check_len("weight", buf.weight, d)?;
        check_len("dparams", buf.dparams, 2 * d)?;
        check_len("stats", buf.stats, rows * 2)?;
        check_len("scratch", buf.scratch, self.scratch_len(rows))?;
        let rpg = LayerNorm::rows_per_group(rows);
        let groups = to_u32(rows.div_ceil(rpg))?;
        let flags = u32::from(buf.accumulate_dx) | (u32::from(buf.accumulate_params) << 1);
        let params =
            BwdParams { rows: to_u32(rows)?, d: d as u32, rows_per_group: rpg as u32, flags };
        let uniform = gpu.uniform("layer_norm_bw params", bytemuck::bytes_of(&params))?;
        let rows_group = gpu.bind_group(
            "layer_norm_bw rows",
            &self.backward_rows,
            &[&uniform, buf.x, buf.weight, buf.stats, buf.dy, buf.dx, buf.scratch],
        )?;
        let param_group = gpu.bind_group_at(
            "layer_norm_bw params",
            &self.backward_params,
            &[(0, &uniform), (6, buf.scratch), (7, buf.dparams)],
        )?;
        let params_grid = [d.div_ceil(PC) as u32, 1, 1];
        gpu.check_grid("layer_norm_bw", params_grid)?;
        Ok([
            Dispatch {
                label: format!("layer_norm_bw rows [{rows}, {d}]"),
                pipeline: self.backward_rows.clone(),
                bind_group: rows_group,
                workgroups: gpu.dispatch_dims(groups),
                owned: vec![uniform.clone()],
            },
            Dispatch {
                label: format!("layer_norm_bw params [{rows}, {d}]"),
                pipeline: self.backward_params.clone(),
                bind_group: param_group,
                workgroups: params_grid,
                owned: vec![uniform],
            },
        ])
    }
}

fn check_len(name: &str, buf: &wgpu::Buffer, len: usize) -> Result<()> {
    let have = buf.size() / 4;
    if (len as u64) > have {
        return Err(err!(
            Device,
            "layer_norm: `{name}` needs {len} elements, its buffer holds {have}"
        ));
    }
    Ok(())
}

fn to_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| err!(Device, "layer_norm: {n} rows do not fit one dispatch"))
}

/// Effective bandwidth of layer-norm forward + backward on `[rows, d]` (f32), in GB/s counting
/// 5·rows·d·4 bytes (read x, write y; read x, dy, write dx), as PyTorch's figure in BASELINES.md
/// does: one warm-up submission, then `iters` (forward, backward) rounds in one submission.
pub fn bench_layer_norm(gpu: &Gpu, rows: usize, d: usize, iters: u32) -> Result<f64> {
    let ln = LayerNorm::new(gpu, d)?;
    let n = rows * d;
    let data: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
    let ones = vec![1.0f32; d];
    let x = gpu.upload_f32("bench x", &data)?;
    let dy = gpu.upload_f32("bench dy", &data)?;
    let w = gpu.upload_f32("bench weight", &ones)?;
    let b = gpu.upload_f32("bench bias", &ones)?;
    let y = gpu.storage("bench y", n)?;
    let dx = gpu.storage("bench dx", n)?;
    let stats = gpu.storage("bench stats", rows * 2)?;
    let dwb = gpu.storage("bench dparams", 2 * d)?;
    let scratch = gpu.storage("bench scratch", ln.scratch_len(rows))?;
    let fwd = ln.forward(
        gpu,
        rows,
        1e-5,
        &LayerNormForward { x: &x, weight: &w, bias: &b, y: &y, stats: &stats },
    )?;
    let [bw_rows, bw_params] = ln.backward(
        gpu,
        rows,
        &LayerNormBackward {
            x: &x,
            weight: &w,
            stats: &stats,
            dy: &dy,
            dx: &dx,
            dparams: &dwb,
            scratch: &scratch,
            accumulate_dx: false,
            accumulate_params: false,
        },
    )?;
    gpu.run(&[&fwd, &bw_rows, &bw_params])?;
    let iters = iters.max(1);
    let all: Vec<&Dispatch> = (0..iters).flat_map(|_| [&fwd, &bw_rows, &bw_params]).collect();
    let start = Instant::now();
    gpu.run(&all)?;
    let secs = start.elapsed().as_secs_f64();
    Ok(5.0 * n as f64 * 4.0 * f64::from(iters) / secs / 1e9)
}
