//! Layout folded into addressing (issue 12): a split value's gradient is one concat of its
//! parts' gradients, not a sum of zero-padded copies.

use rumus::graph::autodiff::grad;
use rumus::graph::{Graph, Op};
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
