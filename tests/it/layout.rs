//! Layout folded into addressing (issue 12): a split value's gradient is one concat of its
//! parts' gradients, not a sum of zero-padded copies; kernels read permuted and sliced values
//! in place instead of copies.

use crate::common::{attention_cases, build, cases};
use rumus::graph::autodiff::grad;
use rumus::graph::{training_graph, Graph, NodeId, Op, OptimConfig, Optimizer};
use rumus::nn::GptConfig;
use rumus::plan::{plan, PlanOptions};
use rumus::DType;

/// The gradient of `x` split into slices along `axis` at `cuts` (each slice scaled by its
/// own factor, then summed): the ops of the gradient's node and of its inputs, e.g.
/// `concat(mul, mul, mul)`.
fn split_grad(shape: &[usize], axis: usize, cuts: &[(usize, usize)]) -> String {
    let mut g = Graph::new();
    let x = g.input("x", shape, DType::F32).unwrap();
    let mut total = None;
    for (i, &(a, b)) in cuts.iter().enumerate() {
        let s = g.slice(x, axis, a, b).unwrap();
        let s = g.scale(s, i as f32 + 2.0).unwrap();
        let s = g.sum(s, &(0..shape.len()).collect::<Vec<_>>(), false).unwrap();
        total = Some(match total {
            Some(t) => g.add(t, s).unwrap(),
            None => s,
        });
    }
    let d = grad(&mut g, total.unwrap(), &[x]).unwrap()[0];
    let node = g.node(d);
    let ins: Vec<&str> = node
        .inputs
        .iter()
        .map(|&i| match g.node(i).op {
            Op::Constant { .. } => "0",
            ref op => op.name(),
        })
        .collect();
    format!("{}({})", node.op.name(), ins.join(", "))
}

#[test]
fn a_split_values_gradient_is_one_concat_of_its_parts() {
    let check = |shape: &[usize], axis, cuts: &[(usize, usize)], want: &str| {
        assert_eq!(split_grad(shape, axis, cuts), want, "{shape:?} axis {axis} {cuts:?}");
    };
    // q, k, v out of one projection: the three gradients side by side.
    check(&[2, 9], 1, &[(0, 3), (3, 6), (6, 9)], "concat(mul, mul, mul)");
    // Gaps stay zero; the order of the slices does not matter.
    check(&[2, 9], 1, &[(6, 8), (1, 3)], "concat(0, mul, 0, mul, 0)");
    check(&[4, 3], 0, &[(2, 4), (0, 1)], "concat(mul, 0, mul)");
    // Overlapping slices, or slices along different axes, are summed.
    check(&[2, 9], 1, &[(0, 4), (3, 6)], "add(concat, concat)");
    check(&[4, 4], 0, &[(0, 2)], "concat(mul, 0)");
}

/// The kernels of `p` that only move data (every op they compute is `slice`, `reshape`,
/// `permute` or `concat`, flat arenas' concats aside), by their ops.
fn moves(g: &Graph, p: &rumus::plan::Plan) -> Vec<String> {
    let moves = |op: &Op| {
        matches!(op, Op::Slice { .. } | Op::Reshape | Op::Permute { .. } | Op::Concat { .. })
    };
    let constant = |id: &NodeId| matches!(g.node(*id).op, Op::Constant { .. });
    p.kernels
        .iter()
        .filter(|k| k.fused.iter().all(|id| moves(&g.node(*id).op) || constant(id)))
        .filter(|k| {
            !k.fused
                .iter()
                .any(|&id| matches!(g.node(id).op, Op::Concat { .. }) && g.shape(id).len() == 1)
        })
        .map(|k| {
            let ops = k.fused.iter().filter(|id| !constant(id));
            ops.map(|&id| g.node(id).op.name()).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

/// The kernels of a 2-layer GPT training step that only move data (every op they compute is
/// `slice`, `reshape`, `permute` or `concat`), by their ops.
fn copies(d: usize) -> Vec<String> {
    let c = GptConfig { vocab: 64, d, heads: 4, layers: 2, ctx: 16 };
    let (g, loss) = crate::common::gpt_loss(c, 2);
    let t = training_graph(g, loss, &OptimConfig::new(Optimizer::adamw())).unwrap();
    let opts = PlanOptions { fusion: true, reuse: true, limits: None, ..PlanOptions::default() };
    let p = plan(&t.graph, &[t.loss], true, opts).unwrap();
    moves(&t.graph, &p)
}

/// Per layer, backward: at a width that is no multiple of the arenas' alignment (64) each
/// LayerNorm's weight and bias gradients copied into the gradient arena (`slice reshape`: the
/// bias gradient's place is not right after the weight's). At 64, the `[2, D]` value of both
/// is placed in the arena, each a view of it. Everything else is a strided view read in
/// place: q, k and v of the qkv projection; the transposed weights of the input gradients'
/// products; the attention output, written in [B, T, H, Dh] order so that its heads merged for
/// the projection (and transposed for the projection's weight gradient, from the
/// rematerialized copy) are views; the output gradient split into heads; or written in place:
/// dq, dK and dV, by the attention backward inside the qkv gradient, which no kernel copies
/// them into (it was one concat a layer). (The flat arenas' concats are not counted.)
#[test]
fn a_gpt_steps_data_movement_kernels() {
    let ln = ["slice reshape"; 2];
    let want: Vec<&str> = ln.repeat(5);
    assert_eq!(copies(32), want);
    assert!(copies(64).is_empty(), "{:?}", copies(64));
}

/// The layout cases of the op table (tests/it/common), forward and backward: the kernels that
/// only move data, by their ops. A view every reader reads through strides is no kernel; what
/// no reader can address is copied.
#[test]
fn layout_ops_read_in_place_are_no_kernel() {
    let check = |name: &str, want: &[&str]| {
        let c = cases().into_iter().chain(attention_cases()).find(|c| c.name == name).unwrap();
        let b = build(&c).unwrap();
        let mut roots = vec![b.out];
        roots.extend(b.grads.iter().map(|&(_, d)| d));
        let p = plan(&b.g, &roots, false, PlanOptions::default()).unwrap();
        assert_eq!(moves(&b.g, &p), want, "{name}");
    };
    // The weight's transpose, forward, and the operands' transposes in both gradients; the
    // weight's gradient, a value the host reads, is the transpose of a product: a copy (as
    // is every input's gradient that is a layout op of a computed value).
    check("matmul transposed right view", &["permute"]);
    check("matmul permute of reshape view", &["permute reshape"]);
    // The slice's gradient is a zero-padded concat: a kernel of its own.
    check("matmul slice view", &["concat"]);
    check("matmul view read twice", &[]);
    // The attention output is written in [B, T, H, Dh] order, so its heads merged for the
    // product are a view, as is the gradient split back into heads; dk and dv, wanted, are
    // copied out of their one buffer.
    check("attention heads merged", &["slice reshape", "slice reshape"]);
}

/// An elementwise value that a matmul reads only transposed (a weight gradient's `Hᵀ` of a
/// rematerialized activation) is written in its own row-major order and read as a view: its
/// kernel computes the activation alone, with no transposing store, and no copy is made.
#[test]
fn an_activation_read_transposed_by_a_product_is_written_in_its_own_order() {
    let mut g = Graph::new();
    let x = g.input("x", &[2, 8, 4], DType::F32).unwrap();
    let dy = g.input("dy", &[16, 3], DType::F32).unwrap();
    let h = g.gelu_tanh(x).unwrap();
    let flat = g.reshape(h, &[16, 4]).unwrap();
    let ht = g.permute(flat, &[1, 0]).unwrap();
    let dw = g.matmul(ht, dy).unwrap();
    let p = plan(&g, &[dw], false, PlanOptions::default()).unwrap();
    let ops = |k: &rumus::plan::Kernel| {
        k.fused.iter().map(|&n| g.node(n).op.name()).collect::<Vec<_>>().join(" ")
    };
    let kernels: Vec<String> = p.kernels.iter().map(ops).collect();
    assert_eq!(kernels, ["gelu_tanh", "matmul"]);
    assert_eq!(p.alias[ht.index()], Some(h), "the transpose is a view of the activation's buffer");
    assert!(p.view[ht.index()].is_some());
    // Read by a kernel that inlines it, the transpose stays in that kernel's expression.
    let mut g2 = Graph::new();
    let x = g2.input("x", &[4, 4], DType::F32).unwrap();
    let h = g2.gelu_tanh(x).unwrap();
    let ht = g2.permute(h, &[1, 0]).unwrap();
    let y = g2.exp(ht).unwrap();
    let p = plan(&g2, &[y], false, PlanOptions::default()).unwrap();
    assert_eq!(p.kernels.len(), 1);
}
