//! Matmul programs: the `shaders/matmul.wgsl` template (batched, strided
//! `C = epilogue(alpha·A·B) + beta·C`), and the lowering of a plan's matmul kernel onto it.
//!
//! Operands are described by [`Operand`] (offset and batch/row/col strides, in elements), so the
//! backward products dW = Xᵀ·dY and dX = dY·Wᵀ and broadcast batches need no copies. Each
//! product's kernel, tile and slices of K come from one choice by the cost model of
//! `matmul_cost.rs` ([`MatmulTile::choose_split`]): the template's register tiles, the
//! generated SIMT kernel (`matmul_simt.rs`), the generated kernel for skinny products
//! (`matmul_dot.rs`), or in the `high` and `medium` precision modes a
//! cooperative-matrix kernel (`matmul_coop.rs`, after the conversion of its operands to f16 of
//! `coop_convert.rs`) where the device has them. A split
//! product runs its partial products over slices of K into scratch, then a generated kernel
//! that sums the slices and applies the epilogue. Dispatch labels name the product's shape and
//! end with the tile that ran, so `rumus plan --wgsl` and profiles say which kernel each
//! product got.

use super::matmul_coop::{self, CoopKernel, CoopMode, CoopTile};
use super::matmul_cost as cost;
use super::matmul_dot::{self, DOT_BLOCK, DOT_LANES};
use super::matmul_simt::{self, SimtTile, SIMT_TILES};
use super::coop_convert;
use super::prologue::Prologue;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks, Target};
use super::templates::MATMUL;
use super::wgsl::{matmul_epilogue, MatmulEpilogue, MAIN_ARGS, WG};
use super::writer::Wgsl;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::plan::{Kernel, Plan};
use super::MatmulPrecision;

/// The scratch slot of the cooperative kernels' exponents ([`super::coop_convert`]; split-K
/// partials use slot 0), written by a product's conversion and read by the product.
pub const EXPONENT_SLOT: usize = 3;
/// The scratch slot of the per-slice column sums a split cooperative product's conversion
/// writes when its kernel also sums B (`sum` of [`crate::plan::KernelKind::MatMul`]), added
/// up by the split-K sum.
pub const SUM_SLOT: usize = 4;
/// The scratch slot of the cooperative kernels' f16 workspace ([`super::coop_convert`]): like
/// every scratch slot it lives only within one kernel's dispatches and is shared by every
/// product of the plan, sized for the largest.
pub const WORKSPACE_SLOT: usize = 2;

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

    /// Elements a buffer must hold for this operand (one past the largest index touched; 0 when
    /// the operand is empty).
    pub(super) fn words(&self, batch: u32, rows: u32, cols: u32) -> u64 {
        if batch == 0 || rows == 0 || cols == 0 {
            return 0;
        }
        let last = |n: u32, stride: u32| u64::from(n - 1) * u64::from(stride);
        u64::from(self.offset)
            + last(batch, self.batch_stride)
            + last(rows, self.row_stride)
            + last(cols, self.col_stride)
            + 1
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

/// The fp32 kernels `RUMUS_MATMUL_TILE` forces on every product it fits, by name (checked
/// by `MatmulOptions::from_env`; the SIMT kernel only where it fits the product).
pub const FP32_TILES: [(&str, MatmulTile); 7] = [
    ("large", MatmulTile::Large),
    ("small", MatmulTile::Small),
    ("register", MatmulTile::Register),
    ("register8", MatmulTile::Register8),
    (SIMT_TILES[0].0, MatmulTile::Simt(SIMT_TILES[0].1)),
    (SIMT_TILES[1].0, MatmulTile::Simt(SIMT_TILES[1].1)),
    ("dot", MatmulTile::Dot),
];

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
    /// The generated fp32 SIMT kernel ([`super::matmul_simt`]) on one of its tiles
    /// ([`SIMT_TILES`]): slices double-buffered in workgroup memory, compiled without the loop
    /// guard.
    Simt(SimtTile),
    /// The generated fp32 kernel for skinny products ([`super::matmul_dot`]): 4×4 blocks, K
    /// across a workgroup's 256 threads, the partial sums added in workgroup memory.
    Dot,
    /// A cooperative-matrix kernel (`high` or `medium`, [`super::matmul_coop`]), after the
    /// conversion to f16.
    Coop(CoopKernel),
}

impl MatmulTile {
    /// `(BM, BN, BK, TM, TN)`; a cooperative tile has no per-thread tile (TM and TN are 0),
    /// nor has the dot kernel, whose BK is the K steps its threads take at once.
    pub fn shape(self) -> (u32, u32, u32, u32, u32) {
        match self {
            MatmulTile::Coop(k) => (k.tile.bm, k.tile.bn, k.tile.bk, 0, 0),
            MatmulTile::Dot => (DOT_BLOCK, DOT_BLOCK, DOT_LANES, 0, 0),
            MatmulTile::Large => (128, 128, 8, 8, 8),
            MatmulTile::Small | MatmulTile::Register => (64, 64, 8, 4, 4),
            MatmulTile::Register8 => (128, 64, 8, 8, 4),
            MatmulTile::Simt(t) => (t.bm, t.bn, t.bk, t.tm, t.tn),
        }
    }

    /// The entry point of `matmul.wgsl` for this tile.
    pub fn entry(self) -> &'static str {
        match self {
            MatmulTile::Register => "main_reg",
            MatmulTile::Register8 => "main_reg8",
            MatmulTile::Large
            | MatmulTile::Small
            | MatmulTile::Simt(_)
            | MatmulTile::Dot
            | MatmulTile::Coop(_) => "main",
        }
    }

    /// The name reports use (`rumus plan`, dispatch labels, `rumus bench --kernels`).
    pub fn name(self) -> &'static str {
        match self {
            MatmulTile::Large => "large",
            MatmulTile::Small => "small",
            MatmulTile::Register => "register",
            MatmulTile::Register8 => "register8",
            MatmulTile::Simt(t) => t.name(),
            MatmulTile::Dot => "dot",
            MatmulTile::Coop(k) => k.name(),
        }
    }

    /// Rows and columns of C one workgroup computes.
    pub fn block(self) -> (u32, u32) {
        let (bm, bn, ..) = self.shape();
        (bm, bn)
    }

    /// The cooperative kernel on `tile` for `spec` on `target`, when the precision is `high`
    /// or `medium` and the target has cooperative matrices (or emulates them), the product is
    /// not empty (K included), both operands have a unit stride, the tile splits evenly and
    /// fits the device's threads and workgroup memory, and the f16 workspace's halves can be
    /// indexed by a u32; `None` otherwise (an fp32 kernel computes it). The product binds no
    /// more storage buffers than an fp32 one: the workspace and the exponents instead of A and
    /// B.
    pub fn coop_on(spec: &MatmulSpec, target: &Target, tile: CoopTile) -> Option<CoopKernel> {
        let k = coop_kernel(target, tile)?;
        let access = matmul_simt::accesses(spec)?;
        let s = spec;
        let fits = [s.batch, s.m, s.n, s.k].iter().all(|&d| d > 0)
            && k.tile.check(k.subgroup).is_ok()
            && k.threads() <= target.max_invocations
            && k.workgroup_bytes(access) <= target.max_workgroup_bytes
            && coop_convert::workspace_halves(&k, access, s) <= u64::from(u32::MAX);
        fits.then_some(k)
    }

    /// The cooperative tiles the cost model chooses between for `target`'s mode: none in
    /// `highest`, the override (`RUMUS_MATMUL_COOP_TILE`, tests) alone, else
    /// [`matmul_coop::tiles`].
    fn coop_tiles(target: &Target) -> Vec<CoopTile> {
        match (coop_mode(target.matmul.precision), target.matmul.coop_tile) {
            (None, _) => Vec::new(),
            (Some(_), Some(t)) => vec![t],
            (Some(mode), None) => matmul_coop::tiles(mode),
        }
    }

    /// Whether the SIMT kernel on tile `t` can compute `spec` on `target`: one batch (batched
    /// products, attention's, stay on the template; a split's partial products are checked
    /// unsplit), operands with a unit stride, and the kernel's threads and workgroup memory
    /// within the device's limits.
    pub fn simt_fits(t: &SimtTile, spec: &MatmulSpec, target: &Target) -> bool {
        spec.batch == 1
            && matmul_simt::accesses(spec).is_some()
            && t.threads() <= target.max_invocations
            && t.workgroup_bytes() <= target.max_workgroup_bytes
    }

    /// The tile for `spec` on `target` computing it unsplit (see [`MatmulTile::choose_split`]).
    pub fn choose(spec: &MatmulSpec, target: &Target) -> MatmulTile {
        Self::best(spec, target, 1)
    }

    /// The tile for `spec` on `target` and the slices of K it computes in (1: unsplit), by the
    /// cost model of an H200-class GPU ([`super::matmul_cost`]): waves of blocks over the
    /// multiprocessors, K's length, the cooperative kernels' pre-passes and the split-K sum.
    ///
    /// - `high`, `medium` (where [`MatmulTile::coop_on`] gives a kernel): the mode's tile or
    ///   its half, each unsplit or split, or an fp32 kernel where it is estimated faster than
    ///   a cooperative product and its pre-passes (small products; fp32 is never less
    ///   accurate than `high`, and the plan's labels name the kernel). An emulated cooperative
    ///   kernel or a cooperative tile set by the options (tests, `RUMUS_MATMUL_COOP_TILE`)
    ///   is taken wherever it fits.
    /// - fp32: `target.matmul.fp32_tile` (`RUMUS_MATMUL_TILE`: `large`, `small`, `register`,
    ///   `register8`, `simt`, `simt-128x64` where they fit, `dot`) when set, for
    ///   benchmarking; else the SIMT kernel on the tile the cost model prices lowest of those
    ///   whose blocks number at least `target.matmul.simt_min_workgroups`, unsplit or split (only
    ///   the 128x256 tile where cooperative products compete), else
    ///   the register tile measured fastest on the H200, 8 x 4 per thread while that gives two
    ///   workgroups per multiprocessor, else 4 x 4, or the dot kernel for skinny products (a few
    ///   rows or columns, a long K) where the cost model prices it below that tile and its grid of
    ///   4x4 blocks fits the device's.
    ///
    /// `target.matmul.split_k` (tests) forces the slices wherever the product allows them.
    pub fn choose_split(spec: &MatmulSpec, target: &Target) -> (MatmulTile, u32) {
        let mut splits = split_options(spec);
        if let Some(s) = target.matmul.split_k {
            splits.retain(|&o| o == s);
            if splits.is_empty() {
                splits.push(1);
            }
        }
        let mut best: Option<(f64, MatmulTile, u32)> = None;
        for s in splits {
            let part = partial(spec, s);
            let tile = Self::best(&part, target, s);
            let mut us = cost::product_us(tile, &part);
            if let MatmulTile::Coop(k) = tile {
                us += cost::prepass_us(&k, &part);
            }
            if s > 1 {
                us += cost::split_us(spec.m, spec.n, s);
            }
            if best.is_none_or(|(b, ..)| us < b) {
                best = Some((us, tile, s));
            }
        }
        best.map_or((Self::best(spec, target, 1), 1), |(_, t, s)| (t, s))
    }

    /// The fastest tile by the cost model for `part`, a product already split into `split`
    /// slices of K (its batches when split).
    fn best(part: &MatmulSpec, target: &Target, split: u32) -> MatmulTile {
        let unsplit_batch = if split > 1 { 1 } else { part.batch };
        let one = MatmulSpec { batch: unsplit_batch, ..*part };
        let fp32 = Self::fp32(part, target, &one);
        let coop = Self::coop_tiles(target)
            .into_iter()
            .filter_map(|t| Self::coop_on(part, target, t))
            .map(|k| {
                let us = cost::product_us(MatmulTile::Coop(k), part) + cost::prepass_us(&k, part);
                (us, k)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match coop {
            // Tests and tile trials run the cooperative kernel on every product it can take.
            Some((_, k)) if k.emulate || target.matmul.coop_tile.is_some() => MatmulTile::Coop(k),
            Some((us, k)) if us <= cost::product_us(fp32, part) => MatmulTile::Coop(k),
            _ => fp32,
        }
    }

    /// The fp32 tile for `part` (see [`MatmulTile::choose_split`]); `one`: the product of one
    /// batch the SIMT kernel must fit.
    fn fp32(part: &MatmulSpec, target: &Target, one: &MatmulSpec) -> MatmulTile {
        let fits = |t: &SimtTile| Self::simt_fits(t, one, target);
        let forced = target.matmul.fp32_tile.filter(|t| match t {
            MatmulTile::Simt(s) => fits(s),
            _ => true,
        });
        if let Some(tile) = forced {
            return tile;
        }
        let blocks_of = |bm: u32, bn: u32| {
            u64::from(part.m.div_ceil(bm)) * u64::from(part.n.div_ceil(bn)) * u64::from(part.batch)
        };
        // The SIMT tile the cost model prices lowest, of those that fit with enough blocks.
        // Where cooperative products compete, only the 128x256 tile: with the smaller ones
        // the model sent gpt-small's products to fp32 and its `high` step went from 4.75 to
        // 5.25 ms on the H200 (2026-12-02), its waves priced below what they took there.
        let min_blocks = u64::from(target.matmul.simt_min_workgroups);
        let coop = coop_kernel(target, matmul_coop::HIGH_TILE).is_some();
        let tiles = if coop { 1 } else { SIMT_TILES.len() };
        let simt = SIMT_TILES[..tiles]
            .iter()
            .map(|&(_, t)| t)
            .filter(|t| fits(t) && blocks_of(t.bm, t.bn) >= min_blocks)
            .map(|t| (cost::product_us(MatmulTile::Simt(t), part), t))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, t)) = simt {
            return MatmulTile::Simt(t);
        }
        let blocks = blocks_of(128, 64);
        let tile = if blocks >= 264 { MatmulTile::Register8 } else { MatmulTile::Register };
        let grid = target.max_workgroups_per_dimension;
        let dot_fits = DOT_LANES <= target.max_invocations
            && matmul_dot::WORKGROUP_BYTES <= target.max_workgroup_bytes
            && part.m.div_ceil(DOT_BLOCK) <= grid
            && part.n.div_ceil(DOT_BLOCK) <= grid;
        if dot_fits && cost::product_us(MatmulTile::Dot, part) < cost::product_us(tile, part) {
            MatmulTile::Dot
        } else {
            tile
        }
    }
}

/// The cooperative kernel on `tile` for `target`: its precision's mode, on the device's
/// subgroups, or emulated (subgroups of 32); `None` in `highest` or without cooperative
/// matrices.
fn coop_kernel(target: &Target, tile: CoopTile) -> Option<CoopKernel> {
    let mode = coop_mode(target.matmul.precision)?;
    let (subgroup, emulate) = match (target.cooperative, target.matmul.emulate_coop) {
        (_, true) => (32, true),
        (Some(sg), false) => (sg, false),
        (None, false) => return None,
    };
    Some(CoopKernel { mode, tile, subgroup, emulate })
}

/// A cooperative tile forced on every product (`RUMUS_MATMUL_COOP_TILE`) that `target` cannot
/// run for any product, for its threads or its workgroup memory, is an error that says so:
/// every product would otherwise fall back to fp32 without a word.
pub fn check_forced_coop_tile(target: &Target) -> Result<()> {
    let Some(k) = target.matmul.coop_tile.and_then(|tile| coop_kernel(target, tile)) else {
        return Ok(());
    };
    let tile = k.tile;
    let refuse = |why: String| err!(Usage, "RUMUS_MATMUL_COOP_TILE: cooperative tile {}: {why}", tile.name());
    tile.check(k.subgroup).map_err(|e| err!(Usage, "RUMUS_MATMUL_COOP_TILE: {}", e.message))?;
    let (threads, most) = (k.threads(), target.max_invocations);
    if threads > most {
        return Err(refuse(format!(
            "{threads} threads a workgroup, and this device runs at most {most}"
        )));
    }
    let layouts = [true, false].map(|row_major| matmul_simt::Access { row_major, vector: false });
    let bytes = layouts
        .iter()
        .flat_map(|&a| layouts.iter().map(move |&b| k.workgroup_bytes([a, b])))
        .min()
        .unwrap_or(0);
    if bytes > target.max_workgroup_bytes {
        return Err(refuse(format!(
            "at least {bytes} bytes of workgroup memory in `{}`, and this device has {}",
            target.matmul.precision, target.max_workgroup_bytes
        )));
    }
    Ok(())
}

impl Target {
    /// Whether the products of a plan for this target run on cooperative kernels, which
    /// convert their operands in a pass of their own: then the plan may give products
    /// operand prologues ([`crate::plan::PlanOptions::matmul_prologues`]).
    pub fn converts_operands(&self) -> bool {
        coop_mode(self.matmul.precision).is_some()
            && (self.cooperative.is_some() || self.matmul.emulate_coop)
    }
}

/// The cooperative mode computing products in `precision`; `None` for `highest` (fp32).
fn coop_mode(precision: MatmulPrecision) -> Option<CoopMode> {
    match precision {
        MatmulPrecision::Highest => None,
        MatmulPrecision::High => Some(CoopMode::High),
        MatmulPrecision::Medium => Some(CoopMode::Medium),
    }
}

/// Slices of K worth pricing for `spec`: 1, and for one long product (K at least 512) the
/// powers of two up to 32 that divide K into slices of at least 128 with the partial products
/// (scratch slot 0) under 2^26 words and each slice's offset into A and B a u32 ([`partial`]).
fn split_options(spec: &MatmulSpec) -> Vec<u32> {
    let mut out = vec![1];
    if spec.batch != 1 || spec.k < 512 {
        return out;
    }
    let mn = u64::from(spec.m) * u64::from(spec.n);
    let stride = u64::from(spec.a.col_stride.max(spec.b.row_stride));
    let offsets_fit = |s: u32| u64::from(spec.k / s) * stride <= u64::from(u32::MAX);
    let mut s = 2;
    while s <= 32
        && spec.k.is_multiple_of(s)
        && spec.k / s >= 128
        && mn * u64::from(s) <= 1 << 26
        && offsets_fit(s)
    {
        out.push(s);
        s *= 2;
    }
    out
}

/// The partial products of `spec` split into `splits` slices of K: one batch a slice, into a
/// row-major `[splits, m, n]` scratch.
fn partial(spec: &MatmulSpec, splits: u32) -> MatmulSpec {
    if splits <= 1 {
        return *spec;
    }
    let chunk = spec.k / splits;
    MatmulSpec {
        batch: splits,
        k: chunk,
        a: Operand { batch_stride: chunk * spec.a.col_stride, ..spec.a },
        b: Operand { batch_stride: chunk * spec.b.row_stride, ..spec.b },
        c: Operand::row_major(spec.m, spec.n),
        ..*spec
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

/// The template program for `spec` on `tile`: A, B and C are buffers 0, 1 and 2, and the
/// epilogue's `extra` buffers (declared in `epilogue.decls` from `@binding(4)` on) follow.
/// `None` for the identity epilogue.
pub fn program(
    spec: &MatmulSpec,
    tile: MatmulTile,
    epilogue: Option<&MatmulEpilogue>,
    [a, b, c]: [Resource; 3],
) -> Result<Program> {
    if let MatmulTile::Coop(k) = tile {
        return Err(err!(
            Invariant,
            "the {} matmul is two programs (conversion and product): use `programs`",
            k.name()
        ));
    }
    let (bm, bn, bk, tm, tn) = tile.shape();
    let (decls, body) = epilogue.map_or(("", "return v;"), |e| (&e.decls, &e.body));
    // Its own indices stay inside the operands and its loops end; an epilogue's loads of
    // other buffers clamp their indices themselves (`ExprEmitter::clamp_loads`).
    let trusted = ShaderChecks { bounds: false, loop_bounding: false };
    let mut checks = ShaderChecks::ALL;
    let mut workgroup_size = if tm * tn == 0 { 0 } else { (bm / tm) * (bn / tn) };
    let wgsl = if tile == MatmulTile::Dot {
        checks = trusted;
        workgroup_size = DOT_LANES;
        matmul_dot::generate(decls, body)
    } else if let MatmulTile::Simt(t) = tile {
        let Some(access) = matmul_simt::accesses(spec) else {
            return Err(err!(
                Invariant,
                "the simt matmul needs operands with a unit stride, not {:?} and {:?}",
                spec.a,
                spec.b
            ));
        };
        checks = trusted;
        matmul_simt::generate(&t, access, decls, body, epilogue.map_or(0, |e| e.loads))
    } else {
        MATMUL.fill(&[
            ("BM", &bm.to_string()),
            ("BN", &bn.to_string()),
            ("BK", &bk.to_string()),
            ("TM", &tm.to_string()),
            ("TN", &tn.to_string()),
            ("EPILOGUE_BINDINGS", decls),
            ("EPILOGUE", body),
        ])?
    };
    let s = spec;
    Ok(Program {
        label: format!("matmul {}x{}x{} batch {} {}", s.m, s.n, s.k, s.batch, tile.name()),
        wgsl,
        entry: tile.entry(),
        workgroup_size,
        bindings: bindings(spec, epilogue, [a, b, c]),
        grid: Grid::Fixed([s.n.div_ceil(bn), s.m.div_ceil(bm), s.batch]),
        checks,
    })
}

/// The programs of `spec` on `tile`, labelled `label` and the tile's name: one for a template
/// or SIMT tile, and for a cooperative tile two: the conversion of A and B to f16 (into
/// scratch slot [`WORKSPACE_SLOT`], their strips' exponents into [`EXPONENT_SLOT`]) and the
/// product. Bindings as in [`program`].
pub fn programs(
    label: &str,
    spec: &MatmulSpec,
    tile: MatmulTile,
    epilogue: Option<&MatmulEpilogue>,
    operands: [Resource; 3],
) -> Result<Vec<Program>> {
    programs_summing(label, spec, tile, epilogue, operands, None)
}

/// [`programs`], and with `sums` on a cooperative tile the conversion also writes the sums
/// over K of B's columns, `[batch, n]` row-major, into `sums` (B must be row-major:
/// [`coop_convert::program`]). Other tiles have no conversion and ignore `sums`.
pub fn programs_summing(
    label: &str,
    spec: &MatmulSpec,
    tile: MatmulTile,
    epilogue: Option<&MatmulEpilogue>,
    operands: [Resource; 3],
    sums: Option<Resource>,
) -> Result<Vec<Program>> {
    let none = [Prologue::default(), Prologue::default()];
    programs_with(label, spec, tile, epilogue, operands, sums, &none)
}

/// [`programs_summing`], with A and B read through `prologues` (the conversion applies them;
/// a tile without one must not be given any).
fn programs_with(
    label: &str,
    spec: &MatmulSpec,
    tile: MatmulTile,
    epilogue: Option<&MatmulEpilogue>,
    [a, b, c]: [Resource; 3],
    sums: Option<Resource>,
    prologues: &[Prologue; 2],
) -> Result<Vec<Program>> {
    let label = format!("{label} {}", tile.name());
    if !matches!(tile, MatmulTile::Coop(_)) && prologues.iter().any(|p| !p.is_empty()) {
        return Err(err!(Invariant, "{label}: an operand prologue on a kernel without a conversion"));
    }
    let MatmulTile::Coop(k) = tile else {
        let mut p = program(spec, tile, epilogue, [a, b, c])?;
        p.label = label;
        return Ok(vec![p]);
    };
    let Some(access) = matmul_simt::accesses(spec) else {
        return Err(err!(
            Invariant,
            "the {} matmul needs operands with a unit stride, not {:?} and {:?}",
            k.name(),
            spec.a,
            spec.b
        ));
    };
    k.tile.check(k.subgroup)?;
    let exps = Resource::Scratch { slot: EXPONENT_SLOT };
    let ws = Resource::Scratch { slot: WORKSPACE_SLOT };
    let convert = coop_convert::program(
        spec,
        &k,
        access,
        [params_uniform(spec), a, b, ws.clone(), exps.clone()],
        sums,
        prologues,
        &format!("{label} convert"),
    )?;
    let (decls, body) = epilogue.map_or(("", "return v;"), |e| (&e.decls, &e.body));
    let bind = |at, name: &str, resource, words| Binding { at, name: name.into(), resource, words };
    let c_words = spec.c.words(spec.batch, spec.m, spec.n);
    let mut bindings = vec![bind(0, "p", params_uniform(spec), 0), bind(3, "c", c, c_words)];
    bindings.extend(epilogue_bindings(epilogue));
    let ws_words = coop_convert::workspace_words(&k, access, spec);
    bindings.push(bind(coop_convert::WORKSPACE_BINDING, "ws", ws, ws_words));
    let exp_words = coop_convert::exponent_words(&k, spec);
    bindings.push(bind(coop_convert::EXPONENT_BINDING, "exps", exps, exp_words));
    let (bm, bn) = tile.block();
    let s = spec;
    let product = Program {
        label,
        wgsl: matmul_coop::generate(
            &k,
            access,
            spec.k,
            matmul_coop::Epilogue { decls, body, loads: epilogue.map_or(0, |e| e.loads) },
        ),
        entry: "main",
        workgroup_size: k.threads(),
        bindings,
        grid: Grid::Fixed([s.n.div_ceil(bn), s.m.div_ceil(bm), s.batch]),
        // Its reads stay inside the workspace's padded planes, its loops end, and its
        // epilogue's loads of other buffers clamp their indices: the runtime's bounds checks
        // on every access cost gpt-medium's 4096x3072x768 products with a GELU-gradient
        // epilogue 258 µs each on the H200.
        checks: ShaderChecks { bounds: false, loop_bounding: false },
    };
    Ok(vec![convert, product])
}

/// The `Params` uniform of `s` (`shaders/matmul.wgsl`'s, read by every matmul kernel).
fn params_uniform(s: &MatmulSpec) -> Resource {
    let params = Params {
        dims: [s.m, s.n, s.k, s.batch],
        a: [s.a.offset, s.a.batch_stride, s.a.row_stride, s.a.col_stride],
        b: [s.b.offset, s.b.batch_stride, s.b.row_stride, s.b.col_stride],
        c: [s.c.offset, s.c.batch_stride, s.c.row_stride, s.c.col_stride],
        alpha: s.alpha,
        beta: s.beta,
        pad: [0; 2],
    };
    Resource::Uniform(bytemuck::bytes_of(&params).to_vec())
}

/// The `Params` uniform, A, B and C (bindings 0 to 3) and the epilogue's buffers (4 on).
fn bindings(
    s: &MatmulSpec,
    epilogue: Option<&MatmulEpilogue>,
    [a, b, c]: [Resource; 3],
) -> Vec<Binding> {
    let operand = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    let mut bindings = vec![
        operand(0, "p", params_uniform(s), 0),
        operand(1, "a", a, s.a.words(s.batch, s.m, s.k)),
        operand(2, "b", b, s.b.words(s.batch, s.k, s.n)),
        operand(3, "c", c, s.c.words(s.batch, s.m, s.n)),
    ];
    bindings.extend(epilogue_bindings(epilogue));
    bindings
}

/// The epilogue's buffers (bindings 4 on).
fn epilogue_bindings(epilogue: Option<&MatmulEpilogue>) -> Vec<Binding> {
    let extra = epilogue.map_or(&[][..], |e| &e.extra);
    let bind = |(i, &buffer): (usize, &usize)| Binding {
        at: 4 + i as u32,
        name: format!("e{i}"),
        resource: Resource::Buffer(buffer),
        words: 0,
    };
    extra.iter().enumerate().map(bind).collect()
}

/// The programs of matmul kernel `k` with its epilogue generated, and the name of the tile its
/// product runs on (`empty` for a product with nothing to write), when the operands can be described by strides (contiguous buffers, optionally
/// transposed, batch equal or broadcast) and the grid fits `target`; `None` when the generated
/// kernel must do it.
pub fn lower(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    (mm, register): (NodeId, NodeId),
    target: &Target,
) -> Result<Option<(Vec<Program>, &'static str)>> {
    let Some(out) = k.outputs.last().copied() else { return Ok(None) };
    let Some(epilogue) = matmul_epilogue(g, plan, k, register) else {
        return Ok(None);
    };
    let node = g.node(mm);
    let (sa, sb, so) = (g.shape(node.inputs[0]), g.shape(node.inputs[1]), &node.shape);
    let r = so.len();
    let (m, n, kk) = (so[r - 2], so[r - 1], sa[sa.len() - 1]);
    let batch: usize = so[..r - 2].iter().product();
    if m * n * batch == 0 {
        // An empty product: nothing to write but the sum of B, if the kernel computes one.
        let sum = k.without_sum(g).1.map(|r| super::wgsl::generate(g, plan, &r, target));
        return Ok(Some((sum.unwrap_or_default(), "empty")));
    }
    let fits = |v: usize| u32::try_from(v).is_ok();
    if ![m, n, kk, batch, m * n * batch].iter().all(|&v| fits(v)) {
        return Ok(None);
    }
    let (Some((a_src, a_op, a_pro)), Some((b_src, b_op, b_pro))) = (
        operand(g, plan, node.inputs[0], sa, batch, m, kk),
        operand(g, plan, node.inputs[1], sb, batch, kk, n),
    ) else {
        return Ok(None);
    };
    let buffer = |id: NodeId| plan.value_of(id).map(|v| Resource::Buffer(v.buffer));
    let (Some(a), Some(b), Some(c)) = (buffer(a_src), buffer(b_src), buffer(out)) else {
        return Ok(None);
    };
    let mut spec = MatmulSpec {
        batch: batch as u32,
        m: m as u32,
        n: n as u32,
        k: kk as u32,
        a: a_op,
        b: b_op,
        c: Operand::row_major(m as u32, n as u32),
        alpha: 1.0,
        beta: 0.0,
    };
    // The shape in the label tells a profile's products apart (`scripts/bench/profile_top.py`).
    let batch_name = if batch > 1 { format!("{batch}x") } else { String::new() };
    let label = format!("{} #{} {batch_name}{m}x{n}x{kk}", k.kind.name(), out.index());
    let (mut tile, mut splits) = MatmulTile::choose_split(&spec, target);
    // An operand read through a prologue: the conversion of a cooperative product applies
    // it; for any other kernel a program first writes the chain's value into scratch.
    let mut prologues = [a_pro, b_pro];
    let (mut a, mut b) = (a, b);
    let mut pre = Vec::new();
    // The stats of the LayerNorm A reads, computed by this kernel (`plan::fuse::norm_prologue`):
    // by the conversion, each of whose strips holds whole rows of A; on an fp32 kernel by the
    // LayerNorm's own program into scratch.
    let mut computed_norm = None;
    if let Some((s, eps)) = k.norm_stats(g) {
        let op = &spec.a;
        let whole_rows = spec.batch == 1 && op.offset == 0 && op.row_stride == spec.k && op.col_stride == 1;
        let norm = prologues[0].norm.as_mut().filter(|n| n.stats_node == s && n.d == spec.k && whole_rows);
        let (Some(norm), true) = (norm, prologues[0].ops.is_empty()) else {
            return Err(err!(Invariant, "{label}: computes LayerNorm stats #{} its A does not read as whole rows", s.index()));
        };
        norm.eps = Some(eps);
        if !matches!(tile, MatmulTile::Coop(_)) {
            let n = prologues[0].norm.take().expect("checked above");
            let slot = Resource::Scratch { slot: super::prologue::PROLOGUE_SLOTS[0] };
            let buf = super::layer_norm::Forward {
                x: std::mem::replace(&mut a, slot.clone()),
                weight: n.weight,
                bias: n.bias,
                y: slot,
                stats: n.stats,
            };
            let mut p = super::layer_norm::forward(spec.m as usize, spec.k as usize, eps, buf)?;
            p.label = format!("{label} layer_norm A");
            computed_norm = Some(p);
        }
    }
    if !matches!(tile, MatmulTile::Coop(_)) && prologues.iter().any(|p| !p.is_empty()) {
        for (side, name) in [(0, "A"), (1, "B")] {
            let p = std::mem::take(&mut prologues[side]);
            // K = 0: the product reads nothing of its operands.
            if p.is_empty() || spec.k == 0 {
                continue;
            }
            let (op, dims, res) = match side {
                0 => (&mut spec.a, (spec.batch, spec.m, spec.k), &mut a),
                _ => (&mut spec.b, (spec.batch, spec.k, spec.n), &mut b),
            };
            let slot = Resource::Scratch { slot: super::prologue::PROLOGUE_SLOTS[side] };
            let from = std::mem::replace(res, slot.clone());
            pre.push(super::prologue::program(&p, dims, *op, [from, slot], &format!("{label} prologue {name}"))?);
            let row_major = Operand::row_major(dims.1, dims.2);
            *op = if op.batch_stride == 0 { row_major.broadcast() } else { row_major };
        }
        (tile, splits) = MatmulTile::choose_split(&spec, target);
    }
    if let Some(l) = computed_norm {
        pre.insert(0, l); // the LayerNorm into scratch for an fp32 kernel, its stats too
    }
    let (bm, bn) = tile.block();
    let max = target.max_workgroups_per_dimension as usize;
    if n.div_ceil(bn as usize) > max || m.div_ceil(bm as usize) > max || batch > max {
        return Ok(None); // the generated kernel splits any grid
    }
    // A sum of B the kernel computes too: in a cooperative product's conversion when B is
    // the summed value, unstrided; else by the reduction's own dispatches after the product.
    let (_, reduce) = k.without_sum(g);
    let summed = reduce.as_ref().map(|r| r.outputs[0]);
    let in_conversion = summed.filter(|&s| {
        let whole_b = spec.b.offset == 0 && spec.b.row_stride == spec.n && spec.b.col_stride == 1;
        let same = |x: NodeId| plan.value_of(x).map(|v| v.node);
        matches!(tile, MatmulTile::Coop(_))
            && batch == 1
            && whole_b
            && same(g.node(s).inputs[0]) == same(b_src)
    });
    let sums = in_conversion.and_then(buffer);
    let mut progs = pre;
    progs.extend(if splits > 1 {
        split_k_programs(&spec, (tile, splits), [a, b, c], &epilogue, &label, sums.clone(), &prologues)?
    } else {
        programs_with(&label, &spec, tile, Some(&epilogue), [a, b, c], sums.clone(), &prologues)?
    });
    if let (Some(r), None) = (&reduce, sums) {
        progs.extend(super::wgsl::generate(g, plan, r, target));
    }
    Ok(Some((progs, tile.name())))
}

/// Workgroups of the split-K sum at most: about four waves of an H200-class GPU's resident
/// threads, so each thread of a large output sums several of its vectors (a grid-stride loop)
/// and no output needs more workgroups than an axis allows.
pub const SUM_WORKGROUPS: u32 = 4096;

/// Split-K: `splits` partial products over slices of K on `tile` (one batched matmul into
/// scratch slot 0), then one generated kernel that sums the slices and applies the epilogue
/// ([`split_k_sum`]).
///
/// With `sums`, the partial products' conversion writes each slice's column sums of B into
/// scratch slot [`SUM_SLOT`] and the split-K sum adds them up into `sums`.
fn split_k_programs(
    spec: &MatmulSpec,
    (tile, splits): (MatmulTile, u32),
    [a, b, c]: [Resource; 3],
    epilogue: &MatmulEpilogue,
    label: &str,
    sums: Option<Resource>,
    prologues: &[Prologue; 2],
) -> Result<Vec<Program>> {
    let parts = Resource::Scratch { slot: 0 };
    let part = partial(spec, splits);
    let slices = sums.as_ref().map(|_| Resource::Scratch { slot: SUM_SLOT });
    let label_k = format!("{label} split-k {splits}");
    let ops = [a, b, parts.clone()];
    let mut out = programs_with(&label_k, &part, tile, None, ops, slices.clone(), prologues)?;
    let shape = (spec.m, spec.n, splits);
    let sums = slices.zip(sums).map(|(p, s)| [p, s]);
    out.push(split_k_sum(shape, [parts, c], epilogue, SUM_WORKGROUPS, label, sums));
    Ok(out)
}

/// The kernel that sums the `splits` row-major `[m, n]` slices of `parts` (one after another)
/// into `c` and applies `epilogue` (its buffers bound from 4 on), labelled `{label} split-k
/// sum`.
///
/// It is bound by memory: where `m x n` is a multiple of 4 each thread reads and writes
/// `vec4`s (every slice then starts on a vector), otherwise single elements. It runs at most
/// `max_workgroups` workgroups ([`SUM_WORKGROUPS`] in a plan), a thread taking the vectors `t`,
/// `t + stride`, … of the output. The epilogue runs per element at its own `(0, i, j)`,
/// whatever row each lane of a vector falls in. With `sums` (`[slices, out]`) it also adds
/// the `splits` row-major `[n]` slices of column sums into `out`.
pub fn split_k_sum(
    (m, n, splits): (u32, u32, u32),
    [parts, c]: [Resource; 2],
    epilogue: &MatmulEpilogue,
    max_workgroups: u32,
    label: &str,
    sums: Option<[Resource; 2]>,
) -> Program {
    let mn = u64::from(m) * u64::from(n);
    let lanes: u64 = if mn.is_multiple_of(4) { 4 } else { 1 };
    let ty = if lanes == 4 { "vec4<f32>" } else { "f32" };
    let vectors = mn / lanes;
    let workgroups = vectors.div_ceil(u64::from(WG)).clamp(1, u64::from(max_workgroups.max(1)));
    let stride = workgroups * u64::from(WG);
    let rounds = vectors.div_ceil(stride);

    let mut w = Wgsl::new();
    w.line("alias scalar = f32;");
    w.line(&format!("@group(0) @binding(0) var<storage, read> parts: array<{ty}>;"));
    w.line(&format!("@group(0) @binding(1) var<storage, read_write> c: array<{ty}>;"));
    if sums.is_some() {
        w.line("@group(0) @binding(2) var<storage, read> slices: array<f32>;");
        w.line("@group(0) @binding(3) var<storage, read_write> sums: array<f32>;");
    }
    w.lines(&epilogue.decls);
    w.blank();
    w.open("fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar");
    w.lines(&epilogue.body);
    w.close();
    w.blank();
    w.line(&format!("@compute @workgroup_size({WG})"));
    w.open(&format!("fn main({MAIN_ARGS})"));
    w.line(&format!("let t = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
    w.block(&format!("if (t >= {stride}u)"), &["return;"]);
    if sums.is_some() {
        w.open(&format!("for (var j = t; j < {n}u; j += {stride}u)"));
        w.line("var s = slices[j];");
        for s in 1..splits {
            w.line(&format!("s += slices[{}u + j];", u64::from(s) * u64::from(n)));
        }
        w.line("sums[j] = s;");
        w.close();
    }
    w.open(&format!("for (var r = 0u; r < {rounds}u; r++)"));
    w.line(&format!("let g = t + r * {stride}u;"));
    w.block(&format!("if (g >= {vectors}u)"), &["return;"]);
    // Every slice's load is issued before the first add needs it.
    w.line("var v = parts[g];");
    for s in 1..u64::from(splits) {
        w.line(&format!("v += parts[{}u + g];", s * vectors));
    }
    if lanes == 4 {
        w.line("let e = g * 4u;");
        for (k, x) in ["x", "y", "z", "w"].into_iter().enumerate() {
            let e = if k == 0 { "e".to_string() } else { format!("(e + {k}u)") };
            w.line(&format!("let o{k} = epilogue(v.{x}, 0u, {e} / {n}u, {e} % {n}u);"));
        }
        w.line("c[g] = vec4<f32>(o0, o1, o2, o3);");
    } else {
        w.line(&format!("c[g] = epilogue(v, 0u, g / {n}u, g % {n}u);"));
    }
    w.close();
    w.close();
    let mut bindings = vec![
        Binding { at: 0, name: "parts".into(), resource: parts, words: mn * u64::from(splits) },
        Binding { at: 1, name: "c".into(), resource: c, words: mn },
    ];
    if let Some([slices, out]) = sums {
        let words = u64::from(n);
        let all = words * u64::from(splits);
        bindings.push(Binding { at: 2, name: "slices".into(), resource: slices, words: all });
        bindings.push(Binding { at: 3, name: "sums".into(), resource: out, words });
    }
    bindings.extend(epilogue_bindings(Some(epilogue)));
    Program {
        label: format!("{label} split-k sum"),
        wgsl: w.finish(),
        entry: "main",
        workgroup_size: WG,
        bindings,
        grid: Grid::Linear(workgroups as u32),
        // Its loops run to counts fixed here: the loop guard would cost time and guard nothing.
        checks: ShaderChecks { bounds: true, loop_bounding: false },
    }
}

/// Describe matmul operand `id` (logical `[batch.., rows, cols]`) as strides over a buffer: a
/// materialized value, or a strided view of one (a transpose, a slice, heads of a projection:
/// `plan::view`) whose batch axes one stride steps through. Batch dims must equal the
/// output's or be all 1 (broadcast).
fn operand(
    g: &Graph,
    plan: &Plan,
    id: NodeId,
    shape: &[usize],
    batch: usize,
    rows: usize,
    cols: usize,
) -> Option<(NodeId, Operand, Prologue)> {
    let own_batch: usize = shape[..shape.len() - 2].iter().product();
    let broadcast = own_batch == 1 && batch != 1;
    if own_batch != batch && !broadcast {
        return None;
    }
    let (src, view, prologue) = super::prologue::operand_source(g, plan, id)?;
    let op = match view.as_ref() {
        None => Operand::row_major(rows as u32, cols as u32),
        Some(v) => {
            let [b, r, c] = v.matrix(shape)?;
            let word = |n: usize| u32::try_from(n).ok();
            Operand {
                offset: word(v.offset)?,
                batch_stride: word(b)?,
                row_stride: word(r)?,
                col_stride: word(c)?,
            }
        }
    };
    Some((src, if broadcast { op.broadcast() } else { op }, prologue))
}
