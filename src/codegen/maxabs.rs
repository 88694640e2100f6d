//! The range pre-pass of the cooperative matmuls: one dispatch that leaves in the `range`
//! buffer the max-abs of A and of B, from which the conversion ([`super::coop_convert`])
//! derives the power-of-two exponents `ea`, `eb` it multiplies A and B by and the product
//! (`matmul_coop.rs`) divides by.
//!
//! `main` (grid `[GROUPS, 2, 1]`, `y` picks the operand) reduces `|x|` (f32 bits, compared as
//! u32, which orders non-negative floats) within each workgroup, then `atomicMax`es it into
//! `range[op]`. Each operand is walked as `[batch][outer][inner]`, `inner` its unit-stride
//! axis, so loads coalesce for plain and transposed operands alike.
//!
//! The words must be zero before the pre-pass: the buffer is its own scratch slot
//! ([`super::matmul::RANGE_SLOT`], which nothing else binds), zero when created, and each
//! product sets them back to zero once the conversion has turned them into the exponents
//! (`range[EXPONENTS]`, `range[EXPONENTS + 1]`, see `exponent_fn`). One dispatch instead of
//! a partial-maxima pass and a one-workgroup finish: a quarter fewer dispatches per product.

use super::matmul::MatmulSpec;
use super::matmul_simt::Access;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;

/// Workgroups of `main` per operand, each writing one partial maximum.
const GROUPS: u32 = 256;
/// Threads per workgroup of both entry points.
const THREADS: u32 = 256;
/// Index in `range` of `ea` (`eb` follows), after the max-abs bits of A and of B.
pub const EXPONENTS: u32 = 2;
/// u32 words of the `range` buffer: the max-abs bits of both operands, then `ea` and `eb`.
pub const RANGE_WORDS: u64 = 4;
/// The binding of `range` in the pre-pass and in the cooperative kernels (after any epilogue's).
pub const RANGE_BINDING: u32 = 15;

/// How one operand is walked: element `(b, o, i)` at `offset + b * batch_stride +
/// o * outer_stride + i` for `b < batch`, `o < outer`, `i < inner`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Walk {
    offset: u32,
    batch_stride: u32,
    outer_stride: u32,
    outer: u32,
    inner: u32,
    batch: u32,
    pad: [u32; 2],
}

/// The walk of operand `[batch, rows, cols]` read as `access` says (one batch when broadcast).
fn walk(op: &super::matmul::Operand, access: Access, batch: u32, rows: u32, cols: u32) -> Walk {
    let (outer_stride, outer, inner) =
        if access.row_major { (op.row_stride, rows, cols) } else { (op.col_stride, cols, rows) };
    let empty = batch == 0 || rows == 0 || cols == 0;
    Walk {
        offset: op.offset,
        batch_stride: op.batch_stride,
        outer_stride,
        outer: if empty { 0 } else { outer },
        inner: if empty { 0 } else { inner },
        batch: if op.batch_stride == 0 { batch.min(1) } else { batch },
        pad: [0; 2],
    }
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
    let walks = [
        walk(&s.a, access[0], s.batch, s.m, s.k),
        walk(&s.b, access[1], s.batch, s.k, s.n),
    ];
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    Program {
        label: label.to_string(),
        wgsl: generate(),
        entry: "main",
        workgroup_size: THREADS,
        bindings: vec![
            bind(0, "q", Resource::Uniform(bytemuck::cast_slice(&walks).to_vec()), 0),
            bind(1, "a", a, s.a.words(s.batch, s.m, s.k)),
            bind(2, "b", b, s.b.words(s.batch, s.k, s.n)),
            bind(RANGE_BINDING, "range", range, RANGE_WORDS),
        ],
        grid: Grid::Fixed([GROUPS, 2, 1]),
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

/// The WGSL of the pre-pass (entry point `main`).
fn generate() -> String {
    let g = GROUPS;
    let mut w = Wgsl::new();
    w.lines(
        "struct Walk {
            off: u32, sb: u32, so: u32, outer: u32,
            inner: u32, batch: u32, pad0: u32, pad1: u32,
        }

        struct Q {
            a: Walk,
            b: Walk,
        }",
    );
    w.line("// the max-abs range pre-pass of the cooperative matmuls (codegen/maxabs.rs)");
    w.blank();
    w.line("@group(0) @binding(0) var<uniform> q: Q;");
    w.line("@group(0) @binding(1) var<storage, read> a: array<f32>;");
    w.line("@group(0) @binding(2) var<storage, read> b: array<f32>;");
    w.line(&format!(
        "@group(0) @binding({RANGE_BINDING}) var<storage, read_write> range: array<atomic<u32>>;"
    ));
    w.blank();
    w.line(&format!("var<workgroup> red: array<u32, {THREADS}>;"));
    w.blank();
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open(
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32)",
    );
    w.line("var m = 0u;");
    for (cond, x) in [("if (wid.y == 0u)", "a"), ("else", "b")] {
        w.open(cond);
        w.open(&format!("for (var o = wid.x; o < q.{x}.batch * q.{x}.outer; o += {g}u)"));
        w.line(&format!("let bi = o / q.{x}.outer;"));
        w.line(&format!(
            "let base = q.{x}.off + bi * q.{x}.sb + (o - bi * q.{x}.outer) * q.{x}.so;"
        ));
        w.block(
            &format!("for (var j = t; j < q.{x}.inner; j += {THREADS}u)"),
            &[&format!("m = max(m, bitcast<u32>(abs({x}[base + j])));")],
        );
        w.close();
        w.close();
    }
    w.line("red[t] = m;");
    w.line("workgroupBarrier();");
    w.open(&format!("for (var s = {}u; s > 0u; s >>= 1u)", THREADS / 2));
    w.block("if (t < s)", &["red[t] = max(red[t], red[t + s]);"]);
    w.line("workgroupBarrier();");
    w.close();
    // A zero maximum leaves the word as it is: no atomic needed.
    w.block("if (t == 0u && red[0] != 0u)", &["atomicMax(&range[wid.y], red[0]);"]);
    w.close();
    w.finish()
}
