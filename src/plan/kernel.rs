//! Kernels, the unit of a plan: what each computes ([`KernelKind`], with the names reports and
//! dispatch labels use) and which values it reads, writes and computes inside ([`Kernel`]).
//! Fusion ([`super::fuse`]) makes them; codegen turns each kind into programs.

use crate::graph::{Graph, NodeId, Op};

/// What a kernel computes; codegen turns each kind into its programs.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelKind {
    /// Evaluates the expression of its output over the output's shape.
    Elementwise,
    /// A matmul whose result feeds the output's expression (the epilogue) in registers.
    /// `register` is the node the epilogue sees as the accumulator: the matmul itself, or a
    /// reshape of it (the matmul's rows and columns then map to the output's coordinates through
    /// the linear index). With `sum` it also computes that `sum` of its B operand's value
    /// over every axis but the last (the gradient of the bias of the linear layer whose weight
    /// gradient this product is): a cooperative product's conversion sums the columns it
    /// converts anyway, any other product is followed by the reduction's own dispatches
    /// ([`Kernel::without_sum`]).
    MatMul {
        matmul: NodeId,
        register: NodeId,
        sum: Option<NodeId>,
    },
    /// A reduction whose input may be an inlined expression (the prologue).
    Reduce,
    Softmax,
    LogSoftmax,
    /// `layer_norm`; with `with_stats` it also computes the `layer_norm_stats` node it reads
    /// (one pass writing both), otherwise it reads the stats from their buffer.
    LayerNorm {
        with_stats: bool,
    },
    /// Stats only (when the normalized output is not needed in this plan).
    LayerNormStats,
    /// `layer_norm_grad_input`; with `weight_grad` it also computes that
    /// `layer_norm_grad_weight` node (same x, stats, dy) in the same passes. With `add` its
    /// value stays in registers and the kernel writes that `add` node instead: the gradient
    /// plus a buffer of its shape (a residual connection's gradient joining the LayerNorm's).
    /// With `col_sum` it also computes that `sum` of what it writes over every axis but the
    /// last (the gradient of a bias added before: a linear layer's in a residual block).
    LayerNormGradInput {
        weight_grad: Option<NodeId>,
        add: Option<NodeId>,
        col_sum: Option<NodeId>,
    },
    LayerNormGradWeight,
    /// `attention`; with `with_stats` it also computes the `attention_stats` node it reads (one
    /// pass writing both), otherwise it reads nothing of the stats buffer.
    Attention {
        with_stats: bool,
    },
    /// Stats only (when the attention output is not needed in this plan, or fusion is off).
    AttentionStats,
    AttentionGradKv,
    AttentionGradQ,
    Embedding,
    EmbeddingGrad,
    CrossEntropy,
    CrossEntropyGrad,
    /// The part of a concat's output that inputs `parts` fill (all of them unless the adapter's
    /// binding limit splits the concat into several kernels).
    Concat {
        parts: std::ops::Range<usize>,
    },
}

impl KernelKind {
    /// Short name, for labels and reports.
    pub fn name(&self) -> &'static str {
        match self {
            KernelKind::Elementwise => "elementwise",
            KernelKind::MatMul { .. } => "matmul",
            KernelKind::Reduce => "reduce",
            KernelKind::Softmax => "softmax",
            KernelKind::LogSoftmax => "log_softmax",
            KernelKind::LayerNorm { .. } => "layer_norm",
            KernelKind::LayerNormStats => "layer_norm_stats",
            KernelKind::LayerNormGradInput { .. } => "layer_norm_bw",
            KernelKind::LayerNormGradWeight => "layer_norm_grad_weight",
            KernelKind::Attention { .. } => "attention",
            KernelKind::AttentionStats => "attention_stats",
            KernelKind::AttentionGradKv => "attention_bw_kv",
            KernelKind::AttentionGradQ => "attention_bw_q",
            KernelKind::Embedding => "embedding",
            KernelKind::EmbeddingGrad => "embedding_grad",
            KernelKind::CrossEntropy => "cross_entropy",
            KernelKind::CrossEntropyGrad => "cross_entropy_grad",
            KernelKind::Concat { .. } => "concat",
        }
    }
}

/// One kernel group: what fusion puts in one kernel, run as one dispatch (or a short fixed
/// sequence of dispatches) of the programs codegen makes for its kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub kind: KernelKind,
    /// The materialized values this kernel writes; the last one defines its iteration space.
    pub outputs: Vec<NodeId>,
    /// The materialized values it reads (buffers bound as inputs), in first-use order.
    pub inputs: Vec<NodeId>,
    /// Every graph node computed inside it, outputs included, in arena order.
    pub fused: Vec<NodeId>,
}

impl Kernel {
    /// A matmul kernel that also computes a sum of its operand, split in two: the kernel
    /// without it, and the reduction computing the sum alone from the value's buffer. Any
    /// other kernel is itself and `None`.
    pub fn without_sum(&self, g: &Graph) -> (Kernel, Option<Kernel>) {
        let KernelKind::MatMul { matmul, register, sum: Some(s) } = self.kind else {
            return (self.clone(), None);
        };
        let base = Kernel {
            kind: KernelKind::MatMul { matmul, register, sum: None },
            outputs: self.outputs.iter().copied().filter(|&o| o != s).collect(),
            inputs: self.inputs.clone(),
            fused: self.fused.iter().copied().filter(|&f| f != s).collect(),
        };
        let reduce = Kernel {
            kind: KernelKind::Reduce,
            outputs: vec![s],
            inputs: vec![g.node(s).inputs[0]],
            fused: vec![s],
        };
        (base, Some(reduce))
    }

    /// The stats of the LayerNorm that a matmul kernel's A conversion computes, and its
    /// epsilon (`fuse::norm_prologue`): an output of the kernel.
    pub fn norm_stats(&self, g: &Graph) -> Option<(NodeId, f32)> {
        self.outputs.iter().find_map(|&o| match g.node(o).op {
            Op::LayerNormStats { eps } => Some((o, eps)),
            _ => None,
        })
    }
}
