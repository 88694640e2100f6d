//! The fp32 SIMT attention kernels: forward, dK/dV and dQ, every block product on the SIMT
//! cores (the `highest` precision).
//!
//! Each workgroup owns `R` rows (query rows for the forward and dQ, key rows for dK/dV) and
//! loops over blocks of `C` rows of the other side. Operand rows are staged in workgroup memory
//! as `vec4<f32>` rows of `DP/4 + 1` (`DP` = Dh rounded up to a multiple of 4, or further when
//! a small Dh would leave threads without accumulator columns; zero-filled; the extra vec4
//! keeps the rows of a warp on distinct banks). Thread `(ty, tx)` of a `Y x X` split
//! ([`Split`]) owns rows `ty + Y·a` of both the `R x C` score tile (columns `tx + X·b`) and
//! the `R x DP` accumulator (the vec4 columns `tx + X·e`), so each row's softmax state lives
//! in the registers of the `X` threads that share the row, and every product reads vec4s:
//!
//! - scores `S[r, c] = Σ_d A[r, d]·B[c, d]`: per 4 elements of d, `A + B` vec4 loads for
//!   `4·A·B` multiply-adds;
//! - `acc[r, :] += Σ_c P[r, c]·M[c, :]`: P goes through workgroup memory as vec4 rows of
//!   `C/4 + 1`; per 4 columns c, `A + 4·E` vec4 loads for `16·A·E` multiply-adds.
//!
//! - Forward (per query block): stage Q once; per key block at or left of the diagonal stage K
//!   and V, scores `scale·Q Kᵀ` (masked), each thread's row maxima meet in `red`, every thread
//!   of a row takes the same new maximum `m`, rescales its part of O and of the row sum `l` by
//!   `e^(m_old − m)` and writes `P = e^(S − m)` over K's block (no longer read), then
//!   `O += P V`. At the end the parts of `l` meet in `red`; `O / l` and `L = m + ln l` are
//!   stored.
//! - dQ (per query block): stage Q and dO once, the rows' L and delta in registers; per key
//!   block stage K and V, `P = e^(scale·Q Kᵀ − L)`, `dS = P ∘ (dO Vᵀ − delta)` written over
//!   V's block, then `dQ += dS K`.
//! - dK/dV (per key block): stage K and V once; per query block at or below the diagonal stage
//!   Q, dO and L, compute the rows' delta, form `Pᵀ` and `dSᵀ` (rows: keys), then
//!   `dV += Pᵀ dO`, `dK += dSᵀ Q`.
//!
//! Both backward kernels compute FlashAttention-2's `delta_i = Σ_d dO_id·O_id` of their query
//! rows themselves (no reduction kernel before them): each thread takes the vec4s of O it
//! would stage (loaded with the block's other rows), multiplies them by the staged dO's, and
//! writes the products' sums into `dp`; the threads of a row then add its `DG` partials in
//! order.
//!
//! Each loop over blocks loads the next block's rows into registers (`pf_*`) while the current
//! one is computed, and stores them to workgroup memory at the top of the next iteration. q, k,
//! v and dO are read as vec4s where their layouts allow it.
//!
//! Grid: `blocks · heads` workgroups, linear; workgroup `id` takes head `id % heads` and the
//! block `id / heads` in the order of most work first (under the causal mask: the last query
//! block, the first key block). Loop bounds depend on the workgroup id only, so every barrier
//! is in uniform control flow. Every global read and write is guarded by `i < T && d < DH`.

use super::{Blocks, Config, Generated, Pass, Shape, Tensor};
use crate::codegen::expr::f32_lit;
use crate::codegen::loops::Loops;
use crate::codegen::writer::Wgsl;

/// Blocks `configure` tries for `pass` at head dimension `dh`, in order of preference: the
/// fastest measured on an H200 at gpt-small's and gpt-medium's shapes (BENCHMARKS.md) first,
/// then smaller blocks for less workgroup memory or short sequences.
pub fn candidates(pass: Pass, dh: u32) -> &'static [Blocks] {
    if pass == Pass::Forward && dh > 32 {
        &CANDIDATES
    } else {
        &CANDIDATES[1..]
    }
}

const CANDIDATES: [Blocks; 10] = [
    Blocks { br: 64, bc: 32, threads: 128 },
    Blocks { br: 32, bc: 32, threads: 128 },
    Blocks { br: 32, bc: 32, threads: 64 },
    Blocks { br: 32, bc: 16, threads: 64 },
    Blocks { br: 16, bc: 16, threads: 64 },
    Blocks { br: 16, bc: 16, threads: 32 },
    Blocks { br: 16, bc: 8, threads: 32 },
    Blocks { br: 8, bc: 8, threads: 16 },
    Blocks { br: 8, bc: 4, threads: 16 },
    Blocks { br: 4, bc: 4, threads: 16 },
];

/// Rows a workgroup owns and rows of each block it loops over: `(R, C)`.
fn sides(b: &Blocks, pass: Pass) -> (u32, u32) {
    match pass {
        Pass::BackwardKv => (b.bc, b.br),
        Pass::Forward | Pass::BackwardQ => (b.br, b.bc),
    }
}

/// Bytes of workgroup memory the kernel of `pass` declares with blocks `b`, or None when no
/// split of the threads fits the blocks.
pub fn workgroup_bytes(s: &Shape, b: &Blocks, pass: Pass) -> Option<u32> {
    let (dp, sp) = padded(s.dh, b, pass)?;
    Some(arrays(b, pass, dp, &sp).iter().map(|a| a.1 * a.2).sum())
}

/// The workgroup arrays of `pass`: name, elements, bytes per element.
fn arrays(b: &Blocks, pass: Pass, dp: u32, sp: &Split) -> Vec<(&'static str, u32, u32)> {
    let (r, c) = sides(b, pass);
    let dv = dp / 4 + 1;
    let pv = c / 4 + 1;
    let (own, other, p) = (r * dv, c * dv, r * pv);
    match pass {
        Pass::Forward => vec![
            ("qs", own, 16),
            ("kps", other.max(p), 16),
            ("vs", other, 16),
            ("red", r * sp.x, 4),
        ],
        Pass::BackwardQ => vec![
            ("qs", own, 16),
            ("dos", own, 16),
            ("ks", other, 16),
            ("vds", other.max(p), 16),
            ("dp", r * dp / 4, 4),
        ],
        Pass::BackwardKv => vec![
            ("ks", own, 16),
            ("vs", own, 16),
            ("qs", other, 16),
            ("dos", other, 16),
            ("ps", p, 16),
            ("dss", p, 16),
            ("rl", c, 4),
            ("rd", c, 4),
            ("dp", c * dp / 4, 4),
        ],
    }
}

/// The storage bindings of `pass`, in binding order, and whether each is written (at most 7).
pub(super) fn bindings(pass: Pass) -> Vec<(Tensor, bool)> {
    use Tensor::*;
    let (read, write): (&[Tensor], &[Tensor]) = match pass {
        Pass::Forward => (&[Q, K, V], &[O, Lse]),
        Pass::BackwardKv => (&[Q, K, V, Lse, DO, O], &[DKV]),
        Pass::BackwardQ => (&[Q, K, V, Lse, DO, O], &[DQ]),
    };
    let r = read.iter().map(|&t| (t, false));
    r.chain(write.iter().map(|&t| (t, true))).collect()
}

/// The kernel of `pass` for `cfg` (whose blocks `configure` chose, so they have a split).
pub fn generate(cfg: &Config, pass: Pass) -> Generated {
    let g = Gen::new(cfg, pass);
    let mut w = Wgsl::new();
    let bindings = bindings(pass);
    g.header(&mut w, &bindings);
    let bytes = g.memory(&mut w);
    let s = &cfg.shape;
    let blocks = s.t.div_ceil(g.r);
    w.line(&format!("@compute @workgroup_size({})", g.b.threads));
    w.open("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32)");
    w.line("let id = wid.x + wid.y * nwg.x;");
    w.block(&format!("if id >= {}u", blocks * s.heads()), &["return;"]);
    // The longest workgroups first (those owning the most blocks under the causal mask: the
    // last query blocks, the first key blocks), every head's, then the next longest.
    w.line(&format!("let bh = id % {}u;", s.heads()));
    if pass == Pass::BackwardKv {
        w.line(&format!("let blk = id / {}u;", s.heads()));
    } else {
        w.line(&format!("let blk = {}u - id / {}u;", blocks - 1, s.heads()));
    }
    w.line("let ty = t / X;");
    w.line("let tx = t % X;");
    let loops = match pass {
        Pass::Forward => g.forward(&mut w),
        Pass::BackwardKv => g.backward_kv(&mut w),
        Pass::BackwardQ => g.backward_q(&mut w),
    };
    w.close();
    Generated {
        wgsl: w.finish(),
        threads: g.b.threads,
        workgroup_bytes: bytes,
        workgroups: blocks * s.heads(),
        bindings,
        loops,
    }
}

/// Dh rounded up to 4, or further (zero columns) until the threads split the tiles evenly,
/// and that split; None when no padding up to Dh + 128 gives one.
fn padded(dh: u32, b: &Blocks, pass: Pass) -> Option<(u32, Split)> {
    let (r, c) = sides(b, pass);
    let dp0 = dh.next_multiple_of(4);
    (dp0..dp0 + 128).step_by(4).find_map(|dp| Split::new(r, c, dp, b.threads, pass).map(|s| (dp, s)))
}

/// A split of the threads: `y x x` of them, each owning `a` rows, `b` score columns and `e`
/// vec4 columns of the accumulator.
#[derive(Clone, Copy, Debug)]
struct Split {
    y: u32,
    x: u32,
    a: u32,
    b: u32,
    e: u32,
}

impl Split {
    /// The split of `threads` over `r` rows, `c` score columns and `dp / 4` vec4 accumulator
    /// columns with the fewest workgroup-memory loads per block pair, ties to more threads
    /// along rows; None when no split divides every side.
    fn new(r: u32, c: u32, dp: u32, threads: u32, pass: Pass) -> Option<Split> {
        let (n_scores, n_products) = match pass {
            Pass::Forward => (1, 1),
            Pass::BackwardQ => (2, 1),
            Pass::BackwardKv => (2, 2),
        };
        (1..=threads)
            .filter(|&x| threads.is_multiple_of(x))
            .map(|x| (threads / x, x))
            .filter(|&(y, x)| r.is_multiple_of(y) && c.is_multiple_of(x) && (dp / 4).is_multiple_of(x))
            .map(|(y, x)| Split { y, x, a: r / y, b: c / x, e: dp / 4 / x })
            .min_by_key(|s| {
                let scores = n_scores * dp / 4 * (s.a + s.b);
                let products = n_products * c / 4 * (s.a + 4 * s.e);
                let reduce = if pass == Pass::Forward { s.a * s.x } else { 0 };
                (scores + products + reduce, s.x)
            })
    }

    /// Row `a` of this thread in the block.
    fn row(&self, a: u32) -> String {
        format!("(ty + {}u)", a * self.y)
    }

    /// Score column `b` of this thread in the block.
    fn col(&self, b: u32) -> String {
        format!("(tx + {}u)", b * self.x)
    }

    /// Accumulator vec4 column `e` of this thread.
    fn group(&self, e: u32) -> String {
        format!("(tx + {}u)", e * self.x)
    }

    fn scores(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.a).flat_map(move |a| (0..self.b).map(move |b| (a, b)))
    }

    fn accs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.a).flat_map(move |a| (0..self.e).map(move |e| (a, e)))
    }
}

struct Gen<'a> {
    cfg: &'a Config,
    b: Blocks,
    /// Rows owned, rows per block looped over.
    r: u32,
    c: u32,
    /// Padded head dimension.
    dp: u32,
    sp: Split,
    pass: Pass,
}

impl<'a> Gen<'a> {
    fn new(cfg: &'a Config, pass: Pass) -> Gen<'a> {
        let b = cfg.blocks(pass);
        let (r, c) = sides(&b, pass);
        // `configure` only picks blocks with a split.
        let (dp, sp) = padded(cfg.shape.dh, &b, pass).unwrap_or((cfg.shape.dh.next_multiple_of(4), Split { y: 1, x: 1, a: r, b: c, e: 1 }));
        Gen { cfg, b, r, c, dp, sp, pass }
    }

    /// Constants, bindings, and `fn at_{name}(bh, i, d) -> u32` (the element index) for each
    /// bound `[b, h, t, dh]` tensor (two for dK/dV), `fn row_at(bh, i)` for the stats.
    fn header(&self, w: &mut Wgsl, bindings: &[(Tensor, bool)]) {
        let s = &self.cfg.shape;
        let consts = [
            ("T", s.t),
            ("DH", s.dh),
            ("H", s.h),
            ("BR", self.b.br),
            ("BC", self.b.bc),
            ("NT", self.b.threads),
            ("DG", self.dp / 4),
            ("DV", self.dp / 4 + 1),
            ("CG", self.c / 4),
            ("PV", self.c / 4 + 1),
            ("X", self.sp.x),
        ];
        for (name, v) in consts {
            w.line(&format!("const {name}: u32 = {v}u;"));
        }
        let scale = f32_lit((1.0 / (s.dh as f64).sqrt()) as f32);
        w.line(&format!("const SCALE: f32 = {scale};"));
        w.line("// Below every score: the running maximum starts here and masked scores are set to it.");
        w.line("const NEG: f32 = -3.0e38;");
        w.blank();
        for (i, (t, write)) in bindings.iter().enumerate() {
            let access = if *write { "read_write" } else { "read" };
            let ty = if self.vec4_rows(t.name()) { "vec4<f32>" } else { "f32" };
            w.line(&format!("@group(0) @binding({i}) var<storage, {access}> {}: array<{ty}>;", t.name()));
        }
        w.blank();
        super::index_fns(w, &self.cfg.layouts, bindings);
        w.blank();
    }

    /// Whether operand `x` (q, k, v, d_o, or o where the backward reads it) is read as vec4s:
    /// Dh, its offset and its strides multiples of 4, so every group of 4 elements of a row is
    /// one aligned vec4 (and the buffer, holding the last row's end, holds its last vec4).
    fn vec4_rows(&self, x: &str) -> bool {
        let l = &self.cfg.layouts;
        let layout = match x {
            "q" => l.q,
            "k" => l.k,
            "v" => l.v,
            "d_o" => l.d_o,
            "o" if self.pass != Pass::Forward => l.o,
            _ => return false,
        };
        self.cfg.shape.dh.is_multiple_of(4) && [layout.offset, layout.sb, layout.sh, layout.st].iter().all(|n| n.is_multiple_of(4))
    }

    /// Declares the workgroup arrays of this pass; returns their bytes.
    fn memory(&self, w: &mut Wgsl) -> u32 {
        let arrays = arrays(&self.b, self.pass, self.dp, &self.sp);
        for &(name, n, bytes) in &arrays {
            let ty = if bytes == 16 { "vec4<f32>" } else { "f32" };
            w.line(&format!("var<workgroup> {name}: array<{ty}, {n}>;"));
        }
        w.blank();
        arrays.iter().map(|a| a.1 * a.2).sum()
    }

    /// Stage rows `row0 .. row0 + rows` of tensor `x` (head `bh`) into `dst` as vec4s, zero
    /// past T and past DH.
    fn stage(&self, w: &mut Wgsl, dst: &str, x: &str, row0: &str, rows: u32) {
        self.load(w, dst, x, row0, rows, true);
        self.store(w, dst, rows);
    }

    /// This thread's vec4s of rows `row0 .. row0 + rows` of tensor `x` into registers
    /// `pf_{reg}{k}` (declared here when `declare`), zero past T and past DH: element
    /// `e = t + k·NT` of the block, for `k` below `rows·DG / NT` rounded up.
    fn load(&self, w: &mut Wgsl, reg: &str, x: &str, row0: &str, rows: u32, declare: bool) {
        let n = rows * self.dp / 4;
        for k in 0..n.div_ceil(self.b.threads) {
            let v = format!("pf_{reg}{k}");
            if declare {
                w.line(&format!("var {v} = vec4<f32>();"));
            } else {
                w.line(&format!("{v} = vec4<f32>();"));
            }
            w.line(&format!("let {v}e = t + {}u;", k * self.b.threads));
            w.line(&format!("let {v}i = {row0} + {v}e / DG;"));
            w.line(&format!("let {v}d = 4u * ({v}e % DG);"));
            w.open(&format!("if {v}e < {n}u && {v}i < T && {v}d < DH"));
            w.line(&format!("let at = at_{x}(bh, {v}i, {v}d);"));
            if self.vec4_rows(x) {
                w.line(&format!("{v} = {x}[at / 4u];"));
            } else if self.cfg.shape.dh.is_multiple_of(4) {
                w.line(&format!("{v} = vec4<f32>({x}[at], {x}[at + 1u], {x}[at + 2u], {x}[at + 3u]);"));
            } else {
                w.line(&format!("{v}.x = {x}[at];"));
                for (j, c) in ["y", "z", "w"].iter().enumerate() {
                    let j = j + 1;
                    w.block(&format!("if {v}d + {j}u < DH"), &[&format!("{v}.{c} = {x}[at + {j}u];")]);
                }
            }
            w.close();
        }
    }

    /// Registers `pf_{dst}{k}` of [`Gen::load`] into the workgroup array `dst`.
    fn store(&self, w: &mut Wgsl, dst: &str, rows: u32) {
        self.each_vec4(w, rows, |e, k| format!("{dst}[{e} / DG * DV + {e} % DG] = pf_{dst}{k};"));
    }

    /// `line(e, k)` for each of this thread's vec4s `e = (t + k·NT)` of a block of `rows` rows
    /// (the elements [`Gen::load`] gives it), guarded by `e` in range where the last `k` is
    /// not full.
    fn each_vec4(&self, w: &mut Wgsl, rows: u32, line: impl Fn(&str, u32) -> String) {
        let n = rows * self.dp / 4;
        for k in 0..n.div_ceil(self.b.threads) {
            let e = format!("(t + {}u)", k * self.b.threads);
            let text = line(&e, k);
            if (k + 1) * self.b.threads <= n {
                w.line(&text);
            } else {
                w.block(&format!("if {e} < {n}u"), &[&text]);
            }
        }
    }

    /// When `cond`, [`Gen::load`] of each `(registers, tensor)` of `pairs` from `row0`.
    fn prefetch(&self, w: &mut Wgsl, pairs: &[(&str, &str)], cond: &str, row0: &str, rows: u32) {
        w.line("// The next block's rows come in while this one is computed.");
        w.open(&format!("if {cond}"));
        for &(reg, x) in pairs {
            self.load(w, reg, x, row0, rows, false);
        }
        w.close();
    }

    /// The log-sum-exp of query rows `row0 + t + k·NT` into `pl{k}` (0 past T).
    fn load_stats(&self, w: &mut Wgsl, row0: &str, declare: bool) {
        for k in 0..self.b.br.div_ceil(self.b.threads) {
            if declare {
                w.line(&format!("var pl{k} = 0.0;"));
            } else {
                w.line(&format!("pl{k} = 0.0;"));
            }
            let i = format!("{row0} + t + {}u", k * self.b.threads);
            w.block(&format!("if t + {}u < BR && {i} < T", k * self.b.threads), &[&format!("pl{k} = lse[row_at(bh, {i})];")]);
        }
    }

    /// The partial products of delta over `rows` staged query rows: `dp[e] = dos[e]·pf_os{k}`
    /// for this thread's vec4s `e = t + k·NT` (those [`Gen::load`] of O into `os` gave it;
    /// zero past T and past DH), then a barrier. Row `r`'s delta is `Σ_g dp[r·DG + g]`.
    fn delta_partials(&self, w: &mut Wgsl, rows: u32) {
        self.each_vec4(w, rows, |e, k| format!("dp[{e}] = dot(dos[{e} / DG * DV + {e} % DG], pf_os{k});"));
        w.line("workgroupBarrier();");
    }

    /// `Σ_g dp[{row}·DG + g]`, in order; its loop.
    fn delta_sum(&self, w: &mut Wgsl, var: &str, row: &str) -> Loops {
        w.line(&format!("var {var} = 0.0;"));
        w.block("for (var g = 0u; g < DG; g++)", &[&format!("{var} += dp[{row} * DG + g];")]);
        Loops::flat(u64::from(self.dp / 4))
    }

    /// This thread's score tiles `{acc}{a}_{b} = Σ_d A[r, d]·B[c, d]` for each `(acc, A, B)` of
    /// `pairs`, over staged rows (rows of the scores: A, columns: B); its loop over Dh.
    fn scores(&self, w: &mut Wgsl, pairs: &[(&str, &str, &str)]) -> Loops {
        let s = self.sp;
        for &(acc, _, _) in pairs {
            for (a, b) in s.scores() {
                w.line(&format!("var {acc}{a}_{b} = 0.0;"));
            }
        }
        w.open("for (var g = 0u; g < DG; g++)");
        for &(acc, x, y) in pairs {
            for a in 0..s.a {
                w.line(&format!("let {acc}a{a} = {x}[{} * DV + g];", s.row(a)));
            }
            for b in 0..s.b {
                w.line(&format!("let {acc}b{b} = {y}[{} * DV + g];", s.col(b)));
            }
            for (a, b) in s.scores() {
                w.line(&format!("{acc}{a}_{b} += dot({acc}a{a}, {acc}b{b});"));
            }
        }
        w.close();
        Loops::flat(u64::from(self.dp / 4))
    }

    /// `{acc}{a}_{e} += Σ_c P[r, c]·M[c, :]` for each `(acc, P, M)` of `products`; its loop
    /// over the block's columns.
    fn products(&self, w: &mut Wgsl, products: &[(&str, &str, &str)]) -> Loops {
        let s = self.sp;
        w.open("for (var c4 = 0u; c4 < CG; c4++)");
        for &(acc, p, m) in products {
            for a in 0..s.a {
                w.line(&format!("let {acc}p{a} = {p}[{} * PV + c4];", s.row(a)));
            }
            for j in 0..4 {
                for e in 0..s.e {
                    w.line(&format!("let {acc}m{j}_{e} = {m}[(4u * c4 + {j}u) * DV + {}];", s.group(e)));
                }
            }
            for (a, e) in s.accs() {
                for (j, c) in ["x", "y", "z", "w"].iter().enumerate() {
                    w.line(&format!("{acc}{a}_{e} += {acc}p{a}.{c} * {acc}m{j}_{e};"));
                }
            }
        }
        w.close();
        Loops::flat(u64::from(self.c / 4))
    }

    /// Store this thread's `{val}{a}_{b}` at its rows and columns of the P-shaped array `dst`.
    fn store_p(&self, w: &mut Wgsl, dst: &str, val: &str) {
        let s = self.sp;
        for (a, b) in s.scores() {
            let c = s.col(b);
            w.line(&format!("{dst}[{} * PV + {c} / 4u][{c} % 4u] = {val}{a}_{b};", s.row(a)));
        }
    }

    fn zero_acc(&self, w: &mut Wgsl, names: &[&str]) {
        for n in names {
            for (a, e) in self.sp.accs() {
                w.line(&format!("var {n}{a}_{e} = vec4<f32>();"));
            }
        }
    }

    /// Write this thread's `{acc}{a}_{e}·{factor}` to rows `row0 + r` of `at_{x}`, guarded.
    fn write_acc(&self, w: &mut Wgsl, acc: &str, x: &str, row0: &str, factor: &dyn Fn(u32) -> String) {
        let s = self.sp;
        for a in 0..s.a {
            let r = s.row(a);
            w.open(&format!("if {row0} + {r} < T"));
            for e in 0..s.e {
                let f = factor(a);
                w.line(&format!("let {x}{a}_{e} = {acc}{a}_{e} * {f};"));
                w.line(&format!("let {x}d{a}_{e} = 4u * {};", s.group(e)));
                for (j, c) in ["x", "y", "z", "w"].iter().enumerate() {
                    w.block(
                        &format!("if {x}d{a}_{e} + {j}u < DH"),
                        &[&format!("{}[at_{x}(bh, {row0} + {r}, {x}d{a}_{e} + {j}u)] = {x}{a}_{e}.{c};", self.buffer_of(x))],
                    );
                }
            }
            w.close();
        }
    }

    fn buffer_of(&self, x: &str) -> &'static str {
        match x {
            "o" => "o",
            "dq" => "dq",
            _ => "dkv",
        }
    }

    /// `let nb = ...;`: the key blocks query block `row0` sees (causal: up to the diagonal).
    fn key_blocks(&self, w: &mut Wgsl) {
        w.line("let nb = min((T + BC - 1u) / BC, (row0 + BR + BC - 1u) / BC);");
    }

    /// Whether score `(a, b)` takes part: query row below T, key at or left of it.
    fn keep(&self, a: u32, b: u32) -> String {
        let (r, c) = (self.sp.row(a), self.sp.col(b));
        match self.pass {
            Pass::BackwardKv => format!("(row0 + {c} < T && col0 + {r} <= row0 + {c})"),
            _ => format!("(row0 + {r} < T && col0 + {c} <= row0 + {r})"),
        }
    }

    /// Blocks of `rows` rows over T: the most iterations of a loop over blocks.
    fn blocks_of(&self, rows: u32) -> u64 {
        u64::from(self.cfg.shape.t.div_ceil(rows))
    }

    /// The forward; its loops: over the key blocks, each the scores, the row maxima of each
    /// of this thread's rows and the products, then the rows' sums.
    fn forward(&self, w: &mut Wgsl) -> Loops {
        let s = self.sp;
        w.line("let row0 = blk * BR;");
        self.stage(w, "qs", "q", "row0", self.b.br);
        for a in 0..s.a {
            w.line(&format!("var m{a} = NEG;"));
            w.line(&format!("var l{a} = 0.0;"));
        }
        self.zero_acc(w, &["acc"]);
        self.key_blocks(w);
        self.load(w, "kps", "k", "0u", self.b.bc, true);
        self.load(w, "vs", "v", "0u", self.b.bc, true);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line("let col0 = jb * BC;");
        w.line("workgroupBarrier();");
        self.store(w, "kps", self.b.bc);
        self.store(w, "vs", self.b.bc);
        w.line("workgroupBarrier();");
        self.prefetch(w, &[("kps", "k"), ("vs", "v")], "jb + 1u < nb", "col0 + BC", self.b.bc);
        let mut block = self.scores(w, &[("s", "qs", "kps")]);
        let threads_of_a_row = Loops::flat(u64::from(s.x));
        w.line("// Each thread's row maxima meet in red.");
        for a in 0..s.a {
            let mut mx = String::new();
            for b in 0..s.b {
                w.line(&format!("s{a}_{b} = select(NEG, s{a}_{b} * SCALE, {});", self.keep(a, b)));
                mx = if b == 0 { format!("s{a}_0") } else { format!("max({mx}, s{a}_{b})") };
            }
            w.line(&format!("red[{} * X + tx] = {mx};", s.row(a)));
        }
        w.line("workgroupBarrier();");
        w.line("// Every thread of a row takes the same maximum; P = e^(S - m) goes over K's block.");
        for a in 0..s.a {
            w.line(&format!("var mx{a} = m{a};"));
            w.block("for (var x = 0u; x < X; x++)", &[&format!("mx{a} = max(mx{a}, red[{} * X + x]);", s.row(a))]);
            block = block.then(threads_of_a_row);
            w.line(&format!("let corr{a} = exp(m{a} - mx{a});"));
            w.line(&format!("m{a} = mx{a};"));
            w.line(&format!("l{a} *= corr{a};"));
            for e in 0..s.e {
                w.line(&format!("acc{a}_{e} *= corr{a};"));
            }
            for b in 0..s.b {
                w.line(&format!("let p{a}_{b} = select(0.0, exp(s{a}_{b} - mx{a}), s{a}_{b} != NEG);"));
                w.line(&format!("l{a} += p{a}_{b};"));
            }
        }
        self.store_p(w, "kps", "p");
        w.line("workgroupBarrier();");
        let block = block.then(self.products(w, &[("acc", "kps", "vs")]));
        w.close();
        let mut loops = Loops::of(self.blocks_of(self.b.bc), block);
        w.line("// The parts of each row's sum meet in red.");
        w.line("workgroupBarrier();");
        for a in 0..s.a {
            w.line(&format!("red[{} * X + tx] = l{a};", s.row(a)));
        }
        w.line("workgroupBarrier();");
        for a in 0..s.a {
            w.line(&format!("var lt{a} = 0.0;"));
            w.block("for (var x = 0u; x < X; x++)", &[&format!("lt{a} += red[{} * X + x];", s.row(a))]);
            loops = loops.then(threads_of_a_row);
            w.line(&format!("let inv{a} = 1.0 / lt{a};"));
        }
        self.write_acc(w, "acc", "o", "row0", &|a| format!("inv{a}"));
        for a in 0..s.a {
            let r = s.row(a);
            w.block(
                &format!("if tx == 0u && row0 + {r} < T"),
                &[&format!("lse[row_at(bh, row0 + {r})] = m{a} + log(lt{a});")],
            );
        }
        loops
    }

    /// dQ; its loops: each of this thread's rows' delta, then over the key blocks the scores
    /// and the products.
    fn backward_q(&self, w: &mut Wgsl) -> Loops {
        let s = self.sp;
        w.line("let row0 = blk * BR;");
        self.stage(w, "qs", "q", "row0", self.b.br);
        self.stage(w, "dos", "d_o", "row0", self.b.br);
        self.load(w, "os", "o", "row0", self.b.br, true);
        for a in 0..s.a {
            let r = s.row(a);
            w.line(&format!("var rl{a} = 0.0;"));
            w.block(&format!("if row0 + {r} < T"), &[&format!("rl{a} = lse[row_at(bh, row0 + {r})];")]);
        }
        self.zero_acc(w, &["gq"]);
        self.key_blocks(w);
        self.load(w, "ks", "k", "0u", self.b.bc, true);
        self.load(w, "vds", "v", "0u", self.b.bc, true);
        w.line("workgroupBarrier();");
        self.delta_partials(w, self.b.br);
        let mut loops = Loops::NONE;
        for a in 0..s.a {
            loops = loops.then(self.delta_sum(w, &format!("rd{a}"), &s.row(a)));
        }
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line("let col0 = jb * BC;");
        w.line("workgroupBarrier();");
        self.store(w, "ks", self.b.bc);
        self.store(w, "vds", self.b.bc);
        w.line("workgroupBarrier();");
        self.prefetch(w, &[("ks", "k"), ("vds", "v")], "jb + 1u < nb", "col0 + BC", self.b.bc);
        let block = self.scores(w, &[("s", "qs", "ks"), ("g", "dos", "vds")]);
        for (a, b) in s.scores() {
            w.line(&format!("let p{a}_{b} = select(0.0, exp(s{a}_{b} * SCALE - rl{a}), {});", self.keep(a, b)));
            w.line(&format!("let ds{a}_{b} = p{a}_{b} * (g{a}_{b} - rd{a});"));
        }
        w.line("// dS goes over V's block once every thread has read V.");
        w.line("workgroupBarrier();");
        self.store_p(w, "vds", "ds");
        w.line("workgroupBarrier();");
        let block = block.then(self.products(w, &[("gq", "vds", "ks")]));
        w.close();
        self.write_acc(w, "gq", "dq", "row0", &|_| "SCALE".into());
        loops.then(Loops::of(self.blocks_of(self.b.bc), block))
    }

    /// dK and dV; its loops: over the query blocks, each the deltas of the block's rows this
    /// thread sums, the scores and the products.
    fn backward_kv(&self, w: &mut Wgsl) -> Loops {
        let s = self.sp;
        w.line("let col0 = blk * BC;");
        self.stage(w, "ks", "k", "col0", self.b.bc);
        self.stage(w, "vs", "v", "col0", self.b.bc);
        self.zero_acc(w, &["gk", "gv"]);
        w.line("let ib0 = col0 / BR;");
        w.line("let nib = (T + BR - 1u) / BR;");
        self.load(w, "qs", "q", "ib0 * BR", self.b.br, true);
        self.load(w, "dos", "d_o", "ib0 * BR", self.b.br, true);
        self.load(w, "os", "o", "ib0 * BR", self.b.br, true);
        self.load_stats(w, "ib0 * BR", true);
        w.open("for (var ib = ib0; ib < nib; ib++)");
        w.line("let row0 = ib * BR;");
        w.line("workgroupBarrier();");
        self.store(w, "qs", self.b.br);
        self.store(w, "dos", self.b.br);
        for k in 0..self.b.br.div_ceil(self.b.threads) {
            let r = format!("(t + {}u)", k * self.b.threads);
            w.block(&format!("if {r} < BR"), &[&format!("rl[{r}] = pl{k};")]);
        }
        w.line("workgroupBarrier();");
        self.delta_partials(w, self.b.br);
        let mut block = Loops::NONE;
        for k in 0..self.b.br.div_ceil(self.b.threads) {
            let r = format!("(t + {}u)", k * self.b.threads);
            w.open(&format!("if {r} < BR"));
            block = block.then(self.delta_sum(w, &format!("sd{k}"), &r));
            w.line(&format!("rd[{r}] = sd{k};"));
            w.close();
        }
        w.open("if ib + 1u < nib");
        self.load(w, "qs", "q", "row0 + BR", self.b.br, false);
        self.load(w, "dos", "d_o", "row0 + BR", self.b.br, false);
        self.load(w, "os", "o", "row0 + BR", self.b.br, false);
        self.load_stats(w, "row0 + BR", false);
        w.close();
        w.line("// Transposed scores: rows are this block's keys, columns the query rows.");
        let block = block.then(self.scores(w, &[("s", "ks", "qs"), ("g", "vs", "dos")]));
        w.line("// Every row's delta is in rd.");
        w.line("workgroupBarrier();");
        for b in 0..s.b {
            let c = s.col(b);
            w.line(&format!("let cl{b} = rl[{c}];"));
            w.line(&format!("let cd{b} = rd[{c}];"));
        }
        for (a, b) in s.scores() {
            w.line(&format!("let p{a}_{b} = select(0.0, exp(s{a}_{b} * SCALE - cl{b}), {});", self.keep(a, b)));
            w.line(&format!("let ds{a}_{b} = p{a}_{b} * (g{a}_{b} - cd{b});"));
        }
        self.store_p(w, "ps", "p");
        self.store_p(w, "dss", "ds");
        w.line("workgroupBarrier();");
        let block = block.then(self.products(w, &[("gv", "ps", "dos"), ("gk", "dss", "qs")]));
        w.close();
        self.write_acc(w, "gk", "dk", "col0", &|_| "SCALE".into());
        self.write_acc(w, "gv", "dv", "col0", &|_| "1.0".into());
        Loops::of(self.blocks_of(self.b.br), block)
    }
}
