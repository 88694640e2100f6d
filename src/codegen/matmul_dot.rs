//! The generated fp32 matmul for skinny products (a few rows or columns of C, a long K, such as
//! a classifier head's `128x10x1024` and its weight gradient `1024x10x128`): a workgroup of
//! [`DOT_LANES`] threads computes one `4x4` block of C, its threads taking K in turn (thread
//! `t` the steps `t`, `t + lanes`, ...), each keeping the block's 16 partial sums in four
//! `vec4` registers; the partial sums are then added in workgroup memory in two rounds of 16.
//!
//! The register tiles give such a product a handful of workgroups whose threads each walk all
//! of K one load after another (on the H200, 30 µs for 2.6 MFLOP); here every product has
//! `ceil(M/4) · ceil(N/4)` workgroups and each thread `ceil(K / lanes)` steps.
//!
//! Bounds: rows and columns past M and N are clamped to the last one (their sums are never
//! stored) and steps past K are not taken, so every read lies inside the operands' `[rows,
//! cols]` extents, which the caller checks against the buffers; stores are checked against M
//! and N. K is below 2^30 (an operand of K elements fits one binding), so the step index does
//! not wrap. The kernel is compiled without naga's bounds checks (kept when the epilogue reads
//! buffers of its own) and without the loop guard.
//!
//! Bindings are those of the template (0 the `Params` uniform, 1 A, 2 B, 3 C, the epilogue's
//! from 4), A and B read as `f32` through any strides.

use super::matmul_simt::{block_entry, epilogue_and_store, operands, params, Access};
use super::writer::Wgsl;

/// Threads of a workgroup, all along K.
pub const DOT_LANES: u32 = 256;
/// Rows and columns of the block of C a workgroup computes.
pub const DOT_BLOCK: u32 = 4;
/// Bytes of workgroup memory the kernel declares (16 KiB, WebGPU's default limit): every
/// thread's 16 partial sums.
pub const WORKGROUP_BYTES: u32 = DOT_LANES * DOT_BLOCK * DOT_BLOCK * 4;

/// The WGSL of the kernel, with the epilogue's declarations (`@binding(4)` on) and body (of
/// `fn epilogue(v, batch, i, j) -> scalar`).
pub fn generate(decls: &str, body: &str) -> String {
    let lanes = DOT_LANES;
    let outputs = DOT_BLOCK * DOT_BLOCK;
    let groups = lanes / outputs;
    let mut w = Wgsl::new();
    w.line("alias scalar = f32;");
    w.line(&format!(
        "// fp32 dot matmul: {DOT_BLOCK}x{DOT_BLOCK} of C a workgroup, K across its {lanes} threads (codegen/matmul_dot.rs)"
    ));
    w.blank();
    params(&mut w);
    let scalar = Access { row_major: true, vector: false };
    operands(&mut w, [scalar, scalar]);
    w.line("@group(0) @binding(3) var<storage, read_write> c: array<f32>;");
    w.lines(decls);
    w.blank();
    w.line("// Thread t's partial sums, row r of the block at t * 4 + r; then the rounds' sums.");
    w.line(&format!("var<workgroup> red: array<vec4<f32>, {}>;", WORKGROUP_BYTES / 16));
    w.blank();
    epilogue_and_store(&mut w, body);
    block_entry(&mut w, lanes, (DOT_BLOCK, DOT_BLOCK));
    for r in 0..DOT_BLOCK {
        w.line(&format!("let ra{r} = a_base + min(row0 + {r}u, M - 1u) * p.a_si;"));
    }
    for q in 0..DOT_BLOCK {
        w.line(&format!("let cb{q} = b_base + min(col0 + {q}u, N - 1u) * p.b_sj;"));
    }
    for r in 0..DOT_BLOCK {
        w.line(&format!("var acc{r} = vec4<f32>(0.0);"));
    }
    w.open(&format!("for (var k = t; k < K; k += {lanes}u)"));
    w.line("let ka = k * p.a_sk;");
    w.line("let kb = k * p.b_sk;");
    w.line("let bv = vec4<f32>(b[cb0 + kb], b[cb1 + kb], b[cb2 + kb], b[cb3 + kb]);");
    for r in 0..DOT_BLOCK {
        w.line(&format!("acc{r} += a[ra{r} + ka] * bv;"));
    }
    w.close();
    for r in 0..DOT_BLOCK {
        w.line(&format!("red[t * 4u + {r}u] = acc{r};"));
    }
    w.line("workgroupBarrier();");
    w.line(&format!("// Round 1: thread t adds output t % {outputs} of {groups} threads' sums."));
    w.line(&format!("let o = t % {outputs}u;"));
    w.line(&format!("let g = t / {outputs}u;"));
    w.line("var s = 0.0;");
    w.open(&format!("for (var l = 0u; l < {groups}u; l++)"));
    w.line(&format!("s += red[(g * {groups}u + l) * 4u + o / 4u][o % 4u];"));
    w.close();
    w.line("workgroupBarrier();");
    w.line("red[g * 4u + o / 4u][o % 4u] = s;");
    w.line("workgroupBarrier();");
    w.line(&format!("// Round 2: the first {outputs} threads add the {groups} round sums."));
    w.open(&format!("if (t < {outputs}u)"));
    w.line("var v = 0.0;");
    w.open(&format!("for (var q = 0u; q < {groups}u; q++)"));
    w.line("v += red[q * 4u + t / 4u][t % 4u];");
    w.close();
    w.line("let i = row0 + t / 4u;");
    w.line("let j = col0 + t % 4u;");
    w.block("if (i < M && j < N)", &["store_c(v, batch, i, j);"]);
    w.close();
    w.close();
    w.finish()
}
