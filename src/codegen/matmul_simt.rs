//! The generated fp32 SIMT matmul for large products (precision `highest`): register-tiled,
//! slices of A and B staged in workgroup memory, every loop inside a slice unrolled.
//!
//! A workgroup computes `bm x bn` of C; thread `(tx, ty)` keeps `tm x tn` of it in `vec4`
//! registers, owning rows `r4 * 4 * TY + ty * 4 + e` and columns `q * 4 * TX + tx * 4 + e`, so
//! its reads of workgroup memory are `vec4`s that neighbouring threads take side by side. Both
//! slices are staged k-major (rows padded by 4 floats); an operand whose contiguous axis is K is
//! transposed while staging. The next slice is loaded into registers while the current one is
//! multiplied; with two stages the staging buffers alternate and one barrier per slice suffices.
//! The accumulators are plain `vec4` variables, so the driver sees straight-line code.
//!
//! Ported from the issue-11 prototype, whose best tile on the H200 (128x256x8, 8x16 per thread,
//! two stages, `vec4` loads) reached 40 TFLOP/s at 4096³ where the `shaders/matmul.wgsl`
//! template reaches 18.
//!
//! Bounds: every global read goes through `quad_a` / `quad_b`, which read only elements inside
//! the operand's `[rows, cols]` extent (zero outside: ragged M, N and K), and every store is
//! checked against M and N; the caller checks the extents against the buffers (the program's
//! binding sizes). So the kernel is compiled without naga's bounds checks and loop guard.
//!
//! Bindings are those of the template (0 the `Params` uniform, 1 A, 2 B, 3 C, the epilogue's
//! from 4); with vector loads A and B are bound as `array<vec4<f32>>` views of the same buffers.

use super::matmul::{MatmulSpec, Operand};
use super::writer::Wgsl;

/// Tile of the SIMT kernel: a workgroup computes `bm x bn` of C, each thread `tm x tn` in
/// registers, K in slices of `bk` (`stages` 1: one staging buffer and two barriers per slice;
/// 2: double buffer and one barrier).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    pub stages: u32,
}

/// The tile measured fastest on the H200 for large products (128x256x8, 8x16 per thread, two
/// stages): 41.6 TFLOP/s at 4096³ where [`NARROW_TILE`] reaches 30.0 (and a 128x128 tile
/// with 8x8 a thread, removed since, 39.0: between the two in every product of the GPT steps,
/// and its time, 24 to 35 TFLOP/s at the same blocks and K, was one no cost model of ours
/// predicted well enough to choose it; BENCHMARKS.md, 2026-12-02).
pub const SIMT_TILE: SimtTile = SimtTile { bm: 128, bn: 256, bk: 8, tm: 8, tn: 16, stages: 2 };
/// 128x64 blocks, 8x8 per thread, 128 threads: for products of a narrow C, whose blocks of
/// [`SIMT_TILE`] do not fill the multiprocessors (4096x768x3072: 577 µs against 724).
pub const NARROW_TILE: SimtTile = SimtTile { bm: 128, bn: 64, bk: 8, tm: 8, tn: 8, stages: 2 };

/// The SIMT tiles the cost model chooses between, with the names plans and profiles give them.
pub const SIMT_TILES: [(&str, SimtTile); 2] = [("simt", SIMT_TILE), ("simt-128x64", NARROW_TILE)];

/// Floats of padding after each staged row.
const PAD: u32 = 4;

impl SimtTile {
    /// Threads per workgroup.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// The name of a tile of [`SIMT_TILES`] (`simt-other` for any other).
    pub fn name(&self) -> &'static str {
        SIMT_TILES.iter().find(|(_, t)| t == self).map_or("simt-other", |&(name, _)| name)
    }

    /// Bytes of workgroup memory the kernel declares.
    pub fn workgroup_bytes(&self) -> u32 {
        self.stages * self.bk * ((self.bm + PAD) + (self.bn + PAD)) * 4
    }
}

/// How the kernel reads one operand: which axis has stride 1, and whether whole aligned quads
/// are read as one `vec4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The column stride is 1 (`[rows, cols]` row-major); otherwise the row stride is.
    pub row_major: bool,
    /// The operand is not empty and its offset, non-unit strides and contiguous extent are
    /// multiples of 4: quads are 16-byte aligned `vec4` loads and the operand's extent is a
    /// whole number of `vec4`s.
    pub vector: bool,
}

impl Access {
    /// How the kernel can read `op` (`[batch, rows, cols]`), or `None` when neither its row
    /// nor its column stride is 1.
    pub fn of(op: &Operand, batch: u32, rows: u32, cols: u32) -> Option<Access> {
        let (row_major, other, contig) = if op.col_stride == 1 {
            (true, op.row_stride, cols)
        } else if op.row_stride == 1 {
            (false, op.col_stride, rows)
        } else {
            return None;
        };
        let batch_stride = if batch > 1 { op.batch_stride } else { 0 };
        // An empty operand may sit in a 4-byte buffer, too small to bind as `vec4`s.
        let empty = batch == 0 || rows == 0 || cols == 0;
        let vector = !empty && [op.offset, other, batch_stride, contig].iter().all(|v| v % 4 == 0);
        Some(Access { row_major, vector })
    }
}

/// The layouts of A and B in `spec`, when the kernel can read both.
pub fn accesses(spec: &MatmulSpec) -> Option<[Access; 2]> {
    Some([
        Access::of(&spec.a, spec.batch, spec.m, spec.k)?,
        Access::of(&spec.b, spec.batch, spec.k, spec.n)?,
    ])
}

/// The two operands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    A,
    B,
}

/// How a `bk`-deep slice of one operand is cut into quads: the slice is `outer x contig`
/// elements, `contig` along the operand's unit-stride axis; quad `g` covers
/// `(g / (contig / 4), 4 * (g % (contig / 4)) + 0..4)`. Origins and extents are WGSL names.
/// Shared with the cooperative kernels (`matmul_coop.rs`).
pub(super) struct Slice {
    pub x: &'static str,
    pub outer: u32,
    pub contig: u32,
    pub outer_origin: &'static str,
    pub contig_origin: &'static str,
    pub outer_total: &'static str,
    pub contig_total: &'static str,
    /// The contiguous axis is K (the slice is transposed while staging).
    contig_is_k: bool,
    /// The non-unit stride in `Params`.
    stride: &'static str,
}

/// The slice of `side` for a `bm x bn` block and slices `bk` deep, read as `access` says.
pub(super) fn slice((bm, bn, bk): (u32, u32, u32), side: Side, access: Access) -> Slice {
    let (x, outer, contig, oo, co, ot, ct, kc, stride) = match (side, access.row_major) {
        (Side::A, true) => ("a", bm, bk, "row0", "k0", "M", "K", true, "p.a_si"),
        (Side::A, false) => ("a", bk, bm, "k0", "row0", "K", "M", false, "p.a_sk"),
        (Side::B, true) => ("b", bk, bn, "k0", "col0", "K", "N", false, "p.b_sk"),
        (Side::B, false) => ("b", bn, bk, "col0", "k0", "N", "K", true, "p.b_sj"),
    };
    Slice {
        x,
        outer,
        contig,
        outer_origin: oo,
        contig_origin: co,
        outer_total: ot,
        contig_total: ct,
        contig_is_k: kc,
        stride,
    }
}

/// The most epilogue values an invocation loads ahead of its stores at a time (registers on
/// top of the accumulators): the rows of its tile go in groups that load at most this many.
const LOADS_AHEAD: u32 = 32;

/// The WGSL of the kernel on tile `t` reading A and B as `access` says, with the epilogue's
/// declarations (`@binding(4)` on) and body (of `fn epilogue(v, batch, i, j) -> scalar`);
/// `loads`: values `epilogue_loads` returns an element (`MatmulEpilogue::loads`), 0 when the
/// epilogue's loads are not split out. The tile must split evenly (see [`tile_fits`]).
pub fn generate(
    t: &SimtTile,
    access: [Access; 2],
    decls: &str,
    body: &str,
    loads: u32,
) -> String {
    let threads = t.threads();
    let (tx, ty) = (t.bn / t.tn, t.bm / t.tm);
    let (as4, bs4) = ((t.bm + PAD) / 4, (t.bn + PAD) / 4);
    let (stage_a, stage_b) = (t.bk * as4, t.bk * bs4);
    let sa = slice((t.bm, t.bn, t.bk), Side::A, access[0]);
    let sb = slice((t.bm, t.bn, t.bk), Side::B, access[1]);
    let la = sa.outer * sa.contig / 4 / threads;
    let lb = sb.outer * sb.contig / 4 / threads;

    let mut w = Wgsl::new();
    w.line("alias scalar = f32;");
    w.line(&format!(
        "// fp32 SIMT matmul {}x{}x{}, {}x{} per thread, {} stages (codegen/matmul_simt.rs)",
        t.bm, t.bn, t.bk, t.tm, t.tn, t.stages
    ));
    w.blank();
    params_and_operands(&mut w, access, decls);
    w.blank();
    w.line(&format!("var<workgroup> sa: array<vec4<f32>, {}>;", t.stages * stage_a));
    w.line(&format!("var<workgroup> sb: array<vec4<f32>, {}>;", t.stages * stage_b));
    w.blank();
    epilogue_and_store(&mut w, body);
    if loads > 0 {
        store_with_loads(&mut w, loads);
    }
    for (s, acc) in [(&sa, access[0]), (&sb, access[1])] {
        quad_fn(&mut w, s, acc.vector, None);
    }
    for (s, stride, reg, per_thread) in [(&sa, as4, "pa", la), (&sb, bs4, "pb", lb)] {
        stage_fn(&mut w, s, stride, reg, per_thread, threads);
    }

    block_entry(&mut w, threads, (t.bm, t.bn));
    w.line(&format!("let tx = t % {tx}u;"));
    w.line(&format!("let ty = t / {tx}u;"));
    for l in 0..la {
        w.line(&format!("var pa{l}: vec4<f32>;"));
    }
    for l in 0..lb {
        w.line(&format!("var pb{l}: vec4<f32>;"));
    }
    let (tm4, tn4) = (t.tm / 4, t.tn / 4);
    for r in 0..t.tm {
        for q in 0..tn4 {
            w.line(&format!("var c{r}_{q} = vec4<f32>(0.0);"));
        }
    }
    w.line("var k0 = 0u;");
    load_quads(&mut w, &sa, "pa", la, threads);
    load_quads(&mut w, &sb, "pb", lb, threads);
    w.line(&format!("stage_a(t, 0u, {});", regs("pa", la)));
    w.line(&format!("stage_b(t, 0u, {});", regs("pb", lb)));
    w.line("workgroupBarrier();");
    w.line(&format!("let n_slices = (K + {}u) / {}u;", t.bk - 1, t.bk));
    w.open("for (var s = 0u; s < n_slices; s++)");
    if t.stages == 2 {
        w.line(&format!("let cur_a = (s & 1u) * {stage_a}u;"));
        w.line(&format!("let cur_b = (s & 1u) * {stage_b}u;"));
        w.line(&format!("let nxt_a = {stage_a}u - cur_a;"));
        w.line(&format!("let nxt_b = {stage_b}u - cur_b;"));
    } else {
        w.line("let cur_a = 0u;");
        w.line("let cur_b = 0u;");
    }
    w.line("let has_next = s + 1u < n_slices;");
    w.open("if (has_next)");
    w.line(&format!("k0 = (s + 1u) * {}u;", t.bk));
    load_quads(&mut w, &sa, "pa", la, threads);
    load_quads(&mut w, &sb, "pb", lb, threads);
    w.close();
    for kk in 0..t.bk {
        for r4 in 0..tm4 {
            w.line(&format!("let a{r4}_{kk} = sa[cur_a + {}u + ty];", kk * as4 + r4 * ty));
        }
        for q in 0..tn4 {
            w.line(&format!("let b{q}_{kk} = sb[cur_b + {}u + tx];", kk * bs4 + q * tx));
        }
        for r in 0..t.tm {
            let comp = ["x", "y", "z", "w"][(r % 4) as usize];
            for q in 0..tn4 {
                w.line(&format!("c{r}_{q} += a{}_{kk}.{comp} * b{q}_{kk};", r / 4));
            }
        }
    }
    let stage_next = |w: &mut Wgsl, at_a: &str, at_b: &str| {
        w.open("if (has_next)");
        w.line(&format!("stage_a(t, {at_a}, {});", regs("pa", la)));
        w.line(&format!("stage_b(t, {at_b}, {});", regs("pb", lb)));
        w.close();
    };
    if t.stages == 2 {
        stage_next(&mut w, "nxt_a", "nxt_b");
        w.line("workgroupBarrier();");
    } else {
        w.line("workgroupBarrier();");
        stage_next(&mut w, "0u", "0u");
        w.line("workgroupBarrier();");
    }
    w.close();
    for r in 0..t.tm {
        w.line(&format!("let i{r} = row0 + {}u + ty * 4u;", (r / 4) * 4 * ty + r % 4));
    }
    for q in 0..tn4 {
        w.line(&format!("let j{q} = col0 + {}u + tx * 4u;", q * 4 * tx));
    }
    // An epilogue that reads other buffers loads a group of rows' values before storing them,
    // so the loads wait for memory together: stored one element after another behind its
    // bounds checks, each load waited in turn (the cooperative kernels' lesson, `22697b2`).
    let group = if loads == 0 { t.tm } else { (LOADS_AHEAD / (t.tn * loads)).clamp(1, t.tm) };
    for rows in (0..t.tm).collect::<Vec<_>>().chunks(group as usize) {
        if loads > 0 {
            for &r in rows {
                for q in 0..tn4 {
                    for e in 0..4 {
                        w.line(&format!(
                            "let pre{r}_{q}_{e} = epilogue_loads(batch, i{r}, j{q} + {e}u);"
                        ));
                    }
                }
            }
        }
        for &r in rows {
            w.open(&format!("if (i{r} < M)"));
            for q in 0..tn4 {
                for (e, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let at = format!("c{r}_{q}.{comp}, batch, i{r}, j{q} + {e}u");
                    let store = if loads > 0 {
                        format!("store_c_with({at}, pre{r}_{q}_{e});")
                    } else {
                        format!("store_c({at});")
                    };
                    w.block(&format!("if (j{q} + {e}u < N)"), &[&store]);
                }
            }
            w.close();
        }
    }
    w.close();
    w.finish()
}

/// The `Params` uniform (binding 0, `shaders/matmul.wgsl`'s), A and B (1 and 2, `vec4<f32>`
/// views with vector loads), C (3) and the epilogue's declarations (from 4 on).
pub(super) fn params_and_operands(w: &mut Wgsl, access: [Access; 2], decls: &str) {
    params(w);
    operands(w, access);
    w.line("@group(0) @binding(3) var<storage, read_write> c: array<f32>;");
    w.lines(decls);
}

/// The `Params` struct and uniform (binding 0).
pub(super) fn params(w: &mut Wgsl) {
    w.open("struct Params");
    w.line("m: u32, n: u32, k: u32, batch: u32,");
    w.line("a_off: u32, a_sb: u32, a_si: u32, a_sk: u32,");
    w.line("b_off: u32, b_sb: u32, b_sk: u32, b_sj: u32,");
    w.line("c_off: u32, c_sb: u32, c_si: u32, c_sj: u32,");
    w.line("alpha: f32, beta: f32, pad0: u32, pad1: u32,");
    w.close();
    w.blank();
    w.line("@group(0) @binding(0) var<uniform> p: Params;");
}

/// A and B (bindings 1 and 2; `vec4<f32>` views with vector loads).
pub(super) fn operands(w: &mut Wgsl, access: [Access; 2]) {
    for (at, x, acc) in [(1, "a", access[0]), (2, "b", access[1])] {
        let ty = if acc.vector { "vec4<f32>" } else { "f32" };
        w.line(&format!("@group(0) @binding({at}) var<storage, read> {x}: array<{ty}>;"));
    }
}

/// `fn epilogue(v, batch, i, j)` with `body`, and `fn store_c`, the one writer of C.
/// The entry point of a block kernel of `threads` invocations over `bm x bn` blocks of C, opened
/// (the caller closes it), with what every block reads first: the sizes, its batch, the first
/// row and column of its block, and its operands' batch offsets.
pub(super) fn block_entry(w: &mut Wgsl, threads: u32, (bm, bn): (u32, u32)) {
    w.line(&format!("@compute @workgroup_size({threads})"));
    w.open(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32)",
    );
    w.line("let M = p.m;");
    w.line("let N = p.n;");
    w.line("let K = p.k;");
    w.line("let batch = wid.z;");
    w.line(&format!("let row0 = wid.y * {bm}u;"));
    w.line(&format!("let col0 = wid.x * {bn}u;"));
    w.line("let a_base = p.a_off + batch * p.a_sb;");
    w.line("let b_base = p.b_off + batch * p.b_sb;");
}

pub(super) fn epilogue_and_store(w: &mut Wgsl, body: &str) {
    w.open("fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar");
    w.lines(body);
    w.close();
    w.blank();
    w.line("// Element (i, j) of C, i < M and j < N: the epilogue, then beta (C unread when 0).");
    store_fn(w, "store_c", "", "epilogue(p.alpha * v, batch, i, j)");
}

/// `fn store_c_with(v, batch, i, j, pre)`: `store_c` for an epilogue whose `loads` values were
/// loaded ahead (`MatmulEpilogue::loads`).
pub(super) fn store_with_loads(w: &mut Wgsl, loads: u32) {
    let call = "epilogue_with(p.alpha * v, batch, i, j, pre)";
    store_fn(w, "store_c_with", &format!(", pre: array<f32, {loads}>"), call);
}

fn store_fn(w: &mut Wgsl, name: &str, params: &str, epilogue: &str) {
    w.open(&format!("fn {name}(v: f32, batch: u32, i: u32, j: u32{params})"));
    w.line("let idx = p.c_off + batch * p.c_sb + i * p.c_si + j * p.c_sj;");
    w.line(&format!("var y = {epilogue};"));
    w.block("if (p.beta != 0.0)", &["y += p.beta * c[idx];"]);
    w.line("c[idx] = y;");
    w.close();
    w.blank();
}

/// Whether tile `t` splits evenly: sizes multiples of 4, whole thread tiles, and the quads of
/// each slice a multiple of the thread count in either layout.
pub fn tile_fits(t: &SimtTile) -> bool {
    let dims = [t.bm, t.bn, t.bk, t.tm, t.tn];
    if dims.iter().any(|&d| d == 0 || d % 4 != 0) || !(1..=2).contains(&t.stages) {
        return false;
    }
    if !t.bm.is_multiple_of(t.tm) || !t.bn.is_multiple_of(t.tn) {
        return false;
    }
    let threads = t.threads();
    (t.bm * t.bk / 4).is_multiple_of(threads) && (t.bk * t.bn / 4).is_multiple_of(threads)
}

/// `fn quad_a(base, o, c, on, cn) -> vec4<f32>`: elements `(o, c..c+4)` along the operand's
/// contiguous axis, zero where `o >= on` or the index is `>= cn`: the only global reads. With
/// `map`, each element read is `map(e, value)` (`e` its index in the buffer); the zeros
/// outside are not mapped.
pub(super) fn quad_fn(w: &mut Wgsl, s: &Slice, vector: bool, map: Option<&str>) {
    quad_fn_named(w, &format!("quad_{}", s.x), s, vector, map);
}

/// [`quad_fn`] named `name`.
pub(super) fn quad_fn_named(w: &mut Wgsl, name: &str, s: &Slice, vector: bool, map: Option<&str>) {
    let x = s.x;
    let stride = s.stride;
    let read = |e: &str| {
        let v = if vector { format!("{x}[({e}) / 4u][({e}) % 4u]") } else { format!("{x}[{e}]") };
        match map {
            Some(f) => format!("{f}({e}, {v})"),
            None => v,
        }
    };
    w.open(&format!("fn {name}(base: u32, o: u32, c: u32, on: u32, cn: u32) -> vec4<f32>"));
    w.line("var v = vec4<f32>(0.0);");
    w.open("if (o < on)");
    w.line(&format!("let e = base + o * {stride} + c;"));
    w.open("if (c + 3u < cn)");
    match (vector, map) {
        (true, None) => w.line(&format!("v = {x}[e / 4u];")),
        (true, Some(f)) => {
            w.line(&format!("let q = {x}[e / 4u];"));
            w.line(&format!("v = vec4<f32>({f}(e, q.x), {f}(e + 1u, q.y), {f}(e + 2u, q.z), {f}(e + 3u, q.w));"))
        }
        (false, _) => {
            let at = |q: u32| if q == 0 { "e".to_string() } else { format!("e + {q}u") };
            let all: Vec<String> = (0..4).map(|q| read(&at(q))).collect();
            w.line(&format!("v = vec4<f32>({});", all.join(", ")))
        }
    };
    w.close();
    w.open("else");
    for (q, comp) in ["x", "y", "z", "w"].iter().enumerate() {
        let at = if q == 0 { "e".to_string() } else { format!("e + {q}u") };
        w.block(&format!("if (c + {q}u < cn)"), &[&format!("v.{comp} = {};", read(&at))]);
    }
    w.close();
    w.close();
    w.line("return v;");
    w.close();
    w.blank();
}

/// `fn stage_a(t, base, pa0, ...)`: this thread's quads into the k-major staging buffer (one
/// `vec4` store when the contiguous axis is M or N, four scalars when it is K).
fn stage_fn(w: &mut Wgsl, s: &Slice, stride: u32, reg: &str, per_thread: u32, threads: u32) {
    let x = s.x;
    let per_row = s.contig / 4;
    let params: Vec<String> = (0..per_thread).map(|l| format!("{reg}{l}: vec4<f32>")).collect();
    w.open(&format!("fn stage_{x}(t: u32, base: u32, {})", params.join(", ")));
    for l in 0..per_thread {
        let g = format!("(t + {}u)", l * threads);
        if s.contig_is_k {
            w.line(&format!("let o{l} = {g} / {per_row}u;"));
            w.line(&format!("let k{l} = 4u * ({g} % {per_row}u);"));
            for (e, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                w.line(&format!(
                    "s{x}[base + (k{l} + {e}u) * {stride}u + o{l} / 4u][o{l} % 4u] = {reg}{l}.{comp};"
                ));
            }
        } else {
            w.line(&format!(
                "s{x}[base + ({g} / {per_row}u) * {stride}u + {g} % {per_row}u] = {reg}{l};"
            ));
        }
    }
    w.close();
    w.blank();
}

/// Lines loading this thread's quads of the slice at `k0` into `{reg}{l}`.
pub(super) fn load_quads(w: &mut Wgsl, s: &Slice, reg: &str, per_thread: u32, threads: u32) {
    let per_row = s.contig / 4;
    for l in 0..per_thread {
        w.line(&format!(
            "{reg}{l} = quad_{x}({x}_base, {oo} + (t + {off}u) / {per_row}u, {co} + 4u * ((t + {off}u) % {per_row}u), {ot}, {ct});",
            x = s.x,
            off = l * threads,
            oo = s.outer_origin,
            co = s.contig_origin,
            ot = s.outer_total,
            ct = s.contig_total,
        ));
    }
}

/// `pa0, pa1, ...`
pub(super) fn regs(reg: &str, n: u32) -> String {
    (0..n).map(|l| format!("{reg}{l}")).collect::<Vec<_>>().join(", ")
}
