//! Strided views: a value that is a layout op (`slice`, `permute`, `reshape`, chained) of a
//! materialized value, read in place through index arithmetic instead of being copied.
//!
//! A [`View`] gives the element of a node at coordinates `c` as element
//! `offset + Σ c[i]·strides[i]` of the buffer of the value it views. Fusion makes a layout node
//! such a view where every kernel that reads it reads strides: generated kernels (elementwise,
//! reduction prologues, concats) through their index expressions, matmuls through their
//! operands' batch, row and column strides ([`View::matrix`]), the attention kernels through
//! their operands' layouts; the node then has no kernel and no buffer of its own.

use crate::graph::{Graph, NodeId, Op, UnaryOp};
use crate::tensor::DType;

/// Where the elements of a viewed node are in its owner's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// Element of the buffer at coordinates zero.
    pub offset: usize,
    /// Elements between neighbours along each axis of the node's shape.
    pub strides: Vec<usize>,
}

impl View {
    /// A row-major value of `shape` from its buffer's start.
    pub fn contiguous(shape: &[usize]) -> View {
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        View { offset: 0, strides }
    }

    /// Whether this is the row-major layout of `shape` from the buffer's start (a plain alias).
    pub fn is_contiguous(&self, shape: &[usize]) -> bool {
        let c = View::contiguous(shape);
        self.offset == 0 && shape.iter().zip(self.strides.iter().zip(&c.strides)).all(|(&d, (a, b))| d == 1 || a == b)
    }

    /// The view of `shape` (`[batch.., rows, cols]`) as one matrix per batch: `[batch stride,
    /// row stride, column stride]`, when its batch axes are one run of memory (a single stride
    /// steps through them; 0 for a single batch). `None` for fewer than two axes.
    pub fn matrix(&self, shape: &[usize]) -> Option<[usize; 3]> {
        let r = shape.len();
        if r < 2 || self.strides.len() != r {
            return None;
        }
        let batch: Vec<(usize, usize)> =
            (0..r - 2).filter(|&i| shape[i] != 1).map(|i| (shape[i], self.strides[i])).collect();
        if batch.windows(2).any(|w| w[0].1 != w[1].0 * w[1].1) {
            return None;
        }
        let batch_stride = batch.last().map_or(0, |b| b.1);
        Some([batch_stride, self.strides[r - 2], self.strides[r - 1]])
    }

    /// The view of layout op `id` given the view of its input, `None` when the op is not a
    /// layout op or its result cannot be addressed by strides (a reshape across axes that are
    /// not contiguous in memory, or a value with no elements).
    pub fn through(&self, g: &Graph, id: NodeId) -> Option<View> {
        let node = g.node(id);
        let from = g.shape(*node.inputs.first()?);
        if from.contains(&0) {
            return None;
        }
        match &node.op {
            Op::Slice { axis, start, .. } => Some(View {
                offset: self.offset + start * self.strides.get(*axis)?,
                strides: self.strides.clone(),
            }),
            Op::Permute { perm } => Some(View {
                offset: self.offset,
                strides: perm.iter().map(|&p| self.strides.get(p).copied()).collect::<Option<_>>()?,
            }),
            Op::Reshape => Some(View {
                offset: self.offset,
                strides: reshape_strides(from, &self.strides, &node.shape)?,
            }),
            _ => None,
        }
    }

    /// [`View::through`] backwards: the view of layout op `id`'s input, given the view of `id`
    /// (for a value written in place of a later one: `plan::fuse`'s concats written by their
    /// inputs' kernels). A slice's input gets the slice's strides and the offset of its first
    /// element; a size-1 axis's stride is free (0), so a caller combining several slices of one
    /// value sets it. `None` when the op is not a layout op, the input's layout cannot be
    /// addressed by strides, or it would start before the buffer.
    pub fn before(&self, g: &Graph, id: NodeId) -> Option<View> {
        let node = g.node(id);
        let from = g.shape(*node.inputs.first()?);
        if from.contains(&0) {
            return None;
        }
        match &node.op {
            Op::Slice { axis, start, .. } => Some(View {
                offset: self.offset.checked_sub(start * self.strides.get(*axis)?)?,
                strides: self.strides.clone(),
            }),
            Op::Permute { perm } => {
                let mut strides = vec![0; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    *strides.get_mut(p)? = *self.strides.get(k)?;
                }
                Some(View { offset: self.offset, strides })
            }
            Op::Reshape => Some(View {
                offset: self.offset,
                strides: reshape_strides(&node.shape, &self.strides, from)?,
            }),
            _ => None,
        }
    }
}

/// The strides of a reshape of a `from`-shaped value with `strides` to `to`, when every run of
/// axes that the reshape merges or splits is contiguous in memory (NumPy's no-copy reshape).
fn reshape_strides(from: &[usize], strides: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    // Axes of size 1 take no part: their strides are free.
    let old: Vec<(usize, usize)> =
        from.iter().zip(strides).filter(|(&d, _)| d != 1).map(|(&d, &s)| (d, s)).collect();
    let new: Vec<usize> = (0..to.len()).filter(|&i| to[i] != 1).collect();
    let mut out = vec![0; to.len()];
    let (mut oi, mut ni) = (0, 0);
    while ni < new.len() && oi < old.len() {
        let (mut oj, mut nj) = (oi + 1, ni + 1);
        let (mut op, mut np) = (old[oi].0, to[new[ni]]);
        while op != np {
            if np < op {
                np *= to[*new.get(nj)?];
                nj += 1;
            } else {
                op *= old.get(oj)?.0;
                oj += 1;
            }
        }
        // The old axes oi..oj must be one contiguous run.
        if (oi..oj - 1).any(|k| old[k + 1].0 * old[k + 1].1 != old[k].1) {
            return None;
        }
        let mut stride = old[oj - 1].1;
        for k in (ni..nj).rev() {
            out[new[k]] = stride;
            stride *= to[new[k]];
        }
        (oi, ni) = (oj, nj);
    }
    (oi == old.len() && ni == new.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::{reshape_strides, View};

    #[test]
    fn matrices_of_views_collapse_their_batch_axes() {
        let check = |strides: &[usize], shape: &[usize], want: Option<[usize; 3]>| {
            let v = View { offset: 0, strides: strides.to_vec() };
            assert_eq!(v.matrix(shape), want, "{strides:?} {shape:?}");
        };
        // A transpose of the last two axes; batches one run of memory.
        check(&[6, 1, 3], &[4, 3, 2], Some([6, 1, 3]));
        check(&[24, 6, 1, 3], &[2, 4, 3, 2], Some([6, 1, 3]));
        // Heads of a [B, T, H, Dh] value: B and H are not one run.
        check(&[512, 32, 256, 1], &[2, 8, 16, 32], None);
        // Size-1 batch axes take no part; no batch at all.
        check(&[0, 5, 1], &[1, 4, 5], Some([0, 5, 1]));
        check(&[7], &[3], None);
    }

    /// `before` undoes `through`: the heads of a gradient written into the third of a
    /// `[B, T, 3C]` buffer (q's place in a fused qkv projection) through the permute and the
    /// reshape that merged them.
    #[test]
    fn a_view_walked_back_through_layout_ops_gives_the_input_its_place() {
        use crate::graph::Graph;
        use crate::tensor::DType;
        let (b, t, h, d) = (2, 5, 3, 4);
        let c = h * d;
        let mut g = Graph::new();
        let dq = g.input("dq", &[b, h, t, d], DType::F32).unwrap();
        let p = g.permute(dq, &[0, 2, 1, 3]).unwrap();
        let r = g.reshape(p, &[b, t, c]).unwrap();
        // Column block 1 of a row-major [B, T, 3C].
        let top = View { offset: c, strides: vec![t * 3 * c, 3 * c, 1] };
        let below = top.before(&g, r).unwrap();
        assert_eq!(below, View { offset: c, strides: vec![t * 3 * c, 3 * c, d, 1] });
        let base = below.before(&g, p).unwrap();
        assert_eq!(base, View { offset: c, strides: vec![t * 3 * c, d, 3 * c, 1] });
        assert_eq!(base.through(&g, p).unwrap().through(&g, r).unwrap(), top);
        // A slice's input starts before it; a transposed pair cannot be merged back.
        let x = g.input("x", &[6, 4], DType::F32).unwrap();
        let s = g.slice(x, 0, 2, 5).unwrap();
        let v = View { offset: 40, strides: vec![10, 1] };
        assert_eq!(v.before(&g, s), Some(View { offset: 20, strides: vec![10, 1] }));
        assert_eq!(View { offset: 10, strides: vec![10, 1] }.before(&g, s), None);
        // A [12] split into [3, 4] whose view is transposed is no run of memory.
        let flat = g.input("flat", &[12], DType::F32).unwrap();
        let split = g.reshape(flat, &[3, 4]).unwrap();
        assert_eq!(View { offset: 0, strides: vec![4, 1] }.before(&g, split), Some(View { offset: 0, strides: vec![1] }));
        assert_eq!(View { offset: 0, strides: vec![1, 3] }.before(&g, split), None);
    }

    #[test]
    fn reshapes_of_contiguous_runs_keep_strides() {
        let check = |from: &[usize], strides: &[usize], to: &[usize], want: Option<&[usize]>| {
            assert_eq!(reshape_strides(from, strides, to).as_deref(), want, "{from:?} {strides:?} -> {to:?}");
        };
        // Split the last axis of a slice of a wider row: the row's stride stays.
        check(&[2, 3, 4], &[36, 12, 1], &[2, 3, 2, 2], Some(&[36, 12, 2, 1]));
        // Merge two contiguous axes; size-1 axes anywhere.
        check(&[2, 3, 4], &[12, 4, 1], &[6, 1, 4], Some(&[4, 0, 1]));
        check(&[1, 6], &[99, 1], &[2, 3], Some(&[3, 1]));
        // A transposed pair cannot be merged.
        check(&[3, 4], &[1, 3], &[12], None);
        // Merging a sliced row with the next axis is not contiguous either.
        check(&[2, 4], &[12, 1], &[8], None);
    }
}

/// A chain of unary and layout ops over a stored value, read in place: an operand prologue
/// (`fuse::prologue_base` decides where, `codegen::prologue` computes it).
#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    /// The stored value under the chain.
    pub base: NodeId,
    /// Where the chain's elements are in the buffer `base` lives in.
    pub view: View,
    /// A LayerNorm of `base` over its last axis, the chain's first op: its stats, weight and
    /// bias (stored values).
    pub norm: Option<[NodeId; 3]>,
    /// The chain's unary ops, from `base` (or its LayerNorm) up.
    pub ops: Vec<UnaryOp>,
}

/// The chain from `top` down to the first node below it that `stored` says has a buffer
/// (`top` itself is walked whatever `stored` says of it): unary ops and `reshape`, `permute`,
/// `slice`, every node and the base f32; and as the op just above the base, a `layer_norm`
/// whose stats, weight and bias are stored, of a base stored row-major from its buffer's
/// start (the LayerNorm then reads element `e` of the buffer as row `e / d`, column `e % d`).
/// `view_of` gives a stored value's view in its owner's buffer (`None`: row-major from its
/// start). `None` when the chain meets another op or dtype, or its layout ops cannot be
/// addressed by strides.
pub fn chain_below(
    g: &Graph,
    top: NodeId,
    stored: &dyn Fn(NodeId) -> bool,
    view_of: &dyn Fn(NodeId) -> Option<View>,
) -> Option<Chain> {
    let mut nodes = Vec::new();
    let mut x = top;
    while x == top || !stored(x) {
        let node = g.node(x);
        let walked = matches!(
            node.op,
            Op::Unary(_) | Op::Reshape | Op::Permute { .. } | Op::Slice { .. } | Op::LayerNorm
        );
        if !walked || node.dtype != DType::F32 {
            return None;
        }
        nodes.push(x);
        x = *node.inputs.first()?;
    }
    if g.dtype(x) != DType::F32 {
        return None;
    }
    let base_view = view_of(x);
    let mut view = base_view.clone().unwrap_or_else(|| View::contiguous(g.shape(x)));
    let mut ops = Vec::new();
    let mut norm = None;
    for (at, &c) in nodes.iter().rev().enumerate() {
        let node = g.node(c);
        match node.op {
            Op::Unary(u) => ops.push(u),
            Op::LayerNorm => {
                let params = [node.inputs[1], node.inputs[2], node.inputs[3]];
                let fits = at == 0
                    && base_view.is_none()
                    && params.iter().all(|&p| stored(p) && g.dtype(p) == DType::F32);
                if !fits {
                    return None;
                }
                norm = Some(params);
            }
            _ => view = view.through(g, c)?,
        }
    }
    Some(Chain { base: x, view, norm, ops })
}
