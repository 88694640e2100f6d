//! The cooperative-matrix matmuls (`high`, `medium`) and their conversion pre-pass against an
//! f64 reference, with the cooperative operations emulated in plain WGSL (`emulate_coop`), so
//! they run on any adapter (lavapipe in CI): ragged and tiny shapes, both transposes, batches
//! with offsets and broadcast, alpha and beta, operands of 1e5 and 1e-8, which f16 cannot hold
//! unscaled, and operands whose strips of rows and columns span many orders of magnitude.
//!
//! Errors are `|c - ref| / (|alpha| Σ_k |a_ik b_kj| + |beta c|)`, as the issue-11 prototype
//! measured them on the H200 (there: `high` 2e-7, `medium` 4e-6 median).

use crate::common::gpu::{coop_or_skip, or_skip};
use crate::gpu_kernels::{at, matmul_ref, outside_nan, random, residual_bias_epilogue};
use rumus::codegen::matmul::{self, MatmulSpec, MatmulTile, Operand, EXPONENT_SLOT};
use rumus::codegen::matmul_coop::{CoopKernel, CoopMode, CoopTile};
use rumus::codegen::program::{scratch_words, Program};
use rumus::codegen::{MatmulOptions, MatmulPrecision, Resource};
use rumus::runtime::kernel_bench::bench_matmul_mode;
use rumus::runtime::launch::{Launcher, Range, Resources};
use rumus::runtime::Gpu;

/// A small tile (64 threads), quick on a software adapter and split by these shapes.
const TILE: CoopTile = CoopTile { bm: 32, bn: 32, bk: 16, wm: 1, wn: 2, stages: 1 };

fn kernel(mode: CoopMode) -> CoopKernel {
    CoopKernel { mode, tile: TILE, subgroup: 32, emulate: true }
}

/// Run `programs` over `buffers` on scratch as a new plan's, every slot NaN (the conversion
/// must write all the product reads). The scratch buffers, for a look afterwards.
fn run_fresh(
    gpu: &Gpu,
    launcher: &mut Launcher,
    programs: &[Program],
    buffers: &[wgpu::Buffer],
) -> Vec<wgpu::Buffer> {
    let scratch: Vec<_> = scratch_words(programs.iter())
        .iter()
        .map(|&w| gpu.upload_f32("scratch", &vec![f32::NAN; w.max(1) as usize]).unwrap())
        .collect();
    let res = Resources {
        buffers: buffers.iter().map(Range::whole).collect(),
        scratch: scratch.iter().collect(),
        ..Resources::default()
    };
    let dispatches: Vec<_> =
        programs.iter().map(|p| launcher.prepare(gpu, p, &res).unwrap()).collect();
    gpu.run(&dispatches.iter().collect::<Vec<_>>()).unwrap();
    scratch
}

/// Largest error of `spec` in `mode` with A scaled by `sa` and B by `sb`.
fn worst_error(
    gpu: &Gpu,
    launcher: &mut Launcher,
    mode: CoopMode,
    spec: &MatmulSpec,
    scales: (f32, f32),
) -> f64 {
    worst_errors(gpu, launcher, mode, &[(*spec, scales)])[0]
}

/// The largest error of each product of `products` (spec, scales of A and B) in `mode`, run
/// one after the other in one submission over the same scratch buffers, as a plan runs them.
fn worst_errors(
    gpu: &Gpu,
    launcher: &mut Launcher,
    mode: CoopMode,
    products: &[(MatmulSpec, (f32, f32))],
) -> Vec<f64> {
    let len = |s: &MatmulSpec, op: &Operand, rows: u32, cols: u32| {
        (op.offset
            + (s.batch - 1) * op.batch_stride
            + (rows - 1) * op.row_stride
            + (cols - 1) * op.col_stride
            + 1) as usize
    };
    let scale = |v: Vec<f32>, f: f32| v.into_iter().map(|x| x * f).collect::<Vec<_>>();
    let tile = MatmulTile::Coop(kernel(mode));
    let (mut buffers, mut programs, mut checks) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &(s, (sa, sb))) in products.iter().enumerate() {
        let a = random(len(&s, &s.a, s.m, s.k), 1);
        let a = outside_nan(scale(a, sa), &s.a, s.batch, s.m, s.k);
        let b = random(len(&s, &s.b, s.k, s.n), 2);
        let b = outside_nan(scale(b, sb), &s.b, s.batch, s.k, s.n);
        let c_old = random(len(&s, &s.c, s.m, s.n), 3);
        let want = matmul_ref(&s, &a, &b, &c_old, |v, _| v);
        let abs_a: Vec<f32> = a.iter().map(|x| x.abs()).collect();
        let abs_b: Vec<f32> = b.iter().map(|x| x.abs()).collect();
        let zeros = vec![0.0; c_old.len()];
        let unsigned = MatmulSpec { alpha: s.alpha.abs(), beta: 0.0, ..s };
        let norm = matmul_ref(&unsigned, &abs_a, &abs_b, &zeros, |v, _| v);
        for v in [&a, &b, &c_old] {
            buffers.push(gpu.upload_f32("operand", v).unwrap());
        }
        let operands = [0, 1, 2].map(|j| Resource::Buffer(3 * i + j));
        let p = matmul::programs("test", &s, tile, None, operands).unwrap();
        assert_eq!(p.len(), 2, "conversion, product");
        programs.extend(p);
        checks.push((s, c_old, want, norm));
    }
    run_fresh(gpu, launcher, &programs, &buffers);
    let mut errors = Vec::new();
    for (i, (s, c_old, want, norm)) in checks.iter().enumerate() {
        let got = gpu.read_f32_range(&buffers[3 * i + 2], 0..c_old.len()).unwrap();
        let mut worst = 0.0f64;
        for bt in 0..s.batch {
            for i in 0..s.m {
                for j in 0..s.n {
                    let idx = at(&s.c, bt, i, j);
                    let beta_c = (f64::from(s.beta) * f64::from(c_old[idx])).abs();
                    let err =
                        (f64::from(got[idx]) - want[idx]).abs() / (norm[idx] + beta_c + 1e-300);
                    worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
                }
            }
        }
        errors.push(worst);
    }
    errors
}

fn tolerance(mode: CoopMode) -> f64 {
    match mode {
        CoopMode::High => 1e-5,
        CoopMode::Medium => 2e-3,
    }
}

/// Ragged, tiny, transposed and batched products in both modes: (name, spec).
fn shapes() -> Vec<(&'static str, MatmulSpec)> {
    let c = MatmulSpec::contiguous;
    let (m, n, k) = (17, 33, 45);
    vec![
        ("1x1x1", c(1, 1, 1, 1)),
        // Longer than DIRECT_HIGH_MAX_K: `high` goes through the scratch without an epilogue.
        ("long k", c(1, 9, 20, 800)),
        ("ragged nn", c(1, m, n, k)),
        // Whole blocks of the tile inside C, no epilogue: fragments go straight into C.
        ("blocks inside C", c(1, 64, 64, 40)),
        ("inside and edge blocks, batch 2, alpha", MatmulSpec { alpha: 0.5, ..c(2, 48, 64, 40) }),
        ("tn (dW = Xt dY)", MatmulSpec { a: Operand::transposed(m, k), ..c(1, m, n, k) }),
        ("nt (dX = dY Wt)", MatmulSpec { b: Operand::transposed(k, n), ..c(1, m, n, k) }),
        (
            "batch 2, B broadcast, C offset, alpha and beta",
            MatmulSpec {
                b: Operand::row_major(k, n).broadcast().at(3),
                c: Operand::row_major(m, n).at(5),
                alpha: 0.5,
                beta: -1.5,
                ..c(2, m, n, k)
            },
        ),
    ]
}

#[test]
fn cooperative_kernels_match_the_reference_on_ragged_shapes() {
    let Some((gpu, _turn)) =
        coop_or_skip("cooperative_kernels_match_the_reference_on_ragged_shapes")
    else {
        return;
    };
    let mut launcher = Launcher::default(); // one compile per distinct module
    for mode in [CoopMode::High, CoopMode::Medium] {
        for (name, spec) in shapes() {
            let err = worst_error(gpu, &mut launcher, mode, &spec, (1.0, 1.0));
            assert!(err <= tolerance(mode), "{mode:?} {name}: worst error {err:e}");
        }
    }
}

/// `x` rounded to f16 and back, in f64: infinite from 65520 on, steps of 2^-24 below 2^-14
/// (subnormals), 11 significant bits between. What an operand holds in f16 unscaled.
fn through_f16(x: f32) -> f64 {
    let x = f64::from(x);
    if x.abs() >= 65520.0 {
        return x.signum() * f64::INFINITY;
    }
    let e = x.abs().log2().floor().max(-14.0);
    let quantum = (e - 10.0).exp2();
    (x / quantum).round() * quantum
}

/// Operands of 1e5 overflow f16 and of 1e-8 flush to zero; the scaling keeps the error of
/// in-range operands. The same operands rounded to f16 unscaled give products far off (on
/// the host, in f64): the scaling, not luck, passes the test.
#[test]
fn range_scaling_keeps_huge_and_tiny_operands_accurate() {
    let Some((gpu, _turn)) = coop_or_skip("range_scaling_keeps_huge_and_tiny_operands_accurate")
    else {
        return;
    };
    let spec =
        MatmulSpec { b: Operand::transposed(45, 33), ..MatmulSpec::contiguous(1, 17, 33, 45) };
    let all = [(1e5, 1e-8), (1e-8, 1e-8), (1e5, 1e5)];
    let mut launcher = Launcher::default();
    for mode in [CoopMode::High, CoopMode::Medium] {
        for scales in all {
            let scaled = worst_error(gpu, &mut launcher, mode, &spec, scales);
            assert!(scaled <= tolerance(mode), "{mode:?} {scales:?}: scaled error {scaled:e}");
        }
    }
    let (m, n, k) = (17, 33, 45);
    for (sa, sb) in all {
        let a: Vec<f32> = random(m * k, 1).into_iter().map(|x| x * sa).collect();
        let b: Vec<f32> = random(k * n, 2).into_iter().map(|x| x * sb).collect();
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut rounded, mut norm) = (0.0, 0.0, 0.0);
                for q in 0..k {
                    let (x, y) = (a[i * k + q], b[j * k + q]);
                    exact += f64::from(x) * f64::from(y);
                    rounded += through_f16(x) * through_f16(y);
                    norm += f64::from(x.abs()) * f64::from(y.abs());
                }
                let err = (rounded - exact).abs() / norm;
                worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
            }
        }
        assert!(worst > 1e-2, "{sa:e} x {sb:e}: unscaled f16 error only {worst:e}");
    }
}

/// Each strip of 16 rows of A (columns of B) has its own exponent: rows of 1e4 and rows of
/// 1e-9 in one operand (with one exponent for the whole operand, as before 2026-12-01, the
/// small rows lie 2^43 below its max-abs and flush to zero: every element of their rows of C
/// is wrong), batched, B transposed. Then products one after another over the same scratch,
/// operands 1e8 smaller each time, each judged on its own.
#[test]
fn every_strip_of_rows_and_columns_gets_its_own_range() {
    let Some((gpu, _turn)) = coop_or_skip("every_strip_of_rows_and_columns_gets_its_own_range")
    else {
        return;
    };
    let (m, n, k) = (64usize, 48usize, 40usize);
    let spec = MatmulSpec {
        b: Operand::transposed(k as u32, n as u32),
        ..MatmulSpec::contiguous(2, m as u32, n as u32, k as u32)
    };
    // Strips alternate between 1e4 and 1e-9: A's rows, B's columns (B^T's rows).
    let mut a = random(2 * m * k, 1);
    for (idx, v) in a.iter_mut().enumerate() {
        *v *= if (idx % (m * k)) / k / 16 % 2 == 0 { 1e4 } else { 1e-9 };
    }
    let mut b = random(2 * k * n, 2);
    for (idx, v) in b.iter_mut().enumerate() {
        *v *= if (idx % (k * n)) / k / 16 % 2 == 0 { 1e-9 } else { 1e4 };
    }
    let zeros = vec![0.0; 2 * m * n];
    let want = matmul_ref(&spec, &a, &b, &zeros, |v, _| v);
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let norm = matmul_ref(&spec, &abs(&a), &abs(&b), &zeros, |v, _| v);
    let mut launcher = Launcher::default();
    for mode in [CoopMode::High, CoopMode::Medium] {
        let buffers: Vec<_> =
            [&a, &b, &zeros].iter().map(|v| gpu.upload_f32("operand", v).unwrap()).collect();
        let tile = MatmulTile::Coop(kernel(mode));
        let programs =
            matmul::programs("test", &spec, tile, None, [0, 1, 2].map(Resource::Buffer)).unwrap();
        run_fresh(gpu, &mut launcher, &programs, &buffers);
        let got = gpu.read_f32_range(&buffers[2], 0..zeros.len()).unwrap();
        for (idx, &g) in got.iter().enumerate() {
            let err = (f64::from(g) - want[idx]).abs() / norm[idx];
            assert!(
                err <= tolerance(mode),
                "{mode:?}: batch {}, element ({}, {}): got {g:e}, want {:e}",
                idx / (m * n),
                idx % (m * n) / n,
                idx % n,
                want[idx]
            );
        }
        let products = [
            (spec, (1e5, 1e5)),
            (MatmulSpec::contiguous(1, 9, 20, 800), (1e-3, 1e-3)),
            (MatmulSpec::contiguous(1, 17, 33, 45), (1e-11, 1e-11)),
        ];
        let errors = worst_errors(gpu, &mut launcher, mode, &products);
        for (e, (_, scales)) in errors.iter().zip(&products) {
            assert!(*e <= tolerance(mode), "{mode:?} {scales:?} after the others: {errors:?}");
        }
    }
}

/// `rumus bench --kernels --matmul-precision MODE` measures the mode's kernel and checks it
/// against an f64 reference on sampled elements: here at a small ragged size, emulated (in
/// fp32 on the dot kernel: a few blocks, K too long for one thread to walk alone).
#[test]
fn the_kernel_benchmark_reports_each_mode_with_its_error() {
    let Some((gpu, _turn)) = coop_or_skip("the_kernel_benchmark_reports_each_mode_with_its_error")
    else {
        return;
    };
    for (precision, tile, tol) in [
        (MatmulPrecision::Highest, "dot", 1e-6),
        (MatmulPrecision::High, "coop-high", 1e-5),
        (MatmulPrecision::Medium, "coop-medium", 2e-3),
    ] {
        let options = MatmulOptions {
            precision,
            coop_tile: Some(TILE),
            emulate_coop: true,
            ..MatmulOptions::DEFAULT
        };
        let n = if gpu.info.backend == wgpu::Backend::Gl { 17 } else { 40 }; // slow there
        let r = bench_matmul_mode(gpu, n, 1, options).unwrap();
        assert_eq!(r.tile, tile);
        assert!(r.tflops > 0.0 && r.error_max <= tol && r.error_median <= r.error_max, "{r:?}");
    }
}

/// `exponent(m)` of the conversion on the host: `2^e` brings max-abs bits `m` into
/// `[2^14, 2^15)`, 0 for zero, clamped to `[-126, 126]`.
fn exponent(bits: u32) -> i32 {
    if bits == 0 {
        0
    } else {
        (141 - (bits >> 23) as i32).clamp(-126, 126)
    }
}

/// The conversion alone gives each strip of 16 rows of A and of 16 columns of B (per batch,
/// one batch for a broadcast operand) the exponent of the strip's own max-abs, wherever in
/// the strip the largest magnitude lies: the first and the last element and elements between,
/// of operands read as `vec4`s and as single elements, transposed, over batches, strided with
/// gaps, split-K views and broadcast. Every element outside the operands is NaN, whose bits
/// exceed any number's: a read outside an operand shows.
#[test]
fn the_conversion_gives_each_strip_the_exponent_of_its_max_abs() {
    let Some((gpu, _turn)) =
        coop_or_skip("the_conversion_gives_each_strip_the_exponent_of_its_max_abs")
    else {
        return;
    };
    let c = MatmulSpec::contiguous;
    let gapped = Operand { offset: 8, batch_stride: 400, row_stride: 16, col_stride: 1 };
    let split_k = Operand { offset: 0, batch_stride: 24, row_stride: 48, col_stride: 1 };
    let cases = [
        ("1x1x1", c(1, 1, 1, 1)),
        ("vec4, several strips", c(1, 96, 64, 200)),
        ("single elements, ragged strips", c(1, 61, 37, 203)),
        (
            "A and B transposed",
            MatmulSpec {
                a: Operand::transposed(40, 50),
                b: Operand::transposed(60, 40),
                ..c(1, 50, 60, 40)
            },
        ),
        ("100 batches of 3x8", c(100, 3, 5, 8)),
        (
            "gaps between rows and batches, B transposed and broadcast",
            MatmulSpec {
                a: gapped,
                b: Operand::transposed(12, 7).broadcast().at(1),
                ..c(3, 20, 7, 12)
            },
        ),
        (
            "a split-K view",
            MatmulSpec { a: split_k, b: Operand::row_major(24, 9), ..c(2, 33, 9, 24) },
        ),
    ];
    let tile = MatmulTile::Coop(kernel(CoopMode::High));
    let mut launcher = Launcher::default();
    let strip = 16usize;
    let pad = |x: u32, to: u32| (x.div_ceil(to) * to) as usize;
    for (name, s) in cases {
        // Per operand: (operand, rows, cols, whether the strips run across rows, strips).
        let ops = [
            (s.a, s.m, s.k, true, pad(s.m, TILE.bm) / strip),
            (s.b, s.k, s.n, false, pad(s.n, TILE.bn) / strip),
        ];
        let batches = |op: &Operand| if op.batch_stride == 0 { 1 } else { s.batch };
        // The elements of each (batch, strip) of each operand.
        let members: Vec<Vec<Vec<usize>>> = ops
            .iter()
            .map(|&(op, rows, cols, by_row, strips)| {
                let mut all = Vec::new();
                for bt in 0..batches(&op) {
                    for st in 0..strips {
                        let mut v = Vec::new();
                        for r in 0..rows as usize {
                            for q in 0..cols as usize {
                                let along = if by_row { r } else { q };
                                if along / strip == st {
                                    v.push(at(&op, bt, r as u32, q as u32));
                                }
                            }
                        }
                        all.push(v);
                    }
                }
                all
            })
            .collect();
        // The largest magnitude at the first, the last and three elements between.
        for pick in [0.0, 1.0, 0.31, 0.5, 0.77] {
            let mut want = Vec::new();
            let buffers: Vec<_> = ops
                .iter()
                .zip(&members)
                .enumerate()
                .map(|(i, (&(op, rows, cols, _, _), strips))| {
                    let len = strips.iter().flatten().max().unwrap() + 1 + 5;
                    let mut v = outside_nan(random(len, i as u64 + 1), &op, s.batch, rows, cols);
                    let inside: Vec<usize> = strips.iter().flatten().copied().collect();
                    let spike = inside[((inside.len() - 1) as f64 * pick) as usize];
                    v[spike] = if i == 0 { -1e3 } else { 2e3 };
                    for members in strips {
                        let bits = members.iter().map(|&e| v[e].abs().to_bits()).max();
                        want.push(exponent(bits.unwrap_or(0)));
                    }
                    gpu.upload_f32("operand", &v).unwrap()
                })
                .collect();
            let mut buffers = buffers;
            buffers.push(gpu.upload_f32("c", &[0.0; 4]).unwrap());
            let programs =
                matmul::programs("test", &s, tile, None, [0, 1, 2].map(Resource::Buffer)).unwrap();
            let scratch = run_fresh(gpu, &mut launcher, &programs[..1], &buffers);
            let got = gpu.read_i32_range(&scratch[EXPONENT_SLOT], 0..want.len()).unwrap();
            assert_eq!(got, want, "{name}, largest magnitude at {pick} of each operand");
        }
    }
}

/// Every element's error of `tile` on the contiguous product `spec` (alpha 1, beta 0) of `a`
/// and `b`, sorted: `|c - ref| / Σ_k |a_ik b_kj|`, the reference in f64.
fn sorted_errors(
    gpu: &Gpu,
    launcher: &mut Launcher,
    tile: MatmulTile,
    spec: &MatmulSpec,
    a: &[f32],
    b: &[f32],
) -> Vec<f64> {
    let s = spec;
    let zeros = vec![0.0; (s.m * s.n) as usize];
    let want = matmul_ref(s, a, b, &zeros, |v, _| v);
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let norm = matmul_ref(s, &abs(a), &abs(b), &zeros, |v, _| v);
    let buffers: Vec<_> =
        [a, b, &zeros].iter().map(|v| gpu.upload_f32("operand", v).unwrap()).collect();
    let programs =
        matmul::programs("test", s, tile, None, [0, 1, 2].map(Resource::Buffer)).unwrap();
    run_fresh(gpu, launcher, &programs, &buffers);
    let got = gpu.read_f32_range(&buffers[2], 0..zeros.len()).unwrap();
    let mut errors: Vec<f64> = (0..zeros.len())
        .map(|i| {
            let e = (f64::from(got[i]) - want[i]).abs() / (norm[i] + 1e-300);
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    errors
}

/// Operands whose rows (A) and columns (B) span magnitudes, as activations and gradients of
/// different tokens do, or that hold one outlier far above the rest (a transformer's massive
/// activations): each element of C is then judged against its own row and column, so the
/// small ones must be as accurate as the large. `high` against fp32 (the register kernel) on
/// the same operands, median and largest error relative to `Σ|a||b|`.
///
/// Measured (emulated on lavapipe; fp32 / `high` median and largest error):
///
/// | operands | fp32 | `high` before | `high` now |
/// |---|---|---|---|
/// | rows and columns from 1 to 2^-20 | 1.2e-8 / 1.8e-7 | 2.4e-8 / 3.1e-7 | 6.8e-9 / 5.9e-8 |
/// | one outlier 2^12 above the rest | 1.3e-8 / 1.2e-6 | 2.2e-8 / 1.9e-6 | 6.6e-9 / 3.6e-7 |
/// | one outlier 2^16 above the rest | 1.3e-8 / 1.1e-6 | 2.5e-8 / 1.7e-5 | 6.6e-9 / 4.4e-7 |
///
/// Before, lo was stored unscaled, an f16 subnormal for every element more than 2^15 below its
/// operand's max-abs (the largest error 15 times fp32's with the 2^16 outlier), and the cross
/// products were added into the hi·hi accumulator, three roundings per term (the median twice
/// fp32's). The bound: no worse than fp32 on the same operands, median and largest. (On the
/// H200 the tensor cores also round toward zero, which the emulation does not: there the
/// error of a 4096³ product fell from 2.2e-7 to 3.9e-9, fp32's 1.5e-8; BENCHMARKS.md.)
#[test]
fn high_keeps_fp32_accuracy_for_operands_spanning_magnitudes() {
    let Some((gpu, _turn)) =
        coop_or_skip("high_keeps_fp32_accuracy_for_operands_spanning_magnitudes")
    else {
        return;
    };
    let spec = MatmulSpec::contiguous(1, 64, 64, 256);
    let (m, n, k) = (spec.m as usize, spec.n as usize, spec.k as usize);
    // Row i of A times 2^-(span i / (m - 1)), column j of B likewise.
    let spanning = |span: f64| {
        let mut a = random(m * k, 1);
        let mut b = random(k * n, 2);
        for (i, v) in a.iter_mut().enumerate() {
            *v *= (-span * (i / k) as f64 / (m - 1) as f64).exp2() as f32;
        }
        for (i, v) in b.iter_mut().enumerate() {
            *v *= (-span * (i % n) as f64 / (n - 1) as f64).exp2() as f32;
        }
        (a, b)
    };
    let outlier = |f: f32| {
        let (mut a, mut b) = (random(m * k, 3), random(k * n, 4));
        a[5 * k + 7] = f;
        b[3 * n + 9] = -f;
        (a, b)
    };
    let cases = [
        ("rows and columns from 1 to 2^-20", spanning(20.0)),
        ("one outlier 2^12 above the rest", outlier(4096.0)),
        ("one outlier 2^16 above the rest", outlier(65536.0)),
    ];
    let mut launcher = Launcher::default();
    let stats = |e: &[f64]| (e[e.len() / 2], e[e.len() - 1]);
    for (name, (a, b)) in &cases {
        let fp32 = stats(&sorted_errors(gpu, &mut launcher, MatmulTile::Register, &spec, a, b));
        let tile = MatmulTile::Coop(kernel(CoopMode::High));
        let high = stats(&sorted_errors(gpu, &mut launcher, tile, &spec, a, b));
        let say = format!(
            "{name}: median, largest error: fp32 {:.1e}, {:.1e}; high {:.1e}, {:.1e}",
            fp32.0, fp32.1, high.0, high.1
        );
        assert!(high.0 <= fp32.0 && high.1 <= fp32.1, "{say}");
    }
}

/// An epilogue whose loads are split out (`MatmulEpilogue::loads`): the product loads a
/// residual and a bias for all of an invocation's elements before the scratch path, then
/// applies `v · residual + bias` element by element. Blocks inside C and ragged ones, each
/// element against the reference: a load handed to another element's epilogue fails it.
#[test]
fn epilogue_loads_issued_ahead_reach_their_own_elements() {
    let Some((gpu, _turn)) = coop_or_skip("epilogue_loads_issued_ahead_reach_their_own_elements")
    else {
        return;
    };
    let mut launcher = Launcher::default();
    for mode in [CoopMode::High, CoopMode::Medium] {
        for (m, n, k) in [(64, 64, 40), (50, 40, 24)] {
            let s = MatmulSpec::contiguous(1, m, n, k);
            let n_ = n as usize;
            let epilogue = residual_bias_epilogue(n);
            let (a, b) = (random((m * k) as usize, 1), random((k * n) as usize, 2));
            let residual = random((m * n) as usize, 3);
            let bias = random(n_, 4);
            let c_old = vec![f32::NAN; (m * n) as usize];
            let product = matmul_ref(&s, &a, &b, &vec![0.0; c_old.len()], |v, _| v);
            let buffers: Vec<_> = [&a, &b, &c_old, &residual, &bias]
                .iter()
                .map(|v| gpu.upload_f32("operand", v).unwrap())
                .collect();
            let operands = [0, 1, 2].map(Resource::Buffer);
            let tile = MatmulTile::Coop(kernel(mode));
            let programs = matmul::programs("test", &s, tile, Some(&epilogue), operands).unwrap();
            assert!(programs[1].wgsl.contains("store_c_with("), "the loads go ahead");
            run_fresh(gpu, &mut launcher, &programs, &buffers);
            let got = gpu.read_f32_range(&buffers[2], 0..c_old.len()).unwrap();
            for (idx, (&g, &p)) in got.iter().zip(&product).enumerate() {
                let want = p * f64::from(residual[idx]) + f64::from(bias[idx % n_]);
                let err = (f64::from(g) - want).abs();
                let tol = tolerance(mode) * (k as f64) * 4.0;
                assert!(
                    err <= tol,
                    "{mode:?} {m}x{n}x{k}: element ({}, {}): got {g}, want {want}",
                    idx / n_,
                    idx % n_
                );
            }
        }
    }
}

/// A forced cooperative tile the device cannot run is an error in the kernel benchmark, as in a
/// plan: the benchmark ran fp32 and reported its figures under the forced tile.
#[test]
fn the_kernel_benchmark_refuses_a_forced_tile_the_device_cannot_run() {
    let Some((gpu, _turn)) =
        or_skip("the_kernel_benchmark_refuses_a_forced_tile_the_device_cannot_run")
    else {
        return;
    };
    let tile = CoopTile { bm: 128, bn: 128, bk: 128, wm: 8, wn: 8, stages: 1 };
    let options = MatmulOptions {
        precision: MatmulPrecision::Medium,
        coop_tile: Some(tile),
        emulate_coop: true,
        ..MatmulOptions::DEFAULT
    };
    let most = gpu.target(options).max_invocations;
    let r = bench_matmul_mode(gpu, 64, 1, options);
    let Err(e) = r else { panic!("accepted on a device of {most} threads: {r:?}") };
    let expected = format!(
        "RUMUS_MATMUL_COOP_TILE: cooperative tile 128x128x128 w8x8: 2048 threads a workgroup, and this device runs at most {most}"
    );
    assert_eq!(e.message, expected);
}
