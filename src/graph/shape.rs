//! Shape and dtype inference: the one place that knows which inputs each op accepts.
//!
//! [`infer`] is used by the builder (to reject a bad node before it exists) and by `verify` (to
//! check a finished graph). Its errors name the op and the shapes involved.

use super::ir::{Op, ReduceOp};
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{checked_numel, fmt_shape, DType};

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Whether `from` broadcasts to exactly `to`.
pub fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    broadcast_shapes(from, to).as_deref() == Some(to)
}

fn need_f32(op: &Op, what: &str, dtype: DType, shape: &[usize]) -> Result<()> {
    if dtype != DType::F32 {
        return Err(Error::shape(format!(
            "{}: {what} must be f32, got {dtype}{}",
            op.name(),
            fmt_shape(shape)
        )));
    }
    Ok(())
}

/// The shape `[B, H, T, Dh]` that the attention operands `ins` (q, k, then v) share: f32, rank
/// 4, one shape, `Dh >= 1`.
pub(crate) fn attention_qkv<'a>(op: &Op, ins: &[(&'a [usize], DType)]) -> Result<&'a [usize]> {
    const NAMES: [&str; 3] = ["q", "k", "v"];
    for ((s, d), what) in ins.iter().zip(NAMES) {
        need_f32(op, what, *d, s)?;
    }
    let q = ins[0].0;
    if q.len() != 4 || ins.iter().any(|(s, _)| *s != q) {
        let got: Vec<String> = ins.iter().map(|(s, _)| fmt_shape(s)).collect();
        return Err(Error::shape(format!(
            "{}: {} must be [B, H, T, Dh], all of one shape, got {}",
            op.name(),
            NAMES[..ins.len()].join(", "),
            got.join(", ")
        )));
    }
    if q[3] == 0 {
        return Err(Error::shape(format!(
            "{}: the head dimension (last axis) must be at least 1, got {}",
            op.name(),
            fmt_shape(q)
        )));
    }
    Ok(q)
}

fn need_i32(op: &Op, what: &str, dtype: DType, shape: &[usize]) -> Result<()> {
    if dtype != DType::I32 {
        return Err(Error::shape(format!(
            "{}: {what} must be i32, got {dtype}{}",
            op.name(),
            fmt_shape(shape)
        )));
    }
    Ok(())
}

/// Infer the shape and dtype of `op` applied to inputs of the given shapes and dtypes. `target`
/// is the node's own shape and `target_dtype` its dtype, used only where the op does not
/// determine them (sources, constants, reshape, broadcast_to). Every value of a graph holds at
/// most [`MAX_ELEMENTS`](crate::tensor::MAX_ELEMENTS) elements, so no later stage's shape or
/// byte arithmetic can overflow.
pub fn infer(
    op: &Op,
    ins: &[(&[usize], DType)],
    target: &[usize],
    target_dtype: DType,
) -> Result<(Vec<usize>, DType)> {
    let (shape, dtype) = infer_unchecked(op, ins, target, target_dtype)?;
    checked_numel(&shape).map_err(|e| Error::shape(format!("{}: {}", op.name(), e.message)))?;
    Ok((shape, dtype))
}

fn infer_unchecked(
    op: &Op,
    ins: &[(&[usize], DType)],
    target: &[usize],
    target_dtype: DType,
) -> Result<(Vec<usize>, DType)> {
    let name = op.name();
    let arity = match op {
        Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } | Op::Constant { .. } => 0,
        Op::Unary(_)
        | Op::Reduce { .. }
        | Op::Reshape
        | Op::Permute { .. }
        | Op::BroadcastTo
        | Op::Slice { .. }
        | Op::Softmax
        | Op::LogSoftmax
        | Op::CausalMask { .. }
        | Op::LayerNormStats { .. }
        | Op::Dropout { .. }
        | Op::Unfold { .. }
        | Op::Fold { .. } => 1,
        Op::Binary(_)
        | Op::MatMul
        | Op::Embedding
        | Op::EmbeddingGrad { .. }
        | Op::CrossEntropy { .. }
        | Op::AttentionStats
        | Op::TrainingSelect => 2,
        Op::Where | Op::LayerNormGradWeight | Op::CrossEntropyGrad { .. } => 3,
        Op::LayerNorm | Op::LayerNormGradInput | Op::Attention => 4,
        Op::AttentionGradKv | Op::AttentionGradQ => 6,
        Op::Concat { .. } => ins.len().max(1),
    };
    if ins.len() != arity {
        return Err(Error::shape(format!("{name}: expected {arity} inputs, got {}", ins.len())));
    }
    let shapes = |sep: &str| ins.iter().map(|(s, _)| fmt_shape(s)).collect::<Vec<_>>().join(sep);
    match op {
        Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } | Op::Constant { .. } => {
            checked_numel(target)?;
            if !matches!(op, Op::Input { .. }) {
                need_f32(op, "value", target_dtype, target)?;
            }
            Ok((target.to_vec(), target_dtype))
        }
        Op::Unary(_) => {
            need_f32(op, "input", ins[0].1, ins[0].0)?;
            Ok((ins[0].0.to_vec(), DType::F32))
        }
        Op::Binary(b) => {
            for (s, d) in ins {
                need_f32(op, "operand", *d, s)?;
            }
            let out = broadcast_shapes(ins[0].0, ins[1].0).ok_or_else(|| {
                Error::shape(format!("{}: shapes {} do not broadcast", b.name(), shapes(" and ")))
            })?;
            Ok((out, DType::F32))
        }
        Op::Where => {
            need_f32(op, "first branch", ins[1].1, ins[1].0)?;
            need_f32(op, "second branch", ins[2].1, ins[2].0)?;
            let out = broadcast_shapes(ins[0].0, ins[1].0)
                .and_then(|s| broadcast_shapes(&s, ins[2].0))
                .ok_or_else(|| {
                    Error::shape(format!("where: shapes {} do not broadcast", shapes(", ")))
                })?;
            Ok((out, DType::F32))
        }
        Op::Reduce { op: r, axes, keepdim } => {
            let x = ins[0].0;
            need_f32(op, "input", ins[0].1, x)?;
            if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|&a| a >= x.len()) {
                return Err(Error::shape(format!(
                    "{}: axes {axes:?} are not distinct axes of {}",
                    r.name(),
                    fmt_shape(x)
                )));
            }
            if *r == ReduceOp::Max && axes.iter().any(|&a| x[a] == 0) {
                return Err(Error::shape(format!(
                    "max: cannot reduce an empty axis of {}",
                    fmt_shape(x)
                )));
            }
            let out = x
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
                    (false, _) => Some(d),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect();
            Ok((out, DType::F32))
        }
        Op::Reshape => {
            let (x, d) = ins[0];
            if checked_numel(target)? != checked_numel(x)? {
                return Err(Error::shape(format!(
                    "reshape: cannot reshape {} ({} elements) into {} ({} elements)",
                    fmt_shape(x),
                    checked_numel(x)?,
                    fmt_shape(target),
                    checked_numel(target)?
                )));
            }
            Ok((target.to_vec(), d))
        }
        Op::Permute { perm } => {
            let (x, d) = ins[0];
            let mut seen = vec![false; x.len()];
            let ok = perm.len() == x.len()
                && perm.iter().all(|&p| p < x.len() && !std::mem::replace(&mut seen[p], true));
            if !ok {
                return Err(Error::shape(format!(
                    "permute: {perm:?} is not a permutation of the axes of {}",
                    fmt_shape(x)
                )));
            }
            Ok((perm.iter().map(|&p| x[p]).collect(), d))
        }
        Op::BroadcastTo => {
            let (x, d) = ins[0];
            checked_numel(target)?;
            if !broadcasts_to(x, target) {
                return Err(Error::shape(format!(
                    "broadcast_to: {} does not broadcast to {}",
                    fmt_shape(x),
                    fmt_shape(target)
                )));
            }
            Ok((target.to_vec(), d))
        }
        Op::Slice { axis, start, end } => {
            let (x, d) = ins[0];
            if *axis >= x.len() || start > end || *end > x[*axis] {
                return Err(Error::shape(format!(
                    "slice: range {start}..{end} on axis {axis} is out of bounds for {}",
                    fmt_shape(x)
                )));
            }
            let mut out = x.to_vec();
            out[*axis] = end - start;
            Ok((out, d))
        }
        Op::Concat { axis } => {
            let (first, d) = ins[0];
            if *axis >= first.len() {
                return Err(Error::shape(format!(
                    "concat: axis {axis} is out of range for {}",
                    fmt_shape(first)
                )));
            }
            let mut out = first.to_vec();
            for (s, dt) in &ins[1..] {
                let same_rest = s.len() == first.len()
                    && s.iter().zip(first).enumerate().all(|(i, (a, b))| i == *axis || a == b);
                if !same_rest || *dt != d {
                    return Err(Error::shape(format!(
                        "concat: shapes {} differ outside axis {axis}",
                        shapes(", ")
                    )));
                }
                out[*axis] = out[*axis].checked_add(s[*axis]).ok_or_else(|| {
                    Error::shape(format!("concat: shapes {} are too large", shapes(", ")))
                })?;
            }
            Ok((out, d))
        }
        Op::MatMul => {
            let ((a, da), (b, db)) = (ins[0], ins[1]);
            need_f32(op, "left operand", da, a)?;
            need_f32(op, "right operand", db, b)?;
            if a.len() < 2 || b.len() < 2 {
                return Err(Error::shape(format!(
                    "matmul: operands need at least 2 dimensions, got {} @ {}",
                    fmt_shape(a),
                    fmt_shape(b)
                )));
            }
            let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
            let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
            if k != k2 {
                return Err(Error::shape(format!(
                    "matmul: inner dimensions differ: {} @ {} ({k} vs {k2})",
                    fmt_shape(a),
                    fmt_shape(b)
                )));
            }
            let mut out =
                broadcast_shapes(&a[..a.len() - 2], &b[..b.len() - 2]).ok_or_else(|| {
                    Error::shape(format!(
                        "matmul: batch dimensions of {} and {} do not broadcast",
                        fmt_shape(a),
                        fmt_shape(b)
                    ))
                })?;
            out.extend([m, n]);
            Ok((out, DType::F32))
        }
        Op::Softmax | Op::LogSoftmax => {
            let (x, d) = ins[0];
            need_f32(op, "input", d, x)?;
            if x.last().is_none_or(|&n| n == 0) {
                return Err(Error::shape(format!(
                    "{name}: needs a non-empty last axis, got {}",
                    fmt_shape(x)
                )));
            }
            Ok((x.to_vec(), DType::F32))
        }
        Op::TrainingSelect => {
            let ((a, da), (b, db)) = (ins[0], ins[1]);
            need_f32(op, "a", da, a)?;
            need_f32(op, "b", db, b)?;
            if a != b {
                return Err(Error::shape(format!(
                    "{name}: a and b must have one shape, got {}",
                    shapes(", ")
                )));
            }
            Ok((a.to_vec(), DType::F32))
        }
        Op::Unfold { window, .. } => {
            let (x, d) = ins[0];
            need_f32(op, "input", d, x)?;
            Ok((super::conv::unfold_shape(name, window, x)?, DType::F32))
        }
        Op::Fold { window } => {
            let (cols, d) = ins[0];
            need_f32(op, "input", d, cols)?;
            let want = super::conv::unfold_shape(name, window, target)?;
            if cols != want {
                return Err(Error::shape(format!(
                    "{name}: columns {} do not unfold from {} (that gives {})",
                    fmt_shape(cols),
                    fmt_shape(target),
                    fmt_shape(&want)
                )));
            }
            Ok((target.to_vec(), DType::F32))
        }
        Op::CausalMask { .. } => {
            let (x, d) = ins[0];
            need_f32(op, "input", d, x)?;
            if x.len() < 2 || x[x.len() - 2] > x[x.len() - 1] {
                return Err(Error::shape(format!(
                    "causal_mask: needs scores [..., T, S] with T <= S, got {}",
                    fmt_shape(x)
                )));
            }
            Ok((x.to_vec(), DType::F32))
        }
        Op::LayerNormStats { eps } => {
            // Checked here too, for a node added directly (`Graph::add_node`) and in `verify`.
            crate::num::eps_f32(*eps).map_err(|m| {
                Error::new(ErrorKind::InvalidArgument, format!("layer_norm: `eps` {m}"))
            })?;
            let (x, d) = ins[0];
            need_f32(op, "input", d, x)?;
            if x.last().is_none_or(|&n| n == 0) {
                return Err(Error::shape(format!(
                    "layer_norm: needs a non-empty last axis, got {}",
                    fmt_shape(x)
                )));
            }
            let mut out = x[..x.len() - 1].to_vec();
            out.push(2);
            Ok((out, DType::F32))
        }
        Op::LayerNorm | Op::LayerNormGradInput | Op::LayerNormGradWeight => {
            for (s, d) in ins {
                need_f32(op, "input", *d, s)?;
            }
            let (x, stats) = (ins[0].0, ins[1].0);
            let dim = x.last().copied().unwrap_or(0);
            let mut want_stats = x[..x.len().saturating_sub(1)].to_vec();
            want_stats.push(2);
            let bad =
                |what: &str| Error::shape(format!("{name}: {what} (shapes {})", shapes(", ")));
            if x.is_empty() || stats != want_stats.as_slice() {
                return Err(bad("stats must be x's shape with last axis 2"));
            }
            match op {
                Op::LayerNorm => {
                    if ins[2].0 != [dim] || ins[3].0 != [dim] {
                        return Err(bad(&format!("weight and bias must be [{dim}]")));
                    }
                    Ok((x.to_vec(), DType::F32))
                }
                Op::LayerNormGradInput => {
                    if ins[2].0 != [dim] || ins[3].0 != x {
                        return Err(bad(&format!("weight must be [{dim}] and dy like x")));
                    }
                    Ok((x.to_vec(), DType::F32))
                }
                _ => {
                    if ins[2].0 != x {
                        return Err(bad("dy must be shaped like x"));
                    }
                    Ok((vec![2, dim], DType::F32))
                }
            }
        }
        Op::AttentionStats => Ok((attention_qkv(op, &ins[..2])?[..3].to_vec(), DType::F32)),
        Op::Attention | Op::AttentionGradKv | Op::AttentionGradQ => {
            let q = attention_qkv(op, &ins[..3])?;
            for (s, d) in &ins[3..] {
                need_f32(op, "input", *d, s)?;
            }
            let bad =
                |what: &str| Error::shape(format!("{name}: {what} (shapes {})", shapes(", ")));
            if ins[3].0 != &q[..3] {
                return Err(bad("stats must be [B, H, T]"));
            }
            if ins.len() == 6 && (ins[4].0 != q || ins[5].0 != q) {
                return Err(bad("dy and y must be shaped like q"));
            }
            let mut out = q.to_vec();
            if *op == Op::AttentionGradKv {
                out.insert(0, 2);
            }
            Ok((out, DType::F32))
        }
        Op::Embedding => {
            let ((table, dt), (idx, di)) = (ins[0], ins[1]);
            need_f32(op, "table", dt, table)?;
            need_i32(op, "indices", di, idx)?;
            if table.len() != 2 {
                return Err(Error::shape(format!(
                    "embedding: table must be [vocab, dim], got {}",
                    fmt_shape(table)
                )));
            }
            let mut out = idx.to_vec();
            out.push(table[1]);
            Ok((out, DType::F32))
        }
        Op::EmbeddingGrad { vocab } => {
            let ((idx, di), (dy, dd)) = (ins[0], ins[1]);
            need_i32(op, "indices", di, idx)?;
            need_f32(op, "gradient", dd, dy)?;
            if dy.len() != idx.len() + 1 || dy[..idx.len()] != *idx {
                return Err(Error::shape(format!(
                    "embedding_grad: gradient {} does not match indices {}",
                    fmt_shape(dy),
                    fmt_shape(idx)
                )));
            }
            Ok((vec![*vocab, dy[idx.len()]], DType::F32))
        }
        Op::CrossEntropy { .. } | Op::CrossEntropyGrad { .. } => {
            let ((logits, dl), (labels, dlab)) = (ins[0], ins[1]);
            need_f32(op, "logits", dl, logits)?;
            need_i32(op, "labels", dlab, labels)?;
            if logits.is_empty()
                || logits[..logits.len() - 1] != *labels
                || logits[logits.len() - 1] == 0
            {
                return Err(Error::shape(format!(
                    "cross_entropy: logits {} need shape labels {} plus a class axis",
                    fmt_shape(logits),
                    fmt_shape(labels)
                )));
            }
            if matches!(op, Op::CrossEntropyGrad { .. }) {
                if !ins[2].0.is_empty() {
                    return Err(Error::shape(format!(
                        "cross_entropy_grad: loss gradient must be a scalar, got {}",
                        fmt_shape(ins[2].0)
                    )));
                }
                return Ok((logits.to_vec(), DType::F32));
            }
            Ok((vec![], DType::F32))
        }
        Op::Dropout { p, .. } => {
            let (x, d) = ins[0];
            need_f32(op, "input", d, x)?;
            if !(0.0..1.0).contains(p) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("dropout: probability must be in [0, 1), got {p}"),
                ));
            }
            Ok((x.to_vec(), DType::F32))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
    }
}
