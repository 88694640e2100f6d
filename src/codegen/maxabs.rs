//! The range pre-pass of the cooperative matmuls: one dispatch that leaves in the `range`
//! buffer the max-abs of A and of B, from which the conversion ([`super::coop_convert`])
//! derives the power-of-two exponents `ea`, `eb` it multiplies A and B by and the product
//! (`matmul_coop.rs`) divides by.
//!
//! Each operand is walked as units `[batch][outer][inner]`, `inner` its unit-stride axis (so
//! loads coalesce for plain and transposed operands alike), a unit a `vec4` where the operand
//! allows vector loads ([`Access::vector`]) and one element otherwise. The grid is sized to the
//! operands: the first `groups` workgroups of the `[groups_a + groups_b, 1, 1]` grid walk A,
//! the rest B, each thread about `UNITS_PER_THREAD` units in a grid-stride loop that issues
//! four loads before it uses them. The loop keeps the unit's `(batch, outer, inner)` indices
//! and advances them by the stride's decomposition, which the host computes: no division in the
//! loop. Each thread's maximum of `|x|` (the f32 bits with the sign cleared, compared as u32,
//! which orders non-negative floats and puts NaN above infinity) is reduced within the
//! workgroup, and one `atomicMax` per workgroup puts it into `range[op]`.
//!
//! The words must be zero before the pre-pass: the buffer is its own scratch slot
//! ([`super::matmul::RANGE_SLOT`], which nothing else binds), zero when created, and each
//! product sets them back to zero once the conversion has turned them into the exponents
//! (`range[EXPONENTS]`, `range[EXPONENTS + 1]`, see `exponent_fn`). One dispatch instead of
//! a partial-maxima pass and a one-workgroup finish: a quarter fewer dispatches per product.

use super::matmul::MatmulSpec;
use super::matmul_simt::{operands, Access};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;

/// Threads per workgroup.
const THREADS: u32 = 256;
/// Units each thread walks when the grid is not capped: one round of four loads (on the H200
/// at gpt-medium's shapes 2 and 16 were slower, 8 by a fifth; BENCHMARKS.md).
const UNITS_PER_THREAD: u64 = 4;
/// Most workgroups per operand; past that each thread walks more units.
const MAX_GROUPS: u64 = 4096;
/// Index in `range` of `ea` (`eb` follows), after the max-abs bits of A and of B.
pub const EXPONENTS: u32 = 2;
/// u32 words of the `range` buffer: the max-abs bits of both operands, then `ea` and `eb`.
pub const RANGE_WORDS: u64 = 4;
/// The binding of `range` in the pre-pass and in the cooperative kernels (after any epilogue's).
pub const RANGE_BINDING: u32 = 15;

/// How the workgroups of one operand walk it, in units: unit `(b, o, i)` at `offset +
/// b * batch_stride + o * outer_stride + i` for `b < batch`, `o < outer`, `i < inner`, in
/// that order `total` units; its workgroups are `first..first + jump / THREADS`, and a thread
/// steps `jump` units at a time, which is `step_batch` batches, `step_outer` rows and
/// `step_inner` units.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
struct Walk {
    offset: u32,
    batch_stride: u32,
    outer_stride: u32,
    outer: u32,
    inner: u32,
    total: u32,
    first: u32,
    jump: u32,
    step_inner: u32,
    step_outer: u32,
    step_batch: u32,
    pad: u32,
}

/// The walk of operand `[batch, rows, cols]` read as `access` says (one batch when broadcast)
/// by the workgroups from `first` on, and how many workgroups it gets.
fn walk(
    op: &super::matmul::Operand,
    access: Access,
    [batch, rows, cols]: [u32; 3],
    first: u32,
) -> (Walk, u32) {
    let (outer_stride, outer, inner) =
        if access.row_major { (op.row_stride, rows, cols) } else { (op.col_stride, cols, rows) };
    let batch = if op.batch_stride == 0 { batch.min(1) } else { batch };
    let lanes = if access.vector { 4 } else { 1 };
    let inner = inner / lanes;
    let total = u64::from(batch) * u64::from(outer) * u64::from(inner);
    let per_group = u64::from(THREADS) * UNITS_PER_THREAD;
    let groups = total.div_ceil(per_group).clamp(1, MAX_GROUPS) as u32;
    let jump = groups * THREADS;
    let rows_per_jump = jump.checked_div(inner).unwrap_or(0);
    let walk = Walk {
        offset: op.offset / lanes,
        batch_stride: op.batch_stride / lanes,
        outer_stride: outer_stride / lanes,
        outer,
        inner,
        // A binding holds at most u32::MAX words; an empty operand walks nothing.
        total: u32::try_from(total).unwrap_or(u32::MAX),
        first,
        jump,
        step_inner: jump.checked_rem(inner).unwrap_or(0),
        step_outer: rows_per_jump.checked_rem(outer).unwrap_or(0),
        step_batch: rows_per_jump.checked_div(outer).unwrap_or(0),
        pad: 0,
    };
    (walk, groups)
}

/// The pre-pass program of `spec` (A and B read as `access` says) over buffers `a`, `b` and
/// `range`, labelled `label`.
pub fn program(
    spec: &MatmulSpec,
    access: [Access; 2],
    [a, b, range]: [Resource; 3],
    label: &str,
) -> Program {
    let s = spec;
    let (wa, ga) = walk(&s.a, access[0], [s.batch, s.m, s.k], 0);
    let (wb, gb) = walk(&s.b, access[1], [s.batch, s.k, s.n], ga);
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    Program {
        label: label.to_string(),
        wgsl: generate(access),
        entry: "main",
        workgroup_size: THREADS,
        bindings: vec![
            bind(0, "q", Resource::Uniform(bytemuck::cast_slice(&[wa, wb]).to_vec()), 0),
            bind(1, "a", a, s.a.words(s.batch, s.m, s.k)),
            bind(2, "b", b, s.b.words(s.batch, s.k, s.n)),
            bind(RANGE_BINDING, "range", range, RANGE_WORDS),
        ],
        grid: Grid::Fixed([ga + gb, 1, 1]),
        checks: ShaderChecks { bounds: true, loop_bounding: false },
    }
}

/// `fn exponent(m: u32) -> i32`: the exponent `e` for max-abs bits `m` such that `2^e` brings
/// the max-abs into `[2^14, 2^15)` (f16's largest finite is 65504), 0 for an all-zero operand,
/// clamped to `[-126, 126]` so that `2^-e` is an exact normal f32.
pub(super) fn exponent_fn(w: &mut Wgsl) {
    w.open("fn exponent(m: u32) -> i32");
    w.block("if (m == 0u)", &["return 0;"]);
    w.line("return clamp(141 - i32(m >> 23u), -126, 126);");
    w.close();
    w.blank();
}

/// `fn walk_x(g: u32) -> u32` for operand `x`: the max-abs bits of the units thread `g` of its
/// workgroups walks.
fn walk_fn(w: &mut Wgsl, x: &str, vector: bool) {
    let (bits, zero) = if vector {
        ("vec4<u32>", "vec4<u32>(0u)")
    } else {
        ("u32", "0u")
    };
    w.open(&format!("fn walk_{x}(g: u32) -> u32"));
    w.line(&format!("let k = q.{x};"));
    w.line(&format!("var m = {zero};"));
    w.block("if (g >= k.total)", &["return 0u;"]);
    w.line("var i = g % k.inner;");
    w.line("let r = g / k.inner;");
    w.line("var o = r % k.outer;");
    w.line("var bi = r / k.outer;");
    w.line("var u = g;");
    let load = |w: &mut Wgsl, v: &str| {
        w.line(&format!(
            "let {v} = bitcast<{bits}>({x}[k.off + bi * k.sb + o * k.so + i]) & {bits}(0x7fffffffu);"
        ));
        w.line("i += k.di;");
        w.block("if (i >= k.inner)", &["i -= k.inner;", "o += 1u;"]);
        w.line("o += k.dor;");
        w.block("if (o >= k.outer)", &["o -= k.outer;", "bi += 1u;"]);
        w.line("bi += k.db;");
    };
    // Four loads in flight, then the ragged end one at a time (u + 3 jumps stays below
    // total, which fits a binding of at most 2^32 words).
    w.open("for (; u + 3u * k.jump < k.total; u += 4u * k.jump)");
    for v in ["v0", "v1", "v2", "v3"] {
        load(w, v);
    }
    w.line("m = max(m, max(max(v0, v1), max(v2, v3)));");
    w.close();
    w.open("for (; u < k.total; u += k.jump)");
    load(w, "v");
    w.line("m = max(m, v);");
    w.close();
    if vector {
        w.line("return max(max(m.x, m.y), max(m.z, m.w));");
    } else {
        w.line("return m;");
    }
    w.close();
    w.blank();
}

/// The WGSL of the pre-pass (entry point `main`).
fn generate(access: [Access; 2]) -> String {
    let mut w = Wgsl::new();
    w.lines(
        "struct Walk {
            off: u32, sb: u32, so: u32, outer: u32,
            inner: u32, total: u32, first: u32, jump: u32,
            di: u32, dor: u32, db: u32, pad: u32,
        }

        struct Q {
            a: Walk,
            b: Walk,
        }",
    );
    w.line("// the max-abs range pre-pass of the cooperative matmuls (codegen/maxabs.rs)");
    w.blank();
    w.line("@group(0) @binding(0) var<uniform> q: Q;");
    operands(&mut w, access);
    w.line(&format!(
        "@group(0) @binding({RANGE_BINDING}) var<storage, read_write> range: array<atomic<u32>>;"
    ));
    w.blank();
    w.line(&format!("var<workgroup> red: array<u32, {THREADS}>;"));
    w.blank();
    walk_fn(&mut w, "a", access[0].vector);
    walk_fn(&mut w, "b", access[1].vector);
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32)",
    );
    w.line("let op = select(0u, 1u, wid.x >= q.b.first);");
    w.line(&format!("let g = (wid.x - select(0u, q.b.first, op == 1u)) * {THREADS}u + t;"));
    w.line("var m: u32;");
    w.block("if (op == 0u)", &["m = walk_a(g);"]);
    w.block("else", &["m = walk_b(g);"]);
    w.line("red[t] = m;");
    w.line("workgroupBarrier();");
    w.open(&format!("for (var s = {}u; s > 0u; s >>= 1u)", THREADS / 2));
    w.block("if (t < s)", &["red[t] = max(red[t], red[t + s]);"]);
    w.line("workgroupBarrier();");
    w.close();
    // A zero maximum leaves the word as it is: no atomic needed.
    w.block("if (t == 0u && red[0] != 0u)", &["atomicMax(&range[op], red[0]);"]);
    w.close();
    w.finish()
}
