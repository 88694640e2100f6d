//! The range pre-pass of the cooperative matmuls: two dispatches that leave in the `range`
//! buffer the power-of-two exponents `ea`, `eb` the kernel multiplies A and B by
//! (`matmul_coop.rs`).
//!
//! - `main` (grid `[GROUPS, 2, 1]`, `y` picks the operand): partial maxima of `|x|` (f32 bits,
//!   compared as u32, which orders non-negative floats) into `range[op * GROUPS + group]`. Each
//!   operand is walked as `[batch][outer][inner]`, `inner` its unit-stride axis, so loads
//!   coalesce for plain and transposed operands alike.
//! - `finish` (one workgroup): reduces each operand's partials and writes its exponent as i32
//!   bits to `range[EXPONENTS + op]`: `2^e` brings the max-abs into `[2^14, 2^15)` (f16's
//!   largest finite is 65504), 0 for an all-zero operand, clamped to `[-126, 126]`.
//!
//! Every word is rewritten each time, so the buffer (a scratch slot) needs no clearing.

use super::matmul::MatmulSpec;
use super::matmul_simt::Access;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;

/// Workgroups of `main` per operand, each writing one partial maximum.
const GROUPS: u32 = 256;
/// Threads per workgroup of both entry points.
const THREADS: u32 = 256;
/// Index in `range` of `ea` (`eb` follows).
pub const EXPONENTS: u32 = 2 * GROUPS;
/// u32 words of the `range` buffer: the partials of both operands, then `ea` and `eb`.
pub const RANGE_WORDS: u64 = 2 * GROUPS as u64 + 2;
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

/// The two pre-pass programs of `spec` (A and B read as `access` says) over buffers `a`, `b`
/// and `range`, labelled `label` and `label finish`.
pub fn programs(
    spec: &MatmulSpec,
    access: [Access; 2],
    [a, b, range]: [Resource; 3],
    label: &str,
) -> [Program; 2] {
    let s = spec;
    let walks = [
        walk(&s.a, access[0], s.batch, s.m, s.k),
        walk(&s.b, access[1], s.batch, s.k, s.n),
    ];
    let wgsl = generate();
    let checks = ShaderChecks { bounds: true, loop_bounding: false };
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    let main = Program {
        label: label.to_string(),
        wgsl: wgsl.clone(),
        entry: "main",
        workgroup_size: THREADS,
        bindings: vec![
            bind(0, "q", Resource::Uniform(bytemuck::cast_slice(&walks).to_vec()), 0),
            bind(1, "a", a, s.a.words(s.batch, s.m, s.k)),
            bind(2, "b", b, s.b.words(s.batch, s.k, s.n)),
            bind(RANGE_BINDING, "range", range.clone(), RANGE_WORDS),
        ],
        grid: Grid::Fixed([GROUPS, 2, 1]),
        checks,
    };
    let finish = Program {
        label: format!("{label} finish"),
        wgsl,
        entry: "finish",
        workgroup_size: THREADS,
        bindings: vec![bind(RANGE_BINDING, "range", range, RANGE_WORDS)],
        grid: Grid::Fixed([1, 1, 1]),
        checks,
    };
    [main, finish]
}

/// The WGSL of the pre-pass (entry points `main` and `finish`).
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
        "@group(0) @binding({RANGE_BINDING}) var<storage, read_write> range: array<u32>;"
    ));
    w.blank();
    w.line(&format!("var<workgroup> red: array<u32, {THREADS}>;"));
    w.blank();
    w.line(&format!("// The max of red[0..{THREADS}] into red[0]; every invocation calls it."));
    w.open("fn reduce(t: u32)");
    w.line("workgroupBarrier();");
    w.open(&format!("for (var s = {}u; s > 0u; s >>= 1u)", THREADS / 2));
    w.block("if (t < s)", &["red[t] = max(red[t], red[t + s]);"]);
    w.line("workgroupBarrier();");
    w.close();
    w.close();
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
    w.line("reduce(t);");
    w.block("if (t == 0u)", &[&format!("range[wid.y * {g}u + wid.x] = red[0];")]);
    w.close();
    w.blank();
    w.line(&format!("@compute @workgroup_size({THREADS})"));
    w.open("fn finish(@builtin(local_invocation_index) t: u32)");
    w.open("for (var op = 0u; op < 2u; op++)");
    w.line("var m = 0u;");
    w.block(
        &format!("for (var i = t; i < {g}u; i += {THREADS}u)"),
        &[&format!("m = max(m, range[op * {g}u + i]);")],
    );
    w.line("red[t] = m;");
    w.line("reduce(t);");
    w.open("if (t == 0u)");
    w.line("var e = 0;");
    w.block("if (red[0] != 0u)", &["e = clamp(141 - i32(red[0] >> 23u), -126, 126);"]);
    w.line(&format!("range[{EXPONENTS}u + op] = bitcast<u32>(e);"));
    w.close();
    w.line("workgroupBarrier();");
    w.close();
    w.close();
    w.finish()
}
