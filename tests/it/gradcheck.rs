//! Every differentiable op's backward against central differences, in f64 on the CPU reference.
//!
//! Each case builds a small forward graph from inputs; the test forms the scalar
//! `loss = Σ out · r` with a fixed random `r`, appends the autodiff nodes, and compares each
//! analytic input gradient with `(loss(x + eps) − loss(x − eps)) / 2eps` element by element
//! (eps 1e-6, rtol 1e-3, atol 1e-5). `every_op_is_covered` walks the op table so no
//! differentiable op can go without a case.

use crate::common;

use common::{attention_cases, attention_long, build, cases, feeds, Case, Dom};
use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::{Graph, NodeId, Op};
use rumus::DType;
use std::collections::HashSet;

const EPS: f64 = 1e-6;
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-5;

/// Run one case, comparing every `every`-th element of each gradient (and its last); the first
/// element whose gradients disagree on failure.
fn check(c: &Case, seed: u64, every: usize) -> std::result::Result<(), String> {
    let b = build(c).map_err(|e| format!("build: {e}"))?;
    let (g, loss) = (&b.g, b.loss);
    let feeds = feeds(c, &b, seed);
    let mut exec = Executor::<f64>::new(g, 0).map_err(|e| e.to_string())?;
    let opts = RunOptions { training: true, step: 3 };
    let mut want = vec![loss];
    want.extend(b.grads.iter().map(|&(_, d)| d));
    let vals = exec.run(g, &feeds, &want, opts).map_err(|e| format!("run: {e}"))?;

    let loss_at = |exec: &mut Executor<f64>, feeds: &[(NodeId, Buf<f64>)]| -> f64 {
        match exec.run(g, feeds, &[loss], opts).expect("loss evaluates").remove(0) {
            Buf::F(v) => v[0],
            Buf::I(_) => panic!("loss is f64"),
        }
    };
    for (k, &(i, _)) in b.grads.iter().enumerate() {
        let Buf::F(analytic) = &vals[k + 1] else {
            return Err("gradient is not float".into());
        };
        let n = analytic.len();
        for e in (0..n).filter(|&e| e % every == 0 || e + 1 == n) {
            let mut plus = feeds.clone();
            let mut minus = feeds.clone();
            if let (Buf::F(p), Buf::F(m)) = (&mut plus[i].1, &mut minus[i].1) {
                p[e] += EPS;
                m[e] -= EPS;
            }
            let numeric = (loss_at(&mut exec, &plus) - loss_at(&mut exec, &minus)) / (2.0 * EPS);
            let a = analytic[e];
            if (a - numeric).abs() > ATOL + RTOL * numeric.abs() {
                return Err(format!("input x{i} element {e}: analytic {a} vs numeric {numeric}"));
            }
        }
    }
    Ok(())
}

#[test]
fn every_case_matches_central_differences() {
    let mut failures = Vec::new();
    for (k, c) in cases().iter().chain(&attention_cases()).enumerate() {
        if let Err(e) = check(c, 1000 + k as u64, 1) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(failures.is_empty(), "gradient check failures:\n{}", failures.join("\n"));
}

/// Attention at T = 300: every 17th element of dq, dk and dv (the rows, keys and head
/// dimensions they fall on vary, since 17 is prime to 2 and 300).
#[test]
fn attention_at_t_300_matches_central_differences() {
    for c in attention_long() {
        check(&c, 77, 17).unwrap();
    }
}

/// Walks the op table: every differentiable op appears in some case's forward graph (and so is
/// gradient-checked), and every op has a backward rule or is declared non-differentiable.
#[test]
fn every_op_is_covered() {
    let mut seen = HashSet::new();
    for c in cases().into_iter().chain(attention_cases()) {
        let mut g = Graph::new();
        let xs: Vec<NodeId> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (s, d))| {
                let dt = if matches!(d, Dom::Index(_)) { DType::I32 } else { DType::F32 };
                g.input(&format!("x{i}"), s, dt).unwrap()
            })
            .collect();
        (c.build)(&mut g, &xs).unwrap();
        seen.extend(g.nodes().map(|(_, n)| n.op.name()));
    }
    let missing: Vec<&str> = Op::samples()
        .iter()
        .filter(|op| op.is_differentiable() && !seen.contains(op.name()))
        .map(|op| op.name())
        .collect();
    assert!(missing.is_empty(), "differentiable ops without a gradient-check case: {missing:?}");
}
