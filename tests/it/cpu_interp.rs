//! The CPU reference interpreter against hand-computed values: every op's forward as a one-line
//! case (inputs, expected shape, expected elements), run in f64 and in f32; then the executor:
//! feeds, updates, determinism, f32/f64 agreement, and the errors a user can cause.
//!
//! Expected values were computed independently at 40 digits (mpmath) and rounded to f64.

// Each case lists its inputs as owned values, cloned from shared ones where cases share them.
#![allow(clippy::cloned_ref_to_slice_refs)]

use rumus::cpu::{dropout_keep, matmul, matmul_reference, Buf, Executor, Float, RunOptions};
use rumus::graph::init::init_values;
use rumus::graph::{BinaryOp, Graph, Init, NodeId, Op, ReduceOp, UnaryOp, Update};
use rumus::DType;

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

// ---- the harness: one op over fed inputs ----

#[derive(Clone)]
enum In {
    F(Vec<usize>, Vec<f64>),
    I(Vec<usize>, Vec<i32>),
}

fn f(shape: &[usize], v: &[f64]) -> In {
    In::F(shape.to_vec(), v.to_vec())
}

fn i(shape: &[usize], v: &[i32]) -> In {
    In::I(shape.to_vec(), v.to_vec())
}

const EVAL: RunOptions = RunOptions { training: false, step: 0 };

/// Build a graph of one `op` node over inputs fed with `ins` and run it in `T`.
fn eval_op<T: Float>(
    op: &Op,
    ins: &[In],
    target: &[usize],
    opts: RunOptions,
) -> rumus::Result<(Vec<usize>, Buf<T>)> {
    let mut g = Graph::new();
    let mut ids = Vec::new();
    let mut feeds = Vec::new();
    for (k, x) in ins.iter().enumerate() {
        let (id, buf) = match x {
            In::F(s, v) => (
                g.input(&format!("x{k}"), s, DType::F32)?,
                Buf::F(v.iter().map(|&e| T::from_f64(e)).collect()),
            ),
            In::I(s, v) => (g.input(&format!("x{k}"), s, DType::I32)?, Buf::I(v.clone())),
        };
        ids.push(id);
        feeds.push((id, buf));
    }
    let y = g.add_node(op.clone(), &ids, target)?;
    let mut exec = Executor::<T>::new(&g, 0)?;
    let out = exec.run(&g, &feeds, &[y], opts)?.remove(0);
    Ok((g.shape(y).to_vec(), out))
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= tol * want.abs().max(1.0)
}

/// `op` over `ins` has shape `want_shape` and elements `want`, in f64 (to 1e-14) and in f32
/// (to 5e-6).
fn check_with(
    opts: RunOptions,
    op: Op,
    ins: &[In],
    target: &[usize],
    want_shape: &[usize],
    want: &[f64],
) {
    let (shape, out) = eval_op::<f64>(&op, ins, target, opts).unwrap();
    assert_eq!(shape, want_shape, "{op:?}: shape");
    let got = out.as_f().unwrap_or_else(|| panic!("{op:?}: not f32"));
    assert_eq!(got.len(), want.len(), "{op:?}: length");
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close(g, w, 1e-14), "{op:?} f64 [{k}]: got {g}, want {w}\n{got:?}");
    }
    let (_, out) = eval_op::<f32>(&op, ins, target, opts).unwrap();
    let got = out.as_f().unwrap();
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close(g as f64, w, 5e-6), "{op:?} f32 [{k}]: got {g}, want {w}\n{got:?}");
    }
}

fn check(op: Op, ins: &[In], want_shape: &[usize], want: &[f64]) {
    check_with(EVAL, op, ins, &[], want_shape, want);
}

/// `op` yields an i32 value of `want_shape` holding `want`.
fn check_i(op: Op, ins: &[In], target: &[usize], want_shape: &[usize], want: &[i32]) {
    let (shape, out) = eval_op::<f64>(&op, ins, target, EVAL).unwrap();
    assert_eq!(shape, want_shape, "{op:?}: shape");
    assert_eq!(out, Buf::I(want.to_vec()), "{op:?}");
}

/// Running `op` over `ins` fails with exactly `msg`.
fn check_err(op: Op, ins: &[In], msg: &str) {
    let e = eval_op::<f64>(&op, ins, &[], EVAL).unwrap_err();
    assert_eq!(e.to_string(), msg);
    let e = eval_op::<f32>(&op, ins, &[], EVAL).unwrap_err();
    assert_eq!(e.to_string(), msg);
}

// ---- elementwise ----

#[test]
#[rustfmt::skip]
fn unary_ops() {
    use UnaryOp::*;
    let x = f(&[5], &[-1.5, -0.25, 0.0, 0.5, 2.0]);
    let pos = f(&[3], &[0.25, 1.0, 4.0]);
    let cases: &[(UnaryOp, &In, &[f64])] = &[
        (Neg, &x, &[1.5, 0.25, 0.0, -0.5, -2.0]),
        (Exp, &x, &[0.22313016014842982, 0.7788007830714049, 1.0, 1.6487212707001282, 7.38905609893065]),
        (Log, &pos, &[-1.3862943611198906, 0.0, 1.3862943611198906]),
        (Sqrt, &pos, &[0.5, 1.0, 2.0]),
        (Rsqrt, &pos, &[2.0, 1.0, 0.5]),
        (Abs, &x, &[1.5, 0.25, 0.0, 0.5, 2.0]),
        (Square, &x, &[2.25, 0.0625, 0.0, 0.25, 4.0]),
        (Tanh, &x, &[-0.9051482536448664, -0.24491866240370913, 0.0, 0.46211715726000974, 0.9640275800758169]),
        (Sigmoid, &x, &[0.18242552380635635, 0.4378234991142019, 0.5, 0.6224593312018546, 0.8807970779778824]),
        (Relu, &x, &[0.0, 0.0, 0.0, 0.5, 2.0]),
        (Gelu, &x, &[-0.1002108019032871, -0.10032341857926907, 0.0, 0.34573123063700656, 1.9544997361036416]),
        (GeluTanh, &x, &[-0.10042842301976708, -0.100324649298315, 0.0, 0.34571400982514394, 1.954597694087775]),
        (Silu, &x, &[-0.2736382857095345, -0.10945587477855047, 0.0, 0.3112296656009273, 1.7615941559557649]),
        (Softplus, &x, &[0.2014132779827524, 0.5759394198788436, std::f64::consts::LN_2, 0.9740769841801067, 2.1269280110429727]),
        (LogSigmoid, &x, &[-1.7014132779827524, -0.8259394198788436, -std::f64::consts::LN_2, -0.4740769841801067, -0.1269280110429725]),
        (Sign, &x, &[-1.0, -1.0, 0.0, 1.0, 1.0]),
        (GeluGrad, &x, &[-0.12746919222997952, 0.30462664511636395, 0.5, 0.8674951246561629, 1.085231801078197]),
        (GeluTanhGrad, &x, &[-0.12771079315143308, 0.30464590484893955, 0.5, 0.8673699035346423, 1.0860992566236183]),
        (SiluGrad, &x, &[-0.041294154299142946, 0.37628997842980233, 0.5, 0.7399611873026518, 1.0907842487848955]),
    ];
    let missing: Vec<&str> =
        UnaryOp::ALL.iter().filter(|u| !cases.iter().any(|c| c.0 == **u)).map(|u| u.name()).collect();
    assert!(missing.is_empty(), "unary ops without a forward case: {missing:?}");
    for (op, input, want) in cases {
        check(Op::Unary(*op), &[(*input).clone()], &[want.len()], want);
    }
}

#[test]
fn unary_edge_values() {
    let x = f(&[4], &[INF, -INF, NAN, -0.0]);
    check(Op::Unary(UnaryOp::Relu), &[x.clone()], &[4], &[INF, 0.0, NAN, -0.0]);
    check(Op::Unary(UnaryOp::Sigmoid), &[x.clone()], &[4], &[1.0, 0.0, NAN, 0.5]);
    check(Op::Unary(UnaryOp::Sign), &[x.clone()], &[4], &[1.0, -1.0, NAN, 0.0]);
    check(Op::Unary(UnaryOp::Softplus), &[x], &[4], &[INF, 0.0, NAN, std::f64::consts::LN_2]);
    // log(1 + e^1000) overflows when computed as written
    check(Op::Unary(UnaryOp::Softplus), &[f(&[2], &[1000.0, -1000.0])], &[2], &[1000.0, 0.0]);
    check(
        Op::Unary(UnaryOp::LogSigmoid),
        &[f(&[4], &[INF, -INF, NAN, 1000.0])],
        &[4],
        &[0.0, -INF, NAN, 0.0],
    );
    check(Op::Unary(UnaryOp::LogSigmoid), &[f(&[1], &[-1000.0])], &[1], &[-1000.0]);
    check(Op::Unary(UnaryOp::Log), &[f(&[2], &[0.0, -1.0])], &[2], &[-INF, NAN]);
}

#[test]
fn binary_ops_broadcast_a_column_against_a_row() {
    use BinaryOp::*;
    let (a, b) = (f(&[2, 1], &[4.0, 2.0]), f(&[3], &[0.5, 2.0, 4.0]));
    let cases: &[(BinaryOp, &[f64])] = &[
        (Add, &[4.5, 6.0, 8.0, 2.5, 4.0, 6.0]),
        (Sub, &[3.5, 2.0, 0.0, 1.5, 0.0, -2.0]),
        (Mul, &[2.0, 8.0, 16.0, 1.0, 4.0, 8.0]),
        (Div, &[8.0, 2.0, 1.0, 4.0, 1.0, 0.5]),
        (Pow, &[2.0, 16.0, 256.0, std::f64::consts::SQRT_2, 4.0, 16.0]),
        (Maximum, &[4.0, 4.0, 4.0, 2.0, 2.0, 4.0]),
        (Minimum, &[0.5, 2.0, 4.0, 0.5, 2.0, 2.0]),
        (Greater, &[1.0, 1.0, 0.0, 1.0, 0.0, 0.0]),
        (Equal, &[0.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
    ];
    let missing: Vec<&str> = BinaryOp::ALL
        .iter()
        .filter(|b| !cases.iter().any(|c| c.0 == **b))
        .map(|b| b.name())
        .collect();
    assert!(missing.is_empty(), "binary ops without a forward case: {missing:?}");
    for (op, want) in cases {
        check(Op::Binary(*op), &[a.clone(), b.clone()], &[2, 3], want);
    }
}

#[test]
fn binary_broadcasting_cases() {
    let add = Op::Binary(BinaryOp::Add);
    // Size-1 axes on both sides: [2, 1, 3] + [1, 2, 1] -> [2, 2, 3].
    check(
        add.clone(),
        &[f(&[2, 1, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), f(&[1, 2, 1], &[10.0, 20.0])],
        &[2, 2, 3],
        &[10.0, 11.0, 12.0, 20.0, 21.0, 22.0, 13.0, 14.0, 15.0, 23.0, 24.0, 25.0],
    );
    // A scalar on the left, a missing leading axis on the right.
    check(add.clone(), &[f(&[], &[1.0]), f(&[2], &[1.0, 2.0])], &[2], &[2.0, 3.0]);
    check(
        Op::Binary(BinaryOp::Sub),
        &[f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), f(&[2], &[1.0, 2.0])],
        &[2, 2],
        &[0.0, 0.0, 2.0, 2.0],
    );
    // Empty tensors broadcast to empty results.
    check(add, &[f(&[0, 3], &[]), f(&[1, 3], &[1.0, 2.0, 3.0])], &[0, 3], &[]);
    // NaN propagates through maximum/minimum.
    check(
        Op::Binary(BinaryOp::Maximum),
        &[f(&[2], &[NAN, 1.0]), f(&[2], &[0.0, NAN])],
        &[2],
        &[NAN, NAN],
    );
}

#[test]
fn where_takes_any_condition_dtype() {
    check(
        Op::Where,
        &[i(&[2, 1], &[1, 0]), f(&[3], &[1.0, 2.0, 3.0]), f(&[], &[-1.0])],
        &[2, 3],
        &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0],
    );
    check(
        Op::Where,
        &[
            f(&[3], &[0.0, -0.5, NAN]),
            f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            f(&[2, 1], &[7.0, 8.0]),
        ],
        &[2, 3],
        &[7.0, 2.0, 3.0, 8.0, 5.0, 6.0],
    );
}

#[test]
fn constant_fills_its_shape() {
    check_with(EVAL, Op::Constant { value: 1.5 }, &[], &[2, 2], &[2, 2], &[1.5; 4]);
    check_with(EVAL, Op::Constant { value: -2.0 }, &[], &[], &[], &[-2.0]);
}

// ---- reductions ----

#[test]
fn reductions() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = |op, axes: &[usize], keepdim| Op::Reduce { op, axes: axes.to_vec(), keepdim };
    check(r(ReduceOp::Sum, &[1], false), &[x.clone()], &[2], &[6.0, 15.0]);
    check(r(ReduceOp::Sum, &[0], true), &[x.clone()], &[1, 3], &[5.0, 7.0, 9.0]);
    check(r(ReduceOp::Sum, &[0, 1], false), &[x.clone()], &[], &[21.0]);
    check(r(ReduceOp::Mean, &[1], false), &[x.clone()], &[2], &[2.0, 5.0]);
    check(r(ReduceOp::Mean, &[0, 1], true), &[x.clone()], &[1, 1], &[3.5]);
    check(r(ReduceOp::Max, &[0], false), &[x.clone()], &[3], &[4.0, 5.0, 6.0]);
    check(r(ReduceOp::Max, &[1], true), &[x], &[2, 1], &[3.0, 6.0]);
    let cube = f(&[2, 2, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    check(r(ReduceOp::Sum, &[0, 2], true), &[cube.clone()], &[1, 2, 1], &[10.0, 18.0]);
    check(r(ReduceOp::Max, &[0, 1], false), &[cube], &[2], &[6.0, 7.0]);
    check(
        r(ReduceOp::Max, &[0], false),
        &[f(&[2, 2], &[-INF, NAN, -INF, 1.0])],
        &[2],
        &[-INF, NAN],
    );
    check(r(ReduceOp::Sum, &[1], false), &[f(&[2, 0], &[])], &[2], &[0.0, 0.0]);
}

#[test]
fn sum_runs_in_index_order() {
    // 1e16 + 1 + 1 + ... in order: each +1 is lost in f64, so the order is visible.
    let mut v = vec![1e16];
    v.extend([1.0; 4]);
    let op = Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false };
    let (_, out) = eval_op::<f64>(&op, &[f(&[5], &v)], &[], EVAL).unwrap();
    assert_eq!(out, Buf::F(vec![1e16]));
}

// ---- shape ops (both dtypes) ----

#[test]
fn shape_ops_on_floats() {
    let x = f(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    check_with(EVAL, Op::Reshape, &[x.clone()], &[3, 2], &[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    check(Op::Permute { perm: vec![1, 0] }, &[x.clone()], &[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let x3: Vec<f64> = (0..12).map(|v| v as f64).collect();
    check(
        Op::Permute { perm: vec![2, 0, 1] },
        &[f(&[2, 3, 2], &x3)],
        &[2, 2, 3],
        &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 1.0, 3.0, 5.0, 7.0, 9.0, 11.0],
    );
    check_with(
        EVAL,
        Op::BroadcastTo,
        &[f(&[3], &[1.0, 2.0, 3.0])],
        &[2, 3],
        &[2, 3],
        &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
    );
    check(Op::Slice { axis: 1, start: 1, end: 3 }, &[x.clone()], &[2, 2], &[1.0, 2.0, 4.0, 5.0]);
    check(Op::Slice { axis: 0, start: 1, end: 2 }, &[x.clone()], &[1, 3], &[3.0, 4.0, 5.0]);
    check(Op::Slice { axis: 1, start: 2, end: 2 }, &[x.clone()], &[2, 0], &[]);
    check(
        Op::Concat { axis: 1 },
        &[f(&[2, 1], &[-1.0, -2.0]), x.clone(), f(&[2, 1], &[9.0, 8.0])],
        &[2, 5],
        &[-1.0, 0.0, 1.0, 2.0, 9.0, -2.0, 3.0, 4.0, 5.0, 8.0],
    );
    check(
        Op::Concat { axis: 0 },
        &[x, f(&[1, 3], &[6.0, 7.0, 8.0])],
        &[3, 3],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    );
}

#[test]
fn shape_ops_keep_i32() {
    let x = i(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    check_i(Op::Reshape, &[x.clone()], &[6], &[6], &[0, 1, 2, 3, 4, 5]);
    check_i(Op::Permute { perm: vec![1, 0] }, &[x.clone()], &[], &[3, 2], &[0, 3, 1, 4, 2, 5]);
    check_i(
        Op::BroadcastTo,
        &[i(&[3, 1], &[1, 2, 3])],
        &[2, 3, 2],
        &[2, 3, 2],
        &[1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3],
    );
    check_i(Op::Slice { axis: 1, start: 0, end: 1 }, &[x.clone()], &[], &[2, 1], &[0, 3]);
    check_i(
        Op::Concat { axis: 0 },
        &[x, i(&[1, 3], &[7, 8, 9])],
        &[],
        &[3, 3],
        &[0, 1, 2, 3, 4, 5, 7, 8, 9],
    );
}

// ---- matmul ----

#[test]
fn matmul_small_cases() {
    check(
        Op::MatMul,
        &[
            f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            f(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]),
        ],
        &[2, 2],
        &[58.0, 64.0, 139.0, 154.0],
    );
    // Batched A against one B.
    check(
        Op::MatMul,
        &[f(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]), f(&[2, 1], &[5.0, 6.0])],
        &[2, 1, 1],
        &[17.0, 39.0],
    );
    // A's batch of 1 broadcast against B's batch of 3.
    check(
        Op::MatMul,
        &[f(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]), f(&[3, 2, 1], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])],
        &[3, 2, 1],
        &[1.0, 3.0, 2.0, 4.0, 3.0, 7.0],
    );
    // K = 0 gives zeros.
    check(Op::MatMul, &[f(&[2, 0], &[]), f(&[0, 2], &[])], &[2, 2], &[0.0; 4]);
}

/// The naive triple loop, per batch, with explicit batch operand offsets.
fn naive<T: Float>(
    a: &[T],
    b: &[T],
    pairs: &[(usize, usize)],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<T> {
    let mut c = Vec::new();
    for &(ab, bb) in pairs {
        for r in 0..m {
            for j in 0..n {
                let mut s = T::zero();
                for p in 0..k {
                    s += a[ab * m * k + r * k + p] * b[bb * k * n + p * n + j];
                }
                c.push(s);
            }
        }
    }
    c
}

fn data<T: Float>(n: usize, salt: usize) -> Vec<T> {
    (0..n).map(|i| T::from_f64(((i * 37 + salt * 11) % 101) as f64 / 17.0 - 2.9)).collect()
}

/// (a shape, b shape, (a batch, b batch) of each output batch)
type MatmulCase = (&'static [usize], &'static [usize], &'static [(usize, usize)]);

fn matmul_matches_naive<T: Float>() {
    // (a shape, b shape, (a batch, b batch) per output batch)
    let cases: &[MatmulCase] = &[
        (&[1, 1], &[1, 1], &[(0, 0)]),
        (&[7, 13], &[13, 5], &[(0, 0)]),
        (
            &[2, 1, 3, 4],
            &[5, 4, 2],
            &[(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)],
        ),
        (&[3, 9, 300], &[300, 21], &[(0, 0), (1, 0), (2, 0)]),
        (&[150, 70], &[70, 130], &[(0, 0)]),
    ];
    for (sa, sb, pairs) in cases {
        let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
        let a = data::<T>(sa.iter().product(), 1);
        let b = data::<T>(sb.iter().product(), 2);
        let want = naive(&a, &b, pairs, m, k, n);
        // The reference sums each element in the loop's order: bit-identical.
        assert!(matmul_reference(&a, sa, &b, sb) == want, "{} {sa:?} @ {sb:?}", T::NAME);
        // gemm sums in blocks with fused multiply-adds: equal up to rounding (|values| < 6,
        // k <= 300, so each sum's rounding error is far below 1e-3 in f32).
        let got = matmul(&a, sa, &b, sb);
        let tol = if T::NAME == "f32" { 1e-3 } else { 1e-11 };
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.to_f64() - w.to_f64()).abs() <= tol,
                "{} {sa:?} @ {sb:?}: {g} vs {w}",
                T::NAME
            );
        }
    }
}

#[test]
fn matmul_matches_naive_loop_f32() {
    matmul_matches_naive::<f32>();
}

#[test]
fn matmul_matches_naive_loop_f64() {
    matmul_matches_naive::<f64>();
}

// ---- normalization and attention ----

#[test]
#[rustfmt::skip]
fn softmax_and_log_softmax_rows() {
    let x = f(&[3, 3], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, -INF, 0.0]);
    let third = 1.0 / 3.0;
    let ln2 = std::f64::consts::LN_2;
    check(Op::Softmax, &[x.clone()], &[3, 3], &[
        0.09003057317038046, 0.24472847105479764, 0.6652409557748219,
        third, third, third,
        0.5, 0.0, 0.5,
    ]);
    check(Op::LogSoftmax, &[x], &[3, 3], &[
        -2.40760596444438, -1.4076059644443804, -0.4076059644443803,
        -1.0986122886681098, -1.0986122886681098, -1.0986122886681098,
        -ln2, -INF, -ln2,
    ]);
    // Large logits do not overflow.
    check(Op::Softmax, &[f(&[2], &[1000.0, 1000.0])], &[2], &[0.5, 0.5]);
}

/// `attention(q, k, v)` equals the unfused `softmax(causal_mask(q kᵀ / sqrt(Dh))) v`, in f64,
/// at sequence lengths 1, 5 and 33 with several heads.
#[test]
fn attention_equals_the_materialized_softmax() {
    for shape in [[1, 2, 1, 3], [2, 3, 5, 4], [1, 1, 33, 8]] {
        let mut g = Graph::new();
        let (q, k, v) = (
            g.input("q", &shape, DType::F32).unwrap(),
            g.input("k", &shape, DType::F32).unwrap(),
            g.input("v", &shape, DType::F32).unwrap(),
        );
        let fused = g.attention(q, k, v).unwrap();
        let kt = g.transpose(k, 2, 3).unwrap();
        let s = g.matmul(q, kt).unwrap();
        let s = g.scale(s, 1.0 / (shape[3] as f32).sqrt()).unwrap();
        let s = g.causal_mask(s).unwrap();
        let p = g.softmax(s).unwrap();
        let plain = g.matmul(p, v).unwrap();
        let n: usize = shape.iter().product();
        let mut rng = rumus::rng::Rng::new(3);
        let feeds: Vec<(NodeId, Buf<f64>)> = [q, k, v]
            .iter()
            .map(|&x| (x, Buf::F((0..n).map(|_| rng.normal()).collect())))
            .collect();
        let mut exec = Executor::<f64>::new(&g, 0).unwrap();
        let out = exec.run(&g, &feeds, &[fused, plain], RunOptions::default()).unwrap();
        let (Buf::F(a), Buf::F(b)) = (&out[0], &out[1]) else { panic!("float outputs") };
        for (x, y) in a.iter().zip(b) {
            // 1/sqrt(Dh) is rounded to f32 in the unfused graph's constant.
            assert!((x - y).abs() < 1e-6, "{shape:?}: {x} vs {y}");
        }
    }
}

#[test]
fn causal_mask_hides_the_future() {
    // T = 2 queries over S = 3 keys: query i sees keys j <= i + 1.
    check(
        Op::CausalMask { fill: f32::NEG_INFINITY },
        &[f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
        &[2, 3],
        &[1.0, 2.0, -INF, 4.0, 5.0, 6.0],
    );
    // A batch of square score matrices, filled with 0 (the gradient's form).
    check(
        Op::CausalMask { fill: 0.0 },
        &[f(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])],
        &[2, 2, 2],
        &[1.0, 0.0, 3.0, 4.0, 5.0, 0.0, 7.0, 8.0],
    );
}

#[test]
#[rustfmt::skip]
fn layer_norm_family() {
    let x = f(&[2, 4], &[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 0.0, 5.0]);
    let stats = [2.5, 0.8944236133127084, 1.0, 0.42640104507409315];
    check(Op::LayerNormStats { eps: 1e-5 }, &[x.clone()], &[2, 2], &stats);
    let s = f(&[2, 2], &stats);
    let w = f(&[4], &[1.0, 2.0, -1.0, 0.5]);
    let b = f(&[4], &[0.0, 0.1, 0.2, 0.3]);
    let dy = f(&[2, 4], &[0.1, -0.2, 0.3, 0.4, 1.0, 0.0, -1.0, 0.5]);
    check(Op::LayerNorm, &[x.clone(), s.clone(), w.clone(), b], &[2, 4], &[
        -1.3416354199690625, -0.7944236133127084, -0.24721180665635417, 0.9708177099845313,
        -0.8528020901481863, -0.7528020901481863, 0.6264010450740931, 1.1528020901481864,
    ]);
    check(Op::LayerNormGradInput, &[x.clone(), s.clone(), w, dy.clone()], &[2, 4], &[
        0.23254971014141518, -0.250438754834188, -0.19677305182216617, 0.214662096514939,
        0.10902313543793486, -0.2786142487451678, 0.1477867963289253, 0.02180431697830768,
    ]);
    // Row 0: dweight = sum over rows of dy * xhat; row 1: dbias = sum over rows of dy.
    check(Op::LayerNormGradWeight, &[x, s, dy], &[2, 4], &[
        -0.9869656321450926, 0.08944236133127084, 0.5605645870709994, 1.3894562581358114,
        1.1, -0.2, -0.7, 0.9,
    ]);
}

// ---- embedding and losses ----

#[test]
fn embedding_gathers_and_its_gradient_sums_repeats() {
    check(
        Op::Embedding,
        &[f(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]), i(&[2, 2], &[2, 0, 2, 1])],
        &[2, 2, 2],
        &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0],
    );
    check(
        Op::EmbeddingGrad { vocab: 3 },
        &[i(&[3], &[2, 0, 2]), f(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
        &[3, 2],
        &[3.0, 4.0, 0.0, 0.0, 6.0, 8.0],
    );
}

#[test]
#[rustfmt::skip]
fn cross_entropy_and_its_gradient() {
    let logits = f(&[3, 3], &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.0]);
    let ce = |ignore_index| Op::CrossEntropy { ignore_index };
    check(ce(None), &[logits.clone(), i(&[3], &[2, 0, 1])], &[], &[1.3046080725189568]);
    check(ce(Some(-100)), &[logits.clone(), i(&[3], &[2, 0, -100])], &[], &[0.753109126556245]);
    // Every label ignored: a mean of nothing, NaN (as PyTorch's), and a gradient of 0 below.
    check(ce(Some(-100)), &[logits.clone(), i(&[3], &[-100; 3])], &[], &[f64::NAN]);
    // dloss = 3 over 2 counted rows: (softmax - onehot) * 1.5, the ignored row zero.
    let grad = |ignore_index| Op::CrossEntropyGrad { ignore_index };
    check(grad(Some(-100)), &[logits.clone(), i(&[3], &[2, 0, -100]), f(&[], &[3.0])], &[3, 3], &[
        0.13504585975557068, 0.3670927065821965, -0.5021385663377672,
        -1.0, 0.5, 0.5,
        0.0, 0.0, 0.0,
    ]);
    check(grad(Some(0)), &[logits, i(&[3], &[0; 3]), f(&[], &[1.0])], &[3, 3], &[0.0; 9]);
}

// ---- dropout ----

#[test]
#[rustfmt::skip]
fn dropout_mask_is_the_documented_hash() {
    // Masks from an independent implementation of rng::dropout_keep: key = hash32(lo ^
    // hash32(hi)) of the 64-bit seed, h = hash32(i ^ hash32(step ^ key)), kept iff
    // (h >> 8) / 2^24 >= p (hash32 = lowbias32).
    let (o, x) = (true, false);
    let cases: &[(u64, u64, f32, [bool; 10])] = &[
        (7, 3, 0.5, [o, x, o, o, o, x, o, x, o, x]),
        (7, 4, 0.5, [o, x, o, o, o, x, x, x, x, o]),
        (1, 0, 0.25, [x, o, o, o, x, o, o, x, o, o]),
        ((1 << 40) | 5, 2, 0.5, [x, x, o, x, o, o, x, x, o, x]),
    ];
    for &(seed, step, p, want) in cases {
        let got: Vec<bool> = (0..10).map(|i| dropout_keep(seed, step, i, p)).collect();
        assert_eq!(got, want, "seed {seed} step {step} p {p}");
    }
    assert!((0..100).all(|i| dropout_keep(3, 9, i, 0.0)));
}

#[test]
#[rustfmt::skip]
fn dropout_scales_kept_elements_and_is_identity_in_eval() {
    let x = f(&[10], &[1.0; 10]);
    let op = Op::Dropout { p: 0.5, seed: 7 };
    check(op.clone(), &[x.clone()], &[10], &[1.0; 10]);
    // The masks of dropout_mask_is_the_documented_hash, scaled by 1 / (1 - p).
    let train = RunOptions { training: true, step: 3 };
    let want = [2.0, 0.0, 2.0, 2.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0];
    check_with(train, op, &[x.clone()], &[], &[10], &want);
    let train = RunOptions { training: true, step: 0 };
    let k = 4.0 / 3.0;
    let want = [0.0, k, k, k, 0.0, k, k, 0.0, k, k];
    check_with(train, Op::Dropout { p: 0.25, seed: 1 }, &[x], &[], &[10], &want);
}

// ---- runtime errors ----

#[test]
fn out_of_range_indices_and_labels_are_errors() {
    let table = f(&[3, 2], &[0.0; 6]);
    check_err(
        Op::Embedding,
        &[table.clone(), i(&[2], &[0, 3])],
        "embedding: index 3 is out of range for 3 rows",
    );
    check_err(
        Op::Embedding,
        &[table, i(&[1], &[-1])],
        "embedding: index -1 is out of range for 3 rows",
    );
    check_err(
        Op::EmbeddingGrad { vocab: 2 },
        &[i(&[1], &[5]), f(&[1, 2], &[1.0, 1.0])],
        "embedding_grad: index 5 is out of range for 2 rows",
    );
    let logits = f(&[2, 3], &[0.0; 6]);
    check_err(
        Op::CrossEntropy { ignore_index: Some(-100) },
        &[logits.clone(), i(&[2], &[1, 3])],
        "cross_entropy: label 3 is out of range for 3 classes",
    );
    check_err(
        Op::CrossEntropyGrad { ignore_index: None },
        &[logits, i(&[2], &[-100, 0]), f(&[], &[1.0])],
        "cross_entropy_grad: label -100 is out of range for 3 classes",
    );
}

// ---- the executor ----

#[test]
fn feeds_are_checked_and_errors_name_the_input() {
    let mut g = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let idx = g.input("idx", &[2], DType::I32).unwrap();
    let unused = g.input("unused", &[1], DType::F32).unwrap();
    let y = g.relu(x).unwrap();
    let mut exec = Executor::<f32>::new(&g, 0).unwrap();
    let run = |exec: &mut Executor<f32>, feeds: &[(NodeId, Buf<f32>)]| {
        exec.run(&g, feeds, &[y], EVAL).map_err(|e| e.to_string())
    };
    assert_eq!(run(&mut exec, &[]).unwrap_err(), "missing feed for input `x` (f32[2, 3])");
    assert_eq!(
        run(&mut exec, &[(x, Buf::F(vec![0.0; 5]))]).unwrap_err(),
        "input `x` is f32[2, 3] (6 elements), got 5 elements"
    );
    assert_eq!(
        run(&mut exec, &[(x, Buf::I(vec![0; 6]))]).unwrap_err(),
        "input `x` is f32[2, 3], got i32 data"
    );
    assert_eq!(
        run(&mut exec, &[(x, Buf::F(vec![0.0; 6])), (idx, Buf::I(vec![1]))]).unwrap_err(),
        "input `idx` is i32[2] (2 elements), got 1 elements"
    );
    assert_eq!(
        run(&mut exec, &[(x, Buf::F(vec![0.0; 6])), (x, Buf::F(vec![0.0; 6]))]).unwrap_err(),
        "input `x` is fed twice"
    );
    assert_eq!(
        run(&mut exec, &[(y, Buf::F(vec![0.0; 6]))]).unwrap_err(),
        "feed for node 3 (relu), which is not an input"
    );
    // Inputs that nothing wanted depends on need no feed.
    let out = run(&mut exec, &[(x, Buf::F(vec![-1.0, 2.0, -3.0, 4.0, 0.0, 1.0]))]).unwrap();
    assert_eq!(out, vec![Buf::F(vec![0.0, 2.0, 0.0, 4.0, 0.0, 1.0])]);
    let _ = unused;
}

#[test]
fn only_needed_nodes_are_evaluated() {
    let mut g = Graph::new();
    let x = g.input("x", &[2], DType::F32).unwrap();
    let table = g.parameter("emb", &[2, 1], Init::Zeros).unwrap();
    let idx = g.input("idx", &[1], DType::I32).unwrap();
    let bad = g.embedding(table, idx).unwrap();
    let y = g.neg(x).unwrap();
    let mut exec = Executor::<f32>::new(&g, 0).unwrap();
    let feeds = [(x, Buf::F(vec![1.0, -2.0])), (idx, Buf::I(vec![9]))];
    let out = exec.run(&g, &feeds, &[y], EVAL).unwrap();
    assert_eq!(out, vec![Buf::F(vec![-1.0, 2.0])]);
    assert!(exec.run(&g, &feeds, &[y, bad], EVAL).is_err());
}

#[test]
fn runtime_error_carries_the_node_span() {
    let mut g = Graph::new();
    let table = g.parameter("emb", &[4, 2], Init::Zeros).unwrap();
    let idx = g.input("idx", &[1], DType::I32).unwrap();
    g.set_span(rumus::Span::new(10, 19));
    let e = g.embedding(table, idx).unwrap();
    let mut exec = Executor::<f64>::new(&g, 0).unwrap();
    let err = exec.run(&g, &[(idx, Buf::I(vec![4]))], &[e], EVAL).unwrap_err();
    assert_eq!(err.message, "embedding: index 4 is out of range for 4 rows");
    assert_eq!(err.span, Some(rumus::Span::new(10, 19)));
}

#[test]
fn parameters_start_from_init_values_and_can_be_set() {
    let mut g = Graph::new();
    let w = g.parameter("fc.weight", &[3, 2], Init::Xavier).unwrap();
    let s = g.state("opt.t", &[], Init::Fill(0.5)).unwrap();
    let exec = Executor::<f64>::new(&g, 42).unwrap();
    let want: Vec<f64> =
        init_values(&Init::Xavier, &[3, 2], 42, "fc.weight").iter().map(|&v| v as f64).collect();
    assert_eq!(exec.persistent(w), Some(&want[..]));
    assert_eq!(exec.persistent(s), Some(&[0.5][..]));
    let mut exec = exec;
    exec.set_persistent(&g, w, vec![1.0; 6]).unwrap();
    assert_eq!(exec.persistent(w), Some(&[1.0; 6][..]));
    let e = exec.set_persistent(&g, w, vec![1.0; 5]).unwrap_err();
    assert_eq!(e.to_string(), "`fc.weight` is f32[3, 2] (6 elements), got 5 elements");
    let x = g.input("x", &[1], DType::F32).unwrap();
    let e = exec.set_persistent(&g, x, vec![1.0]).unwrap_err();
    assert_eq!(e.to_string(), "set_persistent: node 2 (input) is not a parameter or state");
}

#[test]
fn updates_read_pre_step_values() {
    let mut g = Graph::new();
    let a = g.parameter("a", &[2], Init::Fill(1.0)).unwrap();
    let b = g.state("b", &[2], Init::Fill(10.0)).unwrap();
    let a2 = g.scale(a, 2.0).unwrap();
    // a <- 2a, b <- a (the old a), and a reader of both wanted in the same step.
    g.updates.push(Update::new(a, a2));
    g.updates.push(Update::new(b, a));
    let sum = g.add(a, b).unwrap();
    let mut exec = Executor::<f32>::new(&g, 0).unwrap();
    let out = exec.run(&g, &[], &[sum, a], EVAL).unwrap();
    assert_eq!(out, vec![Buf::F(vec![11.0, 11.0]), Buf::F(vec![1.0, 1.0])]);
    assert_eq!(exec.persistent(a), Some(&[2.0, 2.0][..]));
    assert_eq!(exec.persistent(b), Some(&[1.0, 1.0][..]));
    exec.run(&g, &[], &[], EVAL).unwrap();
    assert_eq!(exec.persistent(a), Some(&[4.0, 4.0][..]));
    assert_eq!(exec.persistent(b), Some(&[2.0, 2.0][..]));
}

#[test]
fn state_added_after_the_executor_is_initialized_on_first_use() {
    let mut g = Graph::new();
    let a = g.parameter("a", &[1], Init::Ones).unwrap();
    let mut exec = Executor::<f64>::new(&g, 0).unwrap();
    let m = g.state("m", &[1], Init::Fill(3.0)).unwrap();
    let y = g.add(a, m).unwrap();
    assert_eq!(exec.run(&g, &[], &[y], EVAL).unwrap(), vec![Buf::F(vec![4.0])]);
}

type Feeds<T> = Vec<(NodeId, Buf<T>)>;

/// A small training-shaped graph: embedding, matmul, gelu, layer norm, dropout, attention-style
/// masked softmax, cross-entropy. Returns (graph, feeds, wanted).
fn mlp<T: Float>() -> (Graph, Feeds<T>, Vec<NodeId>) {
    let (b, d, h, c) = (6, 8, 16, 5);
    let mut g = Graph::new();
    let tok = g.input("tok", &[b], DType::I32).unwrap();
    let labels = g.input("labels", &[b], DType::I32).unwrap();
    let emb = g.parameter("emb", &[10, d], Init::Normal { mean: 0.0, std: 1.0 }).unwrap();
    let w1 = g.parameter("w1", &[d, h], Init::Xavier).unwrap();
    let b1 = g.parameter("b1", &[h], Init::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let lw = g.parameter("ln.w", &[h], Init::Ones).unwrap();
    let lb = g.parameter("ln.b", &[h], Init::Zeros).unwrap();
    let w2 = g.parameter("w2", &[h, c], Init::Kaiming).unwrap();
    let x = g.embedding(emb, tok).unwrap();
    let z = g.matmul(x, w1).unwrap();
    let z = g.add(z, b1).unwrap();
    let z = g.unary(UnaryOp::Gelu, z).unwrap();
    let z = g.layer_norm(z, lw, lb, 1e-5).unwrap();
    let z = g.dropout(z, 0.2, 99).unwrap();
    let zt = g.transpose(z, 0, 1).unwrap();
    let scores = g.matmul(z, zt).unwrap();
    let scores = g.causal_mask(scores).unwrap();
    let attn = g.softmax(scores).unwrap();
    let z = g.matmul(attn, z).unwrap();
    let logits = g.matmul(z, w2).unwrap();
    let loss = g.cross_entropy(logits, labels, Some(-1)).unwrap();
    let feeds =
        vec![(tok, Buf::I(vec![1, 4, 4, 9, 0, 2])), (labels, Buf::I(vec![0, 4, -1, 2, 3, 1]))];
    (g, feeds, vec![loss, logits])
}

fn floats<T: Float>(bufs: &[Buf<T>]) -> Vec<f64> {
    bufs.iter().flat_map(|b| b.as_f().unwrap().iter().map(|v| v.to_f64())).collect()
}

#[test]
fn runs_are_deterministic() {
    let opts = RunOptions { training: true, step: 5 };
    let (g, feeds, want) = mlp::<f32>();
    let first = Executor::<f32>::new(&g, 7).unwrap().run(&g, &feeds, &want, opts).unwrap();
    let second = Executor::<f32>::new(&g, 7).unwrap().run(&g, &feeds, &want, opts).unwrap();
    let bits = |b: &[Buf<f32>]| floats(b).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&first), bits(&second));
    // A different step draws a different dropout mask.
    let other = Executor::<f32>::new(&g, 7)
        .unwrap()
        .run(&g, &feeds, &want, RunOptions { training: true, step: 6 })
        .unwrap();
    assert_ne!(bits(&first), bits(&other));
}

#[test]
fn f32_agrees_with_f64() {
    for training in [false, true] {
        let opts = RunOptions { training, step: 1 };
        let (g, feeds32, want) = mlp::<f32>();
        let (_, feeds64, _) = mlp::<f64>();
        let a =
            floats(&Executor::<f32>::new(&g, 3).unwrap().run(&g, &feeds32, &want, opts).unwrap());
        let b =
            floats(&Executor::<f64>::new(&g, 3).unwrap().run(&g, &feeds64, &want, opts).unwrap());
        assert_eq!(a.len(), 1 + 6 * 5);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "f32 {x} vs f64 {y}");
        }
    }
}

/// Long sums in f32 are added in f64 and rounded once: 2^24 + 4 ones sum to 16,777,220 (added
/// in f32 they stopped at 2^24), and a softmax over a million equal logits gives each class
/// 1e-6 and cross-entropy ln(1e6) (added in f32 the row's total came to 1.004).
#[test]
fn long_sums_in_f32_lose_nothing_to_the_order() {
    let n = (1 << 24) + 4;
    let sum = Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false };
    let floats = |b: Buf<f32>| match b {
        Buf::F(v) => v,
        Buf::I(_) => panic!("an f32 op gave i32"),
    };
    let (_, out) = eval_op::<f32>(&sum, &[f(&[n], &vec![1.0; n])], &[], EVAL).unwrap();
    assert_eq!(floats(out), [16_777_220.0]);
    let c = 1_000_000;
    let (_, p) = eval_op::<f32>(&Op::Softmax, &[f(&[1, c], &vec![0.0; c])], &[], EVAL).unwrap();
    let p = floats(p);
    assert!(p.iter().all(|&v| (v - 1e-6).abs() < 1e-12), "{}", p[0]);
    let ce = Op::CrossEntropy { ignore_index: None };
    let ins = [f(&[1, c], &vec![0.0; c]), i(&[1], &[7])];
    let (_, loss) = eval_op::<f32>(&ce, &ins, &[], EVAL).unwrap();
    let want = (c as f64).ln();
    let got = f64::from(floats(loss)[0]);
    assert!((got - want).abs() < 1e-5 * want, "{got} against {want}");
}
