//! The `medium` and `high` matmul kernels: f16 products with f32 accumulation on 16x16x16
//! cooperative matrices (`enable wgpu_cooperative_matrix;`, tensor cores on NVIDIA).
//!
//! A product is two dispatches: the conversion ([`super::coop_convert`]), which writes both
//! operands scaled to f16 (`high`: hi and lo parts) into a workspace of zero-padded planes,
//! with an exponent for each strip of 16 rows of A and 16 columns of B, and the product here,
//! which reads only f16.
//!
//! A workgroup of `wm x wn` subgroups computes `bm x bn` of C; subgroup `(wr, wc)` owns
//! `fm x fn` accumulator fragments. K goes in slices of `bk`: each thread loads its 16-byte
//! units (8 halves) of the next slice from the workspace into registers while the current
//! slice is multiplied, then stores them into workgroup memory laid out like the operand
//! (`[outer][contig]`, rows padded by 8 halves, as `vec4<f16>`), so fragments load row-major
//! (`coopLoadT`) for a row-major operand and column-major (`coopLoad`) for a transposed one.
//! The planes are padded to whole tiles with zeros, so every load is inside the workspace and
//! every cooperative operation runs for every slice in uniform control flow, whatever M, N and
//! K are. The 16-deep steps of a slice are a loop (the driver unrolls it).
//!
//! `high` sums hi·hi + hi·lo + lo·hi (Ootomo and Yokota, arXiv 2203.03341), `hi` the element
//! rounded to 11 significant bits by masking and `lo` the rest; the mask, not
//! `x - f32(f16(x))`, because the H200's driver folded that to zero. As the paper does:
//! - lo is stored times `2^LO_SHIFT`, in f16's range like hi; unscaled, the lo of every
//!   element more than 2^15 below its operand's max-abs was an f16 subnormal and lost bits
//!   (an outlier 2^16 above the rest of an operand: largest error 15 times fp32's, emulated);
//! - the cross products go to accumulators of their own (`accx`), added times
//!   `2^-LO_SHIFT` at the end;
//! - hi·hi of each 16-deep step starts from a zero accumulator and is added to `acc` on the
//!   SIMT cores: the tensor cores round their sums toward zero, and that bias, summed over
//!   all of K in one accumulator, was `high`'s largest error on the H200 (4096³, normal
//!   operands, median error against f64: 2.2e-7 before, 7.6e-8 with scaled lo parts alone,
//!   3.9e-9 with both; fp32 1.5e-8), at 21 % of its speed (79.5 to 62.9 TFLOP/s).
//!
//! Range: the conversion multiplies each strip by `2^e`, `e` from its max-abs, so its largest
//! element lands in `[2^14, 2^15)`; the product multiplies each fragment by `2^-ea · 2^-eb`
//! (its rows' and its columns' strips) before the epilogue (exact). Without it f16 turns
//! elements beyond 65504 into infinities and flushes those below 6e-8.
//!
//! Fragments reach C through a per-subgroup 16x16 f32 scratch in workgroup memory (there is no
//! per-element access to a fragment): `coopStoreT`, barrier, each invocation applies the
//! epilogue to its share and stores it with bounds checks. A product without an epilogue
//! stores the fragments of blocks inside C straight into it (`Gen::direct_store`).
//!
//! Emulated ([`CoopKernel::emulate`]), the workspace holds halves packed by `pack2x16float`,
//! staged values are unpacked to f32, fragments become `vec2<u32>(offset, stride)` references
//! into the staging memory and the cooperative operations plain functions with the same
//! meaning, so the same two dispatches run (slowly) on adapters without cooperative matrices
//! or f16: the GPU-vs-CPU tests on lavapipe and on Mesa's OpenGL adapter.
//!
//! Ported from the issue-11 prototype (round 2, pre-converted operands), correct at every shape
//! it was run on on the H200 (`medium` 128x128x64 w2x4 and `high` 128x128x32 w4x2 were its
//! fastest tiles).

use super::coop_convert::{layout, strips, workspace_decl, EXPONENT_BINDING, STRIP};
use super::matmul_simt::{
    block_entry, epilogue_and_store, params, slice, store_with_loads, Access, Side, Slice,
};
use super::writer::Wgsl;
use crate::err;
use crate::error::Result;

/// Which cooperative mode a kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopMode {
    /// Split-f16: three products per 16-deep step.
    High,
    /// One f16 product.
    Medium,
}

/// Tile of a cooperative kernel: a workgroup computes `bm x bn` of C with `wm x wn` subgroups,
/// each owning `(bm / wm / 16) x (bn / wn / 16)` fragments of 16x16; K in slices of `bk`
/// (`stages` 1: one staging buffer and two barriers per slice; 2: double buffer and one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
    pub stages: u32,
}

/// The tiles measured fastest on the H200 with pre-converted operands (issue-11 prototype,
/// round 2, 2026-11-30).
pub const MEDIUM_TILE: CoopTile = CoopTile { bm: 128, bn: 128, bk: 64, wm: 2, wn: 4, stages: 1 };
/// See [`MEDIUM_TILE`].
pub const HIGH_TILE: CoopTile = CoopTile { bm: 128, bn: 128, bk: 32, wm: 4, wn: 2, stages: 1 };

/// `medium`'s tile for long products: four subgroups of 64x64, a slice of 32, half the
/// workgroup memory, so more blocks share a multiprocessor. On the H200 (2026-12-01) 4096³
/// 218 TFLOP/s against [`MEDIUM_TILE`]'s 163 (product alone), and faster on every GPT product
/// of K 2304 and more with a wave of blocks; slower at K 768 (an epilogue's 128 elements an
/// invocation instead of 64) and below a wave (4 subgroups a multiprocessor).
pub const WIDE_MEDIUM_TILE: CoopTile =
    CoopTile { bm: 128, bn: 128, bk: 32, wm: 2, wn: 2, stages: 1 };

/// The tiles of `mode` the cost model chooses between for each product
/// ([`super::matmul_cost`]): the mode's tile and its half in M (measured on the H200 at GPT
/// shapes: faster for products of few blocks, e.g. 4096x256), and for `medium` its tile for
/// long products.
pub fn tiles(mode: CoopMode) -> Vec<CoopTile> {
    let big = match mode {
        CoopMode::High => HIGH_TILE,
        CoopMode::Medium => MEDIUM_TILE,
    };
    let mut tiles = vec![big, CoopTile { bm: big.bm / 2, wm: 2, wn: 4, ..big }];
    if mode == CoopMode::Medium {
        tiles.push(WIDE_MEDIUM_TILE);
    }
    tiles
}

/// Halves of padding after each staged row.
const PAD: u32 = 8;

/// `high` stores each lo part multiplied by `2^LO_SHIFT` (Ootomo and Yokota): in f16's range
/// like the hi parts, not subnormal for elements far below the operand's max-abs.
pub const LO_SHIFT: u32 = 11;

impl CoopTile {
    /// Parse `BMxBNxBK` followed by `wWMxWN` (e.g. `128x128x64w2x4`, spaces allowed), optionally
    /// `s2` for two stages: the form `RUMUS_MATMUL_COOP_TILE` takes.
    pub fn parse(s: &str) -> Result<CoopTile> {
        let bad = || {
            err!(
                InvalidArgument,
                "cooperative tile `{s}` is not of the form BMxBNxBKwWMxWN[s2], e.g. 128x128x64w2x4"
            )
        };
        let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let (t, stages) = match t.split_once('s') {
            Some((t, st)) => (t.to_string(), st.parse::<u32>().map_err(|_| bad())?),
            None => (t, 1),
        };
        let (block, warps) = t.split_once('w').ok_or_else(bad)?;
        let nums = |p: &str| -> Result<Vec<u32>> {
            p.split('x').map(|v| v.parse::<u32>().map_err(|_| bad())).collect()
        };
        match (nums(block)?.as_slice(), nums(warps)?.as_slice()) {
            (&[bm, bn, bk], &[wm, wn]) => Ok(CoopTile { bm, bn, bk, wm, wn, stages }),
            _ => Err(bad()),
        }
    }

    /// `128x128x64 w2x4` (with ` s2` for two stages).
    pub fn name(&self) -> String {
        let s = if self.stages == 2 { " s2" } else { "" };
        format!("{}x{}x{} w{}x{}{s}", self.bm, self.bn, self.bk, self.wm, self.wn)
    }

    /// An error unless the tile splits evenly for subgroups of `sg`: whole 16x16 fragments per
    /// subgroup, slices a multiple of 16 deep, the 16-byte units (8 halves) of each slice a
    /// multiple of the threads, 1 or 2 stages.
    pub fn check(&self, sg: u32) -> Result<()> {
        let t = self;
        let name = t.name();
        if t.stages != 1 && t.stages != 2 {
            return Err(err!(InvalidArgument, "cooperative tile {name}: stages must be 1 or 2"));
        }
        if [t.bm, t.bn, t.bk].iter().any(|&d| d > 1024) || t.wm > 64 || t.wn > 64 {
            return Err(err!(
                InvalidArgument,
                "cooperative tile {name}: blocks above 1024 or more than 64x64 subgroups fit no device"
            ));
        }
        let frags = t.wm > 0
            && t.wn > 0
            && t.bm.is_multiple_of(16 * t.wm)
            && t.bn.is_multiple_of(16 * t.wn);
        if !frags || t.bm == 0 || t.bn == 0 {
            return Err(err!(
                InvalidArgument,
                "cooperative tile {name}: the block does not split into {}x{} subgroups of whole 16x16 fragments",
                t.wm,
                t.wn
            ));
        }
        if t.bk == 0 || !t.bk.is_multiple_of(16) {
            return Err(err!(
                InvalidArgument,
                "cooperative tile {name}: the slice depth must be a positive multiple of 16"
            ));
        }
        if sg == 0 || !256u32.is_multiple_of(sg) {
            return Err(err!(
                InvalidArgument,
                "subgroups of {sg} do not divide a 16x16 fragment's 256 elements"
            ));
        }
        let threads = t.wm * t.wn * sg;
        for (x, units) in [("a", t.bm * t.bk / 8), ("b", t.bk * t.bn / 8)] {
            if !units.is_multiple_of(threads) {
                return Err(err!(
                    InvalidArgument,
                    "cooperative tile {name}: the {units} 8-half units of a slice of {x} do not divide among {threads} threads"
                ));
            }
        }
        Ok(())
    }
}

/// One cooperative kernel: mode, tile, the subgroup size it is written for, and whether the
/// cooperative operations are emulated in plain WGSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopKernel {
    pub mode: CoopMode,
    pub tile: CoopTile,
    /// Invocations per subgroup (32 on NVIDIA; emulated subgroups are virtual, 32 as well).
    pub subgroup: u32,
    pub emulate: bool,
}

impl CoopKernel {
    /// Threads per workgroup.
    pub fn threads(&self) -> u32 {
        self.tile.wm * self.tile.wn * self.subgroup
    }

    /// Bytes of workgroup memory the kernel declares (staging for hi and lo parts with `high`,
    /// plus a 16x16 f32 scratch per subgroup), for an operand layout `access`.
    pub fn workgroup_bytes(&self, access: [Access; 2]) -> u32 {
        let t = &self.tile;
        let (a, b) = stage_halves(t, access);
        let copies = if self.mode == CoopMode::High { 2 } else { 1 };
        let bytes = if self.emulate { 4 } else { 2 };
        t.stages * copies * (a + b) * bytes + t.wm * t.wn * 256 * 4
    }

    /// The name reports use: `coop-high`, `coop-medium`.
    pub fn name(&self) -> &'static str {
        match self.mode {
            CoopMode::High => "coop-high",
            CoopMode::Medium => "coop-medium",
        }
    }
}

/// Halves of one stage of the A and the B staging buffers.
fn stage_halves(t: &CoopTile, access: [Access; 2]) -> (u32, u32) {
    let sa = slice((t.bm, t.bn, t.bk), Side::A, access[0]);
    let sb = slice((t.bm, t.bn, t.bk), Side::B, access[1]);
    (sa.outer * (sa.contig + PAD), sb.outer * (sb.contig + PAD))
}

/// One staging buffer: its WGSL name and whether fragments read it row-major.
struct Buf {
    name: &'static str,
    row_major: bool,
}

/// The longest K whose `high` products store fragments straight into C (`Gen::direct_store`;
/// `medium` always does).
pub const DIRECT_HIGH_MAX_K: u32 = 768;

/// The WGSL of kernel `k` for products of depth `depth` (K) reading the f16 planes of A and B
/// (laid out as `access` says) from the workspace of [`super::coop_convert`], with the
/// epilogue's declarations (`@binding(4)` on) and body. The tile must pass
/// [`CoopTile::check`].
pub fn generate(k: &CoopKernel, access: [Access; 2], depth: u32, epilogue: Epilogue) -> String {
    let short = depth <= DIRECT_HIGH_MAX_K;
    let direct = epilogue.body.trim() == "return v;" && (k.mode == CoopMode::Medium || short);
    let mut g = Gen::new(k, access, direct);
    // Each invocation holds `loads` values for each of its elements of C until the scratch
    // path reaches them (64 elements with the tiles of `tiles`): up to 2 a element, fewer
    // registers than the K loop takes.
    let elements = g.fm * g.fnn * g.per_lane();
    if epilogue.loads > 0 && epilogue.loads * elements <= 128 {
        g.loads = epilogue.loads;
    }
    g.module(epilogue.decls, epilogue.body)
}

/// What [`generate`] needs of a product's epilogue (`super::wgsl::MatmulEpilogue`): its
/// declarations and body, and how many values it loads when its loads are split out.
#[derive(Clone, Copy)]
pub struct Epilogue<'a> {
    /// Its bindings (`@binding(4)` on) and helper functions, at module scope.
    pub decls: &'a str,
    /// The body of `fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar`.
    pub body: &'a str,
    /// Values `epilogue_loads` returns an element, 0 when the loads are not split out.
    pub loads: u32,
}

impl Epilogue<'_> {
    /// No epilogue: C is the product.
    pub const NONE: Epilogue<'static> = Epilogue { decls: "", body: "return v;", loads: 0 };
}

/// `fn split_hi(x: vec4<f32>) -> vec4<f32>`: x rounded to 11 significant bits by masking
/// (exact in f16 within its normal range).
pub(super) fn split_hi_fn(w: &mut Wgsl) {
    w.line("// x rounded to 11 significant bits (exact in f16 within its normal range).");
    w.open("fn split_hi(x: vec4<f32>) -> vec4<f32>");
    w.line("let bits = (bitcast<vec4<u32>>(x) + vec4<u32>(0x1000u)) & vec4<u32>(0xffffe000u);");
    w.line("return bitcast<vec4<f32>>(bits);");
    w.close();
    w.blank();
}

struct Gen<'a> {
    k: &'a CoopKernel,
    t: CoopTile,
    sg: u32,
    threads: u32,
    fm: u32,
    fnn: u32,
    high: bool,
    access: [Access; 2],
    sa: Slice,
    sb: Slice,
    /// Halves per staged row of A and of B, and per stage.
    a_row: u32,
    b_row: u32,
    stage_a: u32,
    stage_b: u32,
    /// Blocks inside C store their fragments straight into it ([`Gen::direct_store`]).
    direct: bool,
    /// Values the epilogue loads per element, loaded for all of an invocation's elements
    /// before the scratch path (0: the epilogue loads as it goes).
    loads: u32,
}

impl<'a> Gen<'a> {
    fn new(k: &'a CoopKernel, access: [Access; 2], direct: bool) -> Gen<'a> {
        let t = k.tile;
        let sa = slice((t.bm, t.bn, t.bk), Side::A, access[0]);
        let sb = slice((t.bm, t.bn, t.bk), Side::B, access[1]);
        let (a_row, b_row) = (sa.contig + PAD, sb.contig + PAD);
        Gen {
            k,
            t,
            sg: k.subgroup,
            threads: k.threads(),
            fm: t.bm / t.wm / 16,
            fnn: t.bn / t.wn / 16,
            high: k.mode == CoopMode::High,
            access,
            stage_a: sa.outer * a_row,
            stage_b: sb.outer * b_row,
            a_row,
            b_row,
            sa,
            sb,
            direct,
            loads: 0,
        }
    }

    /// Elements of an accumulator fragment each invocation holds when emulating.
    fn per_lane(&self) -> u32 {
        256 / self.sg
    }

    /// Units (8 halves) of a slice each thread loads.
    fn per_thread(&self, s: &Slice) -> u32 {
        s.outer * s.contig / 8 / self.threads
    }

    /// The parts of an operand: `""` (hi, or the only one) and `"l"` (lo) with `high`.
    fn parts(&self) -> &'static [&'static str] {
        if self.high {
            &["", "l"]
        } else {
            &[""]
        }
    }

    /// The prefetch registers of `n` units of operand `x`: per part, one `vec4<u32>` of packed
    /// halves when emulating, two `vec4<f16>` otherwise; with their types when `typed`.
    fn regs(&self, x: &str, n: u32, typed: bool) -> Vec<String> {
        let mut v = Vec::new();
        for l in 0..n {
            for part in self.parts() {
                if self.k.emulate {
                    let ty = if typed { ": vec4<u32>" } else { "" };
                    v.push(format!("q{x}{part}{l}{ty}"));
                } else {
                    let ty = if typed { ": vec4<f16>" } else { "" };
                    v.push(format!("q{x}{part}{l}_0{ty}"));
                    v.push(format!("q{x}{part}{l}_1{ty}"));
                }
            }
        }
        v
    }

    fn bufs(&self) -> (Vec<Buf>, Vec<Buf>) {
        let (ra, rb) = (self.access[0].row_major, self.access[1].row_major);
        let mut a = vec![Buf { name: "sa", row_major: ra }];
        let mut b = vec![Buf { name: "sb", row_major: rb }];
        if self.high {
            a.push(Buf { name: "sal", row_major: ra });
            b.push(Buf { name: "sbl", row_major: rb });
        }
        (a, b)
    }

    fn module(&self, decls: &str, body: &str) -> String {
        let (t, k) = (&self.t, self.k);
        let mut w = Wgsl::new();
        if !k.emulate {
            w.line("enable f16;");
            w.line("enable wgpu_cooperative_matrix;");
        }
        w.line("alias scalar = f32;");
        let emulated = if k.emulate { ", emulated" } else { "" };
        w.line(&format!(
            "// {} matmul {}, subgroups of {}{emulated} (codegen/matmul_coop.rs)",
            k.name(),
            t.name(),
            self.sg
        ));
        w.blank();
        params(&mut w);
        w.line("@group(0) @binding(3) var<storage, read_write> c: array<f32>;");
        w.lines(decls);
        w.line(&workspace_decl(k.emulate, "read"));
        w.line(&format!(
            "@group(0) @binding({EXPONENT_BINDING}) var<storage, read_write> exps: array<i32>;"
        ));
        w.blank();
        let (abufs, bbufs) = self.bufs();
        let elem = if k.emulate { "vec4<f32>" } else { "vec4<f16>" };
        for buf in &abufs {
            let n = t.stages * self.stage_a / 4;
            w.line(&format!("var<workgroup> {}: array<{elem}, {n}>;", buf.name));
        }
        for buf in &bbufs {
            let n = t.stages * self.stage_b / 4;
            w.line(&format!("var<workgroup> {}: array<{elem}, {n}>;", buf.name));
        }
        w.line(&format!("var<workgroup> scratch: array<f32, {}>;", t.wm * t.wn * 256));
        w.blank();
        epilogue_and_store(&mut w, body);
        if self.loads > 0 {
            store_with_loads(&mut w, self.loads);
        }
        self.stage_fn(&mut w, &self.sa, self.a_row, &abufs);
        self.stage_fn(&mut w, &self.sb, self.b_row, &bbufs);
        if k.emulate {
            self.emulation(&mut w, &abufs, &bbufs);
        }
        self.main(&mut w, &abufs, &bbufs);
        w.finish()
    }

    /// `fn stage_a(t, base, qa0_0, ...)`: this thread's units (hi, and lo with `high`) stored
    /// at `base` (in halves) of the staging buffers; emulated, unpacked to f32.
    fn stage_fn(&self, w: &mut Wgsl, s: &Slice, row: u32, bufs: &[Buf]) {
        let x = s.x;
        let per_row = s.contig / 8;
        let n = self.per_thread(s);
        let params = self.regs(x, n, true).join(", ");
        w.open(&format!("fn stage_{x}(t: u32, base: u32, {params})"));
        for l in 0..n {
            let g = format!("(t + {}u)", l * self.threads);
            w.line(&format!(
                "let h{l} = (base + ({g} / {per_row}u) * {row}u + 8u * ({g} % {per_row}u)) / 4u;"
            ));
            for (part, buf) in self.parts().iter().zip(bufs) {
                let q = format!("q{x}{part}{l}");
                let name = buf.name;
                if self.k.emulate {
                    let unpack = |a: &str, b: &str| {
                        format!("vec4<f32>(unpack2x16float({q}.{a}), unpack2x16float({q}.{b}))")
                    };
                    w.line(&format!("{name}[h{l}] = {};", unpack("x", "y")));
                    w.line(&format!("{name}[h{l} + 1u] = {};", unpack("z", "w")));
                } else {
                    w.line(&format!("{name}[h{l}] = {q}_0;"));
                    w.line(&format!("{name}[h{l} + 1u] = {q}_1;"));
                }
            }
        }
        w.close();
        w.blank();
    }

    /// Lines loading this thread's units of the slice at `k0` from the workspace into the
    /// prefetch registers.
    fn prefetch(&self, w: &mut Wgsl) {
        for s in [&self.sa, &self.sb] {
            let x = s.x;
            let per_row = s.contig / 8;
            for l in 0..self.per_thread(s) {
                let g = format!("(t + {}u)", l * self.threads);
                w.line(&format!(
                    "let i{x}{l} = {x}_ws + ({} + {g} / {per_row}u) * {x}_cp8 + {} / 8u + {g} % {per_row}u;",
                    s.outer_origin, s.contig_origin
                ));
                for part in self.parts() {
                    let at = if part.is_empty() { format!("i{x}{l}") } else { format!("lo_ws + i{x}{l}") };
                    if self.k.emulate {
                        w.line(&format!("q{x}{part}{l} = ws[{at}];"));
                    } else {
                        w.line(&format!("q{x}{part}{l}_0 = ws[2u * ({at})];"));
                        w.line(&format!("q{x}{part}{l}_1 = ws[2u * ({at}) + 1u];"));
                    }
                }
            }
        }
    }

    /// Plain-WGSL stand-ins for the cooperative operations (see the module docs). The 16-deep
    /// loop of `emu_mma_*` stays a loop: unrolled (as drivers do with a constant bound), each
    /// product took Mesa's llvmpipe minutes to compile on OpenGL (a compute shader with
    /// barriers is an LLVM coroutine there, and splitting it grows with the blocks of the
    /// unrolled loads), 512 s for `gpu_coop`'s ragged-shapes test with a cold shader cache
    /// against 67 s kept a loop (2 cores, shared).
    fn emulation(&self, w: &mut Wgsl, abufs: &[Buf], bbufs: &[Buf]) {
        let e = self.per_lane();
        // Element (r, c) of a fragment at vec4 index f.x with a stride of f.y vec4s.
        for buf in abufs.iter().chain(bbufs) {
            w.open(&format!("fn emu_{}(f: vec2<u32>, r: u32, c: u32) -> f32", buf.name));
            if buf.row_major {
                w.line("let h = f.x * 4u + r * f.y * 4u + c;");
            } else {
                w.line("let h = f.x * 4u + c * f.y * 4u + r;");
            }
            w.line(&format!("return {}[h / 4u][h % 4u];", buf.name));
            w.close();
            w.blank();
        }
        for ab in abufs {
            for bb in bbufs {
                if ab.name == "sal" && bb.name == "sbl" {
                    continue;
                }
                w.open(&format!(
                    "fn emu_mma_{}_{}(fa: vec2<u32>, fb: vec2<u32>, acc: array<f32, {e}>, lane: u32) -> array<f32, {e}>",
                    ab.name, bb.name
                ));
                w.line("var out = acc;");
                // 16, in a form the driver cannot evaluate (`lane` is below 32), so that it
                // keeps the loop instead of unrolling it (see `emulation`).
                w.line("let depth = 16u + (lane >> 16u);");
                w.open(&format!("for (var q = 0u; q < {e}u; q++)"));
                w.line(&format!("let flat = q * {}u + lane;", self.sg));
                w.line("var s = out[q];");
                w.block(
                    "for (var kk = 0u; kk < depth; kk++)",
                    &[&format!(
                        "s += emu_{}(fa, flat / 16u, kk) * emu_{}(fb, kk, flat % 16u);",
                        ab.name, bb.name
                    )],
                );
                w.line("out[q] = s;");
                w.close();
                w.line("return out;");
                w.close();
                w.blank();
            }
        }
        if self.high {
            let arr = format!("array<f32, {e}>");
            let ops = [("emu_add", format!("y: {arr}"), "out[q] += y[q];"), ("emu_scale", "f: f32".into(), "out[q] *= f;")];
            for (name, operand, op) in ops {
                w.open(&format!("fn {name}(x: {arr}, {operand}) -> {arr}"));
                w.line("var out = x;");
                w.block(&format!("for (var q = 0u; q < {e}u; q++)"), &[op]);
                w.line("return out;");
                w.close();
                w.blank();
            }
        }
        // A fragment into the scratch, and (`Gen::direct_store`) scaled straight into C.
        let mut stores = vec![("emu_store", "", "scratch", "v[q]")];
        if self.direct {
            stores.push(("emu_store_c", ", sc: f32", "c", "v[q] * sc"));
        }
        for (name, extra, dst, value) in stores {
            w.open(&format!(
                "fn {name}(v: array<f32, {e}>, base: u32, stride: u32, lane: u32{extra})"
            ));
            w.open(&format!("for (var q = 0u; q < {e}u; q++)"));
            w.line(&format!("let flat = q * {}u + lane;", self.sg));
            w.line(&format!("{dst}[base + (flat / 16u) * stride + flat % 16u] = {value};"));
            w.close();
            w.close();
            w.blank();
        }
    }

    fn load_frag(&self, w: &mut Wgsl, var: &str, buf: &Buf, idx: &str, stride: &str, role: &str) {
        if self.k.emulate {
            w.line(&format!("let {var} = vec2<u32>({idx}, {stride});"));
        } else {
            let f = if buf.row_major { "coopLoadT" } else { "coopLoad" };
            w.line(&format!(
                "let {var} = {f}<coop_mat16x16<f16, {role}>>(&{}[{idx}], {stride});",
                buf.name
            ));
        }
    }

    /// The expression `fa · fb + c` (buffers `ab`, `bb`).
    fn mma(&self, fa: &str, fb: &str, c: &str, (ab, bb): (&Buf, &Buf)) -> String {
        if self.k.emulate {
            format!("emu_mma_{}_{}({fa}, {fb}, {c}, lane)", ab.name, bb.name)
        } else {
            format!("coopMultiplyAdd({fa}, {fb}, {c})")
        }
    }

    /// The expression `x + y` of two accumulators, added on the SIMT cores (round to nearest).
    fn add(&self, x: &str, y: &str) -> String {
        if self.k.emulate {
            format!("emu_add({x}, {y})")
        } else {
            format!("{x} + {y}")
        }
    }

    /// The expression `x · 2^-LO_SHIFT` of an accumulator (exact).
    fn down(&self, x: &str) -> String {
        let f = format!("{:?}", 1.0 / f64::from(1u32 << LO_SHIFT));
        if self.k.emulate {
            format!("emu_scale({x}, {f})")
        } else {
            format!("({x} * {f})")
        }
    }

    /// The 16-deep steps of the current slice as a loop (`kk`; the driver chooses the
    /// unrolling: faster on the H200 than steps unrolled here). Each step loads the B
    /// fragments (hi, and lo with `high`), then one A fragment at a time, used for its row of
    /// products and dropped, so fewer fragments are live at once.
    fn ksteps(&self, w: &mut Wgsl, abufs: &[Buf], bbufs: &[Buf]) {
        w.open(&format!("for (var kk = 0u; kk < {}u; kk++)", self.t.bk / 16));
        w.line("let k16 = kk * 16u;");
        // B fragment fj at (k16, col b_sub + 16 fj); A fragment fi at (row a_sub + 16 fi, k16).
        for fj in 0..self.fnn {
            let n = format!("(b_sub + {}u)", fj * 16);
            let (o, c) = if self.access[1].row_major { ("k16", n.as_str()) } else { (n.as_str(), "k16") };
            w.line(&format!("let ib{fj} = (cur_b + {o} * {}u + {c}) / 4u;", self.b_row));
            for (part, buf) in self.parts().iter().zip(bbufs) {
                self.load_frag(w, &format!("fb{part}{fj}"), buf, &format!("ib{fj}"), "b_stride", "B");
            }
        }
        for fi in 0..self.fm {
            let m = format!("(a_sub + {}u)", fi * 16);
            let (o, c) = if self.access[0].row_major { (m.as_str(), "k16") } else { ("k16", m.as_str()) };
            w.line(&format!("let ia{fi} = (cur_a + {o} * {}u + {c}) / 4u;", self.a_row));
            for (part, buf) in self.parts().iter().zip(abufs) {
                self.load_frag(w, &format!("fa{part}{fi}"), buf, &format!("ia{fi}"), "a_stride", "A");
            }
            for fj in 0..self.fnn {
                let acc = format!("acc{fi}_{fj}");
                let accx = format!("accx{fi}_{fj}");
                let (fa, fb) = (format!("fa{fi}"), format!("fb{fj}"));
                let (fal, fbl) = (format!("fal{fi}"), format!("fbl{fj}"));
                let hh = (&abufs[0], &bbufs[0]);
                if !self.high {
                    w.line(&format!("{acc} = {};", self.mma(&fa, &fb, &acc, hh)));
                    continue;
                }
                // The cross products (lo scaled by 2^LO_SHIFT) into their own accumulator;
                // hi·hi of this step from zero, added to the accumulator on the SIMT cores.
                let (hl, lh) = ((&abufs[0], &bbufs[1]), (&abufs[1], &bbufs[0]));
                w.line(&format!("{accx} = {};", self.mma(&fa, &fbl, &accx, hl)));
                w.line(&format!("{accx} = {};", self.mma(&fal, &fb, &accx, lh)));
                let step = self.mma(&fa, &fb, "zero", hh);
                w.line(&format!("{acc} = {};", self.add(&acc, &step)));
            }
        }
        w.close();
    }

    /// For a product without an epilogue: a block inside C whose rows are contiguous and
    /// 16-byte aligned, with beta 0, stores each fragment scaled straight into C and returns,
    /// without the scratch's two barriers a fragment (uniform: the condition reads only the
    /// parameters and the block's position). Measured on the H200 (2026-12-01): `medium`
    /// 4096³ 148.5 to 155.1 TFLOP/s, gpt-small 4.21 to 4.16 ms; `high` gpt-small 5.42 to
    /// 5.20 ms, but `high` 4096³ 66.5 to 56.8, so `high` takes it only for products of K up
    /// to [`DIRECT_HIGH_MAX_K`] (long ones keep the scratch path).
    fn direct_store(&self, w: &mut Wgsl) {
        let t = self.t;
        w.line(&format!("let inside = row0 + {}u <= M && col0 + {}u <= N;", t.bm, t.bn));
        w.line(
            "let aligned = p.c_sj == 1u && p.c_si % 4u == 0u && p.c_off % 4u == 0u && p.c_sb % 4u == 0u;",
        );
        w.open("if (inside && aligned && p.beta == 0.0)");
        w.line("let cs = p.c_si;");
        for fi in 0..self.fm {
            for fj in 0..self.fnn {
                let ci = format!("ci{fi}_{fj}");
                let (una, unb) = self.unscale(w, fi, fj);
                w.line(&format!("let sc{fi}_{fj} = p.alpha * {una} * {unb};"));
                w.line(&format!(
                    "let {ci} = p.c_off + batch * p.c_sb + (row0 + a_sub + {}u) * cs + col0 + b_sub + {}u;",
                    fi * 16,
                    fj * 16
                ));
                if self.k.emulate {
                    w.line(&format!("emu_store_c(acc{fi}_{fj}, {ci}, cs, lane, sc{fi}_{fj});"));
                } else {
                    w.line(&format!("coopStoreT(acc{fi}_{fj} * sc{fi}_{fj}, &c[{ci}], cs);"));
                }
            }
        }
        w.line("return;");
        w.close();
    }

    /// The inverse scales of fragment `(fi, fj)`, bound by the lines written: those of its
    /// strip of rows and of columns. Read where the fragment is stored, so they hold no
    /// registers before (all six of a `high` block's read at once after the K loop took its
    /// 4096³ product from 72 to 58 TFLOP/s on the H200); 2^-e is an exact
    /// normal f32 for |e| <= 126 (the conversion clamps), so two multiplies undo the scaling
    /// exactly, where an ldexp per element cost a quarter of the product's speed (prototype,
    /// round 2).
    fn unscale(&self, w: &mut Wgsl, fi: u32, fj: u32) -> (String, String) {
        let (una, unb) = (format!("una{fi}_{fj}"), format!("unb{fi}_{fj}"));
        w.line(&format!("let {una} = ldexp(1.0, -exps[ea + {fi}u]);"));
        w.line(&format!("let {unb} = ldexp(1.0, -exps[eb + {fj}u]);"));
        (una, unb)
    }

    fn main(&self, w: &mut Wgsl, abufs: &[Buf], bbufs: &[Buf]) {
        let t = self.t;
        let threads = self.threads;
        let (la, lb) = (self.per_thread(&self.sa), self.per_thread(&self.sb));
        block_entry(w, threads, (t.bm, t.bn));
        w.line(&format!("let warp = t / {}u;", self.sg));
        w.line(&format!("let lane = t % {}u;", self.sg));
        w.line(&format!("let wr = warp / {}u;", t.wn));
        w.line(&format!("let wc = warp % {}u;", t.wn));
        // A store to `exps` that never runs (an empty product has no blocks): where the kernel
        // holds none, NVIDIA's driver treats the read-only words as constants and loads them
        // all at the kernel's start, holding registers through the K loop (H200, 2026-12-01:
        // `high` 4096³ product 57 TFLOP/s without the store, 72 with it, gpt-medium `high`
        // 63.5 against 60.4 ms a step).
        w.block("if (p.m == 0u && t == 0u)", &["exps[0] = 0;"]);
        // Where this block's batch of each plane starts, in units.
        layout(w, &t, self.access);
        w.line("let a_cp8 = a_cp / 8u;");
        w.line("let b_cp8 = b_cp / 8u;");
        w.line("let a_ws = batch * a_ps;");
        w.line("let b_ws = ua + batch * b_ps;");
        if self.high {
            w.line("let lo_ws = ua + ub;");
        }
        for reg in self.regs("a", la, true).iter().chain(&self.regs("b", lb, true)) {
            w.line(&format!("var {reg};"));
        }
        let zero = if self.k.emulate {
            format!("array<f32, {}>()", self.per_lane())
        } else {
            "coop_mat16x16<f32, C>()".to_string()
        };
        if self.high {
            w.line(&format!("let zero = {zero};"));
        }
        for fi in 0..self.fm {
            for fj in 0..self.fnn {
                w.line(&format!("var acc{fi}_{fj} = {zero};"));
                if self.high {
                    w.line(&format!("var accx{fi}_{fj} = {zero};"));
                }
            }
        }
        let stage = |w: &mut Wgsl, at_a: &str, at_b: &str| {
            w.line(&format!("stage_a(t, {at_a}, {});", self.regs("a", la, false).join(", ")));
            w.line(&format!("stage_b(t, {at_b}, {});", self.regs("b", lb, false).join(", ")));
        };
        w.line("var k0 = 0u;");
        self.prefetch(w);
        stage(w, "0u", "0u");
        w.line("workgroupBarrier();");
        // Fragment origins of this subgroup, in halves within a stage; strides in vec4s.
        w.line(&format!("let a_sub = wr * {}u;", self.fm * 16));
        w.line(&format!("let b_sub = wc * {}u;", self.fnn * 16));
        w.line(&format!("let a_stride = {}u;", self.a_row / 4));
        w.line(&format!("let b_stride = {}u;", self.b_row / 4));
        w.line(&format!("let n_slices = (K + {}u) / {}u;", t.bk - 1, t.bk));
        w.open("for (var s = 0u; s < n_slices; s++)");
        if t.stages == 2 {
            w.line(&format!("let cur_a = (s & 1u) * {}u;", self.stage_a));
            w.line(&format!("let cur_b = (s & 1u) * {}u;", self.stage_b));
        } else {
            w.line("let cur_a = 0u;");
            w.line("let cur_b = 0u;");
        }
        w.line("let has_next = s + 1u < n_slices;");
        w.open("if (has_next)");
        w.line(&format!("k0 = (s + 1u) * {}u;", t.bk));
        self.prefetch(w);
        w.close();
        self.ksteps(w, abufs, bbufs);
        if t.stages == 2 {
            w.open("if (has_next)");
            let (na, nb) = (format!("{}u - cur_a", self.stage_a), format!("{}u - cur_b", self.stage_b));
            stage(w, &na, &nb);
            w.close();
            w.line("workgroupBarrier();");
        } else {
            w.line("workgroupBarrier();");
            w.open("if (has_next)");
            stage(w, "0u", "0u");
            w.close();
            w.line("workgroupBarrier();");
        }
        w.close();
        // Where this subgroup's exponents are: its first strip of rows (of A) and of columns
        // (of B); each fragment reads its two as it is stored ([`Gen::unscale`]).
        strips(w);
        w.line(&format!(
            "let ea = select(batch, 0u, p.a_sb == 0u) * sa + (row0 + a_sub) / {STRIP}u;"
        ));
        w.line(&format!(
            "let eb = na + select(batch, 0u, p.b_sb == 0u) * sb + (col0 + b_sub) / {STRIP}u;"
        ));
        for fi in 0..self.fm {
            for fj in 0..self.fnn {
                if self.high {
                    let (acc, accx) = (format!("acc{fi}_{fj}"), format!("accx{fi}_{fj}"));
                    w.line(&format!("{acc} = {};", self.add(&acc, &self.down(&accx))));
                }
            }
        }
        if self.direct {
            self.direct_store(w);
        }
        // Epilogue: one fragment per subgroup at a time through the scratch. Element q of this
        // invocation's share of fragment (fi, fj) is (i, j); an epilogue's loads for all of
        // them are issued first, so they wait for memory together rather than one fragment's
        // after another's (on the H200 a GELU-gradient epilogue's one load took 4096x3072x768
        // `medium` products from 207 to 389 µs, waited for fragment by fragment).
        w.line("let so = warp * 256u;");
        w.line("let ss = 16u;");
        let elements = || {
            (0..self.fm).flat_map(move |fi| {
                (0..self.fnn).flat_map(move |fj| (0..self.per_lane()).map(move |q| (fi, fj, q)))
            })
        };
        let flat = |q: u32| format!("({}u + lane)", q * self.sg);
        let ij = |fi: u32, fj: u32, q: u32| {
            let i = format!("row0 + a_sub + {}u + {} / 16u", fi * 16, flat(q));
            (i, format!("col0 + b_sub + {}u + {} % 16u", fj * 16, flat(q)))
        };
        if self.loads > 0 {
            for (fi, fj, q) in elements() {
                let (i, j) = ij(fi, fj, q);
                w.line(&format!("let pre{fi}_{fj}_{q} = epilogue_loads(batch, {i}, {j});"));
            }
        }
        for fi in 0..self.fm {
            for fj in 0..self.fnn {
                if self.k.emulate {
                    w.line(&format!("emu_store(acc{fi}_{fj}, so, ss, lane);"));
                } else {
                    w.line(&format!("coopStoreT(acc{fi}_{fj}, &scratch[so], ss);"));
                }
                w.line("workgroupBarrier();");
                let (una, unb) = self.unscale(w, fi, fj);
                for q in 0..self.per_lane() {
                    let (i, j) = (format!("i{fi}_{fj}_{q}"), format!("j{fi}_{fj}_{q}"));
                    let (ie, je) = ij(fi, fj, q);
                    w.line(&format!("let {i} = {ie};"));
                    w.line(&format!("let {j} = {je};"));
                    let v = format!("scratch[so + {}] * {una} * {unb}", flat(q));
                    let store = if self.loads > 0 {
                        format!("store_c_with({v}, batch, {i}, {j}, pre{fi}_{fj}_{q});")
                    } else {
                        format!("store_c({v}, batch, {i}, {j});")
                    };
                    w.block(&format!("if ({i} < M && {j} < N)"), &[&store]);
                }
                w.line("workgroupBarrier();");
            }
        }
        w.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products without an epilogue store inside blocks straight into C: `medium` always,
    /// The product binds the exponents read-write and holds a store to them that never runs
    /// (an empty product has no blocks): it looks like dead code, and without it NVIDIA's
    /// driver loads the exponents at the kernel's start (`high` 4096³ 72 -> 57 TFLOP/s on the
    /// H200). Each fragment reads its own strips' exponents, after the K loop.
    #[test]
    fn the_product_keeps_its_never_run_store_to_the_exponents() {
        let row = Access { row_major: true, vector: true };
        for (mode, tile) in [(CoopMode::Medium, MEDIUM_TILE), (CoopMode::High, HIGH_TILE)] {
            let k = CoopKernel { mode, tile, subgroup: 32, emulate: false };
            let wgsl = generate(&k, [row, row], 4096, Epilogue::NONE);
            assert!(wgsl.contains("var<storage, read_write> exps: array<i32>;"), "{mode:?}");
            let store = wgsl.find("if (p.m == 0u && t == 0u) {").expect("the store");
            assert!(wgsl[store..].contains("exps[0] = 0;"), "{mode:?}");
            let k_loop = wgsl.find("for (var s = 0u;").unwrap();
            let first_read = wgsl.find("-exps[ea").unwrap();
            assert!(store < k_loop && k_loop < first_read, "{mode:?}");
            // Once a fragment on each path that stores it: the scratch, and for `medium` the
            // direct store too (`high` stores directly only up to DIRECT_HIGH_MAX_K).
            let frags = (k.tile.bm / k.tile.wm / 16) * (k.tile.bn / k.tile.wn / 16);
            let paths = if mode == CoopMode::Medium { 2 } else { 1 };
            assert_eq!(wgsl.matches("-exps[ea").count() as u32, frags * paths, "{mode:?}");
        }
    }

    /// Products without an epilogue store inside blocks straight into C: `medium` always,
    /// `high` up to K = [`DIRECT_HIGH_MAX_K`]; with an epilogue, every block goes through the
    /// scratch.
    #[test]
    fn only_products_without_an_epilogue_store_straight_into_c() {
        let row = Access { row_major: true, vector: true };
        for emulate in [false, true] {
            for (mode, tile) in [(CoopMode::Medium, MEDIUM_TILE), (CoopMode::High, HIGH_TILE)] {
                let k = CoopKernel { mode, tile, subgroup: 32, emulate };
                for (depth, body, want) in [
                    (768, "return v;", true),
                    (4096, "return v;", mode == CoopMode::Medium),
                    (768, "return v + 1.0;", false),
                ] {
                    let wgsl = generate(&k, [row, row], depth, Epilogue { body, ..Epilogue::NONE });
                    let direct = wgsl.contains("if (inside && aligned && p.beta == 0.0)");
                    assert_eq!(direct, want, "{mode:?}, K {depth}, `{body}`, emulated {emulate}");
                    assert!(wgsl.contains("store_c(scratch"), "the scratch path stays for other blocks");
                }
            }
        }
    }

    #[test]
    fn tiles_parse_and_bad_ones_say_why() {
        assert_eq!(CoopTile::parse("128x128x64w2x4").unwrap(), MEDIUM_TILE);
        assert_eq!(CoopTile::parse(" 128x128x32 w4x2 ").unwrap(), HIGH_TILE);
        assert_eq!(CoopTile::parse("128x128x32w4x2s2").unwrap(), CoopTile { stages: 2, ..HIGH_TILE });
        let form = "is not of the form BMxBNxBKwWMxWN[s2], e.g. 128x128x64w2x4";
        for bad in ["", "128x128x64", "128x128w2x4", "axbxcwdxe", "1x2x3w4x5sX"] {
            let e = CoopTile::parse(bad).unwrap_err();
            assert_eq!(e.message, format!("cooperative tile `{bad}` {form}"));
        }
        let check = |t: CoopTile, expected: &str| {
            assert_eq!(t.check(32).unwrap_err().message, expected);
        };
        MEDIUM_TILE.check(32).unwrap();
        HIGH_TILE.check(32).unwrap();
        check(
            CoopTile { wm: 3, ..MEDIUM_TILE },
            "cooperative tile 128x128x64 w3x4: the block does not split into 3x4 subgroups of whole 16x16 fragments",
        );
        check(
            CoopTile { bk: 24, ..MEDIUM_TILE },
            "cooperative tile 128x128x24 w2x4: the slice depth must be a positive multiple of 16",
        );
        check(CoopTile { stages: 3, ..MEDIUM_TILE }, "cooperative tile 128x128x64 w2x4: stages must be 1 or 2");
        check(
            CoopTile { wm: u32::MAX, ..MEDIUM_TILE },
            "cooperative tile 128x128x64 w4294967295x4: blocks above 1024 or more than 64x64 subgroups fit no device",
        );
        check(
            CoopTile { bm: 16, bn: 64, bk: 16, wm: 1, wn: 4, stages: 1 },
            "cooperative tile 16x64x16 w1x4: the 32 8-half units of a slice of a do not divide among 128 threads",
        );
        assert_eq!(
            MEDIUM_TILE.check(0).unwrap_err().message,
            "subgroups of 0 do not divide a 16x16 fragment's 256 elements"
        );
    }
}
