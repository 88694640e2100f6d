//! The conversion pre-pass of the cooperative matmuls: one dispatch that writes A and B as f16
//! (scaled by the range pre-pass's powers of two; `high`: hi and lo parts, lo times
//! 2^[`LO_SHIFT`](super::matmul_coop::LO_SHIFT)) into a workspace,
//! so the product ([`super::matmul_coop`]) reads half the bytes and has no conversion, scaling,
//! splitting or bounds check in its loop (issue-11 prototype, round 2: `medium` 150 TFLOP/s
//! for the product alone at 4096³ against 83 converting in the loop).
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
//! [`WORKSPACE_BINDING`] the workspace, [`RANGE_BINDING`] the max-abs words (read) and the
//! exponents (written, for the product). Entry point `main`,
//! a grid-stride loop over the units of the hi planes.

use super::matmul::MatmulSpec;
use super::matmul_coop::{CoopKernel, CoopMode, CoopTile};
use super::matmul_simt::{operands, params, quad_fn, slice, Access, Side};
use super::maxabs::{EXPONENTS, RANGE_BINDING, RANGE_WORDS};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;

/// The binding of the f16 workspace, in the conversion and in the product.
pub const WORKSPACE_BINDING: u32 = 14;
/// Threads per workgroup of the conversion.
const THREADS: u32 = 256;
/// Most workgroups of the conversion (each then converts several units).
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
    let units = hi_halves(k, access, s).iter().sum::<u64>() / 8;
    let groups = units.div_ceil(u64::from(THREADS)).clamp(1, MAX_GROUPS) as u32;
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
            bind(WORKSPACE_BINDING, "ws", ws, workspace_words(k, access, s)),
            bind(RANGE_BINDING, "range", range, RANGE_WORDS),
        ],
        grid: Grid::Fixed([groups, 1, 1]),
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
    params(&mut w);
    operands(&mut w, access);
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
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open(
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>)",
    );
    w.line("let M = p.m;");
    w.line("let N = p.n;");
    w.line("let K = p.k;");
    layout(&mut w, t, access);
    w.line("let ea = exponent(range[0]);");
    w.line("let eb = exponent(range[1]);");
    // Every invocation computes the same exponents; one writes them for the product, which
    // then sets the max-abs words back to zero (codegen/maxabs.rs).
    w.block(
        "if (gid.x == 0u)",
        &[
            &format!("range[{EXPONENTS}u] = bitcast<u32>(ea);"),
            &format!("range[{}u] = bitcast<u32>(eb);", EXPONENTS + 1),
        ],
    );
    w.line("let sca = ldexp(1.0, ea);");
    w.line("let scb = ldexp(1.0, eb);");
    w.line(&format!("let jump = nw.x * {THREADS}u;"));
    w.open("for (var u = gid.x; u < ua + ub; u += jump)");
    w.line("var v0: vec4<f32>;");
    w.line("var v1: vec4<f32>;");
    for (s, cond, rel, sc) in [(&slices[0], "if (u < ua)", "u", "sca"), (&slices[1], "else", "u - ua", "scb")]
    {
        let x = s.x;
        w.open(cond);
        w.line(&format!("let r = {rel};"));
        w.line(&format!("let row = r / ({x}_cp / 8u);"));
        w.line(&format!("let c = (r % ({x}_cp / 8u)) * 8u;"));
        w.line(&format!("let bi = row / {x}_op;"));
        w.line(&format!("let o = row % {x}_op;"));
        w.line(&format!("let base = p.{x}_off + bi * p.{x}_sb;"));
        let (ot, ct) = (s.outer_total, s.contig_total);
        w.line(&format!("v0 = quad_{x}(base, o, c, {ot}, {ct}) * {sc};"));
        w.line(&format!("v1 = quad_{x}(base, o, c + 4u, {ot}, {ct}) * {sc};"));
        w.close();
    }
    if high {
        w.line("let h0 = split_hi(v0);");
        w.line("let h1 = split_hi(v1);");
        w.line("put(u, h0, h1);");
        // lo scaled by 2^LO_SHIFT into hi's range: unscaled, the lo of every element more
        // than 2^15 below the max-abs would be an f16 subnormal and lose bits.
        let up = format!("{:?}", f64::from(1u32 << super::matmul_coop::LO_SHIFT));
        w.line(&format!("put(ua + ub + u, (v0 - h0) * {up}, (v1 - h1) * {up});"));
    } else {
        w.line("put(u, v0, v1);");
    }
    w.close();
    w.close();
    w.finish()
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
