//! Every op in the op table, forward and backward, on the GPU against the CPU reference.
//!
//! Each op-table case (tests/common) is extended with `loss = Σ out · r` and its gradients, then
//! run through the fused GPU plan and through the CPU interpreter in f64; every output and
//! gradient element must agree within the tolerance declared for the case's op below. Shapes
//! include sizes that are not multiples of any workgroup size and size-1 dimensions.
//! `every_op_runs_on_the_gpu` walks the op table so no op is skipped.
//!
//! Runs on any wgpu adapter (Mesa's lavapipe in CI); with `CI=true` a missing adapter fails.

mod common;

use common::{build, cases, feeds};
use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::Op;
use rumus::plan::PlanOptions;
use rumus::runtime::backend::GpuBackend;
use rumus::runtime::test_gpu_or_skip;
use rumus::session::Backend;
use rumus::Tensor;
use std::collections::HashSet;

/// (atol, rtol) for a case, by the op it tests: f32 on the GPU against f64 on the CPU.
fn tolerance(case: &str) -> (f64, f64) {
    let op = case.split(' ').next().unwrap_or("");
    match op {
        // exp/log/pow chains and erf-based GELU amplify f32 rounding a little more.
        "exp" | "pow" | "gelu" | "log_softmax" | "cross_entropy" | "layer_norm" => (2e-4, 2e-3),
        _ => (1e-4, 1e-3),
    }
}

fn to_tensor(shape: &[usize], b: &Buf<f64>) -> Tensor {
    match b {
        Buf::F(v) => Tensor::f32(shape, v.iter().map(|&x| x as f32).collect()).unwrap(),
        Buf::I(v) => Tensor::i32(shape, v.clone()).unwrap(),
    }
}

#[test]
fn every_case_matches_the_cpu_reference() {
    let Some((gpu, _turn)) = test_gpu_or_skip("every_case_matches_the_cpu_reference") else {
        return;
    };
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    for (k, c) in cases().iter().enumerate() {
        let b = build(c).unwrap();
        let f = feeds(c, &b, 2000 + k as u64);
        let mut want = vec![b.out];
        want.extend(b.grads.iter().map(|&(_, d)| d));
        let opts = RunOptions { training: true, step: 5 };
        let mut cpu = Executor::<f64>::new(&b.g, 0).unwrap();
        let expected = cpu.run(&b.g, &f, &want, opts).unwrap();

        let tensors: Vec<Tensor> =
            f.iter().map(|(id, buf)| to_tensor(b.g.shape(*id), buf)).collect();
        let gfeeds: Vec<_> = f.iter().zip(&tensors).map(|((id, _), t)| (*id, t)).collect();
        let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
        let got = match backend.run(&gfeeds, &want, opts) {
            Ok(got) => got,
            Err(e) => {
                failures.push(format!("{}: {e}", c.name));
                continue;
            }
        };
        let (atol, rtol) = tolerance(&c.name);
        'values: for (w, (e, g)) in want.iter().zip(expected.iter().zip(&got)) {
            let Buf::F(e) = e else { continue };
            let g = g.to_f32_vec();
            for (i, (&ev, &gv)) in e.iter().zip(&g).enumerate() {
                let err = (ev - gv as f64).abs();
                worst = worst.max(err / (atol + rtol * ev.abs()));
                if err.is_nan() || err > atol + rtol * ev.abs() {
                    failures.push(format!(
                        "{}: node {} element {i}: gpu {gv} cpu {ev}",
                        c.name,
                        w.index()
                    ));
                    break 'values;
                }
            }
        }
    }
    println!("worst error as a fraction of its tolerance: {worst:.3}");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Every op kind appears in some case's forward or backward graph, so it ran above. Sources
/// (input, param, state) are buffers rather than kernels; parameters and state are exercised by
/// the training-step comparisons in tests/gpu_plan.rs.
#[test]
fn every_op_runs_on_the_gpu() {
    let mut seen = HashSet::new();
    for c in cases() {
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

/// The long-K case above runs through the split-K path (so its comparison covers it).
#[test]
fn a_long_thin_product_splits_k() {
    let Some((gpu, _turn)) = test_gpu_or_skip("a_long_thin_product_splits_k") else { return };
    let c = cases().into_iter().find(|c| c.name == "matmul long k").unwrap();
    let b = build(&c).unwrap();
    let mut backend = GpuBackend::new(gpu, b.g.clone(), 0, PlanOptions::default()).unwrap();
    let labels: Vec<String> = backend
        .plan_for(&[b.out], false)
        .unwrap()
        .dispatch_labels()
        .into_iter()
        .map(String::from)
        .collect();
    assert!(labels.iter().any(|l| l.contains("split-k")), "{labels:?}");
}
