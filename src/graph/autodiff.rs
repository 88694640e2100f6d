//! Reverse-mode differentiation inside the graph: from a scalar loss, append the nodes that
//! compute its gradient with respect to chosen values.
//!
//! Only nodes that both depend on a differentiated value and feed the loss get an adjoint, so no
//! work is appended for values that need no gradient. Where a value fans out, the adjoints of its
//! uses are summed. Backward nodes carry the span of the forward node they differentiate.

use super::ir::{BinaryOp, Graph, Node, NodeId, Op, ReduceOp};
use crate::err;
use crate::error::Result;
use crate::tensor::{fmt_shape, DType};

/// Append the gradient of the scalar `loss` with respect to each of `wrt`, returning one
/// gradient node per entry (a zero constant where the loss does not depend on it).
pub fn grad(g: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    let n = g.n_nodes();
    if loss.index() >= n || wrt.iter().any(|w| w.index() >= n) {
        return Err(err!(Invariant, "grad: node is not in this graph"));
    }
    if !g.shape(loss).is_empty() || g.dtype(loss) != DType::F32 {
        return Err(err!(
            Shape,
            "grad: the loss must be an f32 scalar, got {}{}",
            g.dtype(loss),
            fmt_shape(g.shape(loss))
        )
        .at(g.node(loss).span));
    }
    // Forward reachability from `wrt`, backward reachability from `loss`; a node needs an
    // adjoint when it is in both.
    let mut from_wrt = vec![false; n];
    for w in wrt {
        from_wrt[w.index()] = true;
    }
    for i in 0..n {
        if !from_wrt[i] && g.nodes[i].inputs.iter().any(|x| from_wrt[x.index()]) {
            from_wrt[i] = true;
        }
    }
    let mut to_loss = vec![false; n];
    to_loss[loss.index()] = true;
    for i in (0..n).rev() {
        if to_loss[i] {
            for x in g.nodes[i].inputs.clone() {
                to_loss[x.index()] = true;
            }
        }
    }
    let needs: Vec<bool> = (0..n).map(|i| from_wrt[i] && to_loss[i]).collect();

    let saved_span = g.span;
    let mut adjoint: Vec<Option<NodeId>> = vec![None; n];
    adjoint[loss.index()] = Some(g.constant(1.0));
    for i in (0..=loss.index()).rev() {
        let (Some(dy), true) = (adjoint[i], needs[i]) else {
            continue;
        };
        let node = g.nodes[i].clone();
        if node.inputs.iter().all(|x| !needs[x.index()]) {
            continue;
        }
        g.set_span(node.span);
        let grads = backward(g, NodeId(i as u32), dy)?;
        for (x, dx) in node.inputs.iter().zip(grads) {
            let (Some(dx), true) = (dx, needs[x.index()]) else {
                continue;
            };
            adjoint[x.index()] = Some(match adjoint[x.index()] {
                Some(acc) => match merge_padded(g, acc, dx)? {
                    Some(joined) => joined,
                    None => g.add(acc, dx)?,
                },
                None => dx,
            });
        }
    }
    let mut out = Vec::with_capacity(wrt.len());
    for &w in wrt {
        g.set_span(g.nodes[w.index()].span);
        out.push(match adjoint[w.index()] {
            Some(d) => d,
            None => {
                let shape = g.shape(w).to_vec();
                g.full(&shape, 0.0)?
            }
        });
    }
    g.set_span(saved_span);
    Ok(out)
}

/// The parts of a concat along `axis` with their starts: `None` for a zero constant.
type Pieces = (usize, Vec<(usize, usize, Option<NodeId>)>);

/// `id` as pieces along its concat axis, when it is a concat.
fn pieces(g: &Graph, id: NodeId) -> Option<Pieces> {
    let node = g.node(id);
    let Op::Concat { axis } = node.op else { return None };
    let mut at = 0;
    let mut out = Vec::with_capacity(node.inputs.len());
    for &x in &node.inputs {
        let len = g.shape(x)[axis];
        let zero = matches!(g.node(x).op, Op::Constant { value } if value == 0.0);
        out.push((at, len, (!zero).then_some(x)));
        at += len;
    }
    Some((axis, out))
}

/// `a + b` as one concat when both are zero-padded concats along one axis whose non-zero parts
/// do not overlap (the adjoints of several slices of one value: a split's gradient is the
/// concat of its parts' gradients, not a sum of padded copies); `None` otherwise.
fn merge_padded(g: &mut Graph, a: NodeId, b: NodeId) -> Result<Option<NodeId>> {
    let (Some((axis, pa)), Some((axis_b, pb))) = (pieces(g, a), pieces(g, b)) else {
        return Ok(None);
    };
    if axis != axis_b || g.shape(a) != g.shape(b) || g.dtype(a) != g.dtype(b) {
        return Ok(None);
    }
    let mut parts: Vec<(usize, usize, NodeId)> =
        pa.iter().chain(&pb).filter_map(|&(at, len, x)| x.map(|x| (at, len, x))).collect();
    parts.sort_by_key(|p| p.0);
    if parts.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Ok(None);
    }
    let shape = g.shape(a).to_vec();
    let mut inputs = Vec::with_capacity(2 * parts.len() + 1);
    let mut at = 0;
    let zeros = |g: &mut Graph, from: usize, to: usize| -> Result<Option<NodeId>> {
        if to == from {
            return Ok(None);
        }
        let mut s = shape.clone();
        s[axis] = to - from;
        g.full(&s, 0.0).map(Some)
    };
    for (start, len, x) in parts {
        inputs.extend(zeros(g, at, start)?);
        inputs.push(x);
        at = start + len;
    }
    inputs.extend(zeros(g, at, shape[axis])?);
    g.concat(&inputs, axis).map(Some)
}

/// Gradients of one node's inputs given its output adjoint `dy`: one entry per input, `None`
/// where the input receives no gradient (indices, masks, stats).
fn backward(g: &mut Graph, id: NodeId, dy: NodeId) -> Result<Vec<Option<NodeId>>> {
    let node = g.node(id).clone();
    let x = &node.inputs;
    let shape_of = |g: &Graph, i: usize| g.shape(x[i]).to_vec();
    Ok(match &node.op {
        Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } | Op::Constant { .. } => vec![],
        Op::Unary(u) => match u.backward(g, x[0], id, dy)? {
            Some(dx) => vec![Some(dx)],
            None => return Err(no_gradient(&node)),
        },
        Op::Binary(b) => match b.backward(g, x[0], x[1], id, dy)? {
            Some((da, db)) => {
                let (sa, sb) = (shape_of(g, 0), shape_of(g, 1));
                vec![Some(g.sum_to(da, &sa)?), Some(g.sum_to(db, &sb)?)]
            }
            // The comparison helpers: no gradient flows through a mask.
            None => vec![None, None],
        },
        Op::Where => {
            let zero = g.constant(0.0);
            let da = g.select(x[0], dy, zero)?;
            let db = g.select(x[0], zero, dy)?;
            let (sa, sb) = (shape_of(g, 1), shape_of(g, 2));
            vec![None, Some(g.sum_to(da, &sa)?), Some(g.sum_to(db, &sb)?)]
        }
        Op::Reduce { op, axes, keepdim: _ } => {
            let xs = shape_of(g, 0);
            let kept: Vec<usize> = xs
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            let dyk = g.reshape(dy, &kept)?;
            let dx = match op {
                ReduceOp::Sum => g.broadcast_to(dyk, &xs)?,
                ReduceOp::Mean => {
                    let count: usize = axes.iter().map(|&a| xs[a]).product();
                    let scaled = g.scale(dyk, 1.0 / count.max(1) as f32)?;
                    g.broadcast_to(scaled, &xs)?
                }
                ReduceOp::Max => {
                    // The gradient is shared equally among the elements that attain the maximum.
                    let yk = g.reshape(id, &kept)?;
                    let mask = g.binary(BinaryOp::Equal, x[0], yk)?;
                    let count = g.sum(mask, axes, true)?;
                    let share = g.div(dyk, count)?;
                    g.mul(mask, share)?
                }
            };
            vec![Some(dx)]
        }
        Op::Reshape => {
            let xs = shape_of(g, 0);
            vec![Some(g.reshape(dy, &xs)?)]
        }
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(g.permute(dy, &inverse)?)]
        }
        Op::BroadcastTo => {
            let xs = shape_of(g, 0);
            vec![Some(g.sum_to(dy, &xs)?)]
        }
        Op::Slice { axis, start, end } => {
            let xs = shape_of(g, 0);
            let mut parts = Vec::new();
            for (len, is_dy) in [(*start, false), (end - start, true), (xs[*axis] - end, false)] {
                if is_dy {
                    parts.push(dy);
                } else if len > 0 {
                    let mut s = xs.clone();
                    s[*axis] = len;
                    parts.push(g.full(&s, 0.0)?);
                }
            }
            vec![Some(g.concat(&parts, *axis)?)]
        }
        Op::Concat { axis } => {
            let mut offset = 0;
            let mut out = Vec::new();
            for &xi in x {
                let len = g.shape(xi)[*axis];
                out.push(Some(g.slice(dy, *axis, offset, offset + len)?));
                offset += len;
            }
            out
        }
        Op::MatMul => {
            let (sa, sb) = (shape_of(g, 0), shape_of(g, 1));
            let bt = g.transpose(x[1], sb.len() - 2, sb.len() - 1)?;
            let da = g.matmul(dy, bt)?;
            let at = g.transpose(x[0], sa.len() - 2, sa.len() - 1)?;
            let db = g.matmul(at, dy)?;
            vec![Some(g.sum_to(da, &sa)?), Some(g.sum_to(db, &sb)?)]
        }
        Op::Softmax => {
            // dx = y · (dy − Σ dy·y)
            let last = node.shape.len() - 1;
            let dyy = g.mul(dy, id)?;
            let s = g.sum(dyy, &[last], true)?;
            let centered = g.sub(dy, s)?;
            vec![Some(g.mul(id, centered)?)]
        }
        Op::LogSoftmax => {
            // dx = dy − exp(y) · Σ dy
            let last = node.shape.len() - 1;
            let s = g.sum(dy, &[last], true)?;
            let p = g.exp(id)?;
            let ps = g.mul(p, s)?;
            vec![Some(g.sub(dy, ps)?)]
        }
        Op::CausalMask { .. } => {
            vec![Some(g.add_node(Op::CausalMask { fill: 0.0 }, &[dy], &[])?)]
        }
        Op::LayerNormStats { .. } => vec![None],
        Op::LayerNorm => {
            let d = *node.shape.last().unwrap_or(&1);
            let dx = g.add_node(Op::LayerNormGradInput, &[x[0], x[1], x[2], dy], &[])?;
            let dwb = g.add_node(Op::LayerNormGradWeight, &[x[0], x[1], dy], &[])?;
            let dw = g.slice(dwb, 0, 0, 1)?;
            let dw = g.reshape(dw, &[d])?;
            let db = g.slice(dwb, 0, 1, 2)?;
            let db = g.reshape(db, &[d])?;
            vec![Some(dx), None, Some(dw), Some(db)]
        }
        Op::AttentionStats => vec![None, None],
        Op::Attention => {
            // FlashAttention-2: dk, dv in one pass, dq in another, each reading the output `y`
            // for its rows' `delta = Σ_d dy·y` (no reduction of its own).
            let ins = [x[0], x[1], x[2], x[3], dy, id];
            let dkv = g.add_node(Op::AttentionGradKv, &ins, &[])?;
            let dq = g.add_node(Op::AttentionGradQ, &ins, &[])?;
            let dk = g.slice(dkv, 0, 0, 1)?;
            let dk = g.reshape(dk, &node.shape)?;
            let dv = g.slice(dkv, 0, 1, 2)?;
            let dv = g.reshape(dv, &node.shape)?;
            vec![Some(dq), Some(dk), Some(dv), None]
        }
        Op::Embedding => {
            let vocab = g.shape(x[0])[0];
            vec![Some(g.add_node(Op::EmbeddingGrad { vocab }, &[x[1], dy], &[])?), None]
        }
        Op::CrossEntropy { ignore_index } => {
            let d = g.add_node(
                Op::CrossEntropyGrad { ignore_index: *ignore_index },
                &[x[0], x[1], dy],
                &[],
            )?;
            vec![Some(d), None]
        }
        Op::Dropout { p, seed } => {
            vec![Some(g.add_node(Op::Dropout { p: *p, seed: *seed }, &[dy], &[])?)]
        }
        Op::TrainingSelect => {
            let zero = g.full(&node.shape, 0.0)?;
            let da = g.add_node(Op::TrainingSelect, &[dy, zero], &[])?;
            let db = g.add_node(Op::TrainingSelect, &[zero, dy], &[])?;
            vec![Some(da), Some(db)]
        }
        // unfold and fold are each other's adjoints.
        Op::Unfold { window, .. } => {
            let xs = shape_of(g, 0);
            vec![Some(g.add_node(Op::Fold { window: *window }, &[dy], &xs)?)]
        }
        Op::Fold { window } => vec![Some(g.unfold(dy, *window, 0.0)?)],
        Op::LayerNormGradInput
        | Op::LayerNormGradWeight
        | Op::AttentionGradKv
        | Op::AttentionGradQ
        | Op::EmbeddingGrad { .. }
        | Op::CrossEntropyGrad { .. } => return Err(no_gradient(&node)),
    })
}

/// The error for differentiating through a gradient op.
fn no_gradient(node: &Node) -> crate::error::Error {
    err!(Shape, "{}: has no gradient (it is itself a gradient op)", node.op.name()).at(node.span)
}
