//! The graph IR: an arena of nodes addressed by [`NodeId`] handles.
//!
//! A [`Graph`] is a static dataflow graph. Every node has an [`Op`], its inputs (always earlier
//! nodes, so the arena order is a topological order), a static shape, a dtype, and the [`Span`]
//! of the source expression it came from. A graph also names its outputs and lists its
//! *updates*: pairs (persistent value, new value) that the executor writes back after a step
//! (parameters after an optimizer update, optimizer moments, the step count).

pub use super::conv::Window;
use crate::error::Span;
use crate::tensor::DType;
use std::collections::BTreeMap;

pub use super::elementwise::{BinaryOp, UnaryOp};

/// Handle of a node in a [`Graph`]'s arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) u32);

impl NodeId {
    /// The node's position in the arena (its creation order).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a parameter or state value is initialized. Every random initializer is seeded from the
/// graph's seed and the value's name, so a value's initial contents do not depend on the order
/// values were declared in.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// Every element 0.
    Zeros,
    /// Every element 1.
    Ones,
    /// Every element the same value.
    Fill(f32),
    /// Normal distribution N(mean, std²).
    Normal {
        /// The mean.
        mean: f32,
        /// The standard deviation.
        std: f32,
    },
    /// Uniform distribution U(low, high).
    Uniform {
        /// The lower bound.
        low: f32,
        /// The upper bound.
        high: f32,
    },
    /// Glorot/Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)).
    Xavier,
    /// He/Kaiming normal for ReLU: N(0, 2 / fan_in).
    Kaiming,
}

/// Reductions over chosen axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The arithmetic mean.
    Mean,
    /// The largest element.
    Max,
}

/// The kind of computation an op is. Passes ask an op's class (or one of the predicates built on
/// it) rather than list ops, so a new op is placed once, in [`Op::class`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// No inputs: the values the host provides (inputs, parameters, state) and constants.
    Source,
    /// Each output element computed from the input elements at the same (broadcast) index: the
    /// elementwise table's unary and binary ops, `where`, and `causal_mask` and `dropout`, which
    /// also read the element's position, and `training_select`, which also reads the mode; or
    /// from a few input elements at remapped coordinates: `unfold` and `fold`.
    Elementwise,
    /// Folds axes: `sum`, `mean`, `max`.
    Reduce,
    /// `matmul`.
    MatMul,
    /// Moves elements without computing them: the views `reshape`, `permute`, `broadcast_to`,
    /// `slice`, and `concat`.
    Layout,
    /// Ops with a kernel of their own: softmax, log-softmax, layer norm and its gradients,
    /// attention and its gradients, embedding and cross-entropy, forward and backward.
    Special,
}

/// What a node computes. Ops whose result shape is not determined by their inputs carry it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // ---- sources ----
    /// A value fed by the host at every step.
    Input {
        /// The name the host feeds it by.
        name: String,
    },
    /// A trainable persistent value.
    Parameter {
        /// The dotted name (`fc1.weight`), as in checkpoints.
        name: String,
        /// How it is initialized.
        init: Init,
    },
    /// A persistent value that is not trained: optimizer moments, the step count.
    State {
        /// The dotted name (`optim.step`), as in checkpoints.
        name: String,
        /// How it is initialized.
        init: Init,
    },
    /// A tensor of the node's shape with every element `value`.
    Constant {
        /// The value of every element.
        value: f32,
    },

    // ---- elementwise ----
    /// A unary op of the elementwise table.
    Unary(UnaryOp),
    /// A binary op of the elementwise table, broadcasting (NumPy rules).
    Binary(BinaryOp),
    /// `where(cond, a, b)`: a where cond != 0, else b; broadcasting all three.
    Where,

    // ---- reductions ----
    /// Reduce over sorted, distinct `axes`; `keepdim` keeps them as size-1 axes.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The axes reduced, sorted and distinct.
        axes: Vec<usize>,
        /// Whether the reduced axes stay as size-1 axes.
        keepdim: bool,
    },

    // ---- shape ----
    /// Same elements, the node's shape.
    Reshape,
    /// Output axis i is input axis `perm[i]`.
    Permute {
        /// The input axis of each output axis.
        perm: Vec<usize>,
    },
    /// Broadcast to the node's shape (NumPy rules).
    BroadcastTo,
    /// Elements `start..end` along `axis`.
    Slice {
        /// The axis sliced.
        axis: usize,
        /// First index kept.
        start: usize,
        /// One past the last index kept.
        end: usize,
    },
    /// Join inputs along `axis`.
    Concat {
        /// The axis joined along.
        axis: usize,
    },

    // ---- linear algebra ----
    /// `[..., M, K] @ [..., K, N]`, batch dimensions broadcast.
    MatMul,

    // ---- normalization and attention ----
    /// Softmax over the last axis.
    Softmax,
    /// Log-softmax over the last axis.
    LogSoftmax,
    /// On `[..., T, S]` scores: element (i, j) with j > i + (S - T) becomes `fill`
    /// (forward: -inf; its gradient uses the same op with 0).
    CausalMask {
        /// The value masked elements become.
        fill: f32,
    },
    /// Per-row (last axis) mean and inverse standard deviation: `[..., D] -> [..., 2]`.
    LayerNormStats {
        /// Added to the variance before the square root.
        eps: f32,
    },
    /// `(x [..., D], stats [..., 2], weight [D], bias [D])`: (x - mean) · rstd · weight + bias.
    LayerNorm,
    /// `(x, stats, weight, dy) -> dx`, the full input gradient of `LayerNorm` (through the stats).
    LayerNormGradInput,
    /// `(x, stats, dy) -> [2, D]`: row 0 is dweight = Σ_rows dy · xhat, row 1 is
    /// dbias = Σ_rows dy (one pass computes both).
    LayerNormGradWeight,

    /// `(q, k) -> [B, H, T]`: per query row, the log-sum-exp of its causal scores
    /// `q_i·k_j / sqrt(Dh)` over the keys `j <= i` (q, k `[B, H, T, Dh]`). Differentiated together
    /// with the `attention` that consumes it.
    AttentionStats,
    /// `(q, k, v, stats) -> [B, H, T, Dh]`: causal attention `softmax(q kᵀ / sqrt(Dh)) v`, the
    /// probabilities `e^(s_ij − stats_i)` for `j <= i`.
    Attention,
    /// `(q, k, v, stats, dy, y) -> [2, B, H, T, Dh]`: dk (row 0) and dv (row 1) of
    /// `attention`, whose output is `y`; each query row's `delta = Σ_d dy·y`
    /// (FlashAttention-2's `D`) is computed inside.
    AttentionGradKv,
    /// `(q, k, v, stats, dy, y) -> [B, H, T, Dh]`: dq of `attention`.
    AttentionGradQ,

    // ---- embedding and losses ----
    /// `(table [V, D], idx i32 [...]) -> [..., D]`: rows gathered by index.
    Embedding,
    /// `(idx i32 [...], dy [..., D]) -> [vocab, D]`: dy scattered into rows, repeated indices summed.
    EmbeddingGrad {
        /// Rows of the table (the output's first dimension).
        vocab: usize,
    },
    /// `(logits [..., C], labels i32 [...]) -> []`: mean negative log-likelihood over the labels
    /// that are not `ignore_index`; NaN when every label is (a mean of nothing), with a
    /// gradient of 0.
    CrossEntropy {
        /// A label that contributes nothing (PyTorch's `ignore_index`).
        ignore_index: Option<i32>,
    },
    /// `(logits, labels, dloss []) -> dlogits`: (softmax - onehot) · dloss / count.
    CrossEntropyGrad {
        /// A label that contributes nothing (as in the forward op).
        ignore_index: Option<i32>,
    },

    // ---- regularization ----
    /// Zeroes each element with probability `p` and scales the rest by 1/(1-p); the mask is a
    /// hash of (seed, step, element index), so the gradient is the same op applied to dy.
    /// Identity when not training.
    Dropout {
        /// Probability of zeroing an element, in `[0, 1)`.
        p: f32,
        /// Seed of the mask hash.
        seed: u64,
    },
    /// `(a, b)` of one shape: `a` in a training step, `b` in an evaluation (batch norm's
    /// batch statistics, or its running ones).
    TrainingSelect,

    // ---- convolution ----
    /// im2col, `[N, C, H, W] -> [C·kh·kw, N·Ho·Wo]`: row `(c, i, j)`, column `(n, oh, ow)` holds
    /// `x[n, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw]`, or `fill` in the padding.
    Unfold {
        /// The window's geometry.
        window: Window,
        /// The value read in the padding (0, or -inf for max pooling).
        fill: f32,
    },
    /// col2im, the adjoint of `unfold`: `[C·kh·kw, N·Ho·Wo] -> [N, C, H, W]` (the node's
    /// shape), each element the sum of the entries `unfold` copied it to, in window order.
    Fold {
        /// The window's geometry.
        window: Window,
    },
}

/// One node of the arena.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it computes.
    pub op: Op,
    /// Its operands, all earlier nodes.
    pub inputs: Vec<NodeId>,
    /// Its static shape.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
    /// The source expression it came from (none for nodes built from Rust).
    pub span: Span,
}

/// A persistent value (parameter or state) and the node whose value replaces it after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    /// The parameter or state value written.
    pub target: NodeId,
    /// The node whose value it takes.
    pub value: NodeId,
    /// Applied by a micro-batch run too: a training run of gradient accumulation that only
    /// adds the micro-batch's gradients to the accumulator (the accumulator's own update, and
    /// batch norm's running statistics, which follow every forward pass in training).
    /// Updates without it (the optimizer's) are applied only by full training runs.
    pub every_micro_batch: bool,
}

impl Update {
    /// `target` takes `value` at every full training run (not at micro-batch runs).
    pub fn new(target: NodeId, value: NodeId) -> Update {
        Update { target, value, every_micro_batch: false }
    }
}

/// A static dataflow graph. Build it with the methods in `graph::build`.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub(crate) nodes: Vec<Node>,
    /// Named values the host can read after a step.
    pub outputs: Vec<(String, NodeId)>,
    /// Write-backs applied after a step, in order (at a micro-batch run, only those marked
    /// [`Update::every_micro_batch`]).
    pub updates: Vec<Update>,
    /// Rematerialized values of a training graph (`graph::remat`): each forward value the
    /// backward pass reads, with the backward node that recomputes it (same op, shape and
    /// dtype) right before its first use there.
    pub recomputed: Vec<(NodeId, NodeId)>,
    /// Span given to nodes created from now on (see [`Graph::set_span`]).
    pub(crate) span: Span,
    /// Inputs, parameters and state by name (kept by `push`), so that checking a new name and
    /// finding a value by name do not scan the arena: a model with thousands of parameters
    /// lowers in linear time.
    names: BTreeMap<String, NodeId>,
    /// Dropouts built so far per seed given ([`Graph::dropout`]), so that each draws its own
    /// mask.
    pub(crate) dropouts: BTreeMap<u64, u64>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The node `id` (panics on an id from another, larger graph).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Every node with its id, in arena (topological) order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = (NodeId, &Node)> {
        self.nodes.iter().enumerate().map(|(i, n)| (NodeId(i as u32), n))
    }

    /// The shape of node `id`.
    pub fn shape(&self, id: NodeId) -> &[usize] {
        &self.nodes[id.index()].shape
    }

    /// The element type of node `id`.
    pub fn dtype(&self, id: NodeId) -> DType {
        self.nodes[id.index()].dtype
    }

    /// Nodes created after this call carry `span` (the DSL sets it before lowering each
    /// expression; Rust callers usually never call it).
    pub fn set_span(&mut self, span: Span) {
        self.span = span;
    }

    /// The output called `name`.
    pub fn output(&self, name: &str) -> Option<NodeId> {
        self.outputs.iter().find(|(n, _)| n == name).map(|&(_, id)| id)
    }

    /// Name an output; a later output with the same name replaces it.
    pub fn set_output(&mut self, name: &str, id: NodeId) {
        match self.outputs.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = id,
            None => self.outputs.push((name.to_string(), id)),
        }
    }

    /// Parameters in arena order, with their names.
    pub fn parameters(&self) -> Vec<(NodeId, &str)> {
        self.nodes()
            .filter_map(|(id, n)| match &n.op {
                Op::Parameter { name, .. } => Some((id, name.as_str())),
                _ => None,
            })
            .collect()
    }

    /// The input called `name`.
    pub fn input_named(&self, name: &str) -> Option<NodeId> {
        self.named(name).filter(|&id| matches!(self.node(id).op, Op::Input { .. }))
    }

    /// Find a parameter or state value by name.
    pub fn persistent_named(&self, name: &str) -> Option<NodeId> {
        self.named(name)
            .filter(|&id| matches!(self.node(id).op, Op::Parameter { .. } | Op::State { .. }))
    }

    /// The input, parameter or state called `name`.
    pub(crate) fn named(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    pub(crate) fn push(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        shape: Vec<usize>,
        dtype: DType,
    ) -> NodeId {
        let span = self.span;
        self.push_node(Node { op, inputs, shape, dtype, span })
    }

    /// Append `node` as it is (its span included).
    pub(crate) fn push_node(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        if let Op::Input { name } | Op::Parameter { name, .. } | Op::State { name, .. } = &node.op {
            self.names.entry(name.clone()).or_insert(id);
        }
        self.nodes.push(node);
        id
    }

    /// Remove the nodes from arena index `at` on and return them, for a pass that appends
    /// them again in another order (their names are forgotten until they are pushed again).
    pub(crate) fn split_off(&mut self, at: usize) -> Vec<Node> {
        self.names.retain(|_, id| id.index() < at);
        self.nodes.split_off(at.min(self.nodes.len()))
    }
}

impl Op {
    /// The op's name as written in the model language and in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Parameter { .. } => "param",
            Op::State { .. } => "state",
            Op::Constant { .. } => "constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Reduce { op, .. } => op.name(),
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::BroadcastTo => "broadcast_to",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::MatMul => "matmul",
            Op::Softmax => "softmax",
            Op::LogSoftmax => "log_softmax",
            Op::CausalMask { .. } => "causal_mask",
            Op::LayerNormStats { .. } => "layer_norm_stats",
            Op::LayerNorm => "layer_norm",
            Op::LayerNormGradInput => "layer_norm_grad_input",
            Op::LayerNormGradWeight => "layer_norm_grad_weight",
            Op::AttentionStats => "attention_stats",
            Op::Attention => "attention",
            Op::AttentionGradKv => "attention_grad_kv",
            Op::AttentionGradQ => "attention_grad_q",
            Op::Embedding => "embedding",
            Op::EmbeddingGrad { .. } => "embedding_grad",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::CrossEntropyGrad { .. } => "cross_entropy_grad",
            Op::Dropout { .. } => "dropout",
            Op::TrainingSelect => "training_select",
            Op::Unfold { .. } => "unfold",
            Op::Fold { .. } => "fold",
        }
    }

    /// The op's class.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } | Op::Constant { .. } => {
                OpClass::Source
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::CausalMask { .. }
            | Op::Dropout { .. }
            | Op::TrainingSelect
            | Op::Unfold { .. }
            | Op::Fold { .. } => OpClass::Elementwise,
            Op::Reduce { .. } => OpClass::Reduce,
            Op::MatMul => OpClass::MatMul,
            Op::Reshape
            | Op::Permute { .. }
            | Op::BroadcastTo
            | Op::Slice { .. }
            | Op::Concat { .. } => OpClass::Layout,
            Op::Softmax
            | Op::LogSoftmax
            | Op::LayerNormStats { .. }
            | Op::LayerNorm
            | Op::LayerNormGradInput
            | Op::LayerNormGradWeight
            | Op::AttentionStats
            | Op::Attention
            | Op::AttentionGradKv
            | Op::AttentionGradQ
            | Op::Embedding
            | Op::EmbeddingGrad { .. }
            | Op::CrossEntropy { .. }
            | Op::CrossEntropyGrad { .. } => OpClass::Special,
        }
    }

    /// Whether the op is a source whose value the host provides: an input, a parameter or state.
    /// Such a value lives in a buffer of its own and no kernel computes it (a constant is the
    /// other kind of source, written into the code of the kernels that read it).
    pub fn is_host_value(&self) -> bool {
        self.class() == OpClass::Source && !matches!(self, Op::Constant { .. })
    }

    /// Whether the op is a view: a layout op that reads one input at remapped coordinates
    /// (every layout op but `concat`).
    pub fn is_view(&self) -> bool {
        self.class() == OpClass::Layout && !matches!(self, Op::Concat { .. })
    }

    /// Whether each output element is a function of the input elements at the same index alone,
    /// not of its position: the elementwise table's ops, `where` and constants (not
    /// `causal_mask` or `dropout`).
    pub fn is_pointwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Constant { .. })
    }

    /// Whether gradients flow through the op. Sources, the elementwise table's gradient helpers
    /// and the other gradient ops are not differentiable; `layer_norm_stats` and
    /// `attention_stats` are differentiated together with the op that consumes them.
    pub fn is_differentiable(&self) -> bool {
        match self {
            Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } | Op::Constant { .. } => {
                false
            }
            Op::Unary(u) => u.is_differentiable(),
            Op::Binary(b) => b.is_differentiable(),
            Op::LayerNormGradInput
            | Op::LayerNormGradWeight
            | Op::AttentionGradKv
            | Op::AttentionGradQ
            | Op::EmbeddingGrad { .. }
            | Op::CrossEntropyGrad { .. } => false,
            _ => true,
        }
    }

    /// One instance of every kind of op: the op table that tests walk, so that no op can lack a
    /// CPU forward, a backward rule, a gradient check or a GPU kernel. Adding a variant to `Op`
    /// without adding it here fails `samples_cover_every_op_name`.
    pub fn samples() -> Vec<Op> {
        let mut ops = vec![
            Op::Input { name: String::new() },
            Op::Parameter { name: String::new(), init: Init::Zeros },
            Op::State { name: String::new(), init: Init::Zeros },
            Op::Constant { value: 0.0 },
        ];
        ops.extend(UnaryOp::ALL.iter().map(|&u| Op::Unary(u)));
        ops.extend(BinaryOp::ALL.iter().map(|&b| Op::Binary(b)));
        ops.push(Op::Where);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            ops.push(Op::Reduce { op, axes: vec![0], keepdim: false });
        }
        ops.extend([
            Op::Reshape,
            Op::Permute { perm: vec![] },
            Op::BroadcastTo,
            Op::Slice { axis: 0, start: 0, end: 0 },
            Op::Concat { axis: 0 },
            Op::MatMul,
            Op::Softmax,
            Op::LogSoftmax,
            Op::CausalMask { fill: 0.0 },
            Op::LayerNormStats { eps: 1e-5 },
            Op::LayerNorm,
            Op::LayerNormGradInput,
            Op::LayerNormGradWeight,
            Op::AttentionStats,
            Op::Attention,
            Op::AttentionGradKv,
            Op::AttentionGradQ,
            Op::Embedding,
            Op::EmbeddingGrad { vocab: 0 },
            Op::CrossEntropy { ignore_index: None },
            Op::CrossEntropyGrad { ignore_index: None },
            Op::Dropout { p: 0.0, seed: 0 },
            Op::TrainingSelect,
            Op::Unfold { window: Window::SAMPLE, fill: 0.0 },
            Op::Fold { window: Window::SAMPLE },
        ]);
        ops
    }

    /// Whether the value persists across steps (parameters and optimizer state).
    pub fn is_persistent(&self) -> bool {
        matches!(self, Op::Parameter { .. } | Op::State { .. })
    }
}

impl ReduceOp {
    /// `sum`, `mean` or `max`, as the language spells it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exhaustive match: a new `Op` variant does not compile until it is counted here, and
    /// the count must equal the number of distinct kinds in `Op::samples()`.
    fn kind_count(op: &Op) -> usize {
        match op {
            Op::Input { .. }
            | Op::Parameter { .. }
            | Op::State { .. }
            | Op::Constant { .. }
            | Op::Where
            | Op::Reshape
            | Op::Permute { .. }
            | Op::BroadcastTo
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::MatMul
            | Op::Softmax
            | Op::LogSoftmax
            | Op::CausalMask { .. }
            | Op::LayerNormStats { .. }
            | Op::LayerNorm
            | Op::LayerNormGradInput
            | Op::LayerNormGradWeight
            | Op::AttentionStats
            | Op::Attention
            | Op::AttentionGradKv
            | Op::AttentionGradQ
            | Op::Embedding
            | Op::EmbeddingGrad { .. }
            | Op::CrossEntropy { .. }
            | Op::CrossEntropyGrad { .. }
            | Op::Dropout { .. }
            | Op::TrainingSelect
            | Op::Unfold { .. }
            | Op::Fold { .. } => 30,
            Op::Unary(_) => UnaryOp::ALL.len(),
            Op::Binary(_) => BinaryOp::ALL.len(),
            Op::Reduce { .. } => 3,
        }
    }

    #[test]
    fn values_are_found_by_name_and_kind() {
        let mut g = Graph::new();
        let x = g.input("x", &[2], DType::F32).unwrap();
        let w = g.parameter("w", &[2], crate::graph::Init::Zeros).unwrap();
        let s = g.state("s", &[2], crate::graph::Init::Zeros).unwrap();
        assert_eq!(g.input_named("x"), Some(x));
        assert_eq!(g.persistent_named("w"), Some(w));
        assert_eq!(g.persistent_named("s"), Some(s));
        assert_eq!(g.input_named("w"), None);
        assert_eq!(g.persistent_named("x"), None);
        assert_eq!(g.persistent_named("v"), None);
        let e = g.parameter("x", &[2], crate::graph::Init::Zeros).unwrap_err();
        assert_eq!(e.message, "duplicate name `x`: another input, parameter or state has it");
        assert_eq!(g.clone().persistent_named("s"), Some(s));
    }

    /// Every op's class, as `OpClass`'s documentation lists them.
    #[test]
    fn classes_group_the_ops() {
        let of = |class: OpClass| -> Vec<&str> {
            Op::samples().iter().filter(|o| o.class() == class).map(|o| o.name()).collect()
        };
        assert_eq!(of(OpClass::Source), ["input", "param", "state", "constant"]);
        let mut elementwise: Vec<&str> = UnaryOp::ALL.iter().map(|u| u.name()).collect();
        elementwise.extend(BinaryOp::ALL.iter().map(|b| b.name()));
        elementwise.extend([
            "where",
            "causal_mask",
            "dropout",
            "training_select",
            "unfold",
            "fold",
        ]);
        assert_eq!(of(OpClass::Elementwise), elementwise);
        assert_eq!(of(OpClass::Reduce), ["sum", "mean", "max"]);
        assert_eq!(of(OpClass::MatMul), ["matmul"]);
        assert_eq!(of(OpClass::Layout), ["reshape", "permute", "broadcast_to", "slice", "concat"]);
        let special = [
            "softmax",
            "log_softmax",
            "layer_norm_stats",
            "layer_norm",
            "layer_norm_grad_input",
            "layer_norm_grad_weight",
            "attention_stats",
            "attention",
            "attention_grad_kv",
            "attention_grad_q",
            "embedding",
            "embedding_grad",
            "cross_entropy",
            "cross_entropy_grad",
        ];
        assert_eq!(of(OpClass::Special), special);
        let host: Vec<&str> =
            Op::samples().iter().filter(|o| o.is_host_value()).map(|o| o.name()).collect();
        assert_eq!(host, ["input", "param", "state"]);
        let views: Vec<&str> =
            Op::samples().iter().filter(|o| o.is_view()).map(|o| o.name()).collect();
        assert_eq!(views, ["reshape", "permute", "broadcast_to", "slice"]);
    }

    #[test]
    fn samples_cover_every_op_name() {
        let samples = Op::samples();
        let names: std::collections::HashSet<&str> = samples.iter().map(|o| o.name()).collect();
        assert_eq!(names.len(), samples.len(), "two samples share a name");
        assert_eq!(samples.len(), 30 + UnaryOp::ALL.len() + BinaryOp::ALL.len() + 3);
        assert!(samples.iter().all(|o| kind_count(o) > 0));
    }
}
