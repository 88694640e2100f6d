//! The attention kernels of the cooperative modes (`high`, `medium`): every block product on
//! 16x16x16 f16 cooperative matrices (tensor cores), the softmax on the SIMT cores.
//!
//! A workgroup of `W` subgroups owns `R = 16·W` rows (query rows for the forward and dQ, key
//! rows for dK/dV), each subgroup 16 of them, and loops over blocks of `C` rows of the other
//! side. Operands are staged in workgroup memory as f16 rows of `DP + 8` halves (`DP`: Dh
//! rounded up to 16, zero-filled, as are rows past T), `high` with a lo part beside each hi
//! part (as the matmul kernels: hi by masking to 11 bits, lo times `2^LO_SHIFT`, products
//! hi·hi + hi·lo + lo·hi). A product of two staged operands goes into a fresh accumulator;
//! what the SIMT cores need of it (scores, dP) goes through a per-subgroup f32 scratch of
//! `16 x C`, where invocation `lane` owns row `lane / 2` and half of its columns, so every
//! per-row value (running maximum, log-sum-exp, delta) is one register. What the tensor cores
//! need back (P, dS) is written as f16 into per-subgroup rows and loaded as A fragments.
//!
//! - Forward, two passes over the key blocks: the first computes the scores and each row's
//!   running maximum and sum, which give its log-sum-exp; the second recomputes the scores,
//!   `P = e^(S - L)` (final, so the output accumulates on the tensor cores without the
//!   per-row rescaling a one-pass online softmax needs) and `O += P V`.
//! - dQ (per query block): per key block `P` from the saved log-sum-exp, `dP = dO Vᵀ`,
//!   `dS = P ∘ (dP − delta)`, `dQ += dS K`.
//! - dK/dV (per key block): per query block at or below the diagonal the transposed scores
//!   `Sᵀ = K Qᵀ` and `dPᵀ = V dOᵀ`, then `dV += Pᵀ dO`, `dK += dSᵀ Q`.
//!
//! Range: f16 holds 65504 at most and flushes below 6e-8, so each operand is scaled by a power
//! of two first: in a prologue the workgroup finds the max-abs of every tensor it reads over
//! the rows it will read (its own rows, and the other side's up to the causal limit), and each
//! tensor's exponent brings that into `[2^14, 2^15)` (the matmul conversion's rule). A
//! product's accumulator is multiplied by the inverse powers (exact) as it is added up. P lies
//! in `[0, 1]` and is stored times `2^14`. dS is bounded by `Dh·max|dO|·(max|V| + max|O|)`
//! (delta is `dO·O` and O a mean of V's rows), so an exponent from those bounds keeps it below
//! 2^15 without a reduction per block.
//!
//! Emulated (`emulate`), the staging arrays hold f32 values rounded to f16 and the cooperative
//! operations are plain functions with the same meaning (as `matmul_coop.rs` does), so the
//! same kernels run on adapters without cooperative matrices: the GPU-vs-CPU tests on lavapipe.
//!
//! Grid and uniformity as the SIMT kernels: `blocks · heads` workgroups, the longest first;
//! every loop bound depends on the workgroup id only, so every barrier and every cooperative
//! operation runs in uniform control flow.

use super::{Blocks, Config, Generated, Pass, Shape, Tensor};
use crate::codegen::coop_convert::exponent_fn;
use crate::codegen::expr::f32_lit;
use crate::codegen::loops::{halvings, strided, Loops};
use crate::codegen::matmul_coop::{split_hi_fn, CoopMode, LO_SHIFT};
use crate::codegen::writer::Wgsl;

/// Invocations per subgroup the kernels are written for (NVIDIA's); emulated subgroups are
/// virtual, of the same size.
pub const SUBGROUP: u32 = 32;

/// Halves of padding after each staged row (as the matmul kernels).
const PAD: u32 = 8;

/// Floats of padding after each scratch row (rows stay 16-byte aligned).
const SPAD: u32 = 4;

/// P is stored times `2^P_SHIFT`: its largest element, 1, lands where the staged operands'
/// max-abs does, and small probabilities stay normal f16 numbers.
const P_SHIFT: i32 = 14;

/// Blocks tried for each pass, in order of preference: `(own rows, rows of the other side)`
/// with one subgroup per 16 own rows; the first that fits the device's workgroup memory wins.
/// First the fastest of seven measured at gpt-medium's shape on the H200 in `medium`
/// (BENCHMARKS.md, "Attention on cooperative matrices"): short blocks of the other side, so
/// that more workgroups share a multiprocessor.
const CANDIDATES: [(u32, u32); 5] = [(64, 16), (64, 32), (32, 16), (32, 32), (16, 16)];
/// dQ's list: 64x32 measured fastest for it.
const CANDIDATES_Q: [(u32, u32); 5] = [(64, 32), (64, 16), (32, 16), (32, 32), (16, 16)];

/// The blocks of `pass` for `(own, other)` rows, in the shared [`Blocks`] convention
/// (`br` query rows, `bc` key rows).
fn blocks_of(pass: Pass, own: u32, other: u32) -> Blocks {
    let threads = own / 16 * SUBGROUP;
    match pass {
        Pass::BackwardKv => Blocks { br: other, bc: own, threads },
        Pass::Forward | Pass::BackwardQ => Blocks { br: own, bc: other, threads },
    }
}

/// `(own rows, rows of the other side)` of blocks `b`.
fn sides(b: &Blocks, pass: Pass) -> (u32, u32) {
    match pass {
        Pass::BackwardKv => (b.bc, b.br),
        Pass::Forward | Pass::BackwardQ => (b.br, b.bc),
    }
}

/// Blocks for `pass` in the order [`configure`](super::configure) tries them.
pub fn candidates(pass: Pass) -> Vec<Blocks> {
    let list = if pass == Pass::BackwardQ { &CANDIDATES_Q } else { &CANDIDATES };
    list.iter().map(|&(own, other)| blocks_of(pass, own, other)).collect()
}

/// Head dimension padded to whole fragments.
fn padded(dh: u32) -> u32 {
    dh.next_multiple_of(16).max(16)
}

/// The staged operands of `pass`: own tiles, then the other side's (names as bound).
fn staged(pass: Pass) -> (&'static [&'static str], &'static [&'static str]) {
    match pass {
        Pass::Forward => (&["q"], &["k", "v"]),
        Pass::BackwardQ => (&["q", "d_o"], &["k", "v"]),
        Pass::BackwardKv => (&["k", "v"], &["q", "d_o"]),
    }
}

/// Per-subgroup tiles of `16 x C` the SIMT cores write for the tensor cores (P, dS).
fn produced(pass: Pass) -> &'static [&'static str] {
    match pass {
        Pass::Forward => &["p"],
        Pass::BackwardQ => &["ds"],
        Pass::BackwardKv => &["p", "ds"],
    }
}

/// The layout of one kernel's workgroup memory.
#[derive(Clone, Copy, Debug)]
struct Memory {
    /// Halves of one staging array (hi; `high` has a second, lo, of the same size).
    halves: u32,
    /// Floats of the scratch.
    scratch: u32,
    /// Floats of the per-row stats arrays (`rl`, `rd`): the other side's rows in dK/dV.
    stats: u32,
}

fn memory(s: &Shape, b: &Blocks, pass: Pass) -> Memory {
    let (own, other) = sides(b, pass);
    let (dp, w) = (padded(s.dh), own / 16);
    let (mine, theirs) = staged(pass);
    let rows = mine.len() as u32 * own + theirs.len() as u32 * other;
    let halves = rows * (dp + PAD) + produced(pass).len() as u32 * w * 16 * (other + PAD);
    // The scores of each subgroup; before the first block, the partial sums of delta.
    let delta_rows = match pass {
        Pass::Forward => 0,
        Pass::BackwardQ => own,
        Pass::BackwardKv => other,
    };
    let scratch = (w * 16 * (other + SPAD)).max(delta_rows * dp / 4).max(2 * b.threads);
    let stats = if pass == Pass::BackwardKv { 2 * other } else { 0 };
    Memory { halves, scratch, stats }
}

/// Exponents the prologue reduces, one per tensor read.
fn exponents(pass: Pass) -> &'static [&'static str] {
    match pass {
        Pass::Forward => &["q", "k", "v"],
        Pass::BackwardQ | Pass::BackwardKv => &["q", "k", "v", "d_o", "o"],
    }
}

/// Bytes of workgroup memory the kernel of `pass` declares.
pub fn workgroup_bytes(s: &Shape, b: &Blocks, pass: Pass, mode: CoopMode, emulate: bool) -> u32 {
    let m = memory(s, b, pass);
    let parts = if mode == CoopMode::High { 2 } else { 1 };
    let half = if emulate { 4 } else { 2 };
    let red = exponents(pass).len() as u32 * b.threads;
    m.halves * parts * half + 4 * (m.scratch + m.stats + red)
}

/// A staged operand as a fragment source: where it starts (halves) and its row length.
#[derive(Clone)]
struct Src {
    base: String,
    row: u32,
}

struct Gen<'a> {
    cfg: &'a Config,
    pass: Pass,
    high: bool,
    emulate: bool,
    own: u32,
    other: u32,
    nt: u32,
    dp: u32,
    /// Halves per staged row of a `[t, dh]` operand and of a produced tile; floats per
    /// scratch row.
    row: u32,
    crow: u32,
    ss: u32,
    mem: Memory,
}

/// What the loops of an emulated cooperative operation cost one invocation.
const EMU_MMA: Loops = Loops { statements: 2, trips: 9 + 8 * 17 };
const EMU_FLAT: Loops = Loops { statements: 1, trips: 9 };

impl<'a> Gen<'a> {
    fn new(cfg: &'a Config, pass: Pass, mode: CoopMode, emulate: bool) -> Gen<'a> {
        let b = cfg.blocks(pass);
        let (own, other) = sides(&b, pass);
        let dp = padded(cfg.shape.dh);
        Gen {
            cfg,
            pass,
            high: mode == CoopMode::High,
            emulate,
            own,
            other,
            nt: b.threads,
            dp,
            row: dp + PAD,
            crow: other + PAD,
            ss: other + SPAD,
            mem: memory(&cfg.shape, &b, pass),
        }
    }

    /// Where staged operand `x` starts, in halves.
    fn region(&self, x: &str) -> u32 {
        let (mine, theirs) = staged(self.pass);
        let mut at = 0;
        for m in mine {
            if *m == x {
                return at;
            }
            at += self.own * self.row;
        }
        for t in theirs {
            if *t == x {
                return at;
            }
            at += self.other * self.row;
        }
        for p in produced(self.pass) {
            if *p == x {
                return at;
            }
            at += self.own * self.crow;
        }
        at
    }

    /// Subgroup `warp`'s rows of staged operand `x` as an A source.
    fn own_rows(&self, x: &str) -> Src {
        Src { base: format!("({}u + warp * {}u)", self.region(x), 16 * self.row), row: self.row }
    }

    /// Subgroup `warp`'s produced tile `x` (P or dS) as an A source.
    fn produced_rows(&self, x: &str) -> Src {
        Src { base: format!("({}u + warp * {}u)", self.region(x), 16 * self.crow), row: self.crow }
    }

    fn zero(&self) -> &'static str {
        if self.emulate {
            "array<f32, 8>()"
        } else {
            "coop_mat16x16<f32, C>()"
        }
    }

    fn module(&self) -> (String, u32, Loops) {
        let s = &self.cfg.shape;
        let mut w = Wgsl::new();
        if !self.emulate {
            w.line("enable f16;");
            w.line("enable wgpu_cooperative_matrix;");
        }
        let mode = if self.high { "high" } else { "medium" };
        let emulated = if self.emulate { ", emulated" } else { "" };
        w.line(&format!(
            "// {} coop-{mode} {}x{}, {} subgroups{emulated} (codegen/attention/coop.rs)",
            match self.pass {
                Pass::Forward => "attention",
                Pass::BackwardKv => "attention_bw_kv",
                Pass::BackwardQ => "attention_bw_q",
            },
            self.own,
            self.other,
            self.nt / SUBGROUP
        ));
        let consts = [("T", s.t), ("DH", s.dh), ("H", s.h), ("DG", self.dp / 4), ("NT", self.nt)];
        for (name, v) in consts {
            w.line(&format!("const {name}: u32 = {v}u;"));
        }
        let scale = f32_lit((1.0 / (s.dh as f64).sqrt()) as f32);
        w.line(&format!("const SCALE: f32 = {scale};"));
        w.line("const NEG: f32 = -3.0e38;");
        w.blank();
        let bindings = super::simt::bindings(self.pass);
        for (i, (t, write)) in bindings.iter().enumerate() {
            let access = if *write { "read_write" } else { "read" };
            let ty = if !*write && self.vec4_rows(*t) { "vec4<f32>" } else { "f32" };
            w.line(&format!("@group(0) @binding({i}) var<storage, {access}> {}: array<{ty}>;", t.name()));
        }
        let elem = if self.emulate { "vec4<f32>" } else { "vec4<f16>" };
        let n4 = self.mem.halves / 4;
        w.line(&format!("var<workgroup> st: array<{elem}, {n4}>;"));
        if self.high {
            w.line(&format!("var<workgroup> stl: array<{elem}, {n4}>;"));
        }
        w.line(&format!("var<workgroup> scratch: array<f32, {}>;", self.mem.scratch));
        let nx = exponents(self.pass).len() as u32;
        w.line(&format!("var<workgroup> red: array<u32, {}>;", nx * self.nt));
        if self.mem.stats > 0 {
            w.line(&format!("var<workgroup> rl: array<f32, {}>;", self.mem.stats / 2));
            w.line(&format!("var<workgroup> rd: array<f32, {}>;", self.mem.stats / 2));
        }
        w.blank();
        let mut loops = self.helpers(&mut w, &bindings);
        let bytes = workgroup_bytes(s, &self.cfg.blocks(self.pass), self.pass, self.mode(), self.emulate);
        let blocks = s.t.div_ceil(self.own);
        w.line(&format!("@compute @workgroup_size({})", self.nt));
        w.open("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32)");
        w.line("let id = wid.x + wid.y * nwg.x;");
        w.block(&format!("if id >= {}u", blocks * s.heads()), &["return;"]);
        w.line(&format!("let bh = id % {}u;", s.heads()));
        if self.pass == Pass::BackwardKv {
            w.line(&format!("let blk = id / {}u;", s.heads()));
        } else {
            w.line(&format!("let blk = {}u - id / {}u;", blocks - 1, s.heads()));
        }
        w.line(&format!("let warp = t / {SUBGROUP}u;"));
        w.line(&format!("let lane = t % {SUBGROUP}u;"));
        w.line("// This invocation's row of its subgroup's tiles and its first column there.");
        w.line("let r = lane / 2u;");
        w.line(&format!("let hc = (lane % 2u) * {}u;", self.other / 2));
        loops = loops.then(match self.pass {
            Pass::Forward => self.forward(&mut w),
            Pass::BackwardQ => self.backward_q(&mut w),
            Pass::BackwardKv => self.backward_kv(&mut w),
        });
        w.close();
        (w.finish(), bytes, loops)
    }

    /// Whether tensor `t` is read as vec4s: Dh, its offset and its strides multiples of 4, so
    /// every group of 4 elements of a row is one aligned vec4.
    fn vec4_rows(&self, t: Tensor) -> bool {
        let l = &self.cfg.layouts;
        let layout = match t {
            Tensor::Q => l.q,
            Tensor::K => l.k,
            Tensor::V => l.v,
            Tensor::DO => l.d_o,
            Tensor::O => l.o,
            _ => return false,
        };
        let words = [layout.offset, layout.sb, layout.sh, layout.st];
        self.cfg.shape.dh.is_multiple_of(4) && words.iter().all(|n| n.is_multiple_of(4))
    }

    fn mode(&self) -> CoopMode {
        if self.high {
            CoopMode::High
        } else {
            CoopMode::Medium
        }
    }

    /// Element indices, loads, `put` and the emulated operations; the statements of their
    /// loops.
    fn helpers(&self, w: &mut Wgsl, bindings: &[(Tensor, bool)]) -> Loops {
        super::index_fns(w, &self.cfg.layouts, bindings);
        // Four elements of row i from column d (a multiple of 4), zero past DH.
        for x in ["q", "k", "v", "d_o", "o"] {
            if !bindings.iter().any(|(t, _)| t.name() == x) {
                continue;
            }
            w.open(&format!("fn ld_{x}(bh: u32, i: u32, d: u32) -> vec4<f32>"));
            if bindings.iter().any(|&(t, write)| t.name() == x && !write && self.vec4_rows(t)) {
                w.block("if d < DH", &[&format!("return {x}[at_{x}(bh, i, d) / 4u];")]);
                w.line("return vec4<f32>();");
                w.close();
                continue;
            }
            w.line("var e = vec4<f32>();");
            w.line(&format!("let at = at_{x}(bh, i, d);"));
            for (j, c) in ["x", "y", "z", "w"].iter().enumerate() {
                w.block(&format!("if d + {j}u < DH"), &[&format!("e.{c} = {x}[at + {j}u];")]);
            }
            w.line("return e;");
            w.close();
        }
        w.open("fn mb(v: vec4<f32>) -> u32");
        w.line("let b = bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu);");
        w.line("return max(max(b.x, b.y), max(b.z, b.w));");
        w.close();
        w.blank();
        exponent_fn(w);
        if self.high {
            split_hi_fn(w);
        }
        // Four values (already scaled) at half h of the staging arrays.
        w.open("fn put(h: u32, v: vec4<f32>)");
        let store = |w: &mut Wgsl, arr: &str, v: &str| {
            if self.emulate {
                w.line(&format!(
                    "{arr}[h / 4u] = vec4<f32>(unpack2x16float(pack2x16float({v}.xy)), unpack2x16float(pack2x16float({v}.zw)));"
                ));
            } else {
                w.line(&format!("{arr}[h / 4u] = vec4<f16>({v});"));
            }
        };
        if self.high {
            w.line("let hi = split_hi(v);");
            store(w, "st", "hi");
            let up = f32_lit((1u32 << LO_SHIFT) as f32);
            w.line(&format!("let lo = (v - hi) * {up};"));
            store(w, "stl", "lo");
        } else {
            store(w, "st", "v");
        }
        w.close();
        w.blank();
        if !self.emulate {
            return Loops::NONE;
        }
        let mut loops = Loops::NONE;
        // Element (r, c) of a fragment at vec4 index f.x, stride f.y vec4s.
        let arrays: &[&str] = if self.high { &["st", "stl"] } else { &["st"] };
        for arr in arrays {
            for (major, idx) in [("r", "r * f.y * 4u + c"), ("c", "c * f.y * 4u + r")] {
                w.open(&format!("fn emu_{arr}_{major}(f: vec2<u32>, r: u32, c: u32) -> f32"));
                w.line(&format!("let h = f.x * 4u + {idx};"));
                w.line(&format!("return {arr}[h / 4u][h % 4u];"));
                w.close();
            }
        }
        for (a, b) in self.pairs() {
            for major in ["r", "c"] {
                w.open(&format!(
                    "fn emu_mma_{a}_{b}_{major}(fa: vec2<u32>, fb: vec2<u32>, acc: array<f32, 8>, lane: u32) -> array<f32, 8>"
                ));
                w.line("var out = acc;");
                // 16, in a form the driver cannot evaluate, so that it keeps the loop (see
                // `matmul_coop.rs`'s emulation).
                w.line("let depth = 16u + (lane >> 16u);");
                w.open("for (var q = 0u; q < 8u; q++)");
                w.line(&format!("let flat = q * {SUBGROUP}u + lane;"));
                w.line("var s = out[q];");
                w.block(
                    "for (var kk = 0u; kk < depth; kk++)",
                    &[&format!("s += emu_{a}_r(fa, flat / 16u, kk) * emu_{b}_{major}(fb, kk, flat % 16u);")],
                );
                w.line("out[q] = s;");
                w.close();
                w.line("return out;");
                w.close();
                loops = loops.then(EMU_MMA.defines());
            }
        }
        let arr = "array<f32, 8>";
        let ops = [("emu_add", format!("y: {arr}"), "out[q] += y[q];"), ("emu_scale", "f: f32".into(), "out[q] *= f;")];
        for (name, operand, op) in ops {
            w.open(&format!("fn {name}(x: {arr}, {operand}) -> {arr}"));
            w.line("var out = x;");
            w.block("for (var q = 0u; q < 8u; q++)", &[op]);
            w.line("return out;");
            w.close();
            loops = loops.then(EMU_FLAT.defines());
        }
        w.open(&format!("fn emu_store(v: {arr}, base: u32, stride: u32, lane: u32)"));
        w.open("for (var q = 0u; q < 8u; q++)");
        w.line(&format!("let flat = q * {SUBGROUP}u + lane;"));
        w.line("scratch[base + (flat / 16u) * stride + flat % 16u] = v[q];");
        w.close();
        w.close();
        w.blank();
        loops.then(EMU_FLAT.defines())
    }

    /// The (A, B) staging arrays of one step's products: hi·hi, and with `high` hi·lo, lo·hi.
    fn pairs(&self) -> Vec<(&'static str, &'static str)> {
        if self.high {
            vec![("st", "st"), ("st", "stl"), ("stl", "st")]
        } else {
            vec![("st", "st")]
        }
    }

    /// `let f{a|b}_{arr} = ` the A (B) fragment of staging array `arr` at vec4 index `ia`
    /// (`ib`), stride `sa` (`sb`) vec4s.
    fn load(&self, w: &mut Wgsl, arr: &str, role: &str, row_major: bool) {
        let x = role.to_ascii_lowercase();
        let (v, idx, stride) = (format!("f{x}_{arr}"), format!("i{x}"), format!("s{x}"));
        if self.emulate {
            w.line(&format!("let {v} = vec2<u32>({idx}, {stride});"));
        } else {
            let f = if row_major { "coopLoadT" } else { "coopLoad" };
            w.line(&format!("let {v} = {f}<coop_mat16x16<f16, {role}>>(&{arr}[{idx}], {stride});"));
        }
    }

    /// `out = Σ_k A[16 rows, k]·B[k, 16 columns]` over `steps` steps of 16, from zero: A
    /// row-major at `a` (its first column), B at `b` (its first row and column), row-major
    /// (rows of B are rows of the staged operand) or not (B is a staged operand transposed).
    fn product(&self, w: &mut Wgsl, out: &str, a: &Src, b: &Src, b_row_major: bool, steps: u32) -> Loops {
        let zero = self.zero();
        w.line(&format!("var {out} = {zero};"));
        if self.high {
            w.line(&format!("var {out}x = {zero};"));
        }
        w.open(&format!("for (var kk = 0u; kk < {steps}u; kk++)"));
        w.line(&format!("let ia = ({} + kk * 16u) / 4u;", a.base));
        let b_step = if b_row_major { 16 * b.row } else { 16 };
        w.line(&format!("let ib = ({} + kk * {b_step}u) / 4u;", b.base));
        w.line(&format!("let sa = {}u;", a.row / 4));
        w.line(&format!("let sb = {}u;", b.row / 4));
        let parts: &[&str] = if self.high { &["st", "stl"] } else { &["st"] };
        for arr in parts {
            self.load(w, arr, "A", true);
            self.load(w, arr, "B", b_row_major);
        }
        let major = if b_row_major { "r" } else { "c" };
        let mma = |x: &str, y: &str, acc: &str| {
            if self.emulate {
                format!("emu_mma_{x}_{y}_{major}(fa_{x}, fb_{y}, {acc}, lane)")
            } else {
                format!("coopMultiplyAdd(fa_{x}, fb_{y}, {acc})")
            }
        };
        w.line(&format!("{out} = {};", mma("st", "st", out)));
        if self.high {
            w.line(&format!("{out}x = {};", mma("st", "stl", &format!("{out}x"))));
            w.line(&format!("{out}x = {};", mma("stl", "st", &format!("{out}x"))));
        }
        w.close();
        let per_step = if self.emulate { EMU_MMA.calls(self.pairs().len() as u64) } else { Loops::NONE };
        let mut loops = Loops::of(u64::from(steps), per_step);
        if self.high {
            let down = f32_lit(1.0 / (1u32 << LO_SHIFT) as f32);
            w.line(&format!("{out} = {};", self.add(out, &self.scaled(&format!("{out}x"), &[&down]))));
            loops = loops.then(self.fragment_ops(2));
        }
        loops
    }

    /// The loops of `n` emulated fragment additions or scalings.
    fn fragment_ops(&self, n: u64) -> Loops {
        if self.emulate {
            EMU_FLAT.calls(n)
        } else {
            Loops::NONE
        }
    }

    fn add(&self, x: &str, y: &str) -> String {
        if self.emulate {
            format!("emu_add({x}, {y})")
        } else {
            format!("({x} + {y})")
        }
    }

    /// `x` times each factor in turn (each an exact power of two: the product of all of
    /// them may not be an f32).
    fn scaled(&self, x: &str, factors: &[&str]) -> String {
        factors.iter().fold(x.to_string(), |acc, f| {
            if self.emulate {
                format!("emu_scale({acc}, {f})")
            } else {
                format!("({acc} * {f})")
            }
        })
    }

    /// `acc = acc + part · factors` (the partial product of one block, unscaled); its loops.
    fn accumulate(&self, w: &mut Wgsl, acc: &str, part: &str, factors: &[&str]) -> Loops {
        w.line(&format!("{acc} = {};", self.add(acc, &self.scaled(part, factors))));
        self.fragment_ops(1 + factors.len() as u64)
    }

    /// Store fragment `v` at column `col` of this subgroup's scratch rows; its loops.
    fn to_scratch(&self, w: &mut Wgsl, v: &str, col: u32) -> Loops {
        w.line(&format!("let si = warp * {}u + {col}u;", 16 * self.ss));
        w.line(&format!("let ss = {}u;", self.ss));
        if self.emulate {
            w.line(&format!("emu_store({v}, si, ss, lane);"));
            EMU_FLAT.calls(1)
        } else {
            w.line(&format!("coopStoreT({v}, &scratch[si], ss);"));
            Loops::NONE
        }
    }

    /// This subgroup's `16 x C` products `A · Bᵀ` into its scratch: A its own rows of staged
    /// `a`, B the other side's rows of staged `b`, over DP; then a barrier. Its loops.
    fn scores(&self, w: &mut Wgsl, a: &str, b: &str) -> Loops {
        let mut loops = Loops::NONE;
        for fj in 0..self.other / 16 {
            w.open("");
            let bsrc = Src { base: format!("({}u + {}u)", self.region(b), fj * 16 * self.row), row: self.row };
            loops = loops.then(self.product(w, "sc", &self.own_rows(a), &bsrc, false, self.dp / 16));
            loops = loops.then(self.to_scratch(w, "sc", fj * 16));
            w.close();
        }
        w.line("workgroupBarrier();");
        loops
    }

    /// Lines reading this invocation's scores: `let {v}{q} = vec4(...) * {f}` for each of its
    /// `C / 8` vec4s of its row (column `hc + 4q`).
    fn read_scores(&self, w: &mut Wgsl, v: &str, f: &str) {
        for q in 0..self.other / 8 {
            w.line(&format!("let {v}i{q} = warp * {}u + r * {}u + hc + {}u;", 16 * self.ss, self.ss, 4 * q));
            w.line(&format!(
                "let {v}{q} = vec4<f32>(scratch[{v}i{q}], scratch[{v}i{q} + 1u], scratch[{v}i{q} + 2u], scratch[{v}i{q} + 3u]) * {f};"
            ));
        }
    }

    /// Whether element `j` of this invocation's vec4 `q` takes part (causal, rows below T).
    fn keep(&self, q: u32, j: u32) -> String {
        let c = format!("hc + {}u", 4 * q + j);
        match self.pass {
            // Row: key `col0 + warp·16 + r`; column: query `row0 + c`.
            Pass::BackwardKv => format!("(row0 + {c} < T && col0 + warp * 16u + r <= row0 + {c})"),
            _ => format!("(qi < T && col0 + {c} <= qi)"),
        }
    }

    /// Rows `row0 ..` (`rows` of them) of tensor `x` into registers `{reg}_{k}` (declared
    /// when `declare`), zero past T: unit `t + k·NT` of the tile, 4 elements of a row.
    fn load_tile(&self, w: &mut Wgsl, reg: &str, x: &str, row0: &str, rows: u32, declare: bool) {
        let n = rows * self.dp / 4;
        for k in 0..n.div_ceil(self.nt) {
            let v = format!("{reg}_{k}");
            if declare {
                w.line(&format!("var {v} = vec4<f32>();"));
            } else {
                w.line(&format!("{v} = vec4<f32>();"));
            }
            let u = format!("(t + {}u)", k * self.nt);
            w.open("");
            w.line(&format!("let i = {row0} + {u} / DG;"));
            w.block(&format!("if {u} < {n}u && i < T"), &[&format!("{v} = ld_{x}(bh, i, 4u * ({u} % DG));")]);
            w.close();
        }
    }

    /// The max-abs bits of registers `{reg}_{k}` into `m{x}`.
    fn tile_max(&self, w: &mut Wgsl, reg: &str, x: &str, rows: u32) {
        let n = rows * self.dp / 4;
        for k in 0..n.div_ceil(self.nt) {
            w.line(&format!("m{x} = max(m{x}, mb({reg}_{k}));"));
        }
    }

    /// Registers `{reg}_{k}` of a tile of `rows` rows (from [`Gen::load_tile`]) into the
    /// region of `x`, times `s{x}`.
    fn store_tile(&self, w: &mut Wgsl, reg: &str, x: &str, rows: u32) {
        let n = rows * self.dp / 4;
        let base = self.region(x);
        for k in 0..n.div_ceil(self.nt) {
            let u = format!("(t + {}u)", k * self.nt);
            let line = format!("put({base}u + ({u} / DG) * {}u + 4u * ({u} % DG), {reg}_{k} * s{x});", self.row);
            if (k + 1) * self.nt <= n {
                w.line(&line);
            } else {
                w.block(&format!("if {u} < {n}u"), &[&line]);
            }
        }
    }

    /// `scratch[u] = dot(dO, O)` for each unit `u` of registers `{d}_{k}`, `{o}_{k}`: the
    /// partial sums of delta, a row's `DG` of them at `row·DG`.
    fn delta_partials(&self, w: &mut Wgsl, d: &str, o: &str, rows: u32) {
        let n = rows * self.dp / 4;
        for k in 0..n.div_ceil(self.nt) {
            let u = format!("(t + {}u)", k * self.nt);
            w.block(&format!("if {u} < {n}u"), &[&format!("scratch[{u}] = dot({d}_{k}, {o}_{k});")]);
        }
    }

    /// When `cond`, [`Gen::load_tile`] of each `(registers, tensor)` of `pairs` from `row0`:
    /// the next block's rows come in while this one is computed.
    fn prefetch(&self, w: &mut Wgsl, pairs: &[(&str, &str)], cond: &str, row0: &str, rows: u32) {
        w.open(&format!("if {cond}"));
        for &(reg, x) in pairs {
            self.load_tile(w, reg, x, row0, rows, false);
        }
        w.close();
    }

    /// `m{x}` for each of `xs`, over rows `first .. end` (a loop of the whole workgroup); its
    /// loop, `rows` rows at most.
    fn rows_max(&self, w: &mut Wgsl, xs: &[&str], first: &str, end: &str, rows: u32) -> Loops {
        w.open(&format!("for (var u = t; u < ({end} - {first}) * DG; u += NT)"));
        w.line(&format!("let i = {first} + u / DG;"));
        w.line("let d = 4u * (u % DG);");
        for x in xs {
            w.line(&format!("m{x} = max(m{x}, mb(ld_{x}(bh, i, d)));"));
        }
        w.close();
        Loops::flat(strided(u64::from(rows) * u64::from(self.dp / 4), u64::from(self.nt)))
    }

    /// The workgroup's max of each `m{x}`, as exponents `e{x}` and scales `s{x} = 2^e{x}`;
    /// its loop.
    fn reduce(&self, w: &mut Wgsl) -> Loops {
        let xs = exponents(self.pass);
        for (i, x) in xs.iter().enumerate() {
            w.line(&format!("red[{}u + t] = m{x};", i as u32 * self.nt));
        }
        w.line("workgroupBarrier();");
        w.open(&format!("for (var h = {}u; h > 0u; h >>= 1u)", self.nt / 2));
        w.open("if t < h");
        for i in 0..xs.len() as u32 {
            let at = format!("{}u + t", i * self.nt);
            w.line(&format!("red[{at}] = max(red[{at}], red[{at} + h]);"));
        }
        w.close();
        w.line("workgroupBarrier();");
        w.close();
        for (i, x) in xs.iter().enumerate() {
            w.line(&format!("let e{x} = exponent(red[{}u]);", i as u32 * self.nt));
            w.line(&format!("let s{x} = ldexp(1.0, e{x});"));
            w.line(&format!("let u{x} = ldexp(1.0, -e{x});"));
        }
        Loops::flat(halvings(u64::from(self.nt / 2)))
    }

    /// The factors that scale dS into f16's range (`f1·f2`) and undo it (`v1·v2`): from the
    /// bound `|dS| < 2·DP·2^(15 − e_do)·2^(15 − min(e_v, e_o))`.
    fn ds_scale(&self, w: &mut Wgsl) {
        let lg = self.dp.next_power_of_two().trailing_zeros() as i32;
        w.line("let f1 = sd_o;");
        w.line("let v1 = ud_o;");
        w.line(&format!("let e2 = clamp(min(ev, eo) - {}, -126, 126);", 16 + lg));
        w.line("let f2 = ldexp(1.0, e2);");
        w.line("let v2 = ldexp(1.0, -e2);");
    }

    /// Write this subgroup's fragments `acc{fd}` (times `factor`) to rows `row0 + warp·16 ..`
    /// of output `x` (bounds-checked), one fragment at a time through the scratch; its loops.
    fn write_out(&self, w: &mut Wgsl, acc: &str, x: &str, buf: &str, row0: &str, factor: &str) -> Loops {
        let mut loops = Loops::NONE;
        for fd in 0..self.dp / 16 {
            w.open("");
            loops = loops.then(self.to_scratch(w, &format!("{acc}{fd}"), 0));
            w.line("workgroupBarrier();");
            w.line(&format!("let i = {row0} + warp * 16u + r;"));
            w.open("if i < T");
            for c in 0..8 {
                w.line(&format!("let d{c} = {}u + (lane % 2u) * 8u + {c}u;", fd * 16));
                w.block(
                    &format!("if d{c} < DH"),
                    &[&format!(
                        "{buf}[at_{x}(bh, i, d{c})] = scratch[warp * {}u + r * {}u + (lane % 2u) * 8u + {c}u] * {factor};",
                        16 * self.ss,
                        self.ss
                    )],
                );
            }
            w.close();
            w.line("workgroupBarrier();");
            w.close();
        }
        loops
    }

    fn zero_accs(&self, w: &mut Wgsl, names: &[&str]) {
        for n in names {
            for fd in 0..self.dp / 16 {
                w.line(&format!("var {n}{fd} = {};", self.zero()));
            }
        }
    }

    /// `acc{fd} += (A · B) · factors` for each fragment column `fd` of the head dimension: A
    /// this subgroup's produced tile `a` (`16 x C`), B the other side's staged rows `b`; its
    /// loops.
    fn products(&self, w: &mut Wgsl, acc: &str, a: &str, b: &str, factors: &[&str]) -> Loops {
        let mut loops = Loops::NONE;
        for fd in 0..self.dp / 16 {
            w.open("");
            let bsrc = Src { base: format!("({}u + {}u)", self.region(b), fd * 16), row: self.row };
            loops = loops.then(self.product(w, "pr", &self.produced_rows(a), &bsrc, true, self.other / 16));
            loops = loops.then(self.accumulate(w, &format!("{acc}{fd}"), "pr", factors));
            w.close();
        }
        loops
    }

    /// The forward; its loops.
    fn forward(&self, w: &mut Wgsl) -> Loops {
        let (r, c) = (self.own, self.other);
        w.line(&format!("let row0 = blk * {r}u;"));
        w.line("let qi = row0 + warp * 16u + r;");
        w.line(&format!("let nb = min((T + {}u) / {c}u, (row0 + {}u) / {c}u);", c - 1, r + c - 1));
        w.line(&format!("let kend = min(T, nb * {c}u);"));
        w.line("// The range of every operand the workgroup reads.");
        self.load_tile(w, "qr", "q", "row0", r, true);
        for x in ["q", "k", "v"] {
            w.line(&format!("var m{x} = 0u;"));
        }
        self.tile_max(w, "qr", "q", r);
        let mut loops = self.rows_max(w, &["k", "v"], "0u", "kend", self.cfg.shape.t);
        loops = loops.then(self.reduce(w));
        self.store_tile(w, "qr", "q", r);
        w.line("let fs = SCALE * uq * uk;");
        w.line("// Pass 1: each row's maximum and sum, this invocation's half of its columns.");
        w.line("var m = NEG;");
        w.line("var l = 0.0;");
        self.load_tile(w, "k1", "k", "0u", c, true);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line(&format!("let col0 = jb * {c}u;"));
        w.line("workgroupBarrier();");
        self.store_tile(w, "k1", "k", c);
        w.line("workgroupBarrier();");
        self.prefetch(w, &[("k1", "k")], "jb + 1u < nb", &format!("col0 + {c}u"), c);
        let mut block = self.scores(w, "q", "k");
        self.read_scores(w, "s", "fs");
        w.line("var mx = m;");
        for q in 0..c / 8 {
            for (j, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                w.line(&format!("let k{q}{comp} = {};", self.keep(q, j as u32)));
                w.line(&format!("mx = select(mx, max(mx, s{q}.{comp}), k{q}{comp});"));
            }
        }
        w.line("l *= exp(m - mx);");
        for q in 0..c / 8 {
            for comp in ["x", "y", "z", "w"] {
                w.line(&format!("l += select(0.0, exp(s{q}.{comp} - mx), k{q}{comp});"));
            }
        }
        w.line("m = mx;");
        w.close();
        loops = loops.then(Loops::of(self.blocks_of(c), block));
        w.line("// The two halves of each row meet.");
        w.line("workgroupBarrier();");
        w.line("scratch[t] = m;");
        w.line("scratch[NT + t] = l;");
        w.line("workgroupBarrier();");
        w.line("let pm = scratch[t ^ 1u];");
        w.line("let pl = scratch[NT + (t ^ 1u)];");
        w.line("let mt = max(m, pm);");
        w.line("let lse_row = mt + log(l * exp(m - mt) + pl * exp(pm - mt));");
        w.block("if lane % 2u == 0u && qi < T", &["lse[row_at(bh, qi)] = lse_row;"]);
        w.line("// Pass 2: P from the final log-sum-exp, O on the tensor cores.");
        self.zero_accs(w, &["acc"]);
        let up = f32_lit((1u64 << P_SHIFT) as f32);
        let down = f32_lit(1.0 / (1u64 << P_SHIFT) as f32);
        self.load_tile(w, "k2", "k", "0u", c, true);
        self.load_tile(w, "v2", "v", "0u", c, true);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line(&format!("let col0 = jb * {c}u;"));
        w.line("workgroupBarrier();");
        self.store_tile(w, "k2", "k", c);
        self.store_tile(w, "v2", "v", c);
        w.line("workgroupBarrier();");
        self.prefetch(w, &[("k2", "k"), ("v2", "v")], "jb + 1u < nb", &format!("col0 + {c}u"), c);
        block = self.scores(w, "q", "k");
        self.read_scores(w, "s", "fs");
        let p_base = self.region("p");
        for q in 0..c / 8 {
            let p: Vec<String> = (0..4)
                .map(|j| format!("select(0.0, exp(s{q}[{j}] - lse_row), {})", self.keep(q, j)))
                .collect();
            w.line(&format!("let p{q} = vec4<f32>({});", p.join(", ")));
            w.line(&format!(
                "put({p_base}u + (warp * 16u + r) * {}u + hc + {}u, p{q} * {up});",
                self.crow,
                4 * q
            ));
        }
        w.line("workgroupBarrier();");
        block = block.then(self.products(w, "acc", "p", "v", &[&down, "uv"]));
        w.close();
        loops = loops.then(Loops::of(self.blocks_of(c), block));
        loops.then(self.write_out(w, "acc", "o", "o", "row0", "1.0"))
    }

    /// Blocks of `rows` rows over T: the most iterations of a loop over blocks.
    fn blocks_of(&self, rows: u32) -> u64 {
        u64::from(self.cfg.shape.t.div_ceil(rows))
    }

    /// dQ; its loops.
    fn backward_q(&self, w: &mut Wgsl) -> Loops {
        let (r, c) = (self.own, self.other);
        w.line(&format!("let row0 = blk * {r}u;"));
        w.line("let qi = row0 + warp * 16u + r;");
        w.line(&format!("let nb = min((T + {}u) / {c}u, (row0 + {}u) / {c}u);", c - 1, r + c - 1));
        w.line(&format!("let kend = min(T, nb * {c}u);"));
        for x in ["q", "d_o", "o"] {
            self.load_tile(w, &format!("{x}r"), x, "row0", r, true);
        }
        w.line("// Partial sums of delta = Σ_d dO·O, summed per row in order below.");
        self.delta_partials(w, "d_or", "or", r);
        for x in exponents(self.pass) {
            w.line(&format!("var m{x} = 0u;"));
        }
        for x in ["q", "d_o", "o"] {
            self.tile_max(w, &format!("{x}r"), x, r);
        }
        let mut loops = self.rows_max(w, &["k", "v"], "0u", "kend", self.cfg.shape.t);
        loops = loops.then(self.reduce(w));
        self.store_tile(w, "qr", "q", r);
        self.store_tile(w, "d_or", "d_o", r);
        w.line("var rd = 0.0;");
        w.line("let lr = warp * 16u + r;");
        w.block("for (var g = 0u; g < DG; g++)", &["rd += scratch[lr * DG + g];"]);
        loops = loops.then(Loops::flat(u64::from(self.dp / 4)));
        w.line("var rl = 0.0;");
        w.block("if qi < T", &["rl = lse[row_at(bh, qi)];"]);
        self.ds_scale(w);
        w.line("let fs = SCALE * uq * uk;");
        w.line("let fp = ud_o * uv;");
        self.zero_accs(w, &["acc"]);
        self.load_tile(w, "kn", "k", "0u", c, true);
        self.load_tile(w, "vn", "v", "0u", c, true);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line(&format!("let col0 = jb * {c}u;"));
        w.line("workgroupBarrier();");
        self.store_tile(w, "kn", "k", c);
        self.store_tile(w, "vn", "v", c);
        w.line("workgroupBarrier();");
        self.prefetch(w, &[("kn", "k"), ("vn", "v")], "jb + 1u < nb", &format!("col0 + {c}u"), c);
        let mut block = self.scores(w, "q", "k");
        self.read_scores(w, "s", "fs");
        for q in 0..c / 8 {
            let p: Vec<String> =
                (0..4).map(|j| format!("select(0.0, exp(s{q}[{j}] - rl), {})", self.keep(q, j))).collect();
            w.line(&format!("let p{q} = vec4<f32>({});", p.join(", ")));
        }
        w.line("workgroupBarrier();");
        block = block.then(self.scores(w, "d_o", "v"));
        self.read_scores(w, "g", "fp");
        let ds_base = self.region("ds");
        for q in 0..c / 8 {
            w.line(&format!(
                "put({ds_base}u + (warp * 16u + r) * {}u + hc + {}u, p{q} * (g{q} - rd) * f1 * f2);",
                self.crow,
                4 * q
            ));
        }
        w.line("workgroupBarrier();");
        block = block.then(self.products(w, "acc", "ds", "k", &["v1", "v2", "uk"]));
        w.close();
        loops = loops.then(Loops::of(self.blocks_of(c), block));
        loops.then(self.write_out(w, "acc", "dq", "dq", "row0", "SCALE"))
    }

    /// dK and dV; its loops.
    fn backward_kv(&self, w: &mut Wgsl) -> Loops {
        let (r, c) = (self.own, self.other);
        w.line(&format!("let col0 = blk * {r}u;"));
        w.line(&format!("let ib0 = col0 / {c}u;"));
        w.line(&format!("let nib = (T + {}u) / {c}u;", c - 1));
        self.load_tile(w, "kr", "k", "col0", r, true);
        self.load_tile(w, "vr", "v", "col0", r, true);
        for x in exponents(self.pass) {
            w.line(&format!("var m{x} = 0u;"));
        }
        self.tile_max(w, "kr", "k", r);
        self.tile_max(w, "vr", "v", r);
        let t = self.cfg.shape.t;
        let mut loops = self.rows_max(w, &["q", "d_o", "o"], &format!("ib0 * {c}u"), "T", t);
        loops = loops.then(self.reduce(w));
        self.store_tile(w, "kr", "k", r);
        self.store_tile(w, "vr", "v", r);
        self.ds_scale(w);
        w.line("let fs = SCALE * uk * uq;");
        w.line("let fp = uv * ud_o;");
        self.zero_accs(w, &["gk", "gv"]);
        let up = f32_lit((1u64 << P_SHIFT) as f32);
        let down = f32_lit(1.0 / (1u64 << P_SHIFT) as f32);
        let next = [("qn", "q"), ("d_on", "d_o"), ("on", "o")];
        for (reg, x) in next {
            self.load_tile(w, reg, x, &format!("ib0 * {c}u"), c, true);
        }
        w.open("for (var ib = ib0; ib < nib; ib++)");
        w.line(&format!("let row0 = ib * {c}u;"));
        w.line("workgroupBarrier();");
        self.store_tile(w, "qn", "q", c);
        self.store_tile(w, "d_on", "d_o", c);
        self.delta_partials(w, "d_on", "on", c);
        self.prefetch(w, &next, "ib + 1u < nib", &format!("row0 + {c}u"), c);
        w.open(&format!("if t < {c}u"));
        w.line("var lt = 0.0;");
        w.block("if row0 + t < T", &["lt = lse[row_at(bh, row0 + t)];"]);
        w.line("rl[t] = lt;");
        w.close();
        w.line("workgroupBarrier();");
        w.open(&format!("if t < {c}u"));
        w.line("var dt = 0.0;");
        w.block("for (var g = 0u; g < DG; g++)", &["dt += scratch[t * DG + g];"]);
        w.line("rd[t] = dt;");
        w.close();
        let mut block = Loops::flat(u64::from(self.dp / 4));
        w.line("workgroupBarrier();");
        w.line("// Transposed scores: rows are this subgroup's keys, columns the block's queries.");
        block = block.then(self.scores(w, "k", "q"));
        self.read_scores(w, "s", "fs");
        for q in 0..c / 8 {
            let p: Vec<String> = (0..4)
                .map(|j| {
                    format!("select(0.0, exp(s{q}[{j}] - rl[hc + {}u]), {})", 4 * q + j, self.keep(q, j))
                })
                .collect();
            w.line(&format!("let p{q} = vec4<f32>({});", p.join(", ")));
        }
        w.line("workgroupBarrier();");
        block = block.then(self.scores(w, "v", "d_o"));
        self.read_scores(w, "g", "fp");
        let (p_base, ds_base) = (self.region("p"), self.region("ds"));
        for q in 0..c / 8 {
            let at = format!("(warp * 16u + r) * {}u + hc + {}u", self.crow, 4 * q);
            let cols = 4 * q;
            w.line(&format!(
                "let dl{q} = vec4<f32>(rd[hc + {cols}u], rd[hc + {}u], rd[hc + {}u], rd[hc + {}u]);",
                cols + 1,
                cols + 2,
                cols + 3
            ));
            w.line(&format!("put({p_base}u + {at}, p{q} * {up});"));
            w.line(&format!("put({ds_base}u + {at}, p{q} * (g{q} - dl{q}) * f1 * f2);"));
        }
        w.line("workgroupBarrier();");
        block = block.then(self.products(w, "gv", "p", "d_o", &[&down, "ud_o"]));
        block = block.then(self.products(w, "gk", "ds", "q", &["v1", "v2", "uq"]));
        w.close();
        loops = loops.then(Loops::of(self.blocks_of(c), block));
        loops = loops.then(self.write_out(w, "gk", "dk", "dkv", "col0", "SCALE"));
        loops.then(self.write_out(w, "gv", "dv", "dkv", "col0", "1.0"))
    }
}

/// The kernel of `pass` for `cfg` on cooperative matrices of `mode` (emulated when
/// `emulate`), with blocks `configure` chose from [`candidates`].
pub fn generate(cfg: &Config, pass: Pass, mode: CoopMode, emulate: bool) -> Generated {
    let g = Gen::new(cfg, pass, mode, emulate);
    let (wgsl, workgroup_bytes, loops) = g.module();
    Generated {
        wgsl,
        threads: g.nt,
        workgroup_bytes,
        workgroups: cfg.shape.t.div_ceil(g.own) * cfg.shape.heads(),
        bindings: super::simt::bindings(pass),
        loops,
    }
}
