//! Every op in the op table, forward and backward, on the GPU against the CPU reference.
//!
//! Each op-table case (tests/common) is extended with `loss = Σ out · r` and its gradients, then
//! run through the fused GPU plan and through the CPU interpreter in f64; every output and
//! gradient element must agree within the tolerance declared for the case's op below. Shapes
//! include sizes that are not multiples of any workgroup size and size-1 dimensions.
//! `every_op_runs_on_the_gpu` walks the op table so no op is skipped.
//!
//! Runs on any wgpu adapter (Mesa's lavapipe in CI); with `CI=true` a missing adapter fails.

use crate::common;

use crate::common::gpu::{both_or_skip, coop_or_skip, or_skip};
use common::{attention_cases, attention_long, build, cases, feeds, Case};
use rumus::backend::Backend;
use rumus::codegen::matmul_coop::CoopTile;
use rumus::codegen::{CoopAttention, MatmulOptions, MatmulPrecision};
use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::{BinaryOp, Op, UnaryOp};
use rumus::plan::PlanOptions;
use rumus::runtime::backend::GpuBackend;
use rumus::runtime::Gpu;
use rumus::Tensor;
use std::collections::HashSet;

/// (atol, rtol) for a case, by the op it tests: f32 on the GPU against f64 on the CPU.
fn tolerance(case: &str) -> (f64, f64) {
    let op = case.split(' ').next().unwrap_or("");
    match op {
        // exp/log/pow chains and erf-based GELU amplify f32 rounding a little more.
        "exp" | "pow" | "gelu" | "log_softmax" | "cross_entropy" | "layer_norm" => (2e-4, 2e-3),
        // Sums over up to 300 keys of exponentials, in a different order than the CPU's.
        "attention" => (2e-4, 2e-3),
        _ => (1e-4, 1e-3),
    }
}

/// Both NaN, or the same infinity: agreement that no tolerance can measure.
fn same_special(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b)
}

fn to_tensor(shape: &[usize], b: &Buf<f64>) -> Tensor {
    match b {
        Buf::F(v) => Tensor::f32(shape, v.iter().map(|&x| x as f32).collect()).unwrap(),
        Buf::I(v) => Tensor::i32(shape, v.clone()).unwrap(),
    }
}

/// On the adapter's own limits and on WebGPU's defaults.
#[test]
fn every_case_matches_the_cpu_reference() {
    let (gpus, _turn) = both_or_skip("every_case_matches_the_cpu_reference");
    for gpu in gpus {
        every_case_on(gpu, cases(), |_| true, |_| {});
    }
}

/// Causal attention, forward and backward (dq, dk, dv), at T = 1, 7, 64 and 300: ragged against
/// every block size, several blocks of keys and queries, and an empty batch. On the adapter's
/// own limits and on WebGPU's defaults (smaller blocks: 16 KiB of workgroup memory).
#[test]
fn attention_matches_the_cpu_reference() {
    let (gpus, _turn) = both_or_skip("attention_matches_the_cpu_reference");
    for gpu in gpus {
        // Mesa's OpenGL adapter takes many minutes over T = 64 and 300 (software, with
        // barriers): there T = 1, 7 and the empty batch; the Vulkan adapters run every case.
        let gl = gpu.info.backend == wgpu::Backend::Gl;
        let mut cs = attention_cases();
        cs.extend(attention_long());
        let short = |name: &str| !name.contains(", 64, ") && !name.contains(", 300, ");
        every_case_on(gpu, cs, |name| !gl || short(name), |_| {});
    }
}

/// Causal attention in the cooperative modes, its block products on emulated cooperative
/// matrices (the same kernels as on tensor cores, the operations in plain WGSL): forward and
/// backward against the CPU reference at T = 1, 7, 64 and 300, q, k and v as views of one
/// projection and the gradient of merged heads. `high` within fp32's tolerance, `medium`
/// within 20 times it (f16 operands). The plan names the cooperative kernels.
#[test]
fn attention_matches_the_cpu_in_the_cooperative_modes() {
    let Some((gpu, _turn)) = coop_or_skip("attention_matches_the_cpu_in_the_cooperative_modes")
    else {
        return;
    };
    for precision in [MatmulPrecision::High, MatmulPrecision::Medium] {
        let coop = MatmulOptions {
            precision,
            emulate_coop: true,
            coop_attention: CoopAttention::All,
            ..MatmulOptions::DEFAULT
        };
        let mut cs = attention_cases();
        cs.extend(attention_long());
        every_case_on(gpu, cs, |_| true, |b| b.matmul = coop);
        let c = attention_long().into_iter().next().unwrap();
        let b = build(&c).unwrap();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        backend.matmul = coop;
        // Each kernel's own dispatches (merged ones join labels with ` + `).
        backend.merge_dispatches = false;
        let want: Vec<_> = std::iter::once(b.out).chain(b.grads.iter().map(|&(_, d)| d)).collect();
        let labels = backend.plan_for(&want, true).unwrap().dispatch_labels();
        let attention: Vec<_> = labels.iter().filter(|l| l.starts_with("attention")).collect();
        let name = format!("coop-{precision}");
        assert!(attention.len() >= 3, "{labels:?}");
        assert!(attention.iter().all(|l| l.contains(&name)), "{attention:?}");
    }
}

/// The cases with reductions (and every case's `Σ out · r`) with reductions forced into two
/// stages: a first-stage workgroup sums 3 elements, so partials are ragged and several.
#[test]
fn reductions_in_two_stages_match_the_cpu_reference() {
    let (gpus, _turn) = both_or_skip("reductions_in_two_stages_match_the_cpu_reference");
    let reduces = ["sum", "mean", "max", "mse", "dropout", "cross_entropy", "embedding"];
    for gpu in gpus {
        every_case_on(
            gpu,
            cases(),
            |n| reduces.iter().any(|r| n.starts_with(r)),
            |b| b.reduce_chunk = 3,
        );
    }
}

/// The matmul cases (forward, both backward products with their transposed operands, fused
/// epilogues, split-K partials) again, with every product that the generated SIMT kernel can
/// compute on it: its block threshold lowered to one block, so these small ragged shapes take
/// it. On the adapter's own limits (WebGPU's default workgroup memory is too small for it).
#[test]
fn matmul_cases_match_the_cpu_on_the_simt_kernel() {
    let Some((gpu, _turn)) = or_skip("matmul_cases_match_the_cpu_on_the_simt_kernel") else {
        return;
    };
    // Mesa's OpenGL adapter runs the 128x256 blocks very slowly (minutes for the whole list):
    // there the plain product alone; every matmul case runs on the Vulkan adapters.
    let gl = gpu.info.backend == wgpu::Backend::Gl;
    // The long-K case's product in 8 slices: the SIMT kernel's batched partial products.
    let simt = MatmulOptions { simt_min_workgroups: 1, split_k: Some(8), ..MatmulOptions::DEFAULT };
    let only = |name: &str| if gl { name == "matmul" } else { name.starts_with("matmul") };
    every_case_on(gpu, cases(), only, |b| b.matmul = simt);
    let c = cases().into_iter().find(|c| c.name == "matmul").unwrap();
    let b = build(&c).unwrap();
    let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
    backend.matmul = MatmulOptions { simt_min_workgroups: 1, ..MatmulOptions::DEFAULT };
    // Each kernel's own dispatches (merged ones join labels with ` + `).
    backend.merge_dispatches = false;
    let want: Vec<_> = std::iter::once(b.out).chain(b.grads.iter().map(|&(_, d)| d)).collect();
    let plan = backend.plan_for(&want, true).unwrap();
    let simt = plan.dispatch_labels().iter().filter(|l| l.contains(" simt")).count();
    assert_eq!(simt, 3, "forward and both gradients: {:?}", plan.dispatch_labels());
}

/// One matmul case per kind of product again in the `high` and `medium` modes, with the
/// cooperative operations emulated in plain WGSL (a small tile, so these ragged shapes span
/// several blocks): every product of the plan (forward and both gradients of a plain, a
/// batched-broadcast and a split-K product, and a fused epilogue) takes a cooperative kernel
/// after its conversion to f16. `medium` rounds operands to f16 once,
/// so its tolerance is wider.
#[test]
fn matmul_cases_match_the_cpu_in_the_cooperative_modes() {
    let Some((gpu, _turn)) = coop_or_skip("matmul_cases_match_the_cpu_in_the_cooperative_modes")
    else {
        return;
    };
    let tile = CoopTile { bm: 32, bn: 32, bk: 16, wm: 1, wn: 2, stages: 1 };
    for precision in [MatmulPrecision::High, MatmulPrecision::Medium] {
        let coop = MatmulOptions {
            precision,
            coop_tile: Some(tile),
            emulate_coop: true,
            split_k: Some(8),
            ..MatmulOptions::DEFAULT
        };
        // Software adapters compile and run each emulated module slowly: one case per kind of
        // product.
        let some =
            ["matmul", "matmul batched broadcast", "matmul long k", "matmul empty k then relu"];
        every_case_on(gpu, cases(), |name| some.contains(&name), |b| b.matmul = coop);
        let c = cases().into_iter().find(|c| c.name == "matmul").unwrap();
        let b = build(&c).unwrap();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        backend.matmul = coop;
        // Each kernel's own dispatches (merged ones join labels with ` + `).
        backend.merge_dispatches = false;
        let want: Vec<_> = std::iter::once(b.out).chain(b.grads.iter().map(|&(_, d)| d)).collect();
        let labels = backend.plan_for(&want, true).unwrap().dispatch_labels();
        let name = format!(" coop-{precision}");
        let products = labels.iter().filter(|l| l.ends_with(&name)).count();
        assert_eq!(products, 3, "forward and both gradients: {labels:?}");
        // Right before each product: its conversion.
        for (i, l) in labels.iter().enumerate().filter(|(_, l)| l.ends_with(&name)) {
            let before = i.checked_sub(1).map(|j| &labels[j]);
            let ok = before.is_some_and(|b| b.ends_with(&format!("{name} convert")));
            assert!(ok, "{l} after {before:?}: {labels:?}");
        }
    }
}

/// A linear layer's bias gradient, in the `high` and `medium` modes, is summed by the
/// conversion of its weight gradient's product (which converts the output gradient as B),
/// checked against the CPU in `high`:
/// whole (48 rows), and in split-K slices added up by the split-K sum (1024 rows in 8 slices),
/// over 40 columns, so that the last strip of 16 is ragged. No reduction runs for it.
#[test]
fn bias_gradients_summed_by_the_conversion_in_the_cooperative_modes_match_the_cpu() {
    let Some((gpu, _turn)) = coop_or_skip(
        "bias_gradients_summed_by_the_conversion_in_the_cooperative_modes_match_the_cpu",
    ) else {
        return;
    };
    let linear = |name: &str, rows: usize| {
        let inputs: [(&[usize], common::Dom); 3] = [
            (&[rows, 20], common::Dom::Any),
            (&[20, 40], common::Dom::Any),
            (&[40], common::Dom::Any),
        ];
        common::case(name, &inputs, |g, x| {
            let y = g.matmul(x[0], x[1])?;
            g.add(y, x[2])
        })
    };
    let tile = CoopTile { bm: 32, bn: 32, bk: 16, wm: 1, wn: 2, stages: 1 };
    for precision in [MatmulPrecision::High, MatmulPrecision::Medium] {
        for (rows, split_k, sums) in
            [(48, None, &["convert"][..]), (1024, Some(8), &["convert", "split-k sum"])]
        {
            let coop = MatmulOptions {
                precision,
                coop_tile: Some(tile),
                emulate_coop: true,
                split_k,
                ..MatmulOptions::DEFAULT
            };
            let c = linear("linear", rows);
            // The numbers in `high`: `medium`'s single f16 product puts dW and dX (K up to
            // 1024) beyond any tolerance that would still catch a wrong sum; its conversion
            // sums with the same code, only its stores differ.
            if precision == MatmulPrecision::High {
                let name = format!("linear {rows} rows");
                every_case_on(gpu, vec![linear(&name, rows)], |_| true, |b| b.matmul = coop);
            }
            let b = build(&c).unwrap();
            let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
            backend.matmul = coop;
            let mut want = vec![b.out];
            want.extend(b.grads.iter().map(|&(_, d)| d));
            let plan = backend.plan_for(&want, true).unwrap();
            let labels = plan.dispatch_labels();
            assert!(
                !labels.iter().any(|l| l.starts_with("reduce")),
                "{precision} {rows}: {labels:?}"
            );
            let programs = rumus::codegen::compile(&b.g, &plan.plan, &gpu.target(coop)).unwrap();
            let summing = programs.all().filter(|p| p.bindings.iter().any(|b| b.name == "sums"));
            let summing: Vec<&str> = summing.map(|p| p.label.as_str()).collect();
            // The conversion writes the sums (a split product's slices' sums into scratch, which
            // the split-K sum adds up).
            assert_eq!(summing.len(), sums.len(), "{precision} {rows}: {summing:?}");
            for (label, end) in summing.iter().zip(sums) {
                assert!(label.ends_with(end), "{precision} {rows}: {summing:?}");
            }
        }
    }
}

/// Every case of `cases` whose name `only` accepts, on `gpu`, with the backend's kernel choices
/// set by `configure`.
fn every_case_on(
    gpu: &'static Gpu,
    cases: Vec<Case>,
    only: impl Fn(&str) -> bool,
    configure: impl Fn(&mut GpuBackend),
) {
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    for (k, c) in cases.iter().enumerate() {
        if !only(&c.name) {
            continue;
        }
        let b = build(c).unwrap();
        let f = feeds(c, &b, 2000 + k as u64);
        compare(gpu, c, &b, &f, &configure, &mut failures, &mut worst);
    }
    println!("worst error as a fraction of its tolerance: {worst:.3}");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Case `c` built as `b` with feeds `f`, on `gpu` (configured by `configure`) and on the CPU
/// in f64: each disagreement beyond the case's tolerance is pushed onto `failures`, and
/// `worst` keeps the largest error as a fraction of its tolerance.
fn compare(
    gpu: &'static Gpu,
    c: &common::Case,
    b: &common::Built,
    f: &[(rumus::graph::NodeId, Buf<f64>)],
    configure: &impl Fn(&mut GpuBackend),
    failures: &mut Vec<String>,
    worst: &mut f64,
) {
    let max = gpu.limits.max_storage_buffers_per_shader_stage;
    let mut want = vec![b.out];
    want.extend(b.grads.iter().map(|&(_, d)| d));
    let opts = RunOptions { training: true, step: 5 };
    let mut cpu = Executor::<f64>::new(&b.g, 0).unwrap();
    let expected = cpu.run(&b.g, f, &want, opts).unwrap();

    let tensors: Vec<Tensor> = f.iter().map(|(id, buf)| to_tensor(b.g.shape(*id), buf)).collect();
    let gfeeds: Vec<_> = f.iter().zip(&tensors).map(|((id, _), t)| (*id, t)).collect();
    let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
    configure(&mut backend);
    let got = match backend.run(&gfeeds, &want, opts) {
        Ok(got) => got,
        Err(e) => {
            failures.push(format!("{} at {max} buffers: {e}", c.name));
            return;
        }
    };
    let (atol, rtol) = tolerance(&c.name);
    let wider = match backend.matmul.precision {
        MatmulPrecision::Medium => 20.0,
        MatmulPrecision::High | MatmulPrecision::Highest => 1.0,
    };
    let (atol, rtol) = (atol * wider, rtol * wider);
    for (w, (e, g)) in want.iter().zip(expected.iter().zip(&got)) {
        let Buf::F(e) = e else { continue };
        let g = g.to_f32_vec();
        for (i, (&ev, &gv)) in e.iter().zip(&g).enumerate() {
            if same_special(ev, gv as f64) {
                continue;
            }
            let err = (ev - gv as f64).abs();
            *worst = worst.max(err / (atol + rtol * ev.abs()));
            if err.is_nan() || err > atol + rtol * ev.abs() {
                failures.push(format!(
                    "{} at {max} buffers: node {} element {i}: gpu {gv} cpu {ev}",
                    c.name,
                    w.index()
                ));
                return;
            }
        }
    }
}

/// Embedding backward sorts the ids (a radix pass per 8 bits of the row numbers, blocks of 256
/// ids): ids repeated, rows no id names, more rows than ids, rows past 256 (two passes) and
/// more than 256 ids (several blocks), each table's gradient against the CPU's.
#[test]
fn embedding_backward_matches_the_cpu_over_repeated_and_absent_ids() {
    let (gpus, _turn) =
        both_or_skip("embedding_backward_matches_the_cpu_over_repeated_and_absent_ids");
    let table: Vec<(usize, usize, Vec<i32>)> = vec![
        (5, 3, vec![4, 4, 0, 4, 2, 2]),
        (1000, 2, vec![999, 3, 3, 700, 999, 256, 255, 3]),
        (300, 3, (0..600).map(|i| (i * i % 301) % 300).collect()),
        (7, 1, vec![6; 300]),
    ];
    for gpu in gpus {
        let (mut failures, mut worst) = (Vec::new(), 0.0);
        for (k, (rows, d, ids)) in table.iter().enumerate() {
            let name = format!("embedding {rows}x{d} over {} ids", ids.len());
            let c = common::case(
                &name,
                &[
                    (&[*rows, *d], common::Dom::Any),
                    (&[ids.len()], common::Dom::Index(*rows as i32)),
                ],
                |g, x| g.embedding(x[0], x[1]),
            );
            let b = build(&c).unwrap();
            let mut f = feeds(&c, &b, 3000 + k as u64);
            for (id, buf) in &mut f {
                if *id == b.xs[1] {
                    *buf = Buf::I(ids.clone());
                }
            }
            assert!(b.grads.iter().any(|&(i, _)| i == 0), "{name}: the table's gradient");
            compare(gpu, &c, &b, &f, &|_| {}, &mut failures, &mut worst);
        }
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    }
}

/// Every op kind appears in some case's forward or backward graph, so it ran above. Sources
/// (input, param, state) are buffers rather than kernels; parameters and state are exercised by
/// the training-step comparisons in tests/gpu_plan.rs.
#[test]
fn every_op_runs_on_the_gpu() {
    let mut seen = HashSet::new();
    for c in cases().into_iter().chain(attention_cases()) {
        let b = build(&c).unwrap();
        seen.extend(b.g.nodes().map(|(_, n)| n.op.name()));
    }
    let missing: Vec<&str> = Op::samples()
        .iter()
        .filter(|op| !matches!(op, Op::Parameter { .. } | Op::State { .. }))
        .map(|op| op.name())
        .filter(|name| !seen.contains(name))
        .collect();
    assert!(missing.is_empty(), "ops no GPU case exercises: {missing:?}");
}

/// The long-K cases split into 8 slices of K (the cost model splits only products too large for
/// a software adapter; `MatmulOptions::split_k` forces it) match the CPU on the fp32 kernels:
/// the plain product, and a bias add and GELU fused into the sum of the slices, over outputs
/// summed as 4-element vectors (rows of 8, rows of 6 whose vectors span two rows) and as single
/// elements (5 columns of 3 rows). Each forward product is its partial products and the sum.
#[test]
fn a_long_thin_product_splits_k() {
    let Some((gpu, _turn)) = or_skip("a_long_thin_product_splits_k") else { return };
    let split = MatmulOptions { split_k: Some(8), ..MatmulOptions::DEFAULT };
    let long = |name: &str| name.starts_with("matmul long k");
    every_case_on(gpu, cases(), long, |b| b.matmul = split);
    for c in cases().into_iter().filter(|c| long(&c.name)) {
        let b = build(&c).unwrap();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        backend.matmul = split;
        let plan = backend.plan_for(&[b.out], false).unwrap();
        let labels = plan.dispatch_labels();
        assert_eq!(labels.len(), 2, "{}: {labels:?}", c.name);
        assert!(labels[0].contains("split-k 8 "), "{}: {labels:?}", c.name);
        assert!(labels[1].ends_with("split-k sum"), "{}: {labels:?}", c.name);
    }
}

/// Indices and labels out of range: the GPU reports the error the CPU reference gives, naming
/// the first bad element in the order the CPU reads them, from forward and gradient kernels
/// alike (a plan that wants only a gradient runs only the gradient kernel), and also when the
/// kernel has nothing to gather (rows of width 0).
#[test]
fn out_of_range_indices_and_labels_fail_as_on_the_cpu() {
    let Some((gpu, _turn)) = or_skip("out_of_range_indices_and_labels_fail_as_on_the_cpu") else {
        return;
    };
    // (case, (position, value) planted in its i32 input, want its gradient, error)
    type Row = (&'static str, &'static [(usize, i32)], bool, &'static str);
    let table: &[Row] = &[
        ("embedding repeated", &[(1, 5)], false, "embedding: index 5 is out of range for 5 rows"),
        (
            "embedding repeated",
            &[(6, 9), (2, -1)],
            false,
            "embedding: index -1 is out of range for 5 rows",
        ),
        (
            "embedding repeated",
            &[(7, 6)],
            true,
            "embedding_grad: index 6 is out of range for 5 rows",
        ),
        ("embedding empty rows", &[(4, 5)], false, "embedding: index 5 is out of range for 5 rows"),
        ("cross_entropy", &[(3, 5)], false, "cross_entropy: label 5 is out of range for 5 classes"),
        (
            "cross_entropy",
            &[(1, -2), (2, 8)],
            true,
            "cross_entropy_grad: label -2 is out of range for 5 classes",
        ),
        (
            "cross_entropy ignore 3d",
            &[(0, 3), (4, 4)],
            false,
            "cross_entropy: label 4 is out of range for 4 classes",
        ),
    ];
    let all = cases();
    for &(name, planted, grad, expected) in table {
        let c = all.iter().find(|c| c.name == name).unwrap();
        let b = build(c).unwrap();
        let mut f = feeds(c, &b, 7);
        let Some((_, Buf::I(idx))) = f.iter_mut().find(|(_, v)| matches!(v, Buf::I(_))) else {
            panic!("{name}: no i32 input");
        };
        for &(pos, value) in planted {
            idx[pos] = value;
        }
        let want = if grad { vec![b.grads[0].1] } else { vec![b.out] };
        let opts = RunOptions { training: false, step: 0 };
        let mut cpu = Executor::<f64>::new(&b.g, 0).unwrap();
        let cpu_err = cpu.run(&b.g, &f, &want, opts).unwrap_err();
        assert_eq!(cpu_err.message, expected, "{name}: the cpu");
        let tensors: Vec<Tensor> =
            f.iter().map(|(id, buf)| to_tensor(b.g.shape(*id), buf)).collect();
        let gfeeds: Vec<_> = f.iter().zip(&tensors).map(|((id, _), t)| (*id, t)).collect();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        let gpu_err = backend.run(&gfeeds, &want, opts).unwrap_err();
        assert_eq!(
            (gpu_err.kind, &gpu_err.message[..]),
            (cpu_err.kind, expected),
            "{name}: the gpu"
        );
        // The same backend runs good data afterwards.
        let good: Vec<_> = feeds(c, &b, 7)
            .into_iter()
            .map(|(id, buf)| (id, to_tensor(b.g.shape(id), &buf)))
            .collect();
        let good: Vec<_> = good.iter().map(|(id, t)| (*id, t)).collect();
        backend.run(&good, &want, opts).unwrap();
    }
}

/// NaN, the infinities and signed zeros through every elementwise op (binary ops on every pair),
/// `where` on a NaN condition, reductions and softmax over rows holding them: the GPU gives what
/// the CPU reference gives in f32. Both NaN, or the same infinity, agree; finite results agree to
/// a relative 1e-5 (the transcendental functions differ in their last bits).
#[test]
fn special_values_match_the_cpu_reference() {
    let Some((gpu, _turn)) = or_skip("special_values_match_the_cpu_reference") else {
        return;
    };
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        -2.5,
        3.0,
        1e30,
        -1e-30,
    ];
    let n = specials.len();
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[n], rumus::DType::F32).unwrap();
    let mut outs: Vec<(String, rumus::graph::NodeId)> = Vec::new();
    for u in UnaryOp::ALL {
        outs.push((u.name().to_string(), g.unary(u, x).unwrap()));
    }
    let col = g.reshape(x, &[n, 1]).unwrap();
    let row = g.reshape(x, &[1, n]).unwrap();
    for b in BinaryOp::ALL {
        outs.push((b.name().to_string(), g.binary(b, col, row).unwrap()));
    }
    let zero = g.constant(0.0);
    outs.push(("where".into(), g.select(col, row, zero).unwrap()));
    let square = g.broadcast_to(col, &[n, n]).unwrap();
    let rows = g.add(square, row).unwrap();
    for (name, node) in [
        ("sum", g.sum(rows, &[1], false).unwrap()),
        ("mean", g.mean(rows, &[0], false).unwrap()),
        ("max", g.max(rows, &[1], false).unwrap()),
        ("softmax", g.softmax(rows).unwrap()),
        ("log_softmax", g.log_softmax(rows).unwrap()),
    ] {
        outs.push((name.into(), node));
    }
    let failures = f32_differences(gpu, &g, x, &specials, &outs);
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Found by differential testing: LayerNorm of rows whose mean is huge (1e19, 3e19). The
/// workgroup merges (count, mean, M2) triples, and a row narrower than the workgroup leaves
/// threads empty: merged by the formula, the mean's square overflowed to infinity and times the
/// empty side's zero weight gave NaN for the whole row (the CPU normalized it). The kernel's
/// output matches the CPU's within 1e-4 now, as an ordinary row's does.
#[test]
fn layer_norm_of_rows_with_a_huge_mean_matches_the_cpu() {
    let Some((gpu, _turn)) = or_skip("layer_norm_of_rows_with_a_huge_mean_matches_the_cpu") else {
        return;
    };
    let rows: [[f32; 4]; 4] = [
        [1e19, 1e19, 1e19, 1.01e19],
        [3e19, 3e19, 3.03e19, 3e19],
        [-2e19, -2.02e19, -2e19, -2e19],
        [1.0, 2.0, 3.0, 4.0],
    ];
    let xs: Vec<f32> = rows.iter().flatten().copied().collect();
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[xs.len()], rumus::DType::F32).unwrap();
    let x2 = g.reshape(x, &[4, 4]).unwrap();
    let (w, b) = (g.constant(1.0), g.constant(0.0));
    let (w, b) = (g.broadcast_to(w, &[4]).unwrap(), g.broadcast_to(b, &[4]).unwrap());
    let y = g.layer_norm(x2, w, b, 1e-5).unwrap();
    // Rows spread over 1% of their mean lose 7 bits to cancellation: 1e-4 (the CPU is f32 too).
    let failures = f32_differences_within(gpu, &g, x, &xs, &[("layer_norm".into(), y)], 1e-4);
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Logarithms of values near 1 (WGSL's `log` is only within 2^-21 of the truth there, a
/// relative error of 3e-4 at `log(1 - 1e-4)` on lavapipe): every elementwise op (`log`, and
/// `softplus` and `log_sigmoid`, which take `ln_1p(e^-|x|)`) gives what the f32 CPU reference
/// gives, to a relative 1e-5.
#[test]
fn logarithms_near_one_match_the_cpu_reference() {
    let Some((gpu, _turn)) = or_skip("logarithms_near_one_match_the_cpu_reference") else {
        return;
    };
    let xs = [
        1.0 + 1e-6,
        1.0 + 3e-5,
        1.0 + 1e-4,
        1.0 + 1e-3,
        1.01,
        1.2,
        1.49,
        1.0 - 1e-4,
        0.99,
        0.76,
        9.0,
        12.0,
        -12.0,
        -9.0,
    ];
    let n = xs.len();
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[n], rumus::DType::F32).unwrap();
    let mut outs: Vec<(String, rumus::graph::NodeId)> = Vec::new();
    for u in UnaryOp::ALL {
        outs.push((u.name().to_string(), g.unary(u, x).unwrap()));
    }
    let failures = f32_differences(gpu, &g, x, &xs, &outs);
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Every elementwise op and `where` over constant operands only, NaN and the infinities among
/// them (added to an input so each is a kernel's output): constant subexpressions are folded
/// by codegen rather than left to the WGSL compiler, and give what the CPU reference gives in
/// f32, as in `special_values_match_the_cpu_reference`.
#[test]
fn ops_of_constants_match_the_cpu_reference() {
    let Some((gpu, _turn)) = or_skip("ops_of_constants_match_the_cpu_reference") else {
        return;
    };
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[1], rumus::DType::F32).unwrap();
    let constants = [-0.5, 0.0, 2.0, f32::NAN, f32::NEG_INFINITY];
    let mut outs: Vec<(String, rumus::graph::NodeId)> = Vec::new();
    for &a in &constants {
        let ca = g.constant(a);
        for u in UnaryOp::ALL {
            let y = g.unary(u, ca).unwrap();
            outs.push((format!("{}({a})", u.name()), g.add(x, y).unwrap()));
        }
        for &b in &constants {
            let cb = g.constant(b);
            for op in BinaryOp::ALL {
                let y = g.binary(op, ca, cb).unwrap();
                outs.push((format!("{}({a}, {b})", op.name()), g.add(x, y).unwrap()));
            }
            let y = g.select(ca, cb, x).unwrap();
            outs.push((format!("where({a}, {b}, x)"), g.add(x, y).unwrap()));
        }
    }
    let failures = f32_differences(gpu, &g, x, &[0.0], &outs);
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Where the GPU and the f32 CPU reference disagree on `outs` of `g` fed `xs` at `x`: both NaN,
/// or the same infinity, agree; finite results agree to a relative 1e-5 (the transcendental
/// functions differ in their last bits).
fn f32_differences(
    gpu: &'static Gpu,
    g: &rumus::graph::Graph,
    x: rumus::graph::NodeId,
    xs: &[f32],
    outs: &[(String, rumus::graph::NodeId)],
) -> Vec<String> {
    f32_differences_within(gpu, g, x, xs, outs, 1e-5)
}

/// [`f32_differences`] within `rtol`.
fn f32_differences_within(
    gpu: &'static Gpu,
    g: &rumus::graph::Graph,
    x: rumus::graph::NodeId,
    xs: &[f32],
    outs: &[(String, rumus::graph::NodeId)],
    rtol: f32,
) -> Vec<String> {
    let want: Vec<_> = outs.iter().map(|(_, id)| *id).collect();
    let opts = RunOptions { training: false, step: 0 };
    let mut cpu = Executor::<f32>::new(g, 0).unwrap();
    let expected = cpu.run(g, &[(x, Buf::F(xs.to_vec()))], &want, opts).unwrap();
    let feed = Tensor::f32(&[xs.len()], xs.to_vec()).unwrap();
    let mut backend = GpuBackend::new(gpu, g.clone(), 0, PlanOptions::default()).unwrap();
    let got = backend.run(&[(x, &feed)], &want, opts).unwrap();
    let mut failures = Vec::new();
    for ((name, _), (e, t)) in outs.iter().zip(expected.iter().zip(&got)) {
        let Buf::F(e) = e else { continue };
        for (i, (&ev, &gv)) in e.iter().zip(&t.to_f32_vec()).enumerate() {
            let agree = same_special(ev as f64, gv as f64)
                || (ev.is_finite() && (ev - gv).abs() <= rtol * ev.abs().max(1e-30))
                || (ev.is_finite() && ev.abs() < 1e-30 && gv.abs() < 1e-30);
            if !agree {
                failures.push(format!("{name} element {i}: gpu {gv} cpu {ev}"));
            }
        }
    }
    failures
}

/// More workgroups than one grid axis holds (65,535): a batched matmul of 70,000 products runs
/// (its grid split) and matches the CPU.
#[test]
fn a_batch_beyond_one_grid_axis_is_split() {
    let Some((gpu, _turn)) = or_skip("a_batch_beyond_one_grid_axis_is_split") else {
        return;
    };
    let batch = 70_000;
    let mut g = rumus::graph::Graph::new();
    let a = g.input("a", &[batch, 1, 2], rumus::DType::F32).unwrap();
    let b = g.input("b", &[batch, 2, 1], rumus::DType::F32).unwrap();
    let y = g.matmul(a, b).unwrap();
    let av: Vec<f32> = (0..2 * batch).map(|i| (i % 7) as f32 - 3.0).collect();
    let bv: Vec<f32> = (0..2 * batch).map(|i| (i % 5) as f32 * 0.5).collect();
    let opts = RunOptions { training: false, step: 0 };
    let mut cpu = Executor::<f32>::new(&g, 0).unwrap();
    let feeds = [(a, Buf::F(av.clone())), (b, Buf::F(bv.clone()))];
    let Buf::F(want) = &cpu.run(&g, &feeds, &[y], opts).unwrap()[0] else { panic!("f32") };
    let (ta, tb) =
        (Tensor::f32(&[batch, 1, 2], av).unwrap(), Tensor::f32(&[batch, 2, 1], bv).unwrap());
    let mut backend = GpuBackend::new(gpu, g.clone(), 0, PlanOptions::default()).unwrap();
    let got = backend.run(&[(a, &ta), (b, &tb)], &[y], opts).unwrap()[0].to_f32_vec();
    assert!(got == *want, "the split grid computed other values");
}

/// An evaluation (not training) on the GPU gives what the CPU gives: dropout is the identity
/// (it dropped on the GPU before the step uniform carried the mode) and batch norm reads its
/// running statistics (`training_select`).
#[test]
fn evaluation_mode_matches_the_cpu_reference() {
    let Some((gpu, _turn)) = or_skip("evaluation_mode_matches_the_cpu_reference") else {
        return;
    };
    let wanted = |n: &str| n.starts_with("dropout") || n.starts_with("batch_norm");
    let mut ran = 0;
    for (k, c) in cases().into_iter().enumerate().filter(|(_, c)| wanted(&c.name)) {
        let b = build(&c).unwrap();
        let f = feeds(&c, &b, 4000 + k as u64);
        let opts = RunOptions { training: false, step: 5 };
        let mut eval = b.g.clone();
        eval.updates.clear();
        let mut cpu = Executor::<f64>::new(&eval, 0).unwrap();
        let Buf::F(want) = cpu.run(&eval, &f, &[b.out], opts).unwrap().remove(0) else {
            panic!("{}: f32 output", c.name)
        };
        if c.name.starts_with("dropout") {
            let Buf::F(x) = &f[0].1 else { panic!() };
            assert_eq!(&want, x, "{}: the identity on the cpu", c.name);
        }
        let tensors: Vec<Tensor> =
            f.iter().map(|(id, buf)| to_tensor(b.g.shape(*id), buf)).collect();
        let gfeeds: Vec<_> = f.iter().zip(&tensors).map(|((id, _), t)| (*id, t)).collect();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        let got = backend.run(&gfeeds, &[b.out], opts).unwrap().remove(0).to_f32_vec();
        for (i, (&w, &g)) in want.iter().zip(&got).enumerate() {
            assert!(
                (w - g as f64).abs() <= 1e-4 + 1e-3 * w.abs(),
                "{} element {i}: gpu {g} cpu {w}",
                c.name
            );
        }
        ran += 1;
    }
    assert_eq!(ran, 5, "dropout and batch_norm cases");
}

/// Convolutions run on the matmul kernels, so the precision modes reach them: two conv cases
/// (grouped, and strided with padding) in the `high` mode with the cooperative operations
/// emulated, every product of the plan (forward, the weight's and the input's gradients) on a
/// cooperative kernel.
#[test]
fn conv_cases_match_the_cpu_in_the_cooperative_modes() {
    let Some((gpu, _turn)) = coop_or_skip("conv_cases_match_the_cpu_in_the_cooperative_modes")
    else {
        return;
    };
    let tile = CoopTile { bm: 32, bn: 32, bk: 16, wm: 1, wn: 2, stages: 1 };
    let coop = MatmulOptions {
        precision: MatmulPrecision::High,
        coop_tile: Some(tile),
        emulate_coop: true,
        ..MatmulOptions::DEFAULT
    };
    let some = ["conv2d groups 2", "conv2d stride 2 padding 1"];
    every_case_on(gpu, cases(), |name| some.contains(&name), |b| b.matmul = coop);
    for name in some {
        let c = cases().into_iter().find(|c| c.name == name).unwrap();
        let b = build(&c).unwrap();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        backend.matmul = coop;
        // Each kernel's own dispatches (merged ones join labels with ` + `).
        backend.merge_dispatches = false;
        let want: Vec<_> = std::iter::once(b.out).chain(b.grads.iter().map(|&(_, d)| d)).collect();
        let labels = backend.plan_for(&want, true).unwrap().dispatch_labels();
        let products = labels.iter().filter(|l| l.ends_with(" coop-high")).count();
        assert_eq!(products, 3, "{name}: forward and both gradients: {labels:?}");
    }
}

/// Reductions at the sizes their workgroup layouts split raggedly, forward only: over the rows
/// of 150 x 70 (columns owned by threads, 70 not a multiple of the 64 a workgroup takes; 150 rows
/// in three parts of at most 64, so two stages), over its short rows (several rows a workgroup,
/// 150 not a multiple of them), over a middle axis (the last axis kept), and over everything.
/// Each agrees with the CPU reference in f64 to 1e-5 relative.
#[test]
fn reductions_of_many_columns_and_short_rows_match_the_cpu() {
    let Some((gpu, _turn)) = or_skip("reductions_of_many_columns_and_short_rows_match_the_cpu")
    else {
        return;
    };
    let (rows, cols) = (150, 70);
    let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[rows, cols], rumus::DType::F32).unwrap();
    let cube = g.reshape(x, &[15, 10, cols]).unwrap();
    let outs = [
        ("sum over rows", g.sum(x, &[0], false).unwrap()),
        ("max over rows", g.max(x, &[0], false).unwrap()),
        ("mean over columns", g.mean(x, &[1], false).unwrap()),
        ("max over columns", g.max(x, &[1], false).unwrap()),
        ("sum over a middle axis", g.sum(cube, &[1], false).unwrap()),
        ("sum of everything", g.sum(x, &[0, 1], false).unwrap()),
    ];
    let want: Vec<_> = outs.iter().map(|(_, id)| *id).collect();
    let opts = RunOptions { training: false, step: 0 };
    let mut cpu = Executor::<f64>::new(&g, 0).unwrap();
    let f64s = data.iter().map(|&v| f64::from(v)).collect();
    let expected = cpu.run(&g, &[(x, Buf::F(f64s))], &want, opts).unwrap();
    let feed = Tensor::f32(&[rows, cols], data).unwrap();
    let mut backend = GpuBackend::new(gpu, g.clone(), 0, PlanOptions::default()).unwrap();
    let got = backend.run(&[(x, &feed)], &want, opts).unwrap();
    for ((name, _), (e, t)) in outs.iter().zip(expected.iter().zip(&got)) {
        let Buf::F(e) = e else { panic!("{name}: not a float result") };
        let t = t.to_f32_vec();
        assert_eq!(e.len(), t.len(), "{name}: length");
        for (i, (&ev, &gv)) in e.iter().zip(&t).enumerate() {
            let err = (ev - f64::from(gv)).abs();
            assert!(err <= 1e-5 * ev.abs().max(1.0), "{name} element {i}: gpu {gv} cpu {ev}");
        }
    }
}

/// Operand prologues on the fp32 kernels (`PlanOptions::matmul_prologues` forced; plans for
/// cooperative products turn it on by themselves): an elementwise chain only a product reads
/// is written into scratch by a program of the product's, then read as a row-major operand.
/// A (plain and batched against a broadcast B), B read transposed through a permute, and
/// K = 0 (nothing to read, no program), forward, against the CPU in f32.
#[test]
fn operand_prologues_on_the_fp32_kernels_match_the_cpu() {
    let Some((gpu, _turn)) = or_skip("operand_prologues_on_the_fp32_kernels_match_the_cpu") else {
        return;
    };
    type Build = fn(
        &mut rumus::graph::Graph,
        &[rumus::graph::NodeId],
    ) -> rumus::Result<rumus::graph::NodeId>;
    // (name, input shapes, the graph, programs its plan must have)
    type Case = (&'static str, &'static [&'static [usize]], Build, &'static [&'static str]);
    let cases: [Case; 4] = [
        (
            "tanh A",
            &[&[4, 7], &[7, 5]],
            |g, x| {
                let a = g.unary(UnaryOp::Tanh, x[0])?;
                g.matmul(a, x[1])
            },
            &["prologue A"],
        ),
        (
            "relu batched A, broadcast B",
            &[&[2, 3, 7], &[7, 5]],
            |g, x| {
                let a = g.relu(x[0])?;
                g.matmul(a, x[1])
            },
            &["prologue A"],
        ),
        (
            "gelu B read transposed",
            &[&[5, 7], &[4, 7]],
            |g, x| {
                let b = g.gelu_tanh(x[1])?;
                let bt = g.permute(b, &[1, 0])?;
                g.matmul(x[0], bt)
            },
            &["prologue B"],
        ),
        (
            "relu A of K = 0",
            &[&[3, 0], &[0, 5]],
            |g, x| {
                let a = g.relu(x[0])?;
                g.matmul(a, x[1])
            },
            &[],
        ),
    ];
    for (name, shapes, f, programs) in cases {
        let mut g = rumus::graph::Graph::new();
        let xs: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| g.input(&format!("x{i}"), s, rumus::DType::F32).unwrap())
            .collect();
        let out = f(&mut g, &xs).unwrap();
        let tensors: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n: usize = s.iter().product();
                let v = (0..n).map(|j| ((j * 7 + i * 3) % 11) as f32 * 0.3 - 1.4).collect();
                Tensor::f32(s, v).unwrap()
            })
            .collect();
        let feeds: Vec<_> = xs.iter().copied().zip(&tensors).collect();
        let opts = RunOptions { training: false, step: 0 };
        let mut cpu = rumus::cpu::CpuBackend::new(g.clone(), 0).unwrap();
        let want = cpu.run(&feeds, &[out], opts).unwrap()[0].to_f32_vec();
        let prologues = PlanOptions { matmul_prologues: true, ..PlanOptions::default() };
        let mut gpu_backend = GpuBackend::new(gpu, g.clone(), 0, prologues).unwrap();
        let labels = gpu_backend.plan_for(&[out], false).unwrap().dispatch_labels().join(", ");
        for p in programs {
            assert!(labels.contains(p), "{name}: {labels}");
        }
        assert!(!labels.contains("elementwise"), "{name}: the chain has no kernel: {labels}");
        let got = gpu_backend.run(&feeds, &[out], opts).unwrap()[0].to_f32_vec();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{name}: element {i}: {a} against {b}"
            );
        }
    }
}
