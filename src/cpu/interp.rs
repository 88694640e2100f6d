//! The forward of every op: [`eval`] dispatches one node to the function of its op family.
//! Elementwise, reduction and shape ops live here; the neural-network ops live in
//! [`super::nn`], matrix products in [`mod@super::matmul`].
//!
//! Every function takes its inputs' elements and shapes and returns a fresh buffer; none keeps
//! state. Shapes are trusted (the graph was verified), element types are checked and a mismatch
//! is an `Invariant` error, never a panic.

use super::{attention, conv, matmul, nn, Buf, Float, RunOptions};
use crate::err;
use crate::error::Result;
use crate::graph::shape::infer;
use crate::graph::{BinaryOp, Node, Op, ReduceOp, UnaryOp};
use crate::tensor::{fmt_shape, DType};
use std::borrow::Cow;

/// A borrowed view of one input value's elements.
#[derive(Clone, Copy, Debug)]
pub enum Val<'a, T> {
    /// Float elements.
    F(&'a [T]),
    /// Integer elements.
    I(&'a [i32]),
}

impl<'a, T> Val<'a, T> {
    /// Borrow a buffer.
    pub fn of(buf: &'a Buf<T>) -> Val<'a, T> {
        match buf {
            Buf::F(v) => Val::F(v),
            Buf::I(v) => Val::I(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            Val::F(v) => v.len(),
            Val::I(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Val::F(_) => DType::F32,
            Val::I(_) => DType::I32,
        }
    }
}

/// Compute the value of `node` from the values of its inputs (`ins`, with their shapes `shapes`,
/// in the node's input order). The node's shape and dtype must be what shape inference gives for
/// these inputs, and each input must hold its shape's element count; anything else is an
/// `Invariant` error (so a hand-built node cannot make an op index out of bounds).
pub fn eval<T: Float>(
    node: &Node,
    ins: &[Val<T>],
    shapes: &[&[usize]],
    opts: RunOptions,
) -> Result<Buf<T>> {
    let name = node.op.name();
    if ins.len() != node.inputs.len() || shapes.len() != ins.len() {
        return Err(err!(Invariant, "{name}: wrong number of input values"));
    }
    for (i, (v, s)) in ins.iter().zip(shapes).enumerate() {
        if v.len() != s.iter().product::<usize>() {
            return Err(err!(
                Invariant,
                "{name}: input {i} has {} elements, its shape says {}",
                v.len(),
                s.iter().product::<usize>()
            ));
        }
    }
    let in_types: Vec<(&[usize], DType)> =
        ins.iter().zip(shapes).map(|(v, s)| (*s, v.dtype())).collect();
    let (shape, dtype) = infer(&node.op, &in_types, &node.shape, node.dtype)
        .map_err(|e| err!(Invariant, "{}", e.message))?;
    if shape != node.shape || dtype != node.dtype {
        return Err(err!(
            Invariant,
            "{name}: node is {}{} but its inputs give {dtype}{}",
            node.dtype,
            fmt_shape(&node.shape),
            fmt_shape(&shape)
        ));
    }
    let out = &node.shape[..];
    let f = |i: usize| -> Result<&[T]> {
        match ins[i] {
            Val::F(v) => Ok(v),
            Val::I(_) => Err(err!(Invariant, "{name}: input {i} is i32, expected f32")),
        }
    };
    let int = |i: usize| -> Result<&[i32]> {
        match ins[i] {
            Val::I(v) => Ok(v),
            Val::F(_) => Err(err!(Invariant, "{name}: input {i} is f32, expected i32")),
        }
    };
    let v = match &node.op {
        Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } => {
            return Err(err!(Invariant, "{name}: a source is not evaluated"));
        }
        Op::Constant { value } => Buf::F(vec![T::from_f64(*value as f64); numel(out)]),
        Op::Unary(u) => Buf::F(unary(*u, f(0)?)),
        Op::Binary(b) => Buf::F(binary(*b, f(0)?, shapes[0], f(1)?, shapes[1], out)),
        Op::Where => Buf::F(select(ins[0], shapes[0], f(1)?, shapes[1], f(2)?, shapes[2], out)),
        Op::Reduce { op, axes, .. } => Buf::F(reduce(*op, f(0)?, shapes[0], axes)),
        Op::Reshape => per_dtype(ins[0], |x| x.to_vec(), |x| x.to_vec()),
        Op::Permute { perm } => {
            per_dtype(ins[0], |x| permute(x, shapes[0], perm), |x| permute(x, shapes[0], perm))
        }
        Op::BroadcastTo => per_dtype(
            ins[0],
            |x| broadcast(x, shapes[0], out).into_owned(),
            |x| broadcast(x, shapes[0], out).into_owned(),
        ),
        Op::Slice { axis, start, end } => per_dtype(
            ins[0],
            |x| slice(x, shapes[0], *axis, *start, *end),
            |x| slice(x, shapes[0], *axis, *start, *end),
        ),
        Op::Concat { axis } => concat_vals(ins, shapes, *axis, name)?,
        Op::MatMul => Buf::F(matmul(f(0)?, shapes[0], f(1)?, shapes[1])),
        Op::Softmax => Buf::F(nn::softmax(f(0)?, last(shapes[0]))),
        Op::LogSoftmax => Buf::F(nn::log_softmax(f(0)?, last(shapes[0]))),
        Op::CausalMask { fill } => Buf::F(nn::causal_mask(f(0)?, shapes[0], *fill)),
        Op::LayerNormStats { eps } => Buf::F(nn::layer_norm_stats(f(0)?, last(shapes[0]), *eps)),
        Op::LayerNorm => Buf::F(nn::layer_norm(f(0)?, f(1)?, f(2)?, f(3)?)),
        Op::LayerNormGradInput => Buf::F(nn::layer_norm_grad_input(f(0)?, f(1)?, f(2)?, f(3)?)),
        Op::LayerNormGradWeight => {
            Buf::F(nn::layer_norm_grad_weight(f(0)?, f(1)?, f(2)?, last(out)))
        }
        Op::AttentionStats => Buf::F(attention::attention_stats(f(0)?, f(1)?, shapes[0])),
        Op::Attention => Buf::F(attention::attention(f(0)?, f(1)?, f(2)?, f(3)?, shapes[0])),
        Op::AttentionGradKv => {
            let ins = [f(0)?, f(1)?, f(2)?, f(3)?, f(4)?, f(5)?];
            Buf::F(attention::attention_grad_kv(ins, shapes[0]))
        }
        Op::AttentionGradQ => {
            let ins = [f(0)?, f(1)?, f(2)?, f(3)?, f(4)?, f(5)?];
            Buf::F(attention::attention_grad_q(ins, shapes[0]))
        }
        Op::Embedding => Buf::F(nn::embedding(f(0)?, shapes[0], int(1)?)?),
        Op::EmbeddingGrad { vocab } => {
            Buf::F(nn::embedding_grad(int(0)?, f(1)?, *vocab, last(out))?)
        }
        Op::CrossEntropy { ignore_index } => {
            Buf::F(nn::cross_entropy(f(0)?, last(shapes[0]), int(1)?, *ignore_index)?)
        }
        Op::CrossEntropyGrad { ignore_index } => {
            Buf::F(nn::cross_entropy_grad(f(0)?, last(shapes[0]), int(1)?, f(2)?, *ignore_index)?)
        }
        Op::Dropout { p, seed } => Buf::F(nn::dropout(f(0)?, *p, *seed, opts)),
        Op::TrainingSelect => Buf::F(f(if opts.training { 0 } else { 1 })?.to_vec()),
        Op::Unfold { window, fill } => {
            Buf::F(conv::unfold(f(0)?, shapes[0], window, out, T::from_f64(*fill as f64)))
        }
        Op::Fold { window } => Buf::F(conv::fold(f(0)?, window, out)),
    };
    if v.len() != numel(out) {
        return Err(err!(
            Invariant,
            "{name}: computed {} elements for a value of {}",
            v.len(),
            numel(out)
        ));
    }
    Ok(v)
}

/// Apply a dtype-generic function to whichever element type `v` holds.
fn per_dtype<T: Float>(
    v: Val<T>,
    on_f: impl FnOnce(&[T]) -> Vec<T>,
    on_i: impl FnOnce(&[i32]) -> Vec<i32>,
) -> Buf<T> {
    match v {
        Val::F(x) => Buf::F(on_f(x)),
        Val::I(x) => Buf::I(on_i(x)),
    }
}

// ---- indexing helpers ----

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Length of the last axis (1 for a scalar).
fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// The elements `x[offset + Σ_a idx[a]·strides[a]]` for every index `idx` of `out_shape`, in
/// row-major order. Permute, broadcast and slice are all this one gather.
pub fn gather<E: Copy>(x: &[E], offset: usize, strides: &[usize], out_shape: &[usize]) -> Vec<E> {
    let n = numel(out_shape);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some((&inner, outer_shape)) = out_shape.split_last() else {
        out.push(x[offset]);
        return out;
    };
    let inner_stride = strides[outer_shape.len()];
    let mut idx = vec![0; outer_shape.len()];
    let mut base = offset;
    loop {
        out.extend((0..inner).map(|j| x[base + j * inner_stride]));
        // Advance the odometer over the outer axes.
        let mut a = outer_shape.len();
        loop {
            if a == 0 {
                return out;
            }
            a -= 1;
            idx[a] += 1;
            base += strides[a];
            if idx[a] < outer_shape[a] {
                break;
            }
            base -= idx[a] * strides[a];
            idx[a] = 0;
        }
    }
}

/// Strides that read an array of shape `from` as if it had shape `to` (NumPy broadcasting: missing
/// leading axes and size-1 axes get stride 0).
pub fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<usize> {
    let own = strides(from);
    let lead = to.len() - from.len();
    (0..to.len())
        .map(|a| match a.checked_sub(lead) {
            Some(i) if from[i] != 1 => own[i],
            _ => 0,
        })
        .collect()
}

/// `x` of shape `from` broadcast to `to`; borrowed when nothing changes.
pub fn broadcast<'a, E: Copy>(x: &'a [E], from: &[usize], to: &[usize]) -> Cow<'a, [E]> {
    if from == to {
        Cow::Borrowed(x)
    } else {
        Cow::Owned(gather(x, 0, &broadcast_strides(from, to), to))
    }
}

// ---- elementwise ----

/// An elementwise unary op over a tensor.
pub fn unary<T: Float>(op: UnaryOp, x: &[T]) -> Vec<T> {
    x.iter().map(|&v| op.eval(v)).collect()
}

/// An elementwise binary op with NumPy broadcasting of `a` and `b` to `out`.
pub fn binary<T: Float>(
    op: BinaryOp,
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    out: &[usize],
) -> Vec<T> {
    let (a, b) = (broadcast(a, a_shape, out), broadcast(b, b_shape, out));
    a.iter().zip(b.iter()).map(|(&x, &y)| op.eval(x, y)).collect()
}

/// `where(cond, a, b)`, all three broadcast to `out`; a condition of either dtype is true where
/// it is nonzero (a NaN condition counts as true).
pub fn select<T: Float>(
    cond: Val<T>,
    cond_shape: &[usize],
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    out: &[usize],
) -> Vec<T> {
    let truth: Vec<bool> = match cond {
        Val::F(c) => broadcast(c, cond_shape, out).iter().map(|&v| v != T::zero()).collect(),
        Val::I(c) => broadcast(c, cond_shape, out).iter().map(|&v| v != 0).collect(),
    };
    let (a, b) = (broadcast(a, a_shape, out), broadcast(b, b_shape, out));
    truth.iter().zip(a.iter().zip(b.iter())).map(|(&t, (&x, &y))| if t { x } else { y }).collect()
}

// ---- reductions ----

/// Reduce `x` over the sorted `axes`. The output is the kept axes in order (with or without
/// size-1 placeholders, which does not change the element order). Each output element folds its
/// inputs in row-major order of the reduced axes: sum from 0 upward, mean is that sum divided by
/// the count, max propagates NaN.
pub fn reduce<T: Float>(op: ReduceOp, x: &[T], shape: &[usize], axes: &[usize]) -> Vec<T> {
    // Move the reduced axes to the back, then fold each contiguous group.
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let group: usize = axes.iter().map(|&a| shape[a]).product();
    let n_out: usize = kept.iter().map(|&a| shape[a]).product();
    if group == 0 {
        // Sum over nothing is 0; mean is 0/0; max over an empty axis is refused by shape rules.
        let v = match op {
            ReduceOp::Mean => T::from_f64(f64::NAN),
            _ => T::zero(),
        };
        return vec![v; n_out];
    }
    let moved = permute(x, shape, &perm);
    moved
        .chunks(group)
        .map(|g| match op {
            ReduceOp::Sum => sum(g),
            ReduceOp::Mean => mean(g),
            ReduceOp::Max => g[1..].iter().fold(g[0], |m, &v| m.max_nan(v)),
        })
        .collect()
}

/// Σ x in index order, starting from 0, added in f64 and rounded once: in f32, a long sum
/// loses what each addend falls below the total's last bit (2^24 ones summed to 16,777,216,
/// a million-class softmax row to 1.004).
pub fn sum<T: Float>(x: &[T]) -> T {
    T::from_f64(sum_f64(x))
}

/// The mean of `x`, summed in f64 as [`sum`] and divided there before rounding: a row of
/// 3e38s has a mean f32 holds and a sum it does not (rounded first, the mean was infinite and
/// a LayerNorm of the row NaN).
pub fn mean<T: Float>(x: &[T]) -> T {
    T::from_f64(sum_f64(x) / x.len() as f64)
}

/// Σ x in index order, in f64.
fn sum_f64<T: Float>(x: &[T]) -> f64 {
    let mut s = 0.0f64;
    for &v in x {
        s += v.to_f64();
    }
    s
}

// ---- shape ----

/// Output axis i is input axis `perm[i]`.
pub fn permute<E: Copy>(x: &[E], shape: &[usize], perm: &[usize]) -> Vec<E> {
    let own = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let st: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
    gather(x, 0, &st, &out_shape)
}

/// Elements `start..end` along `axis`.
pub fn slice<E: Copy>(x: &[E], shape: &[usize], axis: usize, start: usize, end: usize) -> Vec<E> {
    let st = strides(shape);
    let mut out_shape = shape.to_vec();
    out_shape[axis] = end - start;
    gather(x, start * st[axis], &st, &out_shape)
}

/// Join along `axis`: for each index of the leading axes, the rows of each input in turn.
pub fn concat<E: Copy>(xs: &[&[E]], shapes: &[&[usize]], axis: usize) -> Vec<E> {
    let outer: usize = shapes[0][..axis].iter().product();
    let chunks: Vec<usize> = shapes.iter().map(|s| s[axis..].iter().product()).collect();
    let mut out = Vec::with_capacity(chunks.iter().sum::<usize>() * outer);
    for o in 0..outer {
        for (x, &c) in xs.iter().zip(&chunks) {
            out.extend_from_slice(&x[o * c..(o + 1) * c]);
        }
    }
    out
}

fn concat_vals<T: Float>(
    ins: &[Val<T>],
    shapes: &[&[usize]],
    axis: usize,
    name: &str,
) -> Result<Buf<T>> {
    let mixed = || err!(Invariant, "{name}: inputs of different dtypes");
    match ins[0] {
        Val::F(_) => {
            let xs = ins
                .iter()
                .map(|v| match v {
                    Val::F(x) => Ok(*x),
                    Val::I(_) => Err(mixed()),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Buf::F(concat(&xs, shapes, axis)))
        }
        Val::I(_) => {
            let xs = ins
                .iter()
                .map(|v| match v {
                    Val::I(x) => Ok(*x),
                    Val::F(_) => Err(mixed()),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Buf::I(concat(&xs, shapes, axis)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_reads_strided_views() {
        let x: Vec<i32> = (0..6).collect(); // [2, 3]
        assert_eq!(permute(&x, &[2, 3], &[1, 0]), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(slice(&x, &[2, 3], 1, 1, 3), vec![1, 2, 4, 5]);
        assert_eq!(gather(&[7], 0, &[], &[]), vec![7]);
        assert_eq!(broadcast(&[1, 2], &[2, 1], &[2, 3]).into_owned(), vec![1, 1, 1, 2, 2, 2]);
        assert!(gather::<i32>(&[], 0, &[1, 1], &[0, 4]).is_empty());
    }

    #[test]
    fn inconsistent_node_is_an_error_not_a_panic() {
        use crate::graph::NodeId;
        let node = Node {
            op: Op::MatMul,
            inputs: vec![NodeId(0), NodeId(1)],
            shape: vec![2, 2],
            dtype: DType::F32,
            span: Default::default(),
        };
        let x = [1.0f64; 3];
        let ins = [Val::F(&x[..]), Val::F(&x[..])];
        let e = eval(&node, &ins, &[&[3], &[3]], RunOptions::default()).unwrap_err();
        assert_eq!(e.message, "matmul: operands need at least 2 dimensions, got [3] @ [3]");
        let e = eval(&node, &ins, &[&[1, 3], &[3, 1]], RunOptions::default()).unwrap_err();
        assert_eq!(e.message, "matmul: node is f32[2, 2] but its inputs give f32[1, 1]");
    }

    #[test]
    fn broadcast_strides_zero_for_size_one_and_missing_axes() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        assert_eq!(broadcast_strides(&[], &[2]), vec![0]);
    }
}
