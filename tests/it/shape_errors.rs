//! Every op rejects bad shapes and dtypes through the public builder with an `Error` that names
//! the op and the shapes; no input built through the public API panics. Tests are data: each
//! case builds a graph from `x: f32[2, 3]`, `y: f32[4]`, `i: i32[2]` and expects one message.

use rumus::graph::{BinaryOp, Graph, Init, NodeId, Op, ReduceOp, UnaryOp};
use rumus::{DType, Result};

type Build = fn(&mut Graph, [NodeId; 3]) -> Result<NodeId>;

fn check(build: Build, expected: &str) {
    let mut g = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let y = g.input("y", &[4], DType::F32).unwrap();
    let i = g.input("i", &[2], DType::I32).unwrap();
    match build(&mut g, [x, y, i]) {
        Ok(_) => panic!("expected the error `{expected}`, but the node was built"),
        Err(e) => assert_eq!(e.to_string(), expected),
    }
}

#[test]
fn a_rejected_layer_norm_leaves_no_stats_node_behind() {
    let mut g = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let w = g.input("w", &[4], DType::F32).unwrap();
    let before = g.n_nodes();
    assert!(g.layer_norm(x, w, w, 1e-5).is_err());
    assert_eq!(g.n_nodes(), before);
}

#[test]
fn a_rejected_attention_leaves_no_stats_node_behind() {
    let mut g = Graph::new();
    let q = g.input("q", &[1, 1, 2, 3], DType::F32).unwrap();
    let v = g.input("v", &[1, 1, 2, 4], DType::F32).unwrap();
    let before = g.n_nodes();
    assert!(g.attention(q, q, v).is_err());
    assert_eq!(g.n_nodes(), before);
}

#[test]
fn bad_shapes_and_dtypes_are_errors_naming_the_op_and_shapes() {
    let cases: &[(Build, &str)] = &[
        (|g, [x, y, _]| g.add(x, y), "add: shapes [2, 3] and [4] do not broadcast"),
        (
            |g, [x, y, _]| g.binary(BinaryOp::Pow, x, y),
            "pow: shapes [2, 3] and [4] do not broadcast",
        ),
        (|g, [x, _, i]| g.mul(x, i), "mul: operand must be f32, got i32[2]"),
        (|g, [_, _, i]| g.unary(UnaryOp::Relu, i), "relu: input must be f32, got i32[2]"),
        (|g, [x, y, _]| g.select(x, x, y), "where: shapes [2, 3], [2, 3], [4] do not broadcast"),
        (|g, [x, _, _]| g.sum(x, &[2], false), "sum: axes [2] are not distinct axes of [2, 3]"),
        (
            |g, [x, _, _]| g.reduce(ReduceOp::Max, x, &[1, 1], true),
            "max: axis listed twice in [1, 1]",
        ),
        (
            |g, [x, _, _]| g.reshape(x, &[4]),
            "reshape: cannot reshape [2, 3] (6 elements) into [4] (4 elements)",
        ),
        (
            |g, [x, _, _]| g.permute(x, &[0, 0]),
            "permute: [0, 0] is not a permutation of the axes of [2, 3]",
        ),
        (|g, [x, _, _]| g.transpose(x, 0, 2), "transpose: axes 0 and 2 out of range for [2, 3]"),
        (
            |g, [x, _, _]| g.broadcast_to(x, &[3, 3]),
            "broadcast_to: [2, 3] does not broadcast to [3, 3]",
        ),
        (
            |g, [x, _, _]| g.slice(x, 1, 2, 5),
            "slice: range 2..5 on axis 1 is out of bounds for [2, 3]",
        ),
        (|g, [x, y, _]| g.concat(&[x, y], 0), "concat: shapes [2, 3], [4] differ outside axis 0"),
        (
            |g, [x, _, _]| g.matmul(x, x),
            "matmul: inner dimensions differ: [2, 3] @ [2, 3] (3 vs 2)",
        ),
        (
            |g, [x, y, _]| g.matmul(x, y),
            "matmul: operands need at least 2 dimensions, got [2, 3] @ [4]",
        ),
        (
            |g, [x, _, _]| {
                let t = g.transpose(x, 0, 1)?;
                g.causal_mask(t)
            },
            "causal_mask: needs scores [..., T, S] with T <= S, got [3, 2]",
        ),
        (
            |g, [_, y, _]| {
                let e = g.reshape(y, &[4, 1])?;
                let e = g.slice(e, 1, 0, 0)?;
                g.softmax(e)
            },
            "softmax: needs a non-empty last axis, got [4, 0]",
        ),
        (
            |g, [x, y, _]| g.layer_norm(x, y, y, 1e-5),
            "layer_norm: weight and bias must be [3], the last axis of x (shapes [2, 3], [4], [4])",
        ),
        (|g, [x, _, _]| g.layer_norm(x, x, x, 0.0), "layer_norm: `eps` must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got 0"),
        // Found by the hostile-input hunt: a subnormal eps, nonzero on the CPU, may be 0 on a
        // GPU; the node added directly is checked as the builder checks it.
        (|g, [x, _, _]| g.layer_norm(x, x, x, 1e-40), "layer_norm: `eps` must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got 1e-40"),
        (|g, [x, _, _]| g.add_node(Op::LayerNormStats { eps: 1e-40 }, &[x], &[]), "layer_norm: `eps` must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got 1e-40"),
        (
            |g, [x, _, _]| g.attention(x, x, x),
            "attention: q, k, v must be [B, H, T, Dh], all of one shape, got [2, 3], [2, 3], [2, 3]",
        ),
        (
            |g, [x, y, _]| {
                let q = g.reshape(x, &[1, 2, 3, 1])?;
                let k = g.reshape(y, &[1, 1, 4, 1])?;
                g.attention(q, k, q)
            },
            "attention: q, k, v must be [B, H, T, Dh], all of one shape, got [1, 2, 3, 1], [1, 1, 4, 1], [1, 2, 3, 1]",
        ),
        (
            |g, [x, _, i]| {
                let q = g.reshape(x, &[1, 1, 2, 3])?;
                let v = g.reshape(i, &[1, 1, 2, 1])?;
                g.attention(q, q, v)
            },
            "attention: v must be f32, got i32[1, 1, 2, 1]",
        ),
        (
            |g, [x, _, _]| {
                let q = g.reshape(x, &[2, 3, 1, 1])?;
                let q = g.slice(q, 3, 0, 0)?;
                g.attention(q, q, q)
            },
            "attention: the head dimension (last axis) must be at least 1, got [2, 3, 1, 0]",
        ),
        (|g, [x, _, _]| g.embedding(x, x), "embedding: indices must be i32, got f32[2, 3]"),
        (|g, [_, y, i]| g.embedding(y, i), "embedding: table must be [vocab, dim], got [4]"),
        (
            |g, [x, _, _]| g.cross_entropy(x, x, None),
            "cross_entropy: labels must be i32, got f32[2, 3]",
        ),
        (
            |g, [_, y, i]| {
                let l = g.reshape(y, &[2, 2])?;
                let l = g.slice(l, 0, 0, 1)?;
                g.cross_entropy(l, i, None)
            },
            "cross_entropy: logits [1, 2] need shape labels [2] plus a class axis",
        ),
        (|g, [x, y, _]| g.mse(x, y), "mse: prediction [2, 3] and target [4] differ"),
        (|g, [x, _, _]| g.dropout(x, 1.0, 0), "dropout: probability must be in [0, 1), got 1"),
        (
            |g, _| g.parameter("w", &[2], Init::Normal { mean: 0.0, std: -1.0 }),
            "normal initializer needs a finite mean and std >= 0, got normal(0, -1)",
        ),
        (
            |g, _| g.parameter("w", &[], Init::Xavier),
            "xavier initializer needs a non-empty weight with at least one axis, got []",
        ),
        (
            |g, _| g.parameter("x", &[2], Init::Zeros),
            "duplicate name `x`: another input, parameter or state has it",
        ),
        (
            |g, _| g.input("big", &[usize::MAX, 2], DType::F32),
            "shape [18446744073709551615, 2] has more than 2^40 elements, the most one value may hold",
        ),
        (
            |g, _| {
                // Two vectors that broadcast to 2^42 elements.
                let a = g.input("a", &[1 << 21, 1], DType::F32)?;
                let b = g.input("b", &[1 << 21], DType::F32)?;
                g.add(a, b)
            },
            "add: shape [2097152, 2097152] has more than 2^40 elements, the most one value may hold",
        ),
        (
            |g, _| {
                let a = g.input("a", &[1 << 20, 1 << 20], DType::F32)?;
                g.concat(&[a, a], 0)
            },
            "concat: shape [2097152, 1048576] has more than 2^40 elements, the most one value may hold",
        ),
        (
            |g, _| {
                let a = g.input("a", &[1 << 30, 1], DType::F32)?;
                let b = g.input("b", &[1, 1 << 30], DType::F32)?;
                g.matmul(a, b)
            },
            "matmul: shape [1073741824, 1073741824] has more than 2^40 elements, the most one value may hold",
        ),
        (
            |g, _| g.parameter("w", &[0, 1 << 40, 2], Init::Zeros),
            "shape [0, 1099511627776, 2] is empty, but its other axes span more than 2^40 elements, the most one value may index",
        ),
        (
            |g, [x, _, _]| {
                // An id from another, larger graph.
                let mut other = Graph::new();
                let mut far = x;
                for k in 0..100 {
                    far = other.input(&format!("a{k}"), &[3, 1], DType::F32)?;
                }
                g.matmul(x, far)
            },
            "matmul: input 99 is not a node of this graph",
        ),
    ];
    for &(build, expected) in cases {
        check(build, expected);
    }
}
