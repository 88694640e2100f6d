//! The conversion pre-pass of the cooperative matmuls: one dispatch that writes A and B as f16
//! (scaled by the range pre-pass's powers of two; `high`: hi and lo parts) into a workspace,
//! so the product ([`super::matmul_coop`]) reads half the bytes and has no conversion, scaling,
//! splitting or bounds check in its loop (issue-11 prototype, round 2: `medium` 150 TFLOP/s
//! for the product alone at 4096³ against 83 converting in the loop).
//!
//! The workspace holds planes of 16-byte units (8 halves), in this order: A hi, B hi, then for
//! `high` A lo, B lo. Each plane is its operand in its own layout (`[batch][outer][contig]`,
//! `contig` the unit-stride axis, so a transposed operand needs no transposing) with M, N and K
//! rounded up to the tile's `bm`, `bn` and `bk` and the padding zero-filled: every row is a
//! whole number of units and every slice the product stages lies inside its plane. A broadcast
//! operand (batch stride 0) has one plane for every batch. The host computes the extents (`plane`,
//! for [`workspace_words`] and the conversion's walk), the product from the `Params` uniform
//! (`layout`, the same padding in WGSL).
//!
//! Real kernels bind the workspace as `array<vec4<f16>>` (two elements a unit; naga 30 cannot
//! bitcast between `u32` and `f16` vectors). Emulated kernels (no f16 on the adapter) bind it
//! as `array<vec4<u32>>`, each word two halves from `pack2x16float`: the same bytes.
//!
//! Bindings: 0 the product's `Params`, 1 A, 2 B (`vec4<f32>` views with vector loads), 3 the
//! walk (a uniform: [`Walk`] of A, then of B), [`WORKSPACE_BINDING`] the workspace,
//! [`RANGE_BINDING`] the max-abs words (read) and the exponents (written, for the product).
//! Entry point `main`. The grid is sized to the planes: the first workgroups convert A's hi
//! plane, the rest B's, each thread about [`UNITS_PER_THREAD`] units in a grid-stride loop of
//! two units (four loads) at a time. As in the range pass ([`super::maxabs`]) a thread keeps
//! its unit's `(batch, outer, contig)` indices and advances them by the stride's
//! decomposition, which the host computes: no division in the loop.

use super::matmul::MatmulSpec;
use super::matmul_coop::{CoopKernel, CoopMode, CoopTile};
use super::matmul_simt::{operands, params, quad_fn, slice, Access, Side, Slice};
use super::maxabs::{EXPONENTS, RANGE_BINDING, RANGE_WORDS};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;

/// The binding of the f16 workspace, in the conversion and in the product.
pub const WORKSPACE_BINDING: u32 = 14;
/// Threads per workgroup of the conversion.
const THREADS: u32 = 256;
/// Units each thread converts when the grid is not capped (two rounds of two units).
const UNITS_PER_THREAD: u64 = 4;
/// Most workgroups per operand; past that each thread converts more units.
const MAX_GROUPS: u64 = 8192;

/// How the workgroups of one operand walk its hi plane: unit `(b, o, c)` (8 halves from
/// column `8c`) is the `((b * outer) + o) * contig + c`th of `total`, read from the operand at
/// batch `b`, outer index `o` and contiguous index `8c`; the operand's workgroups are
/// `first..first + jump / THREADS`, and a thread steps `jump` units at a time, which is
/// `step_batch` batches, `step_outer` rows and `step_contig` units. `plane` is where the hi
/// plane starts in the workspace, `lo` how far the lo plane lies behind it (units).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
struct Walk {
    outer: u32,
    contig: u32,
    total: u32,
    first: u32,
    jump: u32,
    step_contig: u32,
    step_outer: u32,
    step_batch: u32,
    plane: u32,
    lo: u32,
    pad: [u32; 2],
}

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

/// The walk of `side`'s hi plane (read as `access` says) by the workgroups from `first` on,
/// the plane starting at unit `start` of the workspace and its lo plane `lo` units later; and
/// how many workgroups it gets. Units index the workspace as u32, which holds it: a binding
/// holds at most 2^32 bytes.
fn walk(t: &CoopTile, side: Side, access: Access, s: &MatmulSpec, [first, start, lo]: [u64; 3]) -> (Walk, u32) {
    let (outer, contig) = plane(t, side, access, s);
    let contig = contig / 8;
    let batch_stride = if side == Side::A { s.a.batch_stride } else { s.b.batch_stride };
    let batches = if batch_stride == 0 { 1 } else { u64::from(s.batch) };
    let total = batches * outer * contig;
    let per_group = u64::from(THREADS) * UNITS_PER_THREAD;
    let groups = total.div_ceil(per_group).clamp(1, MAX_GROUPS);
    let jump = groups * u64::from(THREADS);
    let rows_per_jump = jump.checked_div(contig).unwrap_or(0);
    let word = |v: u64| v as u32;
    let walk = Walk {
        outer: word(outer),
        contig: word(contig),
        total: word(total),
        first: word(first),
        jump: word(jump),
        step_contig: word(jump.checked_rem(contig).unwrap_or(0)),
        step_outer: word(rows_per_jump.checked_rem(outer).unwrap_or(0)),
        step_batch: word(rows_per_jump.checked_div(outer).unwrap_or(0)),
        plane: word(start),
        lo: word(lo),
        pad: [0; 2],
    };
    (walk, groups as u32)
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

/// The conversion of `spec` on kernel `k` (A and B read as `access` says; the tile checked),
/// over `params` (the product's uniform), A, B, the workspace and the range words.
pub fn program(
    spec: &MatmulSpec,
    k: &CoopKernel,
    access: [Access; 2],
    [params, a, b, ws, range]: [Resource; 5],
    label: &str,
) -> Program {
    let s = spec;
    let [ua, ub] = hi_halves(k, access, s).map(|h| h / 8);
    let lo = ua + ub;
    let (wa, ga) = walk(&k.tile, Side::A, access[0], s, [0, 0, lo]);
    let (wb, gb) = walk(&k.tile, Side::B, access[1], s, [u64::from(ga), ua, lo]);
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    Program {
        label: label.to_string(),
        wgsl: generate(k, access),
        entry: "main",
        workgroup_size: THREADS,
        bindings: vec![
            bind(0, "p", params, 0),
            bind(1, "a", a, s.a.words(s.batch, s.m, s.k)),
            bind(2, "b", b, s.b.words(s.batch, s.k, s.n)),
            bind(3, "q", Resource::Uniform(bytemuck::cast_slice(&[wa, wb]).to_vec()), 0),
            bind(WORKSPACE_BINDING, "ws", ws, workspace_words(k, access, s)),
            bind(RANGE_BINDING, "range", range, RANGE_WORDS),
        ],
        grid: Grid::Fixed([ga + gb, 1, 1]),
        // Reads go through the quads (inside the operands), writes stay inside the planes.
        checks: ShaderChecks { bounds: false, loop_bounding: false },
    }
}

/// `@binding` of the workspace, as each kernel sees it.
pub(super) fn workspace_decl(emulate: bool, access: &str) -> String {
    let elem = if emulate { "vec4<u32>" } else { "vec4<f16>" };
    format!("@group(0) @binding({WORKSPACE_BINDING}) var<storage, {access}> ws: array<{elem}>;")
}

/// The WGSL of the conversion (entry point `main`).
fn generate(k: &CoopKernel, access: [Access; 2]) -> String {
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
    w.lines(
        "struct Walk {
            outer: u32, contig: u32, total: u32, first: u32,
            jump: u32, dc: u32, dor: u32, db: u32,
            plane: u32, lo: u32, pad0: u32, pad1: u32,
        }

        struct Q {
            a: Walk,
            b: Walk,
        }",
    );
    w.blank();
    params(&mut w);
    operands(&mut w, access);
    w.line("@group(0) @binding(3) var<uniform> q: Q;");
    w.line(&workspace_decl(k.emulate, "read_write"));
    w.line(&format!(
        "@group(0) @binding({RANGE_BINDING}) var<storage, read_write> range: array<u32>;"
    ));
    w.blank();
    super::maxabs::exponent_fn(&mut w);
    let slices = [Side::A, Side::B].map(|side| {
        let i = usize::from(side == Side::B);
        slice((t.bm, t.bn, t.bk), side, access[i])
    });
    for (s, acc) in slices.iter().zip(access) {
        quad_fn(&mut w, s, acc.vector);
    }
    if high {
        super::matmul_coop::split_hi_fn(&mut w);
    }
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
    // One unit: its hi part (or the whole value) into the hi plane, its lo part `lo` later.
    w.open("fn store(u: u32, lo: u32, v0: vec4<f32>, v1: vec4<f32>)");
    if high {
        w.line("let h0 = split_hi(v0);");
        w.line("let h1 = split_hi(v1);");
        w.line("put(u, h0, h1);");
        w.line("put(lo + u, v0 - h0, v1 - h1);");
    } else {
        w.line("put(u, v0, v1);");
    }
    w.close();
    w.blank();
    for s in &slices {
        convert_fn(&mut w, s);
    }
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32)",
    );
    w.line("let ea = exponent(range[0]);");
    w.line("let eb = exponent(range[1]);");
    // Every invocation computes the same exponents; one writes them for the product, which
    // then sets the max-abs words back to zero (codegen/maxabs.rs).
    w.block(
        "if (wid.x == 0u && t == 0u)",
        &[
            &format!("range[{EXPONENTS}u] = bitcast<u32>(ea);"),
            &format!("range[{}u] = bitcast<u32>(eb);", EXPONENTS + 1),
        ],
    );
    w.block(
        "if (wid.x < q.b.first)",
        &[&format!("convert_a(wid.x * {THREADS}u + t, ldexp(1.0, ea));")],
    );
    w.block(
        "else",
        &[&format!("convert_b((wid.x - q.b.first) * {THREADS}u + t, ldexp(1.0, eb));")],
    );
    w.close();
    w.finish()
}

/// `fn convert_x(g: u32, sc: f32)` for the operand of slice `s`: thread `g` of its workgroups
/// converts its units of the hi plane, scaled by `sc`, two at a time (four loads in flight).
fn convert_fn(w: &mut Wgsl, s: &Slice) {
    let x = s.x;
    let (ot, ct) = (s.outer_total, s.contig_total);
    w.open(&format!("fn convert_{x}(g: u32, sc: f32)"));
    w.line(&format!("let k = q.{x};"));
    w.block("if (g >= k.total)", &["return;"]);
    w.line("let M = p.m;");
    w.line("let N = p.n;");
    w.line("let K = p.k;");
    w.line("var c = g % k.contig;");
    w.line("let r = g / k.contig;");
    w.line("var o = r % k.outer;");
    w.line("var bi = r / k.outer;");
    w.line("var u = g;");
    let load = |w: &mut Wgsl, v: &str| {
        w.line(&format!("let base{v} = p.{x}_off + bi * p.{x}_sb;"));
        w.line(&format!("let {v}0 = quad_{x}(base{v}, o, 8u * c, {ot}, {ct}) * sc;"));
        w.line(&format!("let {v}1 = quad_{x}(base{v}, o, 8u * c + 4u, {ot}, {ct}) * sc;"));
        w.line("c += k.dc;");
        w.block("if (c >= k.contig)", &["c -= k.contig;", "o += 1u;"]);
        w.line("o += k.dor;");
        w.block("if (o >= k.outer)", &["o -= k.outer;", "bi += 1u;"]);
        w.line("bi += k.db;");
    };
    // u + one jump stays below total, which fits a u32 (module docs).
    w.open("for (; u + k.jump < k.total; u += 2u * k.jump)");
    load(w, "v");
    load(w, "y");
    w.line("store(k.plane + u, k.lo, v0, v1);");
    w.line("store(k.plane + u + k.jump, k.lo, y0, y1);");
    w.close();
    w.open("if (u < k.total)");
    load(w, "v");
    w.line("store(k.plane + u, k.lo, v0, v1);");
    w.close();
    w.close();
    w.blank();
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
