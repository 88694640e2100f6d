//! The conversion pre-pass of the cooperative matmuls: one dispatch that writes A and B as f16
//! (`high`: hi and lo parts, lo times 2^[`LO_SHIFT`](super::matmul_coop::LO_SHIFT)) into a
//! workspace, each strip of [`STRIP`] rows of A (columns of B) scaled by its own power of two,
//! so the product ([`super::matmul_coop`]) reads half the bytes and has no conversion, scaling,
//! splitting or bounds check in its loop (issue-11 prototype, round 2: `medium` 150 TFLOP/s
//! for the product alone at 4096³ against 83 converting in the loop).
//!
//! Range: a strip's exponent `e` brings its max-abs into `[2^14, 2^15)` (f16's largest
//! finite is 65504); the product multiplies each fragment by `2^-ea · 2^-eb`, the exponents of
//! its rows' strip and its columns' strip, before the epilogue (exact). Without it f16 turns
//! elements beyond 65504 into infinities and flushes those below 6e-8; with one exponent per
//! operand (before 2026-12-01, a separate max-abs pass), rows far below the operand's largest
//! (the gradients of well-predicted tokens, a massive activation's neighbours) still lost
//! their bits. A strip is one fragment's rows, so a fragment's scale is one number.
//!
//! Each strip is one workgroup's: it walks the strip's units twice, for their max-abs
//! (reduced in workgroup memory), then to scale and store them; the second walk goes
//! backwards, so that what the first read last, the likeliest still in cache, is read first.
//! The exponents go to their own words ([`exponent_words`]), written before the product reads
//! them and read by nothing else: no state passes from one product to the next.
//!
//! The workspace holds planes of 16-byte units (8 halves), in this order: A hi, B hi, then for
//! `high` A lo, B lo. Each plane is its operand in its own layout (`[batch][outer][contig]`,
//! `contig` the unit-stride axis, so a transposed operand needs no transposing) with M, N and K
//! rounded up to the tile's `bm`, `bn` and `bk` and the padding zero-filled: every row is a
//! whole number of units and every slice the product stages lies inside its plane. A broadcast
//! operand (batch stride 0) has one plane for every batch. Both kernels compute the extents
//! from the `Params` uniform with the same WGSL (`layout`), the host with
//! [`workspace_words`].
//!
//! Real kernels bind the workspace as `array<vec4<f16>>` (two elements a unit; naga 30 cannot
//! bitcast between `u32` and `f16` vectors). Emulated kernels (no f16 on the adapter) bind it
//! as `array<vec4<u32>>`, each word two halves from `pack2x16float`: the same bytes.
//!
//! Bindings: 0 the product's `Params`, 1 A, 2 B (`vec4<f32>` views with vector loads),
//! [`WORKSPACE_BINDING`] the workspace, [`EXPONENT_BINDING`] the exponents (written). Entry
//! point `main`, a grid-stride loop over the strips.

use super::matmul::MatmulSpec;
use super::matmul_coop::{CoopKernel, CoopMode, CoopTile};
use super::matmul_simt::{operands, params, quad_fn, quad_fn_named, slice, Access, Side};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::prologue::Prologue;
use super::trace::math_wgsl;
use super::writer::Wgsl;
use crate::err;
use crate::error::Result;

/// The binding of the f16 workspace, in the conversion and in the product.
pub const WORKSPACE_BINDING: u32 = 14;
/// The binding of the strips' exponents, in the conversion and in the product (after any
/// epilogue's bindings).
pub const EXPONENT_BINDING: u32 = 15;
/// The binding of B's column sums, in a conversion that writes them.
pub const SUM_BINDING: u32 = 13;
/// The first bindings of A's and of B's LayerNorm buffers (stats, weight, bias), for an
/// operand read through a prologue with one ([`super::prologue::Norm`]).
const NORM_BINDINGS: [u32; 2] = [4, 7];
/// Threads per workgroup of the conversion.
const THREADS: u32 = 256;
/// Most workgroups of the conversion (each then converts several strips).
const MAX_GROUPS: u64 = 8192;

/// Padded `(outer, contig)` extents of operand `side`'s plane, per batch.
fn plane(t: &CoopTile, side: Side, access: Access, s: &MatmulSpec) -> (u64, u64) {
    let pad = |x: u32, m: u32| u64::from(x).div_ceil(u64::from(m)) * u64::from(m);
    let (mp, np, kp) = (pad(s.m, t.bm), pad(s.n, t.bn), pad(s.k, t.bk));
    match (side, access.row_major) {
        (Side::A, true) => (mp, kp),
        (Side::A, false) => (kp, mp),
        (Side::B, true) => (kp, np),
        (Side::B, false) => (np, kp),
    }
}

/// Halves of the hi planes of A and of B (a broadcast operand has one plane).
fn hi_halves(k: &CoopKernel, access: [Access; 2], s: &MatmulSpec) -> [u64; 2] {
    let planes = |batch_stride: u32| if batch_stride == 0 { 1 } else { u64::from(s.batch) };
    let half = |side, acc, batch_stride| {
        let (o, c) = plane(&k.tile, side, acc, s);
        planes(batch_stride) * o * c
    };
    [half(Side::A, access[0], s.a.batch_stride), half(Side::B, access[1], s.b.batch_stride)]
}

/// Halves of the whole workspace of `spec` on kernel `k` (hi planes, and lo planes for `high`).
pub fn workspace_halves(k: &CoopKernel, access: [Access; 2], s: &MatmulSpec) -> u64 {
    let parts = if k.mode == CoopMode::High { 2 } else { 1 };
    parts * hi_halves(k, access, s).iter().sum::<u64>()
}

/// 4-byte words of the workspace (two halves each).
pub fn workspace_words(k: &CoopKernel, access: [Access; 2], s: &MatmulSpec) -> u64 {
    workspace_halves(k, access, s) / 2
}

/// WGSL lines, after `M`, `N` and `K` are bound, that bind the planes' extents: `a_op`, `a_cp`,
/// `b_op`, `b_cp` (outer and contiguous, in halves), `a_ps`, `b_ps` (units per batch, 0 for a
/// broadcast operand) and `ua`, `ub` (units of the A and the B hi plane, all batches).
pub(super) fn layout(w: &mut Wgsl, t: &CoopTile, access: [Access; 2]) {
    for (p, d, b) in [("Mp", "M", t.bm), ("Np", "N", t.bn), ("Kp", "K", t.bk)] {
        w.line(&format!("let {p} = ({d} + {}u) / {b}u * {b}u;", b - 1));
    }
    let (ao, ac) = if access[0].row_major { ("Mp", "Kp") } else { ("Kp", "Mp") };
    let (bo, bc) = if access[1].row_major { ("Kp", "Np") } else { ("Np", "Kp") };
    for (x, o, c) in [("a", ao, ac), ("b", bo, bc)] {
        w.line(&format!("let {x}_op = {o};"));
        w.line(&format!("let {x}_cp = {c};"));
        w.line(&format!("let {x}_ps = select({x}_op * ({x}_cp / 8u), 0u, p.{x}_sb == 0u);"));
        w.line(&format!("let u{x} = select(p.batch, 1u, p.{x}_sb == 0u) * {x}_op * ({x}_cp / 8u);"));
    }
}

/// Rows of A (columns of B) that share an exponent: one fragment's, so a fragment's scale is
/// one number and the product can store fragments straight into C.
pub const STRIP: u32 = 16;

/// Exponent words of `spec` on kernel `k`: one per strip of [`STRIP`] rows of A's padded
/// plane, per batch of A, then one per strip of columns of B's, per batch of B (a broadcast
/// operand has one batch).
pub fn exponent_words(k: &CoopKernel, s: &MatmulSpec) -> u64 {
    let t = &k.tile;
    let pad = |x: u32, m: u32| u64::from(x).div_ceil(u64::from(m)) * u64::from(m);
    let batches = |sb: u32| if sb == 0 { 1 } else { u64::from(s.batch) };
    let strips = |x: u32, m: u32| pad(x, m) / u64::from(STRIP);
    batches(s.a.batch_stride) * strips(s.m, t.bm) + batches(s.b.batch_stride) * strips(s.n, t.bn)
}

/// The conversion of `spec` on kernel `k` (A and B read as `access` says; the tile checked),
/// over `params` (the product's uniform), A, B, the workspace and the exponents; with `sums`
/// it also writes the sums over K of B's columns there (`[batch, n]`, row-major; B must be
/// row-major, so that each invocation walks the same columns of a strip at every row).
pub fn program(
    spec: &MatmulSpec,
    k: &CoopKernel,
    access: [Access; 2],
    [params, a, b, ws, exps]: [Resource; 5],
    sums: Option<Resource>,
    prologues: &[Prologue; 2],
    label: &str,
) -> Result<Program> {
    let s = spec;
    if sums.is_some() && !access[1].row_major {
        return Err(err!(Invariant, "{label}: column sums of a B that is not row-major"));
    }
    let strips = exponent_words(k, s);
    let groups = strips.clamp(1, MAX_GROUPS) as u32;
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    let summing = sums.is_some();
    let mut bindings = vec![
        bind(0, "p", params, 0),
        bind(1, "a", a, s.a.words(s.batch, s.m, s.k)),
        bind(2, "b", b, s.b.words(s.batch, s.k, s.n)),
        bind(WORKSPACE_BINDING, "ws", ws, workspace_words(k, access, s)),
        bind(EXPONENT_BINDING, "exps", exps, strips),
    ];
    if let Some(sums) = sums {
        bindings.push(bind(SUM_BINDING, "sums", sums, u64::from(s.batch) * u64::from(s.n)));
    }
    for ((x, p), at) in ["a", "b"].iter().zip(prologues).zip(NORM_BINDINGS) {
        bindings.extend(p.norm.iter().flat_map(|n| n.bindings(at, x)));
    }
    Ok(Program {
        label: label.to_string(),
        wgsl: generate(k, access, summing, prologues)?,
        entry: "main",
        workgroup_size: THREADS,
        bindings,
        grid: Grid::Fixed([groups, 1, 1]),
        // Reads go through the quads (inside the operands), writes stay inside the planes
        // (and the sums inside `[batch, n]`).
        checks: ShaderChecks { bounds: false, loop_bounding: false },
    })
}

/// `@binding` of the workspace, as each kernel sees it.
pub(super) fn workspace_decl(emulate: bool, access: &str) -> String {
    let elem = if emulate { "vec4<u32>" } else { "vec4<f16>" };
    format!("@group(0) @binding({WORKSPACE_BINDING}) var<storage, {access}> ws: array<{elem}>;")
}

/// WGSL lines, after [`layout`], that bind `sa` and `sb` (strips of A and of B per batch) and
/// `na` (exponent words of A; B's follow).
pub(super) fn strips(w: &mut Wgsl) {
    w.line(&format!("let sa = Mp / {STRIP}u;"));
    w.line(&format!("let sb = Np / {STRIP}u;"));
    w.line("let na = select(p.batch, 1u, p.a_sb == 0u) * sa;");
}

/// `fn exponent(m: u32) -> i32`: the exponent `e` for max-abs bits `m` such that `2^e` brings
/// the max-abs into `[2^14, 2^15)` (f16's largest finite is 65504), 0 for an all-zero strip,
/// clamped to `[-126, 126]` so that `2^-e` is an exact normal f32.
pub(super) fn exponent_fn(w: &mut Wgsl) {
    w.open("fn exponent(m: u32) -> i32");
    w.block("if (m == 0u)", &["return 0;"]);
    w.line("return clamp(141 - i32(m >> 23u), -126, 126);");
    w.close();
    w.blank();
}

/// The WGSL of the conversion (entry point `main`): a grid-stride loop over the strips, each
/// converted by one workgroup in two passes over its units: their max-abs (reduced in
/// workgroup memory), then, walking back, the units scaled by `2^e` into the planes.
///
/// With `sums`, each invocation also adds up the units it reads of a strip of B in its first
/// pass (B row-major: an invocation walks one unit column of 8 at every row it takes), the
/// workgroup adds the invocations' sums of each unit column in the same tree as the max-abs,
/// and two invocations write the strip's 16 column sums: deterministic, in f32, of the values
/// as read (before scaling).
fn generate(k: &CoopKernel, access: [Access; 2], sums: bool, prologues: &[Prologue; 2]) -> Result<String> {
    let t = &k.tile;
    let high = k.mode == CoopMode::High;
    let mut w = Wgsl::new();
    if !k.emulate {
        w.line("enable f16;");
    }
    w.line("alias scalar = f32;");
    let emulated = if k.emulate { ", emulated" } else { "" };
    w.line(&format!(
        "// f16 operands of the {} matmul {}{emulated} (codegen/coop_convert.rs)",
        k.name(),
        t.name()
    ));
    w.blank();
    params(&mut w);
    operands(&mut w, access);
    w.line(&workspace_decl(k.emulate, "read_write"));
    w.line(&format!(
        "@group(0) @binding({EXPONENT_BINDING}) var<storage, read_write> exps: array<i32>;"
    ));
    for (x, p, at) in [("a", &prologues[0], NORM_BINDINGS[0]), ("b", &prologues[1], NORM_BINDINGS[1])] {
        w.lines(&p.decls(at, x));
    }
    w.line(&format!("var<workgroup> red: array<u32, {THREADS}>;"));
    let computes = prologues.iter().any(Prologue::computes_stats);
    if computes {
        w.line(&format!("var<workgroup> ln3: array<vec3<f32>, {THREADS}>;"));
    }
    if sums {
        w.line(&format!(
            "@group(0) @binding({SUM_BINDING}) var<storage, read_write> sums: array<f32>;"
        ));
        w.line(&format!("var<workgroup> part: array<vec4<f32>, {}>;", 2 * THREADS));
    }
    w.blank();
    exponent_fn(&mut w);
    let slices = [Side::A, Side::B].map(|side| {
        let i = usize::from(side == Side::B);
        slice((t.bm, t.bn, t.bk), side, access[i])
    });
    // An operand read through a prologue (`codegen::prologue`): each element read, in both
    // walks, goes through it (not the padding, which stays zero).
    if prologues.iter().any(|p| !p.is_empty()) {
        w.lines(math_wgsl());
    }
    for ((s, acc), p) in slices.iter().zip(access).zip(prologues) {
        let map = format!("prologue_{}", s.x);
        if !p.is_empty() {
            w.lines(&p.wgsl_fn(&map, s.x));
        }
        quad_fn(&mut w, s, acc.vector, (!p.is_empty()).then_some(map.as_str()));
        if p.computes_stats() {
            quad_fn_named(&mut w, &format!("raw_{}", s.x), s, acc.vector, None);
        }
    }
    if computes {
        merge_fn(&mut w);
    }
    if high {
        super::matmul_coop::split_hi_fn(&mut w);
    }
    w.line("fn bits(v: vec4<f32>) -> vec4<u32> {");
    w.line("    return bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu);");
    w.line("}");
    w.blank();
    // One unit: 8 halves, as two vec4<f16> or four words of two packed halves.
    w.open("fn put(u: u32, v0: vec4<f32>, v1: vec4<f32>)");
    if k.emulate {
        w.line("let p0 = vec2<u32>(pack2x16float(v0.xy), pack2x16float(v0.zw));");
        w.line("let p1 = vec2<u32>(pack2x16float(v1.xy), pack2x16float(v1.zw));");
        w.line("ws[u] = vec4<u32>(p0, p1);");
    } else {
        w.line("ws[2u * u] = vec4<f16>(v0);");
        w.line("ws[2u * u + 1u] = vec4<f16>(v1);");
    }
    w.close();
    w.blank();
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32, @builtin(num_workgroups) nw: vec3<u32>)",
    );
    w.line("let M = p.m;");
    w.line("let N = p.n;");
    w.line("let K = p.k;");
    layout(&mut w, t, access);
    strips(&mut w);
    w.line("let nb = select(p.batch, 1u, p.b_sb == 0u) * sb;");
    // Uniform: the strip depends only on the workgroup, so every invocation reaches the
    // barriers.
    w.open("for (var g = wid.x; g < na + nb; g += nw.x)");
    for (side, s) in [Side::A, Side::B].into_iter().zip(&slices) {
        let x = s.x;
        // The scaled axis (M of A, N of B) is the plane's outer one or its contiguous one.
        let outer_scaled = (side == Side::A) == access[usize::from(side == Side::B)].row_major;
        if side == Side::A {
            w.open("if (g < na)");
            w.line("let bi = g / sa;");
            w.line("let st = g % sa;");
            w.line("let plane = bi * a_ps;");
        } else {
            w.open("else");
            w.line("let bi = (g - na) / sb;");
            w.line("let st = (g - na) % sb;");
            w.line("let plane = ua + bi * b_ps;");
        }
        w.line(&format!("let base = p.{x}_off + bi * p.{x}_sb;"));
        w.line(&format!("let row_units = {x}_cp / 8u;"));
        let norm = prologues[usize::from(side == Side::B)].norm.as_ref();
        if let Some(eps) = norm.and_then(|n| n.eps) {
            if !outer_scaled {
                return Err(err!(Invariant, "LayerNorm stats computed by a conversion whose strips are not rows"));
            }
            stats_pass(&mut w, s, eps);
        }
        // Unit @ of the strip: its row and unit column in the plane.
        let (units, o, cu) = if outer_scaled {
            (
                format!("{STRIP}u * row_units"),
                format!("st * {STRIP}u + @ / row_units"),
                "@ % row_units".to_string(),
            )
        } else {
            let per_row = STRIP / 8;
            (
                format!("{x}_op * {per_row}u"),
                format!("@ / {per_row}u"),
                format!("st * {per_row}u + @ % {per_row}u"),
            )
        };
        w.line(&format!("let units = {units};"));
        let (ot, ct) = (s.outer_total, s.contig_total);
        let load = |w: &mut Wgsl| {
            w.line(&format!("let o = {};", o.replace('@', "r")));
            w.line(&format!("let cu = {};", cu.replace('@', "r")));
            w.line(&format!("let v0 = quad_{x}(base, o, cu * 8u, {ot}, {ct});"));
            w.line(&format!("let v1 = quad_{x}(base, o, cu * 8u + 4u, {ot}, {ct});"));
        };
        let walk = format!("for (var r = t; r < units; r += {THREADS}u)");
        // B row-major: the strip's 16 columns are 2 units a row, and an invocation always
        // takes the unit `t % 2` (THREADS is even).
        let sum = sums && side == Side::B && !outer_scaled;
        w.line("var m = vec4<u32>(0u);");
        if sum {
            w.line("var s0 = vec4<f32>(0.0);");
            w.line("var s1 = vec4<f32>(0.0);");
        }
        w.open(&walk);
        load(&mut w);
        w.line("m = max(m, max(bits(v0), bits(v1)));");
        if sum {
            w.line("s0 += v0;");
            w.line("s1 += v1;");
        }
        w.close();
        w.line("red[t] = max(max(m.x, m.y), max(m.z, m.w));");
        if sum {
            w.line("part[2u * t] = s0;");
            w.line("part[2u * t + 1u] = s1;");
        }
        w.line("workgroupBarrier();");
        w.open(&format!("for (var h = {}u; h > 0u; h >>= 1u)", THREADS / 2));
        w.open("if (t < h)");
        w.line("red[t] = max(red[t], red[t + h]);");
        if sum {
            // Down to invocations 0 and 1, each the sum of its unit column.
            w.block(
                "if (h > 1u)",
                &[
                    "part[2u * t] += part[2u * (t + h)];",
                    "part[2u * t + 1u] += part[2u * (t + h) + 1u];",
                ],
            );
        }
        w.close();
        w.line("workgroupBarrier();");
        w.close();
        if sum {
            w.open("if (t < 2u)");
            w.line(&format!("let j = st * {STRIP}u + t * 8u;"));
            w.line("var s = array<vec4<f32>, 2>(part[2u * t], part[2u * t + 1u]);");
            w.open("for (var q = 0u; q < 8u; q++)");
            w.block("if (j + q < N)", &["sums[bi * N + j + q] = s[q / 4u][q % 4u];"]);
            w.close();
            w.close();
        }
        // Strip g's word: A's strips come first, B's follow.
        w.line("let e = exponent(red[0]);");
        w.block("if (t == 0u)", &["exps[g] = e;"]);
        w.line("let sc = ldexp(1.0, e);");
        // The second walk goes backwards: the units the first walk read last are the ones
        // still in cache. Walked forwards again, an operand larger than the L2 cache (a
        // weight gradient's B over 4096 rows: 48 MB) finds none of it there.
        let last = THREADS - 1;
        w.line(&format!("let walks = select(0u, (units - t + {last}u) / {THREADS}u, t < units);"));
        w.open("for (var i = walks; i > 0u; i--)");
        w.line(&format!("let r = t + (i - 1u) * {THREADS}u;"));
        load(&mut w);
        w.line("let u = plane + o * row_units + cu;");
        if high {
            w.line("let x0 = v0 * sc;");
            w.line("let x1 = v1 * sc;");
            w.line("let h0 = split_hi(x0);");
            w.line("let h1 = split_hi(x1);");
            w.line("put(u, h0, h1);");
            // lo scaled by 2^LO_SHIFT into hi's range: unscaled, the lo of every element more
            // than 2^15 below the strip's max-abs would be an f16 subnormal and lose bits.
            let up = format!("{:?}", f64::from(1u32 << super::matmul_coop::LO_SHIFT));
            w.line(&format!("put(ua + ub + u, (x0 - h0) * {up}, (x1 - h1) * {up});"));
        } else {
            w.line("put(u, v0 * sc, v1 * sc);");
        }
        w.close();
        w.close();
    }
    // `red` is read above until every invocation has its exponent.
    w.line("workgroupBarrier();");
    w.close();
    w.close();
    Ok(w.finish())
}

/// `fn merge3`: the (count, mean, M2) of two sets of values merged (Chan, Golub and LeVeque), as
/// `shaders/layer_norm.wgsl` merges them (an empty set leaves the other as it is).
fn merge_fn(w: &mut Wgsl) {
    w.open("fn merge3(a: vec3<f32>, b: vec3<f32>) -> vec3<f32>");
    w.block("if (b.x == 0.0)", &["return a;"]);
    w.block("if (a.x == 0.0)", &["return b;"]);
    w.line("let n = a.x + b.x;");
    w.line("let delta = b.y - a.y;");
    w.line("let f = b.x / n;");
    w.line("return vec3<f32>(n, a.y + delta * f, a.z + b.z + delta * delta * a.x * f);");
    w.close();
    w.blank();
}

/// WGSL lines, inside a strip of A (whole rows: `base`, `st`, `row_units` bound), that compute
/// the LayerNorm stats (mean, rstd) of the strip's rows of the value A reads and write them to
/// `a_stats` before the walks read them through the prologue: 16 invocations a row, each the
/// exact mean and sum of squared deviations of its own elements (read twice, `raw_a`), merged
/// in order with Chan's formula, as `shaders/layer_norm.wgsl` does (rows of K elements).
fn stats_pass(w: &mut Wgsl, s: &super::matmul_simt::Slice, eps: f32) {
    let x = s.x;
    let (ot, ct) = (s.outer_total, s.contig_total);
    let lanes = THREADS / STRIP;
    w.line(&format!("let srow = st * {STRIP}u + t / {lanes}u;"));
    w.line("var sn = 0.0;");
    w.line("var ss = 0.0;");
    w.line("var sq = 0.0;");
    let walk = format!("for (var u = t % {lanes}u; u < row_units; u += {lanes}u)");
    w.open(&format!("if (srow < {ot})"));
    w.open(&walk);
    w.line(&format!("let v0 = raw_{x}(base, srow, u * 8u, {ot}, {ct});"));
    w.line(&format!("let v1 = raw_{x}(base, srow, u * 8u + 4u, {ot}, {ct});"));
    w.line("ss += (v0.x + v0.y + v0.z + v0.w) + (v1.x + v1.y + v1.z + v1.w);");
    w.line(&format!("sn += f32(min({ct} - min({ct}, u * 8u), 8u));"));
    w.close();
    w.line("let own = select(0.0, ss / sn, sn > 0.0);");
    w.open(&walk);
    w.line(&format!("let v0 = raw_{x}(base, srow, u * 8u, {ot}, {ct});"));
    w.line(&format!("let v1 = raw_{x}(base, srow, u * 8u + 4u, {ot}, {ct});"));
    w.line("let j = vec4<u32>(u * 8u) + vec4<u32>(0u, 1u, 2u, 3u);");
    w.line(&format!("let d0 = select(vec4<f32>(0.0), v0 - own, j < vec4<u32>({ct}));"));
    w.line(&format!("let d1 = select(vec4<f32>(0.0), v1 - own, j + vec4<u32>(4u) < vec4<u32>({ct}));"));
    w.line("sq += dot(d0, d0) + dot(d1, d1);");
    w.close();
    w.line("ln3[t] = vec3<f32>(sn, own, sq);");
    w.close();
    w.block("else", &["ln3[t] = vec3<f32>(0.0);"]);
    w.line("workgroupBarrier();");
    w.open(&format!("if (t % {lanes}u == 0u && srow < {ot})"));
    w.line("var tot = ln3[t];");
    w.block(&format!("for (var i = 1u; i < {lanes}u; i++)"), &["tot = merge3(tot, ln3[t + i]);"]);
    w.line(&format!("{x}_stats[2u * srow] = tot.y;"));
    w.line(&format!(
        "{x}_stats[2u * srow + 1u] = inverseSqrt(tot.z / f32({ct}) + {});",
        super::expr::f32_lit(eps)
    ));
    w.close();
    // The walks below read the stats through the prologue.
    w.line("storageBarrier();");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::matmul::Operand;

    #[test]
    fn the_workspace_is_padded_planes_and_a_broadcast_operand_has_one() {
        let tile = CoopTile { bm: 128, bn: 128, bk: 64, wm: 2, wn: 4, stages: 1 };
        let row = Access { row_major: true, vector: false };
        let col = Access { row_major: false, vector: false };
        let spec = MatmulSpec::contiguous(2, 1000, 700, 300);
        // (M, N, K) padded to (1024, 768, 320); halves per batch: A 1024x320, B 320x768.
        let per_batch = 1024 * 320 + 320 * 768;
        for (mode, parts, access) in [(CoopMode::Medium, 1, [row, row]), (CoopMode::High, 2, [col, col])] {
            let k = CoopKernel { mode, tile, subgroup: 32, emulate: false };
            assert_eq!(workspace_halves(&k, access, &spec), parts * 2 * per_batch);
            let broadcast = MatmulSpec { b: Operand::row_major(300, 700).broadcast(), ..spec };
            let want = parts * (2 * 1024 * 320 + 320 * 768);
            assert_eq!(workspace_halves(&k, access, &broadcast), want);
        }
    }
}
