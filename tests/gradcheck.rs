//! Every differentiable op's backward against central differences, in f64 on the CPU reference.
//!
//! Each case builds a small forward graph from inputs; the test forms the scalar
//! `loss = Σ out · r` with a fixed random `r`, appends the autodiff nodes, and compares each
//! analytic input gradient with `(loss(x + eps) − loss(x − eps)) / 2eps` element by element
//! (eps 1e-6, rtol 1e-3, atol 1e-5). `every_op_is_covered` walks the op table so no
//! differentiable op can go without a case.

use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::{autodiff, BinaryOp, Graph, NodeId, Op, UnaryOp};
use rumus::rng::Rng;
use rumus::{DType, Result};
use std::collections::HashSet;

const EPS: f64 = 1e-6;
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-5;

/// How an input's values are drawn.
#[derive(Clone, Copy)]
enum Dom {
    /// N(0, 1), kept away from 0 (so kinks of relu/abs and ties of max are not hit).
    Any,
    /// U(0.5, 2).
    Positive,
    /// 0.0 or 1.0.
    Mask,
    /// i32 in 0..n (the last one set to `ignore` when given).
    Index(i32),
}

struct Case {
    name: String,
    inputs: Vec<(Vec<usize>, Dom)>,
    build: Box<dyn Fn(&mut Graph, &[NodeId]) -> Result<NodeId>>,
}

fn case(
    name: &str,
    inputs: &[(&[usize], Dom)],
    build: impl Fn(&mut Graph, &[NodeId]) -> Result<NodeId> + 'static,
) -> Case {
    Case {
        name: name.to_string(),
        inputs: inputs.iter().map(|(s, d)| (s.to_vec(), *d)).collect(),
        build: Box::new(build),
    }
}

fn cases() -> Vec<Case> {
    use Dom::*;
    let mut cs = Vec::new();
    let unary = [
        (UnaryOp::Neg, Any),
        (UnaryOp::Exp, Any),
        (UnaryOp::Log, Positive),
        (UnaryOp::Sqrt, Positive),
        (UnaryOp::Rsqrt, Positive),
        (UnaryOp::Abs, Any),
        (UnaryOp::Square, Any),
        (UnaryOp::Tanh, Any),
        (UnaryOp::Sigmoid, Any),
        (UnaryOp::Relu, Any),
        (UnaryOp::Gelu, Any),
        (UnaryOp::GeluTanh, Any),
        (UnaryOp::Silu, Any),
    ];
    for (u, dom) in unary {
        for shape in [&[3, 4][..], &[2, 1, 3][..], &[][..]] {
            cs.push(case(
                &format!("{} {:?}", u.name(), shape),
                &[(shape, dom)],
                move |g, x| g.unary(u, x[0]),
            ));
        }
    }
    let binary = [
        (BinaryOp::Add, Any, Any),
        (BinaryOp::Sub, Any, Any),
        (BinaryOp::Mul, Any, Any),
        (BinaryOp::Div, Any, Positive),
        (BinaryOp::Pow, Positive, Any),
        (BinaryOp::Maximum, Any, Any),
        (BinaryOp::Minimum, Any, Any),
    ];
    for (b, da, db) in binary {
        for (sa, sb) in [
            (&[2, 3][..], &[2, 3][..]),
            (&[2, 3][..], &[3][..]),
            (&[4, 1][..], &[1, 5][..]),
            (&[][..], &[2, 1][..]),
        ] {
            cs.push(case(
                &format!("{} {sa:?} {sb:?}", b.name()),
                &[(sa, da), (sb, db)],
                move |g, x| g.binary(b, x[0], x[1]),
            ));
        }
    }
    cs.push(case(
        "where broadcast",
        &[(&[2, 3], Mask), (&[2, 3], Any), (&[3], Any)],
        |g, x| g.select(x[0], x[1], x[2]),
    ));
    cs.push(case(
        "where size-1",
        &[(&[4, 1], Mask), (&[1, 5], Any), (&[], Any)],
        |g, x| g.select(x[0], x[1], x[2]),
    ));
    for (axes, keep) in [
        (&[1][..], false),
        (&[0, 2][..], true),
        (&[0, 1, 2][..], false),
    ] {
        let a = axes.to_vec();
        cs.push(case(
            &format!("sum {axes:?} {keep}"),
            &[(&[2, 3, 4], Any)],
            move |g, x| g.sum(x[0], &a, keep),
        ));
        let a = axes.to_vec();
        cs.push(case(
            &format!("mean {axes:?} {keep}"),
            &[(&[2, 3, 4], Any)],
            move |g, x| g.mean(x[0], &a, keep),
        ));
        let a = axes.to_vec();
        cs.push(case(
            &format!("max {axes:?} {keep}"),
            &[(&[2, 3, 4], Any)],
            move |g, x| g.max(x[0], &a, keep),
        ));
    }
    cs.push(case("max size-1 axis", &[(&[3, 1], Any)], |g, x| {
        g.max(x[0], &[1], false)
    }));
    cs.push(case("reshape", &[(&[2, 3, 4], Any)], |g, x| {
        g.reshape(x[0], &[6, 1, 4])
    }));
    cs.push(case("reshape scalar", &[(&[1, 1], Any)], |g, x| {
        g.reshape(x[0], &[])
    }));
    cs.push(case("permute", &[(&[2, 3, 4], Any)], |g, x| {
        g.permute(x[0], &[2, 0, 1])
    }));
    cs.push(case("transpose size-1", &[(&[1, 3], Any)], |g, x| {
        g.transpose(x[0], 0, 1)
    }));
    cs.push(case("broadcast_to", &[(&[3, 1], Any)], |g, x| {
        g.broadcast_to(x[0], &[2, 3, 4])
    }));
    cs.push(case("broadcast_to scalar", &[(&[], Any)], |g, x| {
        g.broadcast_to(x[0], &[2, 2])
    }));
    cs.push(case("slice middle", &[(&[2, 5], Any)], |g, x| {
        g.slice(x[0], 1, 1, 4)
    }));
    cs.push(case("slice edge", &[(&[4, 1, 3], Any)], |g, x| {
        g.slice(x[0], 0, 0, 1)
    }));
    cs.push(case("concat", &[(&[2, 3], Any), (&[2, 1], Any)], |g, x| {
        g.concat(&[x[0], x[1]], 1)
    }));
    cs.push(case(
        "concat three",
        &[(&[1, 2], Any), (&[3, 2], Any), (&[1, 2], Any)],
        |g, x| g.concat(x, 0),
    ));
    cs.push(case("matmul", &[(&[3, 4], Any), (&[4, 5], Any)], |g, x| {
        g.matmul(x[0], x[1])
    }));
    cs.push(case(
        "matmul batched broadcast",
        &[(&[2, 1, 3, 4], Any), (&[3, 4, 2], Any)],
        |g, x| g.matmul(x[0], x[1]),
    ));
    cs.push(case(
        "matmul nd @ 2d",
        &[(&[2, 3, 4], Any), (&[4, 1], Any)],
        |g, x| g.matmul(x[0], x[1]),
    ));
    cs.push(case(
        "matmul 1x1",
        &[(&[1, 1], Any), (&[1, 1], Any)],
        |g, x| g.matmul(x[0], x[1]),
    ));
    cs.push(case("softmax", &[(&[3, 5], Any)], |g, x| g.softmax(x[0])));
    cs.push(case("softmax size-1", &[(&[2, 1], Any)], |g, x| {
        g.softmax(x[0])
    }));
    cs.push(case("log_softmax", &[(&[2, 3, 4], Any)], |g, x| {
        g.log_softmax(x[0])
    }));
    cs.push(case(
        "log_softmax size-1 rows",
        &[(&[1, 6], Any)],
        |g, x| g.log_softmax(x[0]),
    ));
    cs.push(case(
        "causal_mask then softmax",
        &[(&[2, 4, 4], Any)],
        |g, x| {
            let m = g.causal_mask(x[0])?;
            g.softmax(m)
        },
    ));
    cs.push(case(
        "causal_mask rectangular",
        &[(&[2, 3], Any)],
        |g, x| {
            let m = g.causal_mask(x[0])?;
            g.softmax(m)
        },
    ));
    cs.push(case(
        "layer_norm",
        &[(&[3, 5], Any), (&[5], Any), (&[5], Any)],
        |g, x| g.layer_norm(x[0], x[1], x[2], 1e-5),
    ));
    cs.push(case(
        "layer_norm 3d",
        &[(&[2, 2, 4], Any), (&[4], Any), (&[4], Any)],
        |g, x| g.layer_norm(x[0], x[1], x[2], 1e-5),
    ));
    cs.push(case(
        "embedding repeated",
        &[(&[5, 3], Any), (&[2, 4], Index(5))],
        |g, x| g.embedding(x[0], x[1]),
    ));
    cs.push(case(
        "embedding single",
        &[(&[1, 2], Any), (&[3], Index(1))],
        |g, x| g.embedding(x[0], x[1]),
    ));
    cs.push(case(
        "cross_entropy",
        &[(&[4, 5], Any), (&[4], Index(5))],
        |g, x| g.cross_entropy(x[0], x[1], None),
    ));
    cs.push(case(
        "cross_entropy ignore 3d",
        &[(&[2, 3, 4], Any), (&[2, 3], Index(4))],
        |g, x| g.cross_entropy(x[0], x[1], Some(3)),
    ));
    cs.push(case("mse", &[(&[3, 2], Any), (&[3, 2], Any)], |g, x| {
        g.mse(x[0], x[1])
    }));
    cs.push(case("dropout", &[(&[4, 5], Any)], |g, x| {
        g.dropout(x[0], 0.3, 7)
    }));
    cs.push(case("dropout size-1", &[(&[1, 1, 3], Any)], |g, x| {
        g.dropout(x[0], 0.5, 1)
    }));
    cs
}

fn draw(rng: &mut Rng, shape: &[usize], dom: Dom) -> Buf<f64> {
    let n: usize = shape.iter().product();
    match dom {
        Dom::Any => Buf::F(
            (0..n)
                .map(|_| {
                    let v = rng.normal();
                    if v.abs() < 0.1 {
                        v.signum() * 0.1 + v
                    } else {
                        v
                    }
                })
                .collect(),
        ),
        Dom::Positive => Buf::F((0..n).map(|_| 0.5 + 1.5 * rng.uniform()).collect()),
        Dom::Mask => Buf::F((0..n).map(|_| (rng.uniform() < 0.5) as u8 as f64).collect()),
        Dom::Index(k) => Buf::I((0..n).map(|_| rng.below(k as u64) as i32).collect()),
    }
}

/// Run one case; returns the worst (abs error, element) on failure.
fn check(c: &Case, seed: u64) -> std::result::Result<(), String> {
    let mut g = Graph::new();
    let mut xs = Vec::new();
    for (i, (shape, dom)) in c.inputs.iter().enumerate() {
        let dtype = if matches!(dom, Dom::Index(_)) {
            DType::I32
        } else {
            DType::F32
        };
        xs.push(
            g.input(&format!("x{i}"), shape, dtype)
                .map_err(|e| e.to_string())?,
        );
    }
    let out = (c.build)(&mut g, &xs).map_err(|e| format!("build: {e}"))?;
    let r = g
        .input("r", &g.shape(out).to_vec(), DType::F32)
        .map_err(|e| e.to_string())?;
    let weighted = g.mul(out, r).map_err(|e| e.to_string())?;
    let loss = g.sum_all(weighted).map_err(|e| e.to_string())?;
    let diff: Vec<(usize, NodeId)> = c
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, (_, d))| !matches!(d, Dom::Index(_) | Dom::Mask))
        .map(|(i, _)| (i, xs[i]))
        .collect();
    let wrt: Vec<NodeId> = diff.iter().map(|&(_, x)| x).collect();
    let grads = autodiff::grad(&mut g, loss, &wrt).map_err(|e| format!("grad: {e}"))?;
    rumus::graph::verify(&g).map_err(|e| e.to_string())?;

    let mut rng = Rng::new(seed);
    let mut feeds: Vec<(NodeId, Buf<f64>)> = c
        .inputs
        .iter()
        .zip(&xs)
        .map(|((s, d), &x)| (x, draw(&mut rng, s, *d)))
        .collect();
    let out_shape = g.shape(out).to_vec();
    feeds.push((r, draw(&mut rng, &out_shape, Dom::Any)));
    let mut exec = Executor::<f64>::new(&g, 0).map_err(|e| e.to_string())?;
    let opts = RunOptions {
        training: true,
        step: 3,
    };
    let mut want = vec![loss];
    want.extend(&grads);
    let vals = exec
        .run(&g, &feeds, &want, opts)
        .map_err(|e| format!("run: {e}"))?;

    let loss_at = |exec: &mut Executor<f64>, feeds: &[(NodeId, Buf<f64>)]| -> f64 {
        match exec
            .run(&g, feeds, &[loss], opts)
            .expect("loss evaluates")
            .remove(0)
        {
            Buf::F(v) => v[0],
            Buf::I(_) => panic!("loss is f64"),
        }
    };
    for (k, &(i, _)) in diff.iter().enumerate() {
        let Buf::F(analytic) = &vals[k + 1] else {
            return Err("gradient is not float".into());
        };
        let n = analytic.len();
        for e in 0..n {
            let mut plus = feeds.clone();
            let mut minus = feeds.clone();
            if let (Buf::F(p), Buf::F(m)) = (&mut plus[i].1, &mut minus[i].1) {
                p[e] += EPS;
                m[e] -= EPS;
            }
            let numeric = (loss_at(&mut exec, &plus) - loss_at(&mut exec, &minus)) / (2.0 * EPS);
            let a = analytic[e];
            if (a - numeric).abs() > ATOL + RTOL * numeric.abs() {
                return Err(format!(
                    "input x{i} element {e}: analytic {a} vs numeric {numeric}"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_case_matches_central_differences() {
    let mut failures = Vec::new();
    for (k, c) in cases().iter().enumerate() {
        if let Err(e) = check(c, 1000 + k as u64) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "gradient check failures:\n{}",
        failures.join("\n")
    );
}

/// Walks the op table: every differentiable op appears in some case's forward graph (and so is
/// gradient-checked), and every op has a backward rule or is declared non-differentiable.
#[test]
fn every_op_is_covered() {
    let mut seen = HashSet::new();
    for c in cases() {
        let mut g = Graph::new();
        let xs: Vec<NodeId> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (s, d))| {
                let dt = if matches!(d, Dom::Index(_)) {
                    DType::I32
                } else {
                    DType::F32
                };
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
    assert!(
        missing.is_empty(),
        "differentiable ops without a gradient-check case: {missing:?}"
    );
}
