//! Launcher for `shaders/matmul.wgsl`: batched, strided C = epilogue(alpha·A·B) + beta·C.
//!
//! Operands are described by [`Operand`] (offset and batch/row/col strides, in elements), so the
//! backward products dW = Xᵀ·dY and dX = dY·Wᵀ and broadcast batches need no copies.

use super::MATMUL;
use crate::err;
use crate::error::Result;
use crate::runtime::{Dispatch, Gpu};
use std::time::Instant;

/// How one matrix operand sits in its buffer: element `[b, r, c]` is at
/// `offset + b * batch_stride + r * row_stride + c * col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub offset: u32,
    pub batch_stride: u32,
    pub row_stride: u32,
    pub col_stride: u32,
}

impl Operand {
    /// A contiguous row-major `[batch, rows, cols]` operand.
    pub fn row_major(rows: u32, cols: u32) -> Operand {
        Operand {
            offset: 0,
            batch_stride: rows.saturating_mul(cols),
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The logical `[rows, cols]` operand read from a row-major `[batch, cols, rows]` buffer,
    /// i.e. the transpose of what is stored.
    pub fn transposed(rows: u32, cols: u32) -> Operand {
        Operand {
            offset: 0,
            batch_stride: rows.saturating_mul(cols),
            row_stride: 1,
            col_stride: rows,
        }
    }

    /// The same matrix for every batch (batch stride 0).
    pub fn broadcast(self) -> Operand {
        Operand { batch_stride: 0, ..self }
    }

    /// Start at element `offset` of the buffer.
    pub fn at(self, offset: u32) -> Operand {
        Operand { offset, ..self }
    }

    /// Largest element index read or written, or `None` when the operand is empty.
    fn max_index(&self, batch: u32, rows: u32, cols: u32) -> Option<u64> {
        if batch == 0 || rows == 0 || cols == 0 {
            return None;
        }
        let last = |n: u32, stride: u32| u64::from(n - 1) * u64::from(stride);
        Some(
            u64::from(self.offset)
                + last(batch, self.batch_stride)
                + last(rows, self.row_stride)
                + last(cols, self.col_stride),
        )
    }
}

/// One matrix product: `C[b] = epilogue(alpha · A[b] · B[b]) + beta · C[b]` for `b < batch`,
/// with A `[m, k]`, B `[k, n]`, C `[m, n]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulSpec {
    pub batch: u32,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub alpha: f32,
    /// 0 means C is only written, never read.
    pub beta: f32,
}

impl MatmulSpec {
    /// Contiguous row-major `[batch, m, k] · [batch, k, n] → [batch, m, n]`, alpha 1, beta 0.
    pub fn contiguous(batch: u32, m: u32, n: u32, k: u32) -> MatmulSpec {
        MatmulSpec {
            batch,
            m,
            n,
            k,
            a: Operand::row_major(m, k),
            b: Operand::row_major(k, n),
            c: Operand::row_major(m, n),
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// Floating-point operations (a multiply-add counts two).
    pub fn flops(&self) -> f64 {
        2.0 * f64::from(self.batch) * f64::from(self.m) * f64::from(self.n) * f64::from(self.k)
    }
}

/// Block-tile shape of the matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulTile {
    /// 128×128 blocks, 8×8 per thread, 256 threads: for large products.
    Large,
    /// 64×64 blocks, 4×4 per thread, 256 threads: more workgroups for small products.
    Small,
    /// 64×64 blocks, 4×4 per thread in registers, no workgroup memory or barriers
    /// (entry point `main_reg`).
    Register,
    /// 128×64 blocks, 8×4 per thread in registers (entry point `main_reg8`).
    Register8,
}

impl MatmulTile {
    /// `(BM, BN, BK, TM, TN)`.
    pub fn shape(self) -> (u32, u32, u32, u32, u32) {
        match self {
            MatmulTile::Large => (128, 128, 8, 8, 8),
            MatmulTile::Small | MatmulTile::Register => (64, 64, 8, 4, 4),
            MatmulTile::Register8 => (128, 64, 8, 8, 4),
        }
    }

    /// Large when it still gives enough workgroups to fill a big GPU, else Small.
    /// The tile for `spec`: `RUMUS_MATMUL_TILE` (`large`, `small`, `register`, `register8`) when
    /// set, for benchmarking; otherwise the register tiles measured fastest on the H200: 8 x 4
    /// per thread while that still gives two workgroups per multiprocessor of a big GPU, else
    /// 4 x 4.
    pub fn choose(spec: &MatmulSpec) -> MatmulTile {
        match std::env::var("RUMUS_MATMUL_TILE").as_deref() {
            Ok("large") => MatmulTile::Large,
            Ok("small") => MatmulTile::Small,
            Ok("register") => MatmulTile::Register,
            Ok("register8") => MatmulTile::Register8,
            _ => {
                let blocks = u64::from(spec.m.div_ceil(128))
                    * u64::from(spec.n.div_ceil(64))
                    * u64::from(spec.batch);
                if blocks >= 264 {
                    MatmulTile::Register8
                } else {
                    MatmulTile::Register
                }
            }
        }
    }
}

/// The uniform block of `matmul.wgsl` (`struct Params`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    dims: [u32; 4],
    a: [u32; 4],
    b: [u32; 4],
    c: [u32; 4],
    alpha: f32,
    beta: f32,
    pad: [u32; 2],
}

/// A compiled matmul pipeline for one tile shape and one epilogue. Cloning shares it.
#[derive(Clone)]
pub struct Matmul {
    tile: MatmulTile,
    pipeline: wgpu::ComputePipeline,
}

impl Matmul {
    /// The matmul with the identity epilogue.
    pub fn new(gpu: &Gpu, tile: MatmulTile) -> Result<Matmul> {
        Matmul::with_epilogue(gpu, tile, "", "return v;")
    }

    /// The matmul with generated code in the epilogue: `bindings` declares extra buffers
    /// (`@group(0) @binding(4)` on, passed as `extra` to [`Matmul::dispatch`]) and `body` is the
    /// body of `fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar`.
    pub fn with_epilogue(
        gpu: &Gpu,
        tile: MatmulTile,
        bindings: &str,
        body: &str,
    ) -> Result<Matmul> {
        let (bm, bn, bk, tm, tn) = tile.shape();
        let (bm, bn, bk, tm, tn) =
            (bm.to_string(), bn.to_string(), bk.to_string(), tm.to_string(), tn.to_string());
        let src = MATMUL.fill(&[
            ("BM", &bm),
            ("BN", &bn),
            ("BK", &bk),
            ("TM", &tm),
            ("TN", &tn),
            ("EPILOGUE_BINDINGS", bindings),
            ("EPILOGUE", body),
        ])?;
        let entry = match tile {
            MatmulTile::Register => "main_reg",
            MatmulTile::Register8 => "main_reg8",
            _ => "main",
        };
        let pipeline = gpu.pipeline(&format!("matmul_{bm}x{bn}_{entry}"), &src, entry)?;
        Ok(Matmul { tile, pipeline })
    }

    pub fn tile(&self) -> MatmulTile {
        self.tile
    }

    /// Bind `a`, `b`, `c` (and the epilogue's `extra` buffers) for `spec`. Errors when an operand
    /// would address past the end of its buffer or the grid exceeds the device's limits.
    pub fn dispatch(
        &self,
        gpu: &Gpu,
        spec: &MatmulSpec,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        c: &wgpu::Buffer,
        extra: &[&wgpu::Buffer],
    ) -> Result<Dispatch> {
        let s = spec;
        check_operand("a", &s.a, s.batch, s.m, s.k, a)?;
        check_operand("b", &s.b, s.batch, s.k, s.n, b)?;
        check_operand("c", &s.c, s.batch, s.m, s.n, c)?;
        let (bm, bn, ..) = self.tile.shape();
        let grid = [s.n.div_ceil(bn), s.m.div_ceil(bm), s.batch];
        gpu.check_grid("matmul", grid)?;
        let params = Params {
            dims: [s.m, s.n, s.k, s.batch],
            a: [s.a.offset, s.a.batch_stride, s.a.row_stride, s.a.col_stride],
            b: [s.b.offset, s.b.batch_stride, s.b.row_stride, s.b.col_stride],
            c: [s.c.offset, s.c.batch_stride, s.c.row_stride, s.c.col_stride],
            alpha: s.alpha,
            beta: s.beta,
            pad: [0; 2],
        };
        let uniform = gpu.uniform("matmul params", bytemuck::bytes_of(&params))?;
        let mut buffers = vec![&uniform, a, b, c];
        buffers.extend_from_slice(extra);
        let bind_group = gpu.bind_group("matmul", &self.pipeline, &buffers)?;
        Ok(Dispatch {
            label: format!("matmul {}x{}x{} batch {}", s.m, s.n, s.k, s.batch),
            pipeline: self.pipeline.clone(),
            bind_group,
            workgroups: grid,
            owned: vec![uniform],
        })
    }
}

fn check_operand(
    name: &str,
    op: &Operand,
    batch: u32,
    rows: u32,
    cols: u32,
    buf: &wgpu::Buffer,
) -> Result<()> {
    let len = buf.size() / 4;
    match op.max_index(batch, rows, cols) {
        Some(max) if max >= len => Err(err!(
            Device,
            "matmul: operand {name} ([{batch}, {rows}, {cols}] at offset {} with strides {:?}) \
             reaches element {max} of a buffer of {len} elements",
            op.offset,
            [op.batch_stride, op.row_stride, op.col_stride]
        )),
        _ => Ok(()),
    }
}

/// Throughput of the large-tile matmul on `n × n × n` (contiguous, f32), in TFLOP/s: one warm-up
/// submission, then `iters` dispatches in one compute pass and one submission, timed to completion.
pub fn bench_matmul(gpu: &Gpu, n: u32, iters: u32, tile: MatmulTile) -> Result<f64> {
    let spec = MatmulSpec::contiguous(1, n, n, n);
    let len = n as usize * n as usize;
    let data: Vec<f32> = (0..len).map(|i| (i % 13) as f32 * 0.01 - 0.06).collect();
    let a = gpu.upload_f32("bench a", &data)?;
    let b = gpu.upload_f32("bench b", &data)?;
    let c = gpu.storage("bench c", len)?;
    let mm = Matmul::new(gpu, tile)?;
    let d = mm.dispatch(gpu, &spec, &a, &b, &c, &[])?;
    gpu.run(&[&d])?;
    let iters = iters.max(1);
    let all: Vec<&Dispatch> = (0..iters).map(|_| &d).collect();
    let start = Instant::now();
    gpu.run(&all)?;
    let secs = start.elapsed().as_secs_f64();
    Ok(spec.flops() * f64::from(iters) / secs / 1e12)
}
