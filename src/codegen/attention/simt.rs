//! The fp32 SIMT attention kernels: forward, dK/dV and dQ, every block product on the SIMT
//! cores (the `highest` precision).
//!
//! Each workgroup stages its operands' blocks in workgroup memory as f32 rows of `dp + 1`
//! elements (`dp` = Dh rounded up to 4, or further when a small Dh would leave threads without
//! accumulator elements; zero-filled; the odd stride keeps column reads free of bank
//! conflicts), then computes block products in per-thread register tiles: thread `(ty, tx)` of
//! a `y x x` split ([`split`]) owns rows `ty + y·a` and columns `tx + x·b`.
//!
//! - Forward (per query block): stage Q once; per key block (only those at or left of the
//!   diagonal) stage K and V, scores `S = scale·Q Kᵀ` (masked to `NEG`) into workgroup memory,
//!   a row pass (one thread per row) updates the running max `m`, the sum `l` and the
//!   correction `e^(m_old − m)` and turns S into `P = e^(S − m)`, then `O = O·corr + P V` in
//!   registers. At the end `O / l` and `L = m + ln l` are stored.
//! - dK/dV (per key block): stage K and V once; per query block at or below the diagonal stage
//!   Q, dO, L and delta, form `P = e^(scale·Q Kᵀ − L)` and `dS = P ∘ (dO Vᵀ − delta)`, then
//!   `dV += Pᵀ dO`, `dK += dSᵀ Q`.
//! - dQ (per query block): stage Q, dO, L, delta once; per key block stage K and V, form dS as
//!   above, `dQ += dS K`.
//!
//! Grid: `blocks · heads` workgroups, linear; workgroup `id` takes head `id / blocks` and block
//! `id % blocks`. Loop bounds depend on the workgroup id only, so every barrier is in uniform
//! control flow. Every global read and write is guarded by `i < T && d < DH`.

use super::{Blocks, Config, Generated, Pass, Shape, Strided, Tensor};
use crate::codegen::expr::f32_lit;
use crate::codegen::writer::Wgsl;

/// Blocks `configure` tries, in order of preference.
pub const CANDIDATES: &[Blocks] = &[
    Blocks { br: 64, bc: 64, threads: 256 },
    Blocks { br: 64, bc: 32, threads: 256 },
    Blocks { br: 32, bc: 32, threads: 256 },
    Blocks { br: 32, bc: 32, threads: 128 },
    Blocks { br: 32, bc: 16, threads: 128 },
    Blocks { br: 16, bc: 16, threads: 64 },
    Blocks { br: 16, bc: 8, threads: 64 },
    Blocks { br: 8, bc: 8, threads: 64 },
    Blocks { br: 8, bc: 4, threads: 32 },
    Blocks { br: 4, bc: 4, threads: 16 },
];

/// Bytes of workgroup memory the kernel of `pass` declares with blocks `b`.
pub fn workgroup_bytes(s: &Shape, b: &Blocks, pass: Pass) -> u32 {
    let ds = padded(s.dh, b, pass) + 1;
    let (q_rows, k_rows, p) = (b.br * ds, b.bc * ds, b.br * (b.bc + 1));
    4 * match pass {
        Pass::Forward => q_rows + 2 * k_rows + p + 3 * b.br,
        Pass::BackwardKv => 2 * (q_rows + k_rows) + 2 * p + 2 * b.br,
        Pass::BackwardQ => 2 * (q_rows + k_rows) + p + 2 * b.br,
    }
}

/// The storage bindings of `pass`, in binding order, and whether each is written (at most 7).
fn bindings(pass: Pass) -> Vec<(Tensor, bool)> {
    use Tensor::*;
    let (read, write): (&[Tensor], &[Tensor]) = match pass {
        Pass::Forward => (&[Q, K, V], &[O, Lse]),
        Pass::BackwardKv => (&[Q, K, V, Lse, DO, Delta], &[DKV]),
        Pass::BackwardQ => (&[Q, K, V, Lse, DO, Delta], &[DQ]),
    };
    let r = read.iter().map(|&t| (t, false));
    r.chain(write.iter().map(|&t| (t, true))).collect()
}

/// The kernel of `pass` for `cfg` (whose blocks `configure` chose).
pub fn generate(cfg: &Config, pass: Pass) -> Generated {
    let g = Gen::new(cfg, pass);
    let mut w = Wgsl::new();
    let bindings = bindings(pass);
    g.header(&mut w, &bindings);
    let bytes = g.memory(&mut w);
    let s = &cfg.shape;
    let own = if pass == Pass::BackwardKv { g.b.bc } else { g.b.br };
    let blocks = s.t.div_ceil(own);
    w.line(&format!("@compute @workgroup_size({})", g.b.threads));
    w.open("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32)");
    w.line("let id = wid.x + wid.y * nwg.x;");
    w.block(&format!("if id >= {}u", blocks * s.heads()), &["return;"]);
    w.line(&format!("let bh = id / {blocks}u;"));
    w.line(&format!("let blk = id % {blocks}u;"));
    match pass {
        Pass::Forward => g.forward(&mut w),
        Pass::BackwardKv => g.backward_kv(&mut w),
        Pass::BackwardQ => g.backward_q(&mut w),
    }
    w.close();
    Generated {
        wgsl: w.finish(),
        threads: g.b.threads,
        workgroup_bytes: bytes,
        workgroups: blocks * s.heads(),
        bindings,
    }
}

/// Dh rounded up to 4, or further (zero columns) until the accumulator tile splits evenly over
/// the threads.
fn padded(dh: u32, b: &Blocks, pass: Pass) -> u32 {
    let rows = if pass == Pass::BackwardKv { b.bc } else { b.br };
    let dp0 = dh.next_multiple_of(4);
    (dp0..dp0 + 128).step_by(4).find(|&dp| split(rows, dp, b.threads).is_some()).unwrap_or(dp0)
}

/// Threads `(y, x)` along rows and columns covering an `m x n` tile with `threads`
/// invocations, each owning `(m / y) x (n / x)` elements: the split with the smallest
/// per-thread perimeter (fewest loads per product), ties to more threads along columns; None
/// when no split divides both sides.
fn split(m: u32, n: u32, threads: u32) -> Option<(u32, u32)> {
    (1..=threads)
        .filter(|&x| threads.is_multiple_of(x))
        .map(|x| (threads / x, x))
        .filter(|&(y, x)| m.is_multiple_of(y) && n.is_multiple_of(x))
        .min_by_key(|&(y, x)| (m / y + n / x, u32::MAX - x))
}

/// A split of a tile over the threads: `y x x` threads, `rows x cols` elements each.
#[derive(Clone, Copy, Debug)]
struct Split {
    y: u32,
    x: u32,
    rows: u32,
    cols: u32,
}

impl Split {
    /// The split of an `m x n` tile; every candidate block and padded Dh has one (`padded`,
    /// and the candidates are powers of two with at most as many threads as elements).
    fn new(m: u32, n: u32, threads: u32) -> Split {
        let (y, x) = split(m, n, threads).unwrap_or((1, 1));
        Split { y, x, rows: m / y, cols: n / x }
    }

    /// `let {p}y = t / x;` and `let {p}x = t % x;`
    fn coords(&self, w: &mut Wgsl, p: &str) {
        w.line(&format!("let {p}y = t / {}u;", self.x));
        w.line(&format!("let {p}x = t % {}u;", self.x));
    }

    fn row(&self, p: &str, a: u32) -> String {
        format!("({p}y + {}u)", a * self.y)
    }

    fn col(&self, p: &str, b: u32) -> String {
        format!("({p}x + {}u)", b * self.x)
    }

    fn each(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.rows).flat_map(move |a| (0..self.cols).map(move |b| (a, b)))
    }
}

struct Gen<'a> {
    cfg: &'a Config,
    b: Blocks,
    /// Padded head dimension.
    dp: u32,
    /// The scores tile `br x bc`, and the accumulator tile (`br x dp`, or `bc x dp` for dK/dV).
    s: Split,
    acc: Split,
    pass: Pass,
}

impl<'a> Gen<'a> {
    fn new(cfg: &'a Config, pass: Pass) -> Gen<'a> {
        let b = cfg.blocks(pass);
        let dp = padded(cfg.shape.dh, &b, pass);
        let acc_rows = if pass == Pass::BackwardKv { b.bc } else { b.br };
        let s = Split::new(b.br, b.bc, b.threads);
        let acc = Split::new(acc_rows, dp, b.threads);
        Gen { cfg, b, dp, s, acc, pass }
    }

    /// Constants, bindings, and `fn at_{name}(bh, i, d) -> u32` (the element index) for each
    /// bound `[b, h, t, dh]` tensor (two for dK/dV), `fn row_at(bh, i)` for the stats and delta.
    fn header(&self, w: &mut Wgsl, bindings: &[(Tensor, bool)]) {
        let s = &self.cfg.shape;
        let consts = [
            ("T", s.t),
            ("DH", s.dh),
            ("H", s.h),
            ("BR", self.b.br),
            ("BC", self.b.bc),
            ("NT", self.b.threads),
            ("DP", self.dp),
            ("DS", self.dp + 1),
            ("PS", self.b.bc + 1),
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
            w.line(&format!(
                "@group(0) @binding({i}) var<storage, {access}> {}: array<f32>;",
                t.name()
            ));
        }
        w.blank();
        let l = &self.cfg.layouts;
        for (t, _) in bindings {
            let layouts: &[(&str, Strided)] = match t {
                Tensor::Q => &[("q", l.q)],
                Tensor::K => &[("k", l.k)],
                Tensor::V => &[("v", l.v)],
                Tensor::O => &[("o", l.o)],
                Tensor::DO => &[("d_o", l.d_o)],
                Tensor::DQ => &[("dq", l.dq)],
                Tensor::DKV => &[("dk", l.dk), ("dv", l.dv)],
                Tensor::Lse | Tensor::Delta => &[],
            };
            for (name, l) in layouts {
                w.open(&format!("fn at_{name}(bh: u32, i: u32, d: u32) -> u32"));
                w.line(&format!(
                    "return {}u + (bh / H) * {}u + (bh % H) * {}u + i * {}u + d;",
                    l.offset, l.sb, l.sh, l.st
                ));
                w.close();
            }
        }
        w.open("fn row_at(bh: u32, i: u32) -> u32");
        w.line("return bh * T + i;");
        w.close();
        w.blank();
    }

    /// Declares the workgroup arrays of this pass; returns their bytes.
    fn memory(&self, w: &mut Wgsl) -> u32 {
        let (br, bc, ds, ps) = (self.b.br, self.b.bc, self.dp + 1, self.b.bc + 1);
        let (q_rows, k_rows) = (br * ds, bc * ds);
        let arrays: &[(&str, u32)] = match self.pass {
            Pass::Forward => &[
                ("qs", q_rows),
                ("ks", k_rows),
                ("vs", k_rows),
                ("ps", br * ps),
                ("row_m", br),
                ("row_l", br),
                ("row_c", br),
            ],
            Pass::BackwardKv => &[
                ("qs", q_rows),
                ("dos", q_rows),
                ("ks", k_rows),
                ("vs", k_rows),
                ("ps", br * ps),
                ("dss", br * ps),
                ("rl", br),
                ("rd", br),
            ],
            Pass::BackwardQ => &[
                ("qs", q_rows),
                ("dos", q_rows),
                ("ks", k_rows),
                ("vs", k_rows),
                ("dss", br * ps),
                ("rl", br),
                ("rd", br),
            ],
        };
        for &(name, n) in arrays {
            w.line(&format!("var<workgroup> {name}: array<f32, {n}>;"));
        }
        w.blank();
        4 * arrays.iter().map(|&(_, n)| n).sum::<u32>()
    }

    /// Stage rows `row0 .. row0 + rows` of tensor `x` (head `bh`) into `dst`, zero past T and
    /// past DH.
    fn stage(&self, w: &mut Wgsl, dst: &str, x: &str, row0: &str, rows: u32) {
        w.open(&format!("for (var e = t; e < {}u; e += NT)", rows * self.dp));
        w.line("let r = e / DP;");
        w.line("let d = e % DP;");
        w.line(&format!("let i = {row0} + r;"));
        w.line("var x = 0.0;");
        w.block("if i < T && d < DH", &[&format!("x = {x}[at_{x}(bh, i, d)];")]);
        w.line(&format!("{dst}[r * DS + d] = x;"));
        w.close();
    }

    /// This thread's score tiles `{acc}{a}_{b} = Σ_d A[r, d]·B[c, d]` for each `(acc, A, B)` of
    /// `pairs`, over staged rows (rows of the scores: A, columns: B).
    fn scores(&self, w: &mut Wgsl, pairs: &[(&str, &str, &str)]) {
        let s = self.s;
        for &(acc, _, _) in pairs {
            for (a, b) in s.each() {
                w.line(&format!("var {acc}{a}_{b} = 0.0;"));
            }
        }
        w.open("for (var d = 0u; d < DP; d++)");
        for &(acc, x, y) in pairs {
            for a in 0..s.rows {
                w.line(&format!("let {acc}a{a} = {x}[{} * DS + d];", s.row("s", a)));
            }
            for b in 0..s.cols {
                w.line(&format!("let {acc}b{b} = {y}[{} * DS + d];", s.col("s", b)));
            }
            for (a, b) in s.each() {
                w.line(&format!("{acc}{a}_{b} += {acc}a{a} * {acc}b{b};"));
            }
        }
        w.close();
    }

    /// For each score element of this thread: `body(a, b, r, c, keep)` with `r`, `c` its row
    /// and column in the block and `keep` whether key `c` takes part in query row `r` (the
    /// row below T, the key at or left of it).
    fn each_score(&self, w: &mut Wgsl, mut body: impl FnMut(&mut Wgsl, u32, u32, &str, &str, &str)) {
        for (a, b) in self.s.each() {
            let (r, c) = (self.s.row("s", a), self.s.col("s", b));
            let keep = format!("(row0 + {r} < T && col0 + {c} <= row0 + {r})");
            body(w, a, b, &r, &c, &keep);
        }
    }

    fn zero_acc(&self, w: &mut Wgsl, names: &[&str]) {
        for n in names {
            for (a, b) in self.acc.each() {
                w.line(&format!("var {n}{a}_{b} = 0.0;"));
            }
        }
    }

    /// `let nb = ...;`: the key blocks query block `row0` sees (causal: up to the diagonal).
    fn key_blocks(&self, w: &mut Wgsl) {
        w.line("let nb = min((T + BC - 1u) / BC, (row0 + BR + BC - 1u) / BC);");
    }

    fn forward(&self, w: &mut Wgsl) {
        let (s, o) = (self.s, self.acc);
        w.line("let row0 = blk * BR;");
        self.stage(w, "qs", "q", "row0", self.b.br);
        w.open("for (var r = t; r < BR; r += NT)");
        w.line("row_m[r] = NEG;");
        w.line("row_l[r] = 0.0;");
        w.close();
        s.coords(w, "s");
        o.coords(w, "o");
        self.zero_acc(w, &["acc"]);
        self.key_blocks(w);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line("let col0 = jb * BC;");
        w.line("workgroupBarrier();");
        self.stage(w, "ks", "k", "col0", self.b.bc);
        self.stage(w, "vs", "v", "col0", self.b.bc);
        w.line("workgroupBarrier();");
        self.scores(w, &[("s", "qs", "ks")]);
        self.each_score(w, |w, a, b, r, c, keep| {
            w.line(&format!("ps[{r} * PS + {c}] = select(NEG, s{a}_{b} * SCALE, {keep});"));
        });
        w.line("workgroupBarrier();");
        w.line("// Row pass: running max, sum and correction; S becomes P = e^(S - m).");
        w.open("for (var r = t; r < BR; r += NT)");
        w.line("let m_old = row_m[r];");
        w.line("var m = m_old;");
        w.block("for (var c = 0u; c < BC; c++)", &["m = max(m, ps[r * PS + c]);"]);
        w.line("var l = 0.0;");
        w.open("for (var c = 0u; c < BC; c++)");
        w.line("let x = ps[r * PS + c];");
        w.line("let p = select(0.0, exp(x - m), x != NEG);");
        w.line("ps[r * PS + c] = p;");
        w.line("l += p;");
        w.close();
        w.line("let corr = exp(m_old - m);");
        w.line("row_l[r] = row_l[r] * corr + l;");
        w.line("row_m[r] = m;");
        w.line("row_c[r] = corr;");
        w.close();
        w.line("workgroupBarrier();");
        for a in 0..o.rows {
            w.line(&format!("let corr{a} = row_c[{}];", o.row("o", a)));
            for b in 0..o.cols {
                w.line(&format!("acc{a}_{b} *= corr{a};"));
            }
        }
        w.open("for (var c = 0u; c < BC; c++)");
        for a in 0..o.rows {
            w.line(&format!("let p{a} = ps[{} * PS + c];", o.row("o", a)));
        }
        for b in 0..o.cols {
            w.line(&format!("let v{b} = vs[c * DS + {}];", o.col("o", b)));
        }
        for (a, b) in o.each() {
            w.line(&format!("acc{a}_{b} += p{a} * v{b};"));
        }
        w.close();
        w.close();
        w.line("workgroupBarrier();");
        for a in 0..o.rows {
            let r = o.row("o", a);
            w.open(&format!("if row0 + {r} < T"));
            w.line(&format!("let inv{a} = 1.0 / row_l[{r}];"));
            for b in 0..o.cols {
                let d = o.col("o", b);
                w.block(
                    &format!("if {d} < DH"),
                    &[&format!("o[at_o(bh, row0 + {r}, {d})] = acc{a}_{b} * inv{a};")],
                );
            }
            w.close();
        }
        w.open("for (var r = t; r < BR; r += NT)");
        w.block("if row0 + r < T", &["lse[row_at(bh, row0 + r)] = row_m[r] + log(row_l[r]);"]);
        w.close();
    }

    /// Stage the stats and delta of the query rows `row0 ..` (0 past T).
    fn stage_row_stats(&self, w: &mut Wgsl) {
        w.open("for (var r = t; r < BR; r += NT)");
        w.line("let i = row0 + r;");
        w.line("var l = 0.0;");
        w.line("var dsum = 0.0;");
        w.block("if i < T", &["l = lse[row_at(bh, i)];", "dsum = delta[row_at(bh, i)];"]);
        w.line("rl[r] = l;");
        w.line("rd[r] = dsum;");
        w.close();
    }

    /// P and dS of the current blocks into `ps` (if `with_p`) and `dss`.
    fn probs_and_ds(&self, w: &mut Wgsl, with_p: bool) {
        self.scores(w, &[("s", "qs", "ks"), ("g", "dos", "vs")]);
        self.each_score(w, |w, a, b, r, c, keep| {
            w.line(&format!("let p{a}_{b} = select(0.0, exp(s{a}_{b} * SCALE - rl[{r}]), {keep});"));
            if with_p {
                w.line(&format!("ps[{r} * PS + {c}] = p{a}_{b};"));
            }
            w.line(&format!("dss[{r} * PS + {c}] = p{a}_{b} * (g{a}_{b} - rd[{r}]);"));
        });
    }

    fn backward_kv(&self, w: &mut Wgsl) {
        let k = self.acc;
        w.line("let col0 = blk * BC;");
        self.stage(w, "ks", "k", "col0", self.b.bc);
        self.stage(w, "vs", "v", "col0", self.b.bc);
        self.s.coords(w, "s");
        k.coords(w, "k");
        self.zero_acc(w, &["gk", "gv"]);
        w.open("for (var ib = col0 / BR; ib < (T + BR - 1u) / BR; ib++)");
        w.line("let row0 = ib * BR;");
        w.line("workgroupBarrier();");
        self.stage(w, "qs", "q", "row0", self.b.br);
        self.stage(w, "dos", "d_o", "row0", self.b.br);
        self.stage_row_stats(w);
        w.line("workgroupBarrier();");
        self.probs_and_ds(w, true);
        w.line("workgroupBarrier();");
        w.open("for (var r = 0u; r < BR; r++)");
        for a in 0..k.rows {
            w.line(&format!("let p{a} = ps[r * PS + {}];", k.row("k", a)));
            w.line(&format!("let ds{a} = dss[r * PS + {}];", k.row("k", a)));
        }
        for b in 0..k.cols {
            w.line(&format!("let do{b} = dos[r * DS + {}];", k.col("k", b)));
            w.line(&format!("let q{b} = qs[r * DS + {}];", k.col("k", b)));
        }
        for (a, b) in k.each() {
            w.line(&format!("gv{a}_{b} += p{a} * do{b};"));
            w.line(&format!("gk{a}_{b} += ds{a} * q{b};"));
        }
        w.close();
        w.close();
        for a in 0..k.rows {
            let j = k.row("k", a);
            w.open(&format!("if col0 + {j} < T"));
            for b in 0..k.cols {
                let d = k.col("k", b);
                w.block(
                    &format!("if {d} < DH"),
                    &[
                        &format!("dkv[at_dk(bh, col0 + {j}, {d})] = gk{a}_{b} * SCALE;"),
                        &format!("dkv[at_dv(bh, col0 + {j}, {d})] = gv{a}_{b};"),
                    ],
                );
            }
            w.close();
        }
    }

    fn backward_q(&self, w: &mut Wgsl) {
        let q = self.acc;
        w.line("let row0 = blk * BR;");
        self.stage(w, "qs", "q", "row0", self.b.br);
        self.stage(w, "dos", "d_o", "row0", self.b.br);
        self.stage_row_stats(w);
        self.s.coords(w, "s");
        q.coords(w, "q");
        self.zero_acc(w, &["gq"]);
        self.key_blocks(w);
        w.open("for (var jb = 0u; jb < nb; jb++)");
        w.line("let col0 = jb * BC;");
        w.line("workgroupBarrier();");
        self.stage(w, "ks", "k", "col0", self.b.bc);
        self.stage(w, "vs", "v", "col0", self.b.bc);
        w.line("workgroupBarrier();");
        self.probs_and_ds(w, false);
        w.line("workgroupBarrier();");
        w.open("for (var c = 0u; c < BC; c++)");
        for a in 0..q.rows {
            w.line(&format!("let ds{a} = dss[{} * PS + c];", q.row("q", a)));
        }
        for b in 0..q.cols {
            w.line(&format!("let k{b} = ks[c * DS + {}];", q.col("q", b)));
        }
        for (a, b) in q.each() {
            w.line(&format!("gq{a}_{b} += ds{a} * k{b};"));
        }
        w.close();
        w.close();
        for a in 0..q.rows {
            let r = q.row("q", a);
            w.open(&format!("if row0 + {r} < T"));
            for b in 0..q.cols {
                let d = q.col("q", b);
                w.block(
                    &format!("if {d} < DH"),
                    &[&format!("dq[at_dq(bh, row0 + {r}, {d})] = gq{a}_{b} * SCALE;")],
                );
            }
            w.close();
        }
    }
}
