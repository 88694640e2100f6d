//! The dedicated GPU kernels (matmul, layer norm forward and backward) against plain f64 loops,
//! on sizes that are not multiples of the tiles, with size-1 dimensions. Runs on any wgpu
//! adapter (lavapipe in CI), so the sizes stay small. Skips without an adapter unless CI=true.

use crate::common::gpu::or_skip;
use rumus::codegen::layer_norm::{self, Backward, Forward};
use rumus::codegen::matmul::{self, MatmulSpec, MatmulTile, Operand};
use rumus::codegen::matmul_simt::{NARROW_TILE, SIMT_TILE, SIMT_TILES};
use rumus::codegen::wgsl::MatmulEpilogue;
use rumus::codegen::{Grid, Resource, ShaderChecks};
use rumus::rng::Rng;
use rumus::runtime::launch::prepare;
use rumus::runtime::Gpu;

pub(crate) fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

/// `|got - want| <= tol * (1 + |want|)` elementwise, with the first offender in the message.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert!(got.len() >= want.len(), "{what}: got {} values, want {}", got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(err <= tol * (1.0 + w.abs()), "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

// ---------------------------------------------------------------------------------------------
// matmul

/// Element `[b, r, c]` of an operand, as the kernel addresses it.
pub(crate) fn at(op: &Operand, b: u32, r: u32, c: u32) -> usize {
    (op.offset + b * op.batch_stride + r * op.row_stride + c * op.col_stride) as usize
}

/// The reference: `C = epilogue(alpha A B, j) + beta C_old` in f64.
pub(crate) fn matmul_ref(
    s: &MatmulSpec,
    a: &[f32],
    b: &[f32],
    c_old: &[f32],
    epilogue: impl Fn(f64, u32) -> f64,
) -> Vec<f64> {
    let mut c: Vec<f64> = c_old.iter().map(|&v| f64::from(v)).collect();
    for bt in 0..s.batch {
        for i in 0..s.m {
            for j in 0..s.n {
                let mut acc = 0.0f64;
                for k in 0..s.k {
                    acc += f64::from(a[at(&s.a, bt, i, k)]) * f64::from(b[at(&s.b, bt, k, j)]);
                }
                let idx = at(&s.c, bt, i, j);
                let old = if s.beta != 0.0 { f64::from(s.beta) * c[idx] } else { 0.0 };
                c[idx] = epilogue(f64::from(s.alpha) * acc, j) + old;
            }
        }
    }
    c
}

/// Run the matmul program of `spec` on `tile` over A, B, C (buffers 0, 1, 2) and the epilogue's
/// `extra` buffers (3 on); returns C.
fn run_matmul(
    gpu: &Gpu,
    tile: MatmulTile,
    epilogue: Option<&MatmulEpilogue>,
    spec: &MatmulSpec,
    inputs: [&[f32]; 3],
    extra: &[&wgpu::Buffer],
) -> Vec<f32> {
    let ab = gpu.upload_f32("a", inputs[0]).unwrap();
    let bb = gpu.upload_f32("b", inputs[1]).unwrap();
    let cb = gpu.upload_f32("c", inputs[2]).unwrap();
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let p = matmul::program(spec, tile, epilogue, operands).unwrap();
    let mut buffers = vec![&ab, &bb, &cb];
    buffers.extend_from_slice(extra);
    let d = prepare(gpu, &p, &buffers, &[]).unwrap();
    gpu.run(&[&d]).unwrap();
    gpu.read_f32_range(&cb, 0..inputs[2].len()).unwrap()
}

/// Run `spec` on `tile` with buffers of lengths `lens` (random contents; C pre-filled with
/// `c_fill` when given), and compare C with the reference. With a NaN fill only the elements the
/// product covers are compared (the rest must stay NaN, which they do unless written).
fn check_matmul(
    name: &str,
    tile: MatmulTile,
    spec: MatmulSpec,
    lens: [usize; 3],
    c_fill: Option<f32>,
) {
    let Some((gpu, _turn)) = or_skip(name) else {
        return;
    };
    if !on_this_adapter(gpu, tile) {
        return;
    }
    // Elements outside an operand's extent are NaN: a kernel that reads one (even to multiply
    // it by a zero-filled partner) puts NaN into C.
    let a = outside_nan(random(lens[0], 1), &spec.a, spec.batch, spec.m, spec.k);
    let b = outside_nan(random(lens[1], 2), &spec.b, spec.batch, spec.k, spec.n);
    let c_old = match c_fill {
        Some(v) => vec![v; lens[2]],
        None => random(lens[2], 3),
    };
    let want = matmul_ref(&spec, &a, &b, &c_old, |v, _| v);
    let got = run_matmul(gpu, tile, None, &spec, [&a, &b, &c_old], &[]);
    let tol = 4e-5 * f64::from(spec.k.max(1)).sqrt();
    let mut covered = vec![false; lens[2]];
    for bt in 0..spec.batch {
        for i in 0..spec.m {
            for j in 0..spec.n {
                covered[at(&spec.c, bt, i, j)] = true;
            }
        }
    }
    for (idx, &cov) in covered.iter().enumerate() {
        if cov {
            assert_close(&format!("{name} {tile:?}"), &got[idx..=idx], &want[idx..=idx], tol);
        } else {
            assert_eq!(
                got[idx].to_bits(),
                c_old[idx].to_bits(),
                "{name}: wrote outside C at {idx}"
            );
        }
    }
}

/// `data` with every element that operand `op` (`[batch, rows, cols]`) does not address set to NaN.
pub(crate) fn outside_nan(
    mut data: Vec<f32>,
    op: &Operand,
    batch: u32,
    rows: u32,
    cols: u32,
) -> Vec<f32> {
    let mut inside = vec![false; data.len()];
    for bt in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                inside[at(op, bt, r, c)] = true;
            }
        }
    }
    for (v, inside) in data.iter_mut().zip(inside) {
        if !inside {
            *v = f32::NAN;
        }
    }
    data
}

/// Whether to run `tile` on `gpu`: Mesa's OpenGL adapter compiles the SIMT kernel for tens of
/// seconds a module (the GL pass of `.ci/run` went from 70 s to 720 s with all three tiles in
/// every SIMT test), so there only its 128x256 tile runs; the Vulkan adapters run them all.
fn on_this_adapter(gpu: &Gpu, tile: MatmulTile) -> bool {
    gpu.info.backend != wgpu::Backend::Gl || !matches!(tile, MatmulTile::Simt(t) if t != SIMT_TILE)
}

fn contiguous_lens(s: &MatmulSpec) -> [usize; 3] {
    let (bt, m, n, k) = (s.batch as usize, s.m as usize, s.n as usize, s.k as usize);
    [bt * m * k, bt * k * n, bt * m * n]
}

const ALL_TILES: [MatmulTile; 7] = [
    MatmulTile::Large,
    MatmulTile::Small,
    MatmulTile::Register,
    MatmulTile::Register8,
    MatmulTile::Simt(SIMT_TILES[0].1),
    MatmulTile::Simt(SIMT_TILES[1].1),
    MatmulTile::Dot,
];

#[test]
fn matmul_1x1x1() {
    for tile in ALL_TILES {
        let s = MatmulSpec::contiguous(1, 1, 1, 1);
        check_matmul("matmul_1x1x1", tile, s, contiguous_lens(&s), None);
    }
}

#[test]
fn matmul_17x33x9_both_tiles() {
    for tile in ALL_TILES {
        let s = MatmulSpec::contiguous(1, 17, 33, 9);
        check_matmul("matmul_17x33x9", tile, s, contiguous_lens(&s), None);
    }
}

/// A program compiled without naga's loop guard (or without bounds checks, for a kernel that
/// stays in bounds) gives the same product, bit for bit, as one compiled with every check.
#[test]
fn matmul_compiled_without_runtime_checks_gives_the_same_product() {
    let Some((gpu, _turn)) = or_skip("matmul_without_runtime_checks") else {
        return;
    };
    let s = MatmulSpec::contiguous(1, 17, 33, 9);
    let [la, lb, lc] = contiguous_lens(&s);
    let a = gpu.upload_f32("a", &random(la, 1)).unwrap();
    let b = gpu.upload_f32("b", &random(lb, 2)).unwrap();
    let mut results = Vec::new();
    for (bounds, loop_bounding) in [(true, true), (true, false), (false, false)] {
        let c = gpu.storage("c", lc).unwrap();
        let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
        let mut p = matmul::program(&s, MatmulTile::Small, None, operands).unwrap();
        p.checks = ShaderChecks { bounds, loop_bounding };
        let d = prepare(gpu, &p, &[&a, &b, &c], &[]).unwrap();
        gpu.run(&[&d]).unwrap();
        let got = gpu.read_f32(&c).unwrap();
        results.push(got.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

/// The generated SIMT kernel is compiled without naga's bounds checks, so it must keep every
/// read inside its operands and every write inside C itself: on each of its tiles, at ragged
/// M, N and K crossing its blocks (128x256, 128x128, 128x64), for both layouts of each operand,
/// aligned (`vec4` loads) or not, batched, with operands at offsets inside buffers whose other
/// elements are NaN.
#[test]
fn matmul_simt_at_ragged_shapes_stays_inside_its_operands() {
    // (case, batch, a transposed, b transposed, k, offset of A and B, trailing words of A
    // and B, whether both operands are read as vec4s)
    let cases = [
        ("nn aligned", 1, false, false, 12, 0, 0, true),
        ("tn unaligned", 1, true, false, 13, 3, 5, false),
        ("nt aligned at offset", 1, false, true, 12, 8, 4, true),
        ("tt batched", 2, true, true, 13, 1, 2, false),
    ];
    let tiles = SIMT_TILES.map(|(_, t)| MatmulTile::Simt(t));
    let runs = tiles.iter().flat_map(|&tile| cases.iter().map(move |&case| (tile, case)));
    for (tile, (case, batch, ta, tb, k, offset, tail, vector)) in runs {
        let (m, n) = (130u32, 260u32);
        let mut s = MatmulSpec::contiguous(batch, m, n, k);
        if ta {
            s.a = Operand::transposed(m, k);
        }
        if tb {
            s.b = Operand::transposed(k, n);
        }
        s.a = s.a.at(offset);
        s.b = s.b.at(offset);
        let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
        let wgsl = matmul::program(&s, tile, None, operands).unwrap().wgsl;
        let vec4_a = wgsl.contains("@binding(1) var<storage, read> a: array<vec4<f32>>;");
        let vec4_b = wgsl.contains("@binding(2) var<storage, read> b: array<vec4<f32>>;");
        assert_eq!((vec4_a, vec4_b), (vector, vector), "{case}: vector loads");
        let bt = batch as usize;
        let lens = [
            offset as usize + bt * (m * k) as usize + tail,
            offset as usize + bt * (k * n) as usize + tail,
            bt * (m * n) as usize,
        ];
        let name = format!("matmul_simt {case} on {}", tile.name());
        check_matmul(&name, tile, s, lens, Some(f32::NAN));
    }
}

/// The dot kernel (K across a workgroup, for skinny products) against the reference at the
/// shapes it is chosen for and their edges: one column or row of C, N = 3 and 10 (ragged 4x4
/// blocks), K = 1 and 5 (most threads take no step) and K past its 256 threads, both layouts of
/// each operand, batched and broadcast, at offsets inside buffers whose other elements are NaN
/// (it is compiled without bounds checks), alpha and beta, and C a strided window.
#[test]
fn matmul_dot_at_skinny_shapes_matches_the_reference() {
    // (case, batch, m, n, k, a transposed, b transposed, offset of A and B, beta)
    let cases = [
        ("n1", 1, 37, 1, 300, false, false, 0, 0.0),
        ("n3 k5", 1, 9, 3, 5, false, false, 0, 0.0),
        ("n10 head", 1, 13, 10, 700, false, false, 3, 0.0),
        ("n10 weight gradient", 1, 21, 10, 130, true, false, 0, 0.0),
        ("m1", 1, 1, 11, 513, false, true, 2, 0.0),
        ("k1", 1, 6, 7, 1, true, true, 0, 0.0),
        ("batched beta", 3, 5, 10, 260, false, true, 1, 0.5),
    ];
    for (case, batch, m, n, k, ta, tb, offset, beta) in cases {
        let mut s = MatmulSpec::contiguous(batch, m, n, k);
        if ta {
            s.a = Operand::transposed(m, k);
        }
        if tb {
            s.b = Operand::transposed(k, n).broadcast();
        }
        s.a = s.a.at(offset);
        s.b = s.b.at(offset);
        s.alpha = 0.75;
        s.beta = beta;
        let fill = if beta == 0.0 { Some(f32::NAN) } else { None };
        let bt = batch as usize;
        let b_planes = if tb { 1 } else { bt };
        let lens = [
            offset as usize + bt * (m * k) as usize + 3,
            offset as usize + b_planes * (k * n) as usize + 3,
            bt * (m * n) as usize,
        ];
        check_matmul(&format!("matmul_dot {case}"), MatmulTile::Dot, s, lens, fill);
    }
}

/// The dot kernel writes only C's window: rows of C 6 apart, 4 of them used.
#[test]
fn matmul_dot_writes_a_strided_window_of_c() {
    let mut s = MatmulSpec::contiguous(1, 5, 3, 40);
    s.c = Operand { offset: 1, batch_stride: 0, row_stride: 6, col_stride: 1 };
    check_matmul("matmul_dot_strided_c", MatmulTile::Dot, s, [200, 120, 31], Some(f32::NAN));
}

/// The SIMT and dot kernels are compiled trusted: without the loop guard and without bounds
/// checks, also when the epilogue reads buffers of its own (the epilogues the planner
/// generates clamp those loads themselves: `plan::rumus_plan_wgsl_prints_each_kernel`).
#[test]
fn matmul_simt_is_compiled_without_runtime_checks() {
    let s = MatmulSpec::contiguous(1, 8, 8, 8);
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let epilogue = MatmulEpilogue {
        loads: 0,
        decls: "@group(0) @binding(4) var<storage, read> bias: array<scalar>;".to_string(),
        body: "return v + bias[j];".to_string(),
        extra: vec![3],
    };
    for tile in [MatmulTile::Simt(SIMT_TILE), MatmulTile::Simt(NARROW_TILE), MatmulTile::Dot] {
        let p = matmul::program(&s, tile, None, operands.clone()).unwrap();
        assert_eq!(p.checks, ShaderChecks { bounds: false, loop_bounding: false }, "{tile:?}");
        let p = matmul::program(&s, tile, Some(&epilogue), operands.clone()).unwrap();
        assert_eq!(p.checks, ShaderChecks { bounds: false, loop_bounding: false }, "{tile:?}");
    }
}

#[test]
fn matmul_crosses_block_tiles() {
    // M and N span two small tiles and K several slices, none of them multiples.
    let s = MatmulSpec::contiguous(1, 70, 67, 20);
    check_matmul("matmul_crosses_block_tiles", MatmulTile::Small, s, contiguous_lens(&s), None);
}

#[test]
fn matmul_crosses_large_block_tiles() {
    let s = MatmulSpec::contiguous(1, 130, 129, 20);
    check_matmul(
        "matmul_crosses_large_block_tiles",
        MatmulTile::Large,
        s,
        contiguous_lens(&s),
        None,
    );
}

#[test]
fn matmul_batched_with_broadcast_a() {
    // One [5, 4] A shared by 3 batches of B (batch stride 0).
    let mut s = MatmulSpec::contiguous(3, 5, 6, 4);
    s.a = s.a.broadcast();
    let lens = [5 * 4, 3 * 4 * 6, 3 * 5 * 6];
    check_matmul("matmul_batched_with_broadcast_a", MatmulTile::Register, s, lens, None);
}

#[test]
fn matmul_transposed_a_is_weight_gradient() {
    // dW[k_in, n] = Xᵀ · dY with X stored [rows=11, k_in=6] and dY stored [11, 7]: A = Xᵀ.
    let (rows, k_in, n) = (11u32, 6u32, 7u32);
    let mut s = MatmulSpec::contiguous(1, k_in, n, rows);
    s.a = Operand::transposed(k_in, rows);
    let lens = [(rows * k_in) as usize, (rows * n) as usize, (k_in * n) as usize];
    check_matmul("matmul_transposed_a", MatmulTile::Register, s, lens, None);
}

#[test]
fn matmul_transposed_b_is_input_gradient() {
    // dX[rows, k_in] = dY · Wᵀ with W stored [k_in=5, n=9]: B = Wᵀ, logically [9, 5].
    let (rows, k_in, n) = (10u32, 5u32, 9u32);
    let mut s = MatmulSpec::contiguous(1, rows, k_in, n);
    s.b = Operand::transposed(n, k_in);
    let lens = [(rows * n) as usize, (k_in * n) as usize, (rows * k_in) as usize];
    check_matmul("matmul_transposed_b", MatmulTile::Register8, s, lens, None);
}

#[test]
fn matmul_both_transposed_batched() {
    let mut s = MatmulSpec::contiguous(2, 3, 4, 5);
    s.a = Operand::transposed(3, 5);
    s.b = Operand::transposed(5, 4);
    check_matmul("matmul_both_transposed", MatmulTile::Register, s, [2 * 15, 2 * 20, 2 * 12], None);
}

#[test]
fn matmul_beta_accumulates_and_alpha_scales() {
    let mut s = MatmulSpec::contiguous(2, 6, 5, 3);
    s.alpha = 0.5;
    s.beta = 1.0;
    check_matmul("matmul_beta_accumulates", MatmulTile::Register, s, contiguous_lens(&s), None);
}

#[test]
fn matmul_beta_zero_ignores_nan_in_c() {
    let s = MatmulSpec::contiguous(1, 4, 3, 2);
    let lens = contiguous_lens(&s);
    check_matmul("matmul_beta_zero_ignores_nan", MatmulTile::Register, s, lens, Some(f32::NAN));
}

#[test]
fn matmul_writes_a_strided_window_of_c() {
    // C is columns 2..5 of rows 1..4 of a [6, 8] buffer; everything else keeps its NaN.
    let mut s = MatmulSpec::contiguous(1, 3, 3, 4);
    s.c = Operand { offset: 8 + 2, batch_stride: 0, row_stride: 8, col_stride: 1 };
    check_matmul("matmul_strided_c", MatmulTile::Small, s, [12, 12, 48], Some(f32::NAN));
}

#[test]
fn matmul_zero_k_gives_epilogue_of_zero() {
    let s = MatmulSpec::contiguous(1, 2, 3, 0);
    check_matmul("matmul_zero_k", MatmulTile::Small, s, [1, 1, 6], Some(f32::NAN));
}

#[test]
fn matmul_epilogue_bias_relu() {
    let Some((gpu, _turn)) = or_skip("matmul_epilogue_bias_relu") else {
        return;
    };
    let s = MatmulSpec::contiguous(1, 9, 13, 7);
    let [la, lb, lc] = contiguous_lens(&s);
    let (a, b, bias) = (random(la, 4), random(lb, 5), random(13, 6));
    let epilogue = MatmulEpilogue {
        loads: 0,
        decls: "@group(0) @binding(4) var<storage, read> bias: array<scalar>;".to_string(),
        body: "return max(v + bias[j], scalar(0.0));".to_string(),
        extra: vec![3],
    };
    let bias_buf = gpu.upload_f32("bias", &bias).unwrap();
    let zeros = vec![0.0; lc];
    let got =
        run_matmul(gpu, MatmulTile::Small, Some(&epilogue), &s, [&a, &b, &zeros], &[&bias_buf]);
    let relu = |v: f64, j: u32| (v + f64::from(bias[j as usize])).max(0.0);
    let want = matmul_ref(&s, &a, &b, &zeros, relu);
    assert_close("matmul_epilogue_bias_relu", &got, &want, 1e-4);
    for tile in [MatmulTile::Simt(SIMT_TILE), MatmulTile::Simt(NARROW_TILE), MatmulTile::Dot] {
        if !on_this_adapter(gpu, tile) {
            continue;
        }
        let got = run_matmul(gpu, tile, Some(&epilogue), &s, [&a, &b, &zeros], &[&bias_buf]);
        assert_close(&format!("matmul_epilogue_bias_relu {tile:?}"), &got, &want, 1e-4);
    }
}

/// An epilogue with its loads split out (`MatmulEpilogue::loads` 2), for C of `n` columns:
/// `v · e0[i, j] + e1[j]`, a residual at binding 4 and a bias at 5 (the tests of loads issued
/// ahead, here and in `gpu_coop`).
pub(crate) fn residual_bias_epilogue(n: u32) -> MatmulEpilogue {
    let decls = format!(
        "@group(0) @binding(4) var<storage, read> e0: array<f32>;
@group(0) @binding(5) var<storage, read> e1: array<f32>;
fn epilogue_loads(batch: u32, i: u32, j: u32) -> array<f32, 2> {{
    let r = e0[min(i * {n}u + j, arrayLength(&e0) - 1u)];
    return array<f32, 2>(r, e1[min(j, arrayLength(&e1) - 1u)]);
}}
fn epilogue_with(v: scalar, batch: u32, i: u32, j: u32, pre: array<f32, 2>) -> scalar {{
    return v * pre[0] + pre[1];
}}"
    );
    MatmulEpilogue {
        decls,
        body: "return epilogue_with(v, batch, i, j, epilogue_loads(batch, i, j));".into(),
        extra: vec![3, 4],
        loads: 2,
    }
}

/// The SIMT kernel with an epilogue whose loads are split out (`MatmulEpilogue::loads`): each
/// invocation loads a residual and a bias for a group of its rows before storing them, then
/// applies `v · residual + bias` element by element. Whole blocks and ragged ones, B as stored
/// and transposed, each element against the reference: a load handed to another element's
/// epilogue fails it.
#[test]
fn matmul_simt_epilogue_loads_ahead_reach_their_own_elements() {
    let Some((gpu, _turn)) = or_skip("matmul_simt_epilogue_loads_ahead_reach_their_own_elements")
    else {
        return;
    };
    // One case on Mesa's OpenGL adapter, all three on Vulkan (see `on_this_adapter`).
    let gl = gpu.info.backend == wgpu::Backend::Gl;
    let cases = [(130, 260, 24, true), (128, 256, 16, false), (9, 13, 7, false)];
    for (m, n, k, transposed) in cases.into_iter().take(if gl { 1 } else { 3 }) {
        let mut s = MatmulSpec::contiguous(1, m, n, k);
        if transposed {
            s.b = Operand::transposed(k, n);
        }
        let n_ = n as usize;
        let epilogue = residual_bias_epilogue(n);
        let (a, b) = (random((m * k) as usize, 1), random((k * n) as usize, 2));
        let (residual, bias) = (random((m * n) as usize, 3), random(n_, 4));
        let c_old = vec![f32::NAN; (m * n) as usize];
        let operands = [0, 1, 2].map(Resource::Buffer);
        let tile = MatmulTile::Simt(if transposed && !gl { NARROW_TILE } else { SIMT_TILE });
        let wgsl = matmul::program(&s, tile, Some(&epilogue), operands).unwrap().wgsl;
        assert!(wgsl.contains("store_c_with("), "the loads go ahead");
        let extra = [&residual, &bias].map(|v| gpu.upload_f32("epilogue", v).unwrap());
        let got =
            run_matmul(gpu, tile, Some(&epilogue), &s, [&a, &b, &c_old], &[&extra[0], &extra[1]]);
        let product = matmul_ref(&s, &a, &b, &vec![0.0; c_old.len()], |v, _| v);
        let want: Vec<f64> = (0..product.len())
            .map(|e| product[e] * f64::from(residual[e]) + f64::from(bias[e % n_]))
            .collect();
        let name = format!("simt epilogue loads {m}x{n}x{k}, B transposed: {transposed}");
        assert_close(&name, &got, &want, 1e-4);
    }
}

/// The split-K sum against a plain sum of its slices, with an epilogue that reads a buffer at
/// `(i, j)` and its batch: as 4-element vectors (rows of 36, and rows of 6 whose vectors span
/// two rows) and single elements (25 columns), on one workgroup (so each thread sums two or
/// three vectors of the output) and on as many as the output needs. Words past the output
/// stay as they were. (m, n, slices, at most workgroups, workgroups).
#[test]
fn split_k_sum_matches_a_plain_sum() {
    let Some((gpu, _turn)) = or_skip("split_k_sum_matches_a_plain_sum") else {
        return;
    };
    let table = [
        (37, 36, 3, 1, 1),
        (23, 25, 2, 1, 1),
        (2, 6, 4, matmul::SUM_WORKGROUPS, 1),
        (40, 40, 2, matmul::SUM_WORKGROUPS, 2),
    ];
    for (m, n, splits, max, workgroups) in table {
        let name = format!("split_k_sum {m}x{n} in {splits} on {max}");
        let mn = (m * n) as usize;
        let parts = random(mn * splits as usize, 7);
        let residual = random(mn, 8);
        let epilogue = MatmulEpilogue {
            loads: 0,
            decls: "@group(0) @binding(4) var<storage, read> r: array<scalar>;".to_string(),
            body: format!("return v + r[i * {n}u + j] + scalar(batch);"),
            extra: vec![2],
        };
        let res = [Resource::Buffer(0), Resource::Buffer(1)];
        let p = matmul::split_k_sum((m, n, splits), res, &epilogue, max, "sum", None);
        assert_eq!(p.grid, Grid::Linear(workgroups), "{name}");
        let pb = gpu.upload_f32("parts", &parts).unwrap();
        let cb = gpu.upload_f32("c", &vec![f32::NAN; mn + 4]).unwrap();
        let rb = gpu.upload_f32("r", &residual).unwrap();
        let d = prepare(gpu, &p, &[&pb, &cb, &rb], &[]).unwrap();
        gpu.run(&[&d]).unwrap();
        let got = gpu.read_f32_range(&cb, 0..mn + 4).unwrap();
        let want: Vec<f64> = (0..mn)
            .map(|e| {
                let sum: f64 = (0..splits as usize).map(|s| f64::from(parts[s * mn + e])).sum();
                sum + f64::from(residual[e])
            })
            .collect();
        assert_close(&name, &got[..mn], &want, 1e-6);
        assert!(got[mn..].iter().all(|v| v.is_nan()), "{name}: wrote past the output: {got:?}");
    }
}

#[test]
fn matmul_operand_past_buffer_end_is_an_error() {
    let Some((gpu, _turn)) = or_skip("matmul_operand_past_buffer_end") else {
        return;
    };
    let s = MatmulSpec::contiguous(1, 4, 4, 4);
    let small = gpu.storage("small", 15).unwrap();
    let ok = gpu.storage("ok", 16).unwrap();
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let p = matmul::program(&s, MatmulTile::Small, None, operands).unwrap();
    let Err(e) = prepare(gpu, &p, &[&small, &ok, &ok], &[]) else { panic!("must fail") };
    assert_eq!(e.kind, rumus::ErrorKind::Device);
    assert!(e.message.ends_with("`a` needs 16 elements, its buffer holds 15"), "{}", e.message);
}

// ---------------------------------------------------------------------------------------------
// layer norm

const EPS: f64 = 1e-5;

/// Forward reference: (y, stats) with stats = [mean, rstd] per row.
fn ln_ref(x: &[f32], w: &[f32], b: &[f32], rows: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut stats) = (vec![0.0; rows * d], vec![0.0; rows * 2]);
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / d as f64;
        let rstd = 1.0 / (var + EPS).sqrt();
        for j in 0..d {
            y[r * d + j] = (f64::from(row[j]) - mean) * rstd * f64::from(w[j]) + f64::from(b[j]);
        }
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
    }
    (y, stats)
}

/// Backward reference: (dx, dweight, dbias).
fn ln_bw_ref(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    rows: usize,
    d: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, stats) = ln_ref(x, w, &vec![0.0; d], rows, d);
    let (mut dx, mut dw, mut db) = (vec![0.0; rows * d], vec![0.0; d], vec![0.0; d]);
    for r in 0..rows {
        let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
        let xhat: Vec<f64> = (0..d).map(|j| (f64::from(x[r * d + j]) - mean) * rstd).collect();
        let g: Vec<f64> = (0..d).map(|j| f64::from(dy[r * d + j]) * f64::from(w[j])).collect();
        let mg = g.iter().sum::<f64>() / d as f64;
        let mgx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / d as f64;
        for j in 0..d {
            dx[r * d + j] = rstd * (g[j] - mg - xhat[j] * mgx);
            dw[j] += f64::from(dy[r * d + j]) * xhat[j];
            db[j] += f64::from(dy[r * d + j]);
        }
    }
    (dx, dw, db)
}

fn check_layer_norm(rows: usize, d: usize) {
    let name = format!("layer_norm rows={rows} d={d}");
    let Some((gpu, _turn)) = or_skip(&name) else {
        return;
    };
    let n = rows * d;
    let (x, w, b, dy) = (random(n, 10), random(d, 11), random(d, 12), random(n, 13));
    let up = |label, v: &[f32]| gpu.upload_f32(label, v).unwrap();
    let nan = |label, len| up(label, &vec![f32::NAN; len]);
    let buffers = [
        up("x", &x),
        up("w", &w),
        up("b", &b),
        up("dy", &dy),
        nan("y", n),
        nan("stats", rows * 2),
        nan("dx", n),
        nan("dparams", 2 * d),
        nan("scratch", layer_norm::scratch_len(rows, d, 3)),
        nan("colsum", d),
    ];
    let bound: Vec<&wgpu::Buffer> = buffers.iter().collect();
    let [.., yb, stats, dxb, dparams, _, colsum] = &buffers;
    let [x_, w_, b_, dy_, y_, stats_, dx_, dparams_, scratch_, colsum_] =
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map(Resource::Buffer);
    let fwd_bufs =
        Forward { x: x_.clone(), weight: w_.clone(), bias: b_, y: y_, stats: stats_.clone() };
    let fwd = layer_norm::forward(rows, d, EPS as f32, fwd_bufs).unwrap();
    let fwd = prepare(gpu, &fwd, &bound, &[]).unwrap();
    let bwd = |acc, addend: Option<Resource>, col_sum: Option<Resource>| {
        let buf = Backward {
            x: x_.clone(),
            weight: w_.clone(),
            stats: stats_.clone(),
            dy: dy_.clone(),
            dx: dx_.clone(),
            partial: scratch_.clone(),
            dparams: dparams_.clone(),
            accumulate_dx: acc,
            accumulate_params: acc,
            addend,
            col_sum,
        };
        layer_norm::backward(rows, d, buf).unwrap().map(|p| prepare(gpu, &p, &bound, &[]).unwrap())
    };
    let [r1, p1] = bwd(false, None, None);
    gpu.run(&[&fwd, &r1, &p1]).unwrap();

    let (y_ref, stats_ref) = ln_ref(&x, &w, &b, rows, d);
    let (dx_ref, dw_ref, db_ref) = ln_bw_ref(&x, &w, &dy, rows, d);
    // f32 sums of up to a few hundred terms of size ~1 against f64 sums: a relative tolerance
    // growing with sqrt(d) for per-row values and sqrt(rows) more for the column sums. With d = 1
    // the variance is 0 and rstd = 1/sqrt(eps), which is only compared to 1e-3 relative.
    let tol = 2e-5 * (d as f64).sqrt();
    let tol_cols = tol * (rows as f64).sqrt();
    let read = |buf| gpu.read_f32(buf).unwrap();
    assert_close(&format!("{name} y"), &read(yb), &y_ref, tol);
    let got_stats = read(stats);
    for r in 0..rows {
        let (m, s) = (2 * r, 2 * r + 1);
        assert_close(&format!("{name} mean"), &got_stats[m..=m], &stats_ref[m..=m], tol);
        assert_close(&format!("{name} rstd"), &got_stats[s..=s], &stats_ref[s..=s], 1e-3);
    }
    assert_close(&format!("{name} dx"), &read(dxb), &dx_ref, tol);
    let dp = read(dparams);
    assert_close(&format!("{name} dweight"), &dp[..d], &dw_ref, tol_cols);
    assert_close(&format!("{name} dbias"), &dp[d..], &db_ref, tol_cols);

    // Accumulating into the same gradients doubles them.
    let [r2, p2] = bwd(true, None, None);
    gpu.run(&[&r2, &p2]).unwrap();
    let twice = |v: &[f64]| v.iter().map(|x| 2.0 * x).collect::<Vec<f64>>();
    assert_close(&format!("{name} dx accumulated"), &read(dxb), &twice(&dx_ref), 2.0 * tol);
    let (dw2, db2) = (twice(&dw_ref), twice(&db_ref));
    let dp = read(dparams);
    assert_close(&format!("{name} dweight accumulated"), &dp[..d], &dw2, 2.0 * tol_cols);
    assert_close(&format!("{name} dbias accumulated"), &dp[d..], &db2, 2.0 * tol_cols);

    // With an addend (x here, as a residual connection's gradient): dx is the gradient plus it;
    // with the column sums, those of that dx too (a bias gradient), the others unchanged.
    let [r3, p3] = bwd(false, Some(x_.clone()), Some(colsum_.clone()));
    gpu.run(&[&r3, &p3]).unwrap();
    let plus_x: Vec<f64> = dx_ref.iter().zip(&x).map(|(g, &x)| g + f64::from(x)).collect();
    assert_close(&format!("{name} dx plus addend"), &read(dxb), &plus_x, tol);
    let sums: Vec<f64> = (0..d).map(|j| (0..rows).map(|r| plus_x[r * d + j]).sum()).collect();
    assert_close(&format!("{name} column sums of dx"), &read(colsum), &sums, tol_cols);
    let dp = read(dparams);
    assert_close(&format!("{name} dweight with sums"), &dp[..d], &dw_ref, tol_cols);
    assert_close(&format!("{name} dbias with sums"), &dp[d..], &db_ref, tol_cols);
}

#[test]
fn layer_norm_d1_rows5() {
    check_layer_norm(5, 1);
}

#[test]
fn layer_norm_d7_rows1() {
    check_layer_norm(1, 7);
}

#[test]
fn layer_norm_d7_rows5() {
    check_layer_norm(5, 7);
}

#[test]
fn layer_norm_d300_rows5() {
    // d > 256: two columns per thread, the second only partly filled.
    check_layer_norm(5, 300);
}

#[test]
fn layer_norm_d1000_rows3() {
    // 128 threads a row holding 8 columns each, the last thread's partly filled.
    check_layer_norm(3, 1000);
}

#[test]
fn layer_norm_many_rows_per_group() {
    // 2100 rows: the backward puts 3 rows in each of 700 workgroups.
    check_layer_norm(2100, 3);
}

#[test]
fn layer_norm_rejects_width_beyond_limit() {
    let buf = || Forward {
        x: Resource::Buffer(0),
        weight: Resource::Buffer(1),
        bias: Resource::Buffer(2),
        y: Resource::Buffer(3),
        stats: Resource::Buffer(4),
    };
    let Err(e) = layer_norm::forward(1, 8193, 1e-5, buf()) else { panic!("must fail") };
    let expected = "layer_norm over a last axis of 8193: the GPU's LayerNorm kernels take 1 to 8192; run this model on the CPU (--device cpu)";
    assert_eq!(e.message, expected);
    assert!(layer_norm::forward(1, 8192, 1e-5, buf()).is_ok());
}

// ---------------------------------------------------------------------------------------------
// device

#[test]
fn reports_the_adapter_and_its_limits() {
    let Some((gpu, _turn)) = or_skip("reports_the_adapter") else {
        return;
    };
    eprintln!("adapter: {}", gpu.describe());
    // CI names the backend each pass must run on (`.ci/run`), so a pass meant for OpenGL
    // cannot quietly run on Vulkan.
    if let Ok(want) = std::env::var("RUMUS_EXPECT_BACKEND") {
        let got = format!("{:?}", gpu.info.backend);
        assert!(got.eq_ignore_ascii_case(&want), "adapter backend {got}, expected {want}");
    }
    assert!(gpu.limits.max_compute_workgroups_per_dimension >= 65535);
    assert!(gpu.limits.max_compute_invocations_per_workgroup >= 256);
}

/// A device asked for more than its adapter allows is an error, also where the device is
/// opened through wgpu-hal (to import host memory), which skips wgpu's own checks.
#[test]
fn limits_beyond_the_adapter_are_an_error() {
    let Some((gpu, _turn)) = or_skip("limits_beyond_the_adapter") else {
        return;
    };
    let beyond = gpu.limits.max_storage_buffers_per_shader_stage + 1;
    let opened = Gpu::open_with(rumus::runtime::DeviceChoice::Gpu, |l| wgpu::Limits {
        max_storage_buffers_per_shader_stage: beyond,
        ..l
    });
    let Err(e) = opened else { panic!("a device with {beyond} storage buffers a stage opened") };
    assert_eq!(e.kind, rumus::ErrorKind::Device);
    assert!(e.message.contains("cannot open device"), "{}", e.message);
}

#[test]
fn oversized_buffer_is_an_error_and_device_still_works() {
    let Some((gpu, _turn)) = or_skip("oversized_buffer") else {
        return;
    };
    let too_big = gpu.limits.max_buffer_size + 4;
    let Err(e) = gpu.buffer("huge", too_big, rumus::runtime::STORAGE) else { panic!("must fail") };
    assert_eq!(e.kind, rumus::ErrorKind::Device);
    assert!(e.message.contains("max_buffer_size"), "{}", e.message);
    let binding = gpu.limits.max_storage_buffer_binding_size + 4;
    if binding <= gpu.limits.max_buffer_size {
        let Err(e) = gpu.buffer("wide", binding, rumus::runtime::STORAGE) else {
            panic!("must fail")
        };
        assert!(e.message.contains("max_storage_buffer_binding_size"), "{}", e.message);
    }
    assert!(gpu.storage("overflow", usize::MAX / 2).is_err());
    // The device is still fine: a kernel runs and gives the right answer.
    let s = MatmulSpec::contiguous(1, 2, 2, 2);
    check_matmul("after oversized buffer", MatmulTile::Small, s, contiguous_lens(&s), None);
}

#[test]
fn invalid_wgsl_is_an_error_with_the_compiler_message() {
    let Some((gpu, _turn)) = or_skip("invalid_wgsl") else {
        return;
    };
    let src = "@compute @workgroup_size(1) fn main() { let x: u32 = undefined_name; }";
    let Err(e) = gpu.pipeline("broken", src, "main") else { panic!("must fail") };
    assert_eq!(e.kind, rumus::ErrorKind::Device);
    assert!(e.message.contains("undefined_name"), "{}", e.message);
    eprintln!("invalid wgsl: {}", e.message);
    let s = MatmulSpec::contiguous(1, 3, 1, 2);
    check_matmul("after invalid wgsl", MatmulTile::Small, s, contiguous_lens(&s), None);
}

/// Pipelines compile on several threads; a broken module is reported by name, the first in
/// program order, however the threads interleave, and the good ones are compiled too.
#[test]
fn parallel_compilation_reports_the_first_broken_program() {
    let Some((gpu, _turn)) = or_skip("parallel_compilation") else {
        return;
    };
    let operands = [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let good: Vec<_> = [(3, 1, 2), (5, 7, 3), (2, 2, 9)]
        .iter()
        .map(|&(m, n, k)| {
            let s = MatmulSpec::contiguous(1, m, n, k);
            matmul::program(&s, MatmulTile::Small, None, operands.clone()).unwrap()
        })
        .collect();
    let mut broken = [good[0].clone(), good[1].clone()];
    for (i, p) in broken.iter_mut().enumerate() {
        p.label = format!("broken {i}");
        p.wgsl = p.wgsl.replace("fn main", &format!("fn main_{i}"));
        p.wgsl.push_str("\nfn oops() -> u32 { return undefined_name; }\n");
    }
    let order = [&good[0], &broken[0], &good[1], &broken[1], &good[2]];
    let mut launcher = rumus::runtime::launch::Launcher::default();
    let e = launcher.compile_all(gpu, order).unwrap_err();
    assert_eq!(e.kind, rumus::ErrorKind::Device);
    assert!(e.message.contains("`broken 0`"), "{}", e.message);
    launcher.compile_all(gpu, [&good[0], &good[1], &good[2]]).unwrap();
}

#[test]
fn benchmarks_report_a_positive_rate() {
    let Some((gpu, _turn)) = or_skip("benchmarks_report_a_positive_rate") else {
        return;
    };
    use rumus::runtime::kernel_bench::{bench_layer_norm, bench_matmul};
    let tflops = bench_matmul(gpu, 33, 2, MatmulTile::Register).unwrap();
    let gbs = bench_layer_norm(gpu, 9, 40, 2).unwrap();
    eprintln!("lavapipe: matmul 33^3 {tflops:.6} TFLOP/s, layer norm 9x40 {gbs:.4} GB/s");
    assert!(tflops.is_finite() && tflops > 0.0 && gbs.is_finite() && gbs > 0.0);
}

/// Compiled pipelines are kept on disk between runs: a damaged or foreign file is dropped
/// without harm, and what one run saves the next one loads. Adapters without
/// `PIPELINE_CACHE` (OpenGL) keep no file at all.
#[test]
fn pipeline_cache_survives_a_damaged_file_and_round_trips() {
    use rumus::runtime::pipeline_cache::DiskCache;
    let Some((gpu, _turn)) = or_skip("pipeline_cache_survives_a_damaged_file_and_round_trips")
    else {
        return;
    };
    if !gpu.device.features().contains(wgpu::Features::PIPELINE_CACHE) {
        assert!(gpu.pipeline_cache_file().is_none());
        return;
    }
    let dir = std::env::temp_dir().join(format!("rumus-pipeline-cache-{}", std::process::id()));
    let path = dir.join("cache.bin");
    std::fs::create_dir_all(&dir).unwrap();
    let wgsl = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\
                @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3<u32>) {\n\
                if i.x < arrayLength(&x) { x[i.x] = 2.0 * x[i.x]; } }";
    let compile = |cache: &DiskCache| {
        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("twice"),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
        let _ = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("twice"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: Some(&cache.cache),
        });
    };
    for damaged in [&b""[..], b"RUMUSPC1 but not really", &[0xff; 4096]] {
        std::fs::write(&path, damaged).unwrap();
        let cache = DiskCache::at(&gpu.device, path.clone());
        compile(&cache);
        cache.save();
        assert_eq!(gpu.take_uncaptured_errors(), Vec::<String>::new());
    }
    let saved = std::fs::read(&path).unwrap();
    assert!(saved.starts_with(b"RUMUSPC1"), "the cache was not saved over the damaged file");
    let reopened = DiskCache::at(&gpu.device, path.clone());
    compile(&reopened);
    reopened.save();
    assert_eq!(std::fs::read(&path).unwrap().len(), saved.len(), "a warm cache grew");
    std::fs::remove_dir_all(&dir).unwrap();
}
