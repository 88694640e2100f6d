//! The builder: one method per op on [`Graph`]. Each runs shape inference before the node
//! exists, so a graph built through these methods is well-shaped by construction, and every
//! mistake is an `Err` that names the op and the shapes, positioned at the current span.

use super::ir::{BinaryOp, Graph, Init, NodeId, Op, ReduceOp, UnaryOp};
use super::shape::{attention_qkv, broadcasts_to, infer};
use crate::err;
use crate::error::{Error, Result};
use crate::tensor::{checked_numel, fmt_shape, DType};

impl Graph {
    /// Add a node after checking it; `target` is used by ops that carry their own shape.
    pub fn add_node(&mut self, op: Op, inputs: &[NodeId], target: &[usize]) -> Result<NodeId> {
        self.node_typed(op, inputs, target, DType::F32)
    }

    fn node_typed(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        target: &[usize],
        dtype: DType,
    ) -> Result<NodeId> {
        if let Some(bad) = inputs.iter().find(|id| id.index() >= self.nodes.len()) {
            return Err(err!(
                Invariant,
                "{}: input {} is not a node of this graph",
                op.name(),
                bad.0
            ));
        }
        let ins: Vec<(&[usize], DType)> = inputs
            .iter()
            .map(|&i| (self.nodes[i.index()].shape.as_slice(), self.nodes[i.index()].dtype))
            .collect();
        let (shape, dtype) = infer(&op, &ins, target, dtype).map_err(|e| e.at(self.span))?;
        checked_numel(&shape).map_err(|e| e.at(self.span))?;
        Ok(self.push(op, inputs.to_vec(), shape, dtype))
    }

    /// An error unless every id names a node of this graph (ids from another graph, say).
    pub(super) fn check_ids(&self, op: &str, ids: &[NodeId]) -> Result<()> {
        match ids.iter().find(|id| id.index() >= self.nodes.len()) {
            Some(bad) => {
                Err(err!(Invariant, "{op}: input {} is not a node of this graph", bad.0)
                    .at(self.span))
            }
            None => Ok(()),
        }
    }

    fn check_new_name(&self, kind: &str, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(err!(Name, "{kind} name must not be empty").at(self.span));
        }
        let Some(existing) = self.named(name) else { return Ok(()) };
        let node = self.node(existing);
        let theirs = match node.op {
            Op::Input { .. } => "input",
            Op::Parameter { .. } => "parameter",
            _ => "state",
        };
        // A name rumus gives its own values, taken by the model: say which and what to do, at
        // the model's declaration (the new node is rumus's own, made after the model's).
        if name == crate::session::TARGET_INPUT || name.starts_with("optim.") {
            let e = err!(
                Name,
                "the model's {theirs} `{name}` takes a name rumus gives its own {kind} (`{}`: the labels a loss reads; `optim.`: the optimizer's state): rename it",
                crate::session::TARGET_INPUT
            );
            return Err(e.at(if node.span.is_none() { self.span } else { node.span }));
        }
        Err(err!(Name, "duplicate name `{name}`: another input, parameter or state has it")
            .at(self.span))
    }

    // ---- sources ----

    /// A value the host feeds at every step.
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<NodeId> {
        self.check_new_name("input", name)?;
        self.node_typed(Op::Input { name: name.to_string() }, &[], shape, dtype)
    }

    /// A trainable value with an initializer.
    pub fn parameter(&mut self, name: &str, shape: &[usize], init: Init) -> Result<NodeId> {
        self.check_new_name("parameter", name)?;
        check_init(&init, shape).map_err(|e| e.at(self.span))?;
        self.add_node(Op::Parameter { name: name.to_string(), init }, &[], shape)
    }

    /// A persistent value that is not trained (optimizer state).
    pub fn state(&mut self, name: &str, shape: &[usize], init: Init) -> Result<NodeId> {
        self.check_new_name("state", name)?;
        check_init(&init, shape).map_err(|e| e.at(self.span))?;
        self.add_node(Op::State { name: name.to_string(), init }, &[], shape)
    }

    /// A scalar constant.
    pub fn constant(&mut self, value: f32) -> NodeId {
        self.push(Op::Constant { value }, vec![], vec![], DType::F32)
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(&mut self, shape: &[usize], value: f32) -> Result<NodeId> {
        self.add_node(Op::Constant { value }, &[], shape)
    }

    // ---- elementwise ----

    /// `op(x)`, elementwise.
    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        self.add_node(Op::Unary(op), &[x], &[])
    }

    /// `op(a, b)`, elementwise with NumPy broadcasting.
    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.add_node(Op::Binary(op), &[a, b], &[])
    }

    /// `a + b`, broadcasting.
    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Add, a, b)
    }
    /// `a - b`, broadcasting.
    pub fn sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// `a * b`, broadcasting.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// `a / b`, broadcasting.
    pub fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Div, a, b)
    }
    /// `a` to the power `b`, broadcasting.
    pub fn pow(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Pow, a, b)
    }
    /// The larger of `a` and `b`, elementwise, broadcasting.
    pub fn maximum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Maximum, a, b)
    }
    /// The smaller of `a` and `b`, elementwise, broadcasting.
    pub fn minimum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Minimum, a, b)
    }

    /// `a * s` for a scalar `s`.
    pub fn scale(&mut self, a: NodeId, s: f32) -> Result<NodeId> {
        let c = self.constant(s);
        self.mul(a, c)
    }

    /// `where(cond, a, b)`.
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.add_node(Op::Where, &[cond, a, b], &[])
    }

    /// `-x`.
    pub fn neg(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Neg, x)
    }
    /// `eˣ`.
    pub fn exp(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Exp, x)
    }
    /// Natural logarithm.
    pub fn log(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Log, x)
    }
    /// Square root.
    pub fn sqrt(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Sqrt, x)
    }
    /// `x²`.
    pub fn square(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Square, x)
    }
    /// `max(x, 0)`.
    pub fn relu(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Relu, x)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Tanh, x)
    }
    /// GELU, tanh approximation (GPT-2's).
    pub fn gelu_tanh(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::GeluTanh, x)
    }

    // ---- reductions ----

    /// Reduce over `axes` (any order; duplicates are an error).
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        axes: &[usize],
        keepdim: bool,
    ) -> Result<NodeId> {
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(err!(Shape, "{}: axis listed twice in {axes:?}", op.name()).at(self.span));
        }
        self.add_node(Op::Reduce { op, axes: sorted, keepdim }, &[x], &[])
    }

    /// Sum over `axes`; `keepdim` keeps them as size-1 axes.
    pub fn sum(&mut self, x: NodeId, axes: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Sum, x, axes, keepdim)
    }
    /// Mean over `axes`; `keepdim` keeps them as size-1 axes.
    pub fn mean(&mut self, x: NodeId, axes: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Mean, x, axes, keepdim)
    }
    /// Largest element over `axes`; `keepdim` keeps them as size-1 axes.
    pub fn max(&mut self, x: NodeId, axes: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Max, x, axes, keepdim)
    }

    /// Sum over every axis: a scalar.
    pub fn sum_all(&mut self, x: NodeId) -> Result<NodeId> {
        self.check_ids("sum", &[x])?;
        let axes: Vec<usize> = (0..self.shape(x).len()).collect();
        self.sum(x, &axes, false)
    }

    /// Sum `x` down to `shape`, which `shape` must broadcast to: the adjoint of broadcasting.
    pub fn sum_to(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        self.check_ids("sum_to", &[x])?;
        let xs = self.shape(x).to_vec();
        if xs == shape {
            return Ok(x);
        }
        if !broadcasts_to(shape, &xs) {
            return Err(err!(
                Shape,
                "sum_to: {} does not broadcast to {}",
                fmt_shape(shape),
                fmt_shape(&xs)
            )
            .at(self.span));
        }
        let lead = xs.len() - shape.len();
        let axes: Vec<usize> =
            (0..xs.len()).filter(|&i| i < lead || (shape[i - lead] == 1 && xs[i] != 1)).collect();
        let summed = if axes.is_empty() { x } else { self.sum(x, &axes, true)? };
        self.reshape(summed, shape)
    }

    // ---- shape ----

    /// The same elements in `shape`, which must have as many; `x` itself when the shape is
    /// unchanged.
    pub fn reshape(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        self.check_ids("reshape", &[x])?;
        if self.shape(x) == shape {
            return Ok(x);
        }
        let dtype = self.dtype(x);
        self.node_typed(Op::Reshape, &[x], shape, dtype)
    }

    /// Reorder axes: output axis i is input axis `perm[i]` (`perm` a permutation of the axes).
    pub fn permute(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId> {
        self.add_node(Op::Permute { perm: perm.to_vec() }, &[x], &[])
    }

    /// Swap two axes.
    pub fn transpose(&mut self, x: NodeId, a: usize, b: usize) -> Result<NodeId> {
        self.check_ids("transpose", &[x])?;
        let rank = self.shape(x).len();
        if a >= rank || b >= rank {
            return Err(err!(
                Shape,
                "transpose: axes {a} and {b} out of range for {}",
                fmt_shape(self.shape(x))
            )
            .at(self.span));
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        self.permute(x, &perm)
    }

    /// Broadcast `x` to `shape` (NumPy rules); `x` itself when the shape is unchanged.
    pub fn broadcast_to(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        self.check_ids("broadcast_to", &[x])?;
        if self.shape(x) == shape {
            return Ok(x);
        }
        let dtype = self.dtype(x);
        self.node_typed(Op::BroadcastTo, &[x], shape, dtype)
    }

    /// Elements `start..end` along `axis`.
    pub fn slice(&mut self, x: NodeId, axis: usize, start: usize, end: usize) -> Result<NodeId> {
        self.add_node(Op::Slice { axis, start, end }, &[x], &[])
    }

    /// Join `xs` along `axis` (other dimensions equal); one input is returned as is, none is an
    /// error.
    pub fn concat(&mut self, xs: &[NodeId], axis: usize) -> Result<NodeId> {
        if xs.is_empty() {
            return Err(err!(Shape, "concat: needs at least one input").at(self.span));
        }
        if xs.len() == 1 {
            return Ok(xs[0]);
        }
        self.add_node(Op::Concat { axis }, xs, &[])
    }

    // ---- linear algebra ----

    /// Matrix product with broadcast batch dimensions. `[..., M, K] @ [K, N]` is lowered as one
    /// 2-D product over the flattened rows, which is what the kernels and the backward pass want.
    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.check_ids("matmul", &[a, b])?;
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa.len() > 2 && sb.len() == 2 && sa[sa.len() - 1] == sb[0] {
            let rows = sa[..sa.len() - 1].iter().product();
            let a2 = self.reshape(a, &[rows, sb[0]])?;
            let c2 = self.add_node(Op::MatMul, &[a2, b], &[])?;
            let mut out = sa[..sa.len() - 1].to_vec();
            out.push(sb[1]);
            return self.reshape(c2, &out);
        }
        self.add_node(Op::MatMul, &[a, b], &[])
    }

    // ---- normalization and attention ----

    /// Softmax over the last axis.
    pub fn softmax(&mut self, x: NodeId) -> Result<NodeId> {
        self.add_node(Op::Softmax, &[x], &[])
    }

    /// Log-softmax over the last axis.
    pub fn log_softmax(&mut self, x: NodeId) -> Result<NodeId> {
        self.add_node(Op::LogSoftmax, &[x], &[])
    }

    /// Mask attention scores `[..., T, S]` so position i attends to positions <= i.
    pub fn causal_mask(&mut self, x: NodeId) -> Result<NodeId> {
        self.add_node(Op::CausalMask { fill: f32::NEG_INFINITY }, &[x], &[])
    }

    /// LayerNorm over the last axis: computes the per-row stats node, then the normalized output.
    pub fn layer_norm(
        &mut self,
        x: NodeId,
        weight: NodeId,
        bias: NodeId,
        eps: f32,
    ) -> Result<NodeId> {
        let eps = crate::num::eps_f32(eps)
            .map_err(|m| err!(InvalidArgument, "layer_norm: `eps` {m}").at(self.span))?;
        self.check_ids("layer_norm", &[x, weight, bias])?;
        let d = self.shape(x).last().copied();
        if d.is_none() || [weight, bias].iter().any(|&p| self.shape(p) != [d.unwrap_or(0)]) {
            let shapes: Vec<String> =
                [x, weight, bias].iter().map(|&n| fmt_shape(self.shape(n))).collect();
            return Err(err!(
                Shape,
                "layer_norm: weight and bias must be [{}], the last axis of x (shapes {})",
                d.unwrap_or(0),
                shapes.join(", ")
            )
            .at(self.span));
        }
        let stats = self.add_node(Op::LayerNormStats { eps }, &[x], &[])?;
        self.add_node(Op::LayerNorm, &[x, stats, weight, bias], &[])
    }

    /// Causal attention of `q`, `k`, `v` `[B, H, T, Dh]` with scale `1/sqrt(Dh)`: computes the
    /// per-row log-sum-exp node, then the output `[B, H, T, Dh]`.
    pub fn attention(&mut self, q: NodeId, k: NodeId, v: NodeId) -> Result<NodeId> {
        self.check_ids("attention", &[q, k, v])?;
        let ins: Vec<(&[usize], DType)> =
            [q, k, v].iter().map(|&n| (self.shape(n), self.dtype(n))).collect();
        attention_qkv(&Op::Attention, &ins).map_err(|e| e.at(self.span))?;
        let stats = self.add_node(Op::AttentionStats, &[q, k], &[])?;
        self.add_node(Op::Attention, &[q, k, v, stats], &[])
    }

    // ---- embedding, losses, regularization ----

    /// Rows of `table [V, D]` gathered by the i32 indices `idx [...]`: `[..., D]`.
    pub fn embedding(&mut self, table: NodeId, idx: NodeId) -> Result<NodeId> {
        self.add_node(Op::Embedding, &[table, idx], &[])
    }

    /// Mean cross-entropy of `logits [..., C]` against i32 `labels [...]`.
    pub fn cross_entropy(
        &mut self,
        logits: NodeId,
        labels: NodeId,
        ignore_index: Option<i32>,
    ) -> Result<NodeId> {
        self.add_node(Op::CrossEntropy { ignore_index }, &[logits, labels], &[])
    }

    /// Mean squared error: mean((a - b)²) over every element.
    pub fn mse(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.check_ids("mse", &[a, b])?;
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa != sb {
            return Err(err!(
                Shape,
                "mse: prediction {} and target {} differ",
                fmt_shape(&sa),
                fmt_shape(&sb)
            )
            .at(self.span));
        }
        let d = self.sub(a, b)?;
        let d2 = self.square(d)?;
        let axes: Vec<usize> = (0..sa.len()).collect();
        self.mean(d2, &axes, false)
    }

    /// Zero each element with probability `p` and scale the rest by 1/(1-p) while training
    /// (identity otherwise); the mask is a hash of the dropout's seed, the step and the
    /// element's index. Each dropout built draws its own mask, as each call of PyTorch's
    /// does: the first built with `seed` has that seed, the k-th one `seed` mixed with k (a
    /// dropout inside `repeat`, or in a block called twice, dropped the same elements in every
    /// layer). A graph built the same way has the same seeds.
    pub fn dropout(&mut self, x: NodeId, p: f32, seed: u64) -> Result<NodeId> {
        let built = self.dropouts.get(&seed).copied().unwrap_or(0);
        let stream = match built {
            0 => seed,
            k => crate::rng::splitmix64(seed ^ crate::rng::splitmix64(k)),
        };
        let id = self.add_node(Op::Dropout { p, seed: stream }, &[x], &[])?;
        self.dropouts.insert(seed, built + 1);
        Ok(id)
    }
}

/// Initializers that need fans require a weight of rank >= 2 (fan_in = shape[..-1] product for
/// `[in, out]` weights) or rank 1 (fan = its length); ranges must be ordered and finite.
fn check_init(init: &Init, shape: &[usize]) -> Result<()> {
    match *init {
        Init::Normal { mean, std } if !(mean.is_finite() && std.is_finite() && std >= 0.0) => {
            Err(err!(
                Shape,
                "normal initializer needs a finite mean and std >= 0, got normal({mean}, {std})"
            ))
        }
        Init::Normal { mean, std }
            if mean.abs() as f64 + crate::rng::NORMAL_BOUND * std as f64 > f32::MAX as f64 =>
        {
            Err(err!(
                Shape,
                "normal initializer normal({}, {}) can draw values beyond f32's range (mean ± {:.2} · std must stay within about ±3.4e38, or a parameter starts infinite): use a smaller mean or std",
                crate::num::show(mean),
                crate::num::show(std),
                crate::rng::NORMAL_BOUND
            ))
        }
        Init::Uniform { low, high } if !(low.is_finite() && high.is_finite() && low <= high) => {
            Err(err!(
                Shape,
                "uniform initializer needs finite low <= high, got uniform({low}, {high})"
            ))
        }
        Init::Xavier | Init::Kaiming if shape.is_empty() || shape.contains(&0) => {
            Err(Error::shape(format!(
                "{} initializer needs a non-empty weight with at least one axis, got {}",
                if *init == Init::Xavier { "xavier" } else { "kaiming" },
                fmt_shape(shape)
            )))
        }
        _ => Ok(()),
    }
}

/// (fan_in, fan_out) of a weight: `[in, out]` for matrices (leading axes multiply into fan_in),
/// the length for vectors.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [lead @ .., out] => (lead.iter().product(), *out),
    }
}
