//! Fusion: partition the live nodes of a graph into kernels.
//!
//! Every live node is either *materialized* (its value lives in a buffer) or *inlined* (computed in
//! registers inside the one kernel that consumes it). Sources are buffers without a kernel;
//! constants are always inlined. An elementwise node (including the index-remapping views
//! `broadcast_to`, `permute`, `slice`, `reshape` and `causal_mask`) is inlined when it has exactly
//! one consumer and that consumer can evaluate an expression operand: another elementwise node, a
//! reduction (as its prologue), or a concat (which reads a permuted or sliced input in place); but
//! not into a chain of reshapes and permutes that only matmuls read (they read the chain as a view
//! of its row-major store instead of a transposed copy). A matmul whose only use is an elementwise
//! chain runs inside that chain's kernel, which then computes the chain as the matmul's epilogue. A
//! LayerNorm's input gradient whose only use is an `add` with a buffer computed before it stays in
//! registers: its kernel writes the sum. A sum over the rows of what a LayerNorm backward
//! writes, or of the B operand of a product without an epilogue (a bias gradient beside its
//! weight gradient), is computed by that kernel. Every other node is materialized by a kernel
//! of its own kind. Last, an elementwise kernel whose outputs only one later elementwise kernel
//! reads, at its own elements, is merged into it: one kernel with several outputs (an
//! optimizer's moments and parameters).
//!
//! A chain of layout ops (`slice`, `permute`, `reshape`) over a materialized value that would
//! otherwise be copied is a strided view ([`super::view`]) when every kernel that reads it reads
//! strides (generated kernels through their index expressions, matmul operands, the attention
//! kernels' q, k, v and output gradient) and can address it: no kernel, no buffer, its readers
//! address the viewed value's buffer. A reshape of a value in row-major order is such a view
//! that any kernel can read (it shares the buffer as it is). A chain no reader can address is
//! copied by an elementwise kernel. The other way round, a concat whose every input is such a
//! chain over a value its kernel writes through strides (the attention backward's dq, dK and
//! dV, joined into the qkv projection's gradient) has no kernel: each value is stored inside
//! the concat's buffer where the chain puts it (`concats_in_place`).
//!
//! Where a plan's products convert their operands in a pass of their own (the cooperative
//! kernels; `Fusing::prologues`), an elementwise chain of unary ops that only a product reads
//! is inlined into the product as an operand prologue ([`prologue_base`]): the conversion
//! computes it as it reads the chain's input (`codegen::prologue`). So is a LayerNorm that
//! only a product reads (`norm_prologue`): the backward's copy for a weight gradient from
//! the stats stored, a forward one computing its stats in the conversion (an output of the
//! product's kernel).
//!
//! With `fusion` off every live op gets its own kernel: the one-op-per-kernel plan that fused
//! plans are checked against.
//!
//! With gradient accumulation (a `micro` set: the nodes a micro-batch run evaluates), no node
//! of the set is computed inside a kernel of a node outside it, nor the reverse, so that a
//! micro-batch run is the plan's kernels whose outputs are in the set, each run whole.
//!
//! Given the adapter's storage-buffer limit, fusion keeps every kernel within it (see
//! [`super::limits`]): an expression reading too many buffers is split by materializing
//! subexpressions, and a concat of many inputs is written by several kernels, one per run of
//! inputs.

use super::kernel::{Kernel, KernelKind};
use super::limits::{concat_parts, split_points, storage_bindings};
use super::view::View;
use crate::graph::{Graph, NodeId, Op, OpClass};

/// The result of fusion.
#[derive(Clone, Debug)]
pub struct Fusion {
    /// Nodes the plan evaluates (needed by a root), indexed by node.
    pub live: Vec<bool>,
    /// Whether a live node's value is held in a buffer.
    pub materialized: Vec<bool>,
    /// For a `reshape` view: the node whose buffer it shares (followed to the root).
    pub alias: Vec<Option<NodeId>>,
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// For a value placed inside a flat concat's buffer (see [`super::arena`]): the concat and
    /// the offset in elements.
    pub within: Vec<Option<(NodeId, usize)>>,
    /// The host arenas: concats of persistent values, persistent themselves (no kernel).
    pub arenas: Vec<super::arena::Arena>,
    /// For a strided view (see [`super::view`]): where its elements are in the buffer of the
    /// value it views (its `alias`). Such a node has no kernel.
    pub view: Vec<Option<View>>,
}

/// Ops evaluated in registers from the values of their inputs at (remapped) coordinates:
/// elementwise ops, constants and views.
pub fn is_inlinable(op: &Op) -> bool {
    match op.class() {
        OpClass::Elementwise => true,
        OpClass::Source => !op.is_host_value(),
        OpClass::Layout => op.is_view(),
        OpClass::Reduce | OpClass::MatMul | OpClass::Special => false,
    }
}

/// What fusion may do.
#[derive(Clone, Copy, Debug)]
pub struct Fusing {
    /// Fuse at all (off: one kernel per op).
    pub on: bool,
    /// Products read an operand through a prologue: the kernels of the plan's products
    /// convert their operands in a pass of their own (`high`, `medium`), which computes an
    /// elementwise chain that only the product reads as it reads the chain's input
    /// ([`prologue_base`]).
    pub prologues: bool,
}

/// The most nodes one value's inlined expression holds; a node whose expression would hold
/// more is stored and read as a buffer. The WGSL of a kernel grows with its expression, and
/// naga's typifier is quadratic in a function's expressions: the gradient of a value read by
/// 2,000 slices (a sum of 2,000 terms, one buffer) was one kernel that took `rumus plan`
/// seconds to validate, minutes at 50,000. Bounded, a kernel's expression holds at most this
/// many nodes an operand of its root, and compiles in milliseconds.
pub const MAX_INLINED_NODES: usize = 512;

/// Partition the nodes needed by `roots` into kernels, each binding at most `max_bindings`
/// storage buffers when given (a kernel that still binds more is left for the plan checker to
/// report).
pub fn fuse(
    g: &Graph,
    roots: &[NodeId],
    fusion: Fusing,
    max_bindings: Option<u32>,
    micro: Option<&[bool]>,
) -> Fusion {
    let mut forced = vec![false; g.n_nodes()];
    let arenas = super::arena::host_arenas(g);
    let flat = super::arena::flat_concats(g);
    // Nodes that go into one kernel only when both or neither are in the micro-batch set.
    let apart = |a: NodeId, b: NodeId| micro.is_some_and(|m| m[a.index()] != m[b.index()]);
    loop {
        let f = fuse_once(g, roots, fusion, &forced, max_bindings, &arenas, &flat, &apart);
        let Some(max) = max_bindings else { return f };
        let owner = |id: NodeId| f.alias[id.index()].unwrap_or(id);
        let mut changed = false;
        for k in &f.kernels {
            if storage_bindings(g, k, &|id| owner(id).index(), false) > max as usize {
                for c in split_points(g, k, max, &owner) {
                    changed |= !forced[c.index()];
                    forced[c.index()] = true;
                }
            }
        }
        if !changed {
            return f;
        }
    }
}

/// One fusion pass, with the inlinable nodes of `forced` materialized and no two nodes that
/// are `apart` in one kernel. `flat` says which nodes are flat concats
/// ([`super::arena::flat_concats`]).
#[allow(clippy::too_many_arguments)]
fn fuse_once(
    g: &Graph,
    roots: &[NodeId],
    fusing: Fusing,
    forced: &[bool],
    max_bindings: Option<u32>,
    arenas: &[super::arena::Arena],
    flat: &[bool],
    apart: &dyn Fn(NodeId, NodeId) -> bool,
) -> Fusion {
    let fusion = fusing.on;
    let n = g.n_nodes();
    let mut live = vec![false; n];
    for r in roots {
        live[r.index()] = true;
    }
    for i in (0..n).rev() {
        if live[i] {
            for x in &g.nodes[i].inputs {
                live[x.index()] = true;
            }
        }
    }
    // A persistent value of a host arena lives in the arena's buffer: the arena is part of
    // every plan that uses one of its members.
    let mut within = vec![None; n];
    let mut is_arena = vec![false; n];
    for a in arenas {
        is_arena[a.node.index()] = true;
        for &(m, at) in &a.members {
            within[m.index()] = Some((a.node, at));
            live[a.node.index()] |= live[m.index()];
        }
    }
    let mut is_root = vec![false; n];
    for r in roots {
        is_root[r.index()] = true;
    }
    // Live consumers of each node, counted per use.
    let mut consumers: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (id, node) in g.nodes() {
        if live[id.index()] {
            for x in &node.inputs {
                consumers[x.index()].push(id);
            }
        }
    }
    let in_place = arena_views(g, &live, &consumers, &is_arena, &is_root, flat);
    let (in_place_at, concat_in_place) = match fusion {
        true => concats_in_place(g, &live, &consumers, &is_root, forced, apart),
        false => (vec![None; n], vec![false; n]),
    };
    let read_as_view =
        |id: NodeId| reads_view(g, id, &consumers[id.index()], apart, &in_place, flat);

    let mut materialized = vec![false; n];
    // Nodes each value's inlined expression holds (itself and what it inlines; 0 once
    // materialized): past `MAX_INLINED_NODES` it is stored instead (see there).
    let mut inlined_nodes = vec![0usize; n];
    let mut alias = vec![None; n];
    let mut view: Vec<Option<View>> = vec![None; n];
    // Stats a product's conversion computes, of the LayerNorm it normalizes as it reads
    // (`norm_prologue`), indexed by the product.
    let mut mm_stats: Vec<Option<NodeId>> = vec![None; n];
    for (id, node) in g.nodes() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        materialized[i] = match &node.op {
            op if op.is_host_value() => true,
            Op::Constant { .. } => is_root[i],
            // A view: share the buffer of the materialized input (contiguous), below.
            Op::Reshape if materialized[node.inputs[0].index()] => true,
            // A LayerNorm that only a product reads: the product's conversion normalizes as
            // it reads (`norm_prologue`), computing the stats too where this LayerNorm would.
            Op::LayerNorm if fusing.prologues && !is_root[i] && !forced[i] => {
                let chain_ok = |x: NodeId| !is_root[x.index()] && !forced[x.index()];
                match norm_prologue(g, id, &consumers, &chain_ok, apart, &materialized, &view) {
                    Some((mm, true)) => {
                        mm_stats[mm.index()] = Some(node.inputs[1]);
                        false
                    }
                    Some((_, false)) => false,
                    None => true,
                }
            }
            op if is_inlinable(op) => {
                let c = &consumers[i];
                let inlined = c.len() == 1
                    && !apart(id, c[0])
                    && (accepts_expression(g, flat, c[0], id)
                        || fusing.prologues && prologue_base(g, c[0], id, &materialized, &view).is_some());
                // Only a node that would be inlined is asked whether its readers want it stored.
                let prologue =
                    |mm, top| fusing.prologues && prologue_base(g, mm, top, &materialized, &view).is_some();
                let size = 1 + node.inputs.iter().map(|x| inlined_nodes[x.index()]).sum::<usize>();
                inlined_nodes[i] = size;
                is_root[i]
                    || !fusion
                    || forced[i]
                    || !inlined
                    || size > MAX_INLINED_NODES
                    || permuted_by_readers(g, id, &consumers, &is_root, apart, &in_place, flat, &prologue)
            }
            _ => true,
        };
        if materialized[i] {
            inlined_nodes[i] = 0;
        }
        // A value whose kernel writes it through strides: inside a concat's buffer where the
        // concat would copy it (`concats_in_place`), or stored in the order a permute of it
        // wants (the attention output in [B, T, H, Dh] order, so that merging its heads is a
        // view), when every reader reads strides.
        if let Some((c, v)) = &in_place_at[i] {
            alias[i] = Some(*c);
            view[i] = Some(v.clone());
        } else if fusion && writes_strided(&node.op) && !is_root[i] && read_as_view(id) {
            let order = consumers[i].iter().find_map(|&c| match &g.node(c).op {
                Op::Permute { perm } if perm.last() == Some(&(perm.len() - 1)) => Some(perm),
                _ => None,
            });
            if let Some(perm) = order {
                let permuted: Vec<usize> = perm.iter().map(|&p| node.shape[p]).collect();
                let inner = View::contiguous(&permuted);
                let mut strides = vec![0; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    strides[p] = inner.strides[k];
                }
                view[i] = Some(View { offset: 0, strides });
            }
        }
        // A layout op over a materialized value that every reader reads through strides: a
        // view of that value's buffer, no kernel.
        let layout = matches!(node.op, Op::Slice { .. } | Op::Permute { .. } | Op::Reshape);
        if materialized[i] && layout {
            let viewable = fusion && !is_root[i] && !forced[i] && read_as_view(id);
            let strided = viewable.then(|| strided_view(g, id, &materialized, &alias, &view)).flatten();
            match strided {
                Some((owner, v)) if consumers[i].iter().all(|&c| view_fits(g, c, id, &v)) => {
                    // Its readers' kernels address it: a node of theirs.
                    inlined_nodes[i] = 1;
                    alias[i] = Some(owner);
                    view[i] = (!v.is_contiguous(&node.shape)).then_some(v);
                    continue;
                }
                _ => {}
            }
            // A reshape of a value in row-major order from its buffer's start shares it.
            let x = node.inputs[0];
            if matches!(node.op, Op::Reshape) && materialized[x.index()] && view[x.index()].is_none() {
                alias[i] = Some(alias[x.index()].unwrap_or(x));
            }
        }
    }

    // Matmuls that run inside the kernel of an elementwise epilogue, decided before any kernel
    // is emitted (the matmul comes first in the arena).
    let mut epilogue_of: Vec<Option<(NodeId, NodeId)>> = vec![None; n];
    let mut taken = vec![false; n];
    if fusion {
        for (id, node) in g.nodes() {
            let i = id.index();
            if live[i] && materialized[i] && alias[i].is_none() && is_inlinable(&node.op) {
                if let Some((mm, reg)) =
                    epilogue_matmul(g, id, &materialized, &alias, &consumers, &is_root)
                {
                    if !taken[mm.index()] && !taken[reg.index()] && !apart(mm, id) {
                        taken[mm.index()] = true;
                        taken[reg.index()] = true;
                        epilogue_of[i] = Some((mm, reg));
                    }
                }
            }
        }
    }

    // Stats computed by a product's conversion have no kernel of their own.
    for s in mm_stats.iter().flatten() {
        taken[s.index()] = true;
    }

    // LayerNorm gradients that a materialized `add` of the same shape reads with another buffer
    // computed before them (a residual connection's gradient): the LayerNorm backward kernel
    // adds that buffer and writes the sum, the gradient itself stays in registers. Indexed by
    // the add, the gradient it reads and the weight gradient the kernel computes too (taken
    // here: it comes before the add, so the kernel loop below would give it a kernel first).
    let mut ln_add: Vec<Option<(NodeId, Option<NodeId>)>> = vec![None; n];
    if fusion {
        for (id, node) in g.nodes() {
            let i = id.index();
            if live[i] && materialized[i] && matches!(node.op, Op::LayerNormGradInput) && !is_root[i] {
                if let Some(a) = ln_addend(g, id, &materialized, &view, &consumers, &is_root, &epilogue_of, &live) {
                    if !apart(id, a) && !apart(id, ln_other(g, a, id)) {
                        let w = ln_weight_grad(g, id, &consumers, &live)
                            .filter(|&w| !apart(id, w) && !taken[w.index()] && read_after(w, a, &consumers, &materialized, &alias));
                        if let Some(w) = w {
                            taken[w.index()] = true;
                        }
                        ln_add[a.index()] = Some((id, w));
                        materialized[i] = false;
                    }
                }
            }
        }
    }

    // Column sums over every axis but the last of what a LayerNorm backward kernel writes (its
    // grad-input, or the add it writes instead), read directly or through a reshape sharing its
    // buffer: the kernel computes them with its weight and bias gradients. Indexed by the value
    // written, the sum.
    let mut ln_sum: Vec<Option<NodeId>> = vec![None; n];
    if fusion {
        for (id, node) in g.nodes() {
            let i = id.index();
            let writes = match node.op {
                Op::LayerNormGradInput => materialized[i],
                _ => ln_add[i].is_some(),
            };
            if live[i] && writes {
                let sum = column_sum(g, id, &live, &alias, &consumers).filter(|&s| !apart(id, s) && !taken[s.index()]);
                if let Some(s) = sum {
                    taken[s.index()] = true;
                    ln_sum[i] = Some(s);
                }
            }
        }
    }

    // Column sums of the value a product reads as its B operand, over every axis but the last
    // (the bias gradient of the linear layer whose weight gradient the product is: both read
    // the output gradient, the product with its rows as K): the product's kernel computes them
    // (see `KernelKind::MatMul`). Indexed by the matmul, the sum. Only a product that is its
    // kernel's output (no epilogue), reading the whole value unstrided as `[K, N]`, and only
    // when nothing reads the sum before that kernel runs.
    let mut mm_sum: Vec<Option<NodeId>> = vec![None; n];
    if fusion {
        for (id, node) in g.nodes() {
            let i = id.index();
            let product = matches!(node.op, Op::MatMul) && node.shape.len() == 2;
            if !live[i] || !materialized[i] || taken[i] || !product {
                continue;
            }
            let b = node.inputs[1];
            let v = alias[b.index()].unwrap_or(b);
            let unstrided =
                view[b.index()].is_none() && view[v.index()].is_none() && materialized[v.index()];
            if !unstrided || g.shape(v).last() != g.shape(b).last() {
                continue;
            }
            let free = |s: NodeId| !apart(id, s) && !taken[s.index()];
            let sum = column_sum(g, v, &live, &alias, &consumers)
                .filter(|&s| free(s) && read_after(s, id, &consumers, &materialized, &alias));
            if let Some(s) = sum {
                taken[s.index()] = true;
                mm_sum[i] = Some(s);
            }
        }
    }

    // The kernel that computes a stats node: its first consumer of the op that reads it
    // (`layer_norm` or `attention`), in one pass writing both. A later consumer (a
    // rematerialized copy in the backward pass) reads the stats the first one wrote.
    let stats_home = |stats: NodeId| -> Option<NodeId> {
        let reads = |op: &Op| match g.node(stats).op {
            Op::LayerNormStats { .. } => matches!(op, Op::LayerNorm),
            Op::AttentionStats => matches!(op, Op::Attention),
            _ => false,
        };
        let home = *consumers[stats.index()].iter().find(|c| reads(&g.node(**c).op))?;
        (fusion && materialized[home.index()] && !apart(stats, home)).then_some(home)
    };

    let mut kernels = Vec::new();
    for (id, node) in g.nodes() {
        let i = id.index();
        if !live[i] || !materialized[i] || taken[i] {
            continue;
        }
        let kind = match &node.op {
            Op::Input { .. } | Op::Parameter { .. } | Op::State { .. } => continue,
            Op::Concat { .. } if is_arena[i] => continue, // persistent: no kernel
            Op::Concat { .. } if concat_in_place[i] => continue, // its inputs' kernels write it
            // A view of another value's buffer (not a value its kernel writes into a concat's).
            _ if alias[i].is_some() && in_place_at[i].is_none() => continue,
            // Stats are computed by the kernel of the op that consumes them, when there is one.
            Op::LayerNormStats { .. } | Op::AttentionStats if stats_home(id).is_some() => continue,
            Op::LayerNormStats { .. } => KernelKind::LayerNormStats,
            Op::LayerNorm => KernelKind::LayerNorm { with_stats: stats_home(node.inputs[1]) == Some(id) },
            Op::AttentionStats => KernelKind::AttentionStats,
            Op::Attention => KernelKind::Attention { with_stats: stats_home(node.inputs[3]) == Some(id) },
            Op::AttentionGradKv => KernelKind::AttentionGradKv,
            Op::AttentionGradQ => KernelKind::AttentionGradQ,
            Op::MatMul => KernelKind::MatMul { matmul: id, register: id, sum: mm_sum[i] },
            Op::Reduce { .. } => KernelKind::Reduce,
            Op::Softmax => KernelKind::Softmax,
            Op::LogSoftmax => KernelKind::LogSoftmax,
            Op::LayerNormGradInput => {
                let weight_grad = match fusion {
                    true => ln_weight_grad(g, id, &consumers, &live).filter(|&w| !apart(id, w)),
                    false => None,
                };
                if let Some(w) = weight_grad {
                    taken[w.index()] = true;
                }
                KernelKind::LayerNormGradInput { weight_grad, add: None, col_sum: ln_sum[i] }
            }
            // The sum of a LayerNorm gradient and a buffer: the LayerNorm backward kernel, here,
            // after both (its weight gradient taken by it as above).
            Op::Binary(_) if ln_add[i].is_some() => {
                let weight_grad = ln_add[i].and_then(|(_, w)| w);
                KernelKind::LayerNormGradInput { weight_grad, add: Some(id), col_sum: ln_sum[i] }
            }
            Op::LayerNormGradWeight => KernelKind::LayerNormGradWeight,
            Op::Embedding => KernelKind::Embedding,
            Op::EmbeddingGrad { .. } => KernelKind::EmbeddingGrad,
            Op::CrossEntropy { .. } => KernelKind::CrossEntropy,
            Op::CrossEntropyGrad { .. } => KernelKind::CrossEntropyGrad,
            Op::Concat { .. } => {
                // Each input is a buffer, or a constant evaluated inline.
                let per_input: Vec<(Vec<NodeId>, Vec<NodeId>)> = node
                    .inputs
                    .iter()
                    .map(|&x| {
                        let (mut fused, mut inputs) = (Vec::new(), Vec::new());
                        if materialized[x.index()] {
                            inputs.push(x);
                        } else {
                            collect(
                                g,
                                x,
                                &materialized,
                                &KernelKind::Elementwise,
                                &mut fused,
                                &mut inputs,
                            );
                        }
                        (fused, inputs)
                    })
                    .collect();
                let reads: Vec<Vec<NodeId>> = per_input.iter().map(|(_, r)| r.clone()).collect();
                let nodes: Vec<usize> = per_input.iter().map(|(f, _)| 1 + f.len()).collect();
                for parts in concat_parts(&reads, &nodes, max_bindings) {
                    let mut fused = vec![id];
                    let mut inputs = Vec::new();
                    for (f, r) in &per_input[parts.clone()] {
                        fused.extend(f);
                        inputs.extend(r);
                    }
                    fused.sort();
                    fused.dedup();
                    dedup_in_order(&mut inputs);
                    kernels.push(Kernel {
                        kind: KernelKind::Concat { parts },
                        outputs: vec![id],
                        inputs,
                        fused,
                    });
                }
                continue;
            }
            // Inlinable ops materialized (a root, several consumers, fusion off, or split off
            // for the binding limit): their expression is the kernel. Named one by one, so
            // that a new op does not compile until fusion knows its kernel.
            Op::Constant { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::CausalMask { .. }
            | Op::Dropout { .. }
            | Op::TrainingSelect
            | Op::Unfold { .. }
            | Op::Fold { .. }
            | Op::Reshape
            | Op::Permute { .. }
            | Op::BroadcastTo
            | Op::Slice { .. } => match epilogue_of[i] {
                Some((matmul, register)) => KernelKind::MatMul { matmul, register, sum: None },
                None => KernelKind::Elementwise,
            },
        };
        let mut fused = Vec::new();
        let mut inputs = Vec::new();
        collect(g, id, &materialized, &kind, &mut fused, &mut inputs);
        let mut outputs = vec![id];
        let extras = match kind {
            KernelKind::LayerNormGradInput { weight_grad, col_sum, .. } => [weight_grad, col_sum],
            KernelKind::MatMul { sum, matmul, .. } => [sum, mm_stats[matmul.index()]],
            _ => [None, None],
        };
        for extra in extras.into_iter().flatten() {
            outputs.insert(0, extra);
            fused.push(extra);
            inputs.retain(|&x| x != extra); // a conversion's stats, read by its own LayerNorm
        }
        // The stats a layer_norm or attention kernel computes: an output, not an input (and
        // the operands the stats read are read by the op itself).
        let stats_input = match kind {
            KernelKind::LayerNorm { with_stats: true } => Some(1),
            KernelKind::Attention { with_stats: true } => Some(3),
            _ => None,
        };
        if let Some(s) = stats_input {
            let stats = node.inputs[s];
            outputs.insert(0, stats);
            fused.push(stats);
            inputs.retain(|&x| x != stats);
            if !inputs.contains(&node.inputs[0]) {
                inputs.insert(0, node.inputs[0]);
            }
        }
        fused.sort();
        fused.dedup();
        kernels.push(Kernel { kind, outputs, inputs, fused });
    }
    if fusion {
        merge_elementwise(g, &mut kernels, &alias, &consumers, max_bindings, apart);
    }
    // A matmul (and its reshape) taken into an epilogue kernel lives in registers only.
    for (i, node) in g.nodes.iter().enumerate() {
        if taken[i] && matches!(node.op, Op::MatMul | Op::Reshape) {
            materialized[i] = false;
            alias[i] = None;
        }
    }
    let arenas = arenas.iter().filter(|a| live[a.node.index()]).cloned().collect();
    Fusion { live, materialized, alias, kernels, within, arenas, view }
}

fn dedup_in_order(ids: &mut Vec<NodeId>) {
    let mut seen = Vec::with_capacity(ids.len());
    ids.retain(|&x| {
        let new = !seen.contains(&x);
        seen.push(x);
        new
    });
}

/// Whether `consumer` can take `producer` as an inlined expression operand (`flat`: which
/// nodes are flat concats).
fn accepts_expression(g: &Graph, flat: &[bool], consumer: NodeId, producer: NodeId) -> bool {
    let c = g.node(consumer);
    match &c.op {
        op if is_inlinable(op) => true,
        // A reduction evaluates its input expression as it reads it, a concat each input's
        // (a permuted or sliced gradient is read in place, not copied first), except a flat
        // arena's: its members are written in place by their own kernels, so that the arena's
        // kernels bind a fixed number of buffers and every gradient has a buffer to average.
        Op::Reduce { .. } => c.inputs[0] == producer,
        Op::Concat { .. } => !flat[consumer.index()],
        _ => false,
    }
}

/// Whether every reader of layout op `id` can read it as a strided view: a generated kernel
/// (an elementwise op, a reduction's input, a concat's input; a flat arena's only where the
/// view lies at its place in the arena, [`arena_views`]) through its index expressions, a matmul through its operands'
/// strides, an attention kernel through the layouts of q, k, v, the output and its gradient.
fn reads_view(
    g: &Graph,
    id: NodeId,
    consumers: &[NodeId],
    apart: &dyn Fn(NodeId, NodeId) -> bool,
    in_place: &[bool],
    flat: &[bool],
) -> bool {
    !consumers.is_empty()
        && consumers.iter().all(|&c| {
            let node = g.node(c);
            let at = |ok: &dyn Fn(usize) -> bool| {
                node.inputs.iter().enumerate().all(|(at, &x)| x != id || ok(at))
            };
            let reads = match node.op {
                ref op if is_inlinable(op) => true,
                Op::Reduce { .. } => true,
                Op::Concat { .. } => !flat[c.index()] || in_place[id.index()],
                Op::MatMul => true,
                Op::Attention | Op::AttentionStats => at(&|at| at < 3),
                Op::AttentionGradKv | Op::AttentionGradQ => at(&|at| at != 3),
                _ => false,
            };
            reads && !apart(id, c)
        })
}

/// For each node: whether it is a chain of slices and reshapes, input of a flat concat computed
/// by kernels (the gradient arena, see [`super::arena`]), over a value `w` that its own kernel
/// writes whole, where `w` can lie inside the concat's buffer with every such chain at its
/// place: each is a contiguous range of `w`, every reader of `w` is one of them, all put `w`
/// at the same aligned offset. The chains are then views of `w` that `super::arena` places
/// with it (a LayerNorm's weight and bias gradients, one `[2, D]` value, are two members).
fn arena_views(
    g: &Graph,
    live: &[bool],
    consumers: &[Vec<NodeId>],
    is_arena: &[bool],
    is_root: &[bool],
    flat: &[bool],
) -> Vec<bool> {
    let n = g.n_nodes();
    let mut out = vec![false; n];
    // The chain's base value and the element of it the chain starts at.
    let chain = |mut x: NodeId| -> Option<(NodeId, usize)> {
        let mut ops = Vec::new();
        while matches!(g.node(x).op, Op::Slice { .. } | Op::Reshape) {
            if consumers[x.index()].len() != 1 && !ops.is_empty() || is_root[x.index()] {
                return None;
            }
            ops.push(x);
            x = g.node(x).inputs[0];
        }
        let w = x;
        let mut v = View::contiguous(g.shape(w));
        for &op in ops.iter().rev() {
            v = v.through(g, op)?;
        }
        let top = *ops.first()?;
        let contiguous = View { offset: 0, ..v.clone() }.is_contiguous(g.shape(top));
        let own_kernel = !is_inlinable(&g.node(w).op) && !g.node(w).op.is_host_value();
        (contiguous && own_kernel && !is_root[w.index()]).then_some((w, v.offset))
    };
    for (c, node) in g.nodes() {
        if !live[c.index()] || is_arena[c.index()] || !flat[c.index()] {
            continue;
        }
        // Each base value with the offset in the concat it would lie at, and its chains.
        let mut bases: Vec<(NodeId, Option<usize>, Vec<NodeId>)> = Vec::new();
        let mut at: usize = 0;
        for &x in &node.inputs {
            if let Some((w, off)) = chain(x) {
                let base = at.checked_sub(off).filter(|b| b % super::arena::ALIGN == 0);
                match bases.iter_mut().find(|b| b.0 == w) {
                    Some(b) if b.1 == base => b.2.push(x),
                    Some(b) => b.1 = None,
                    None => bases.push((w, base, vec![x])),
                }
            }
            at += g.shape(x)[0];
        }
        for (w, base, chains) in bases {
            let readers_all_chains = consumers[w.index()].iter().all(|&r| {
                let mut top = r;
                while !chains.contains(&top) {
                    match consumers[top.index()][..] {
                        [next] if matches!(g.node(top).op, Op::Slice { .. } | Op::Reshape) => top = next,
                        _ => return false,
                    }
                }
                true
            });
            if base.is_some() && readers_all_chains {
                for x in chains {
                    out[x.index()] = true;
                }
            }
        }
    }
    out
}

/// Concats that the kernels of their inputs write in place: a concat each of whose inputs is a
/// chain of layout ops (one reader each) over a value whose kernel writes through strides
/// ([`writes_strided`]), or over one of the size-1 slices along one axis that together make
/// such a value (dK and dV, one `[2, ..]` value). Each such value is stored inside the concat's
/// buffer (its `alias` the concat) at the view that puts every element where the chain puts
/// it, and the concat has no kernel: the q, k and v gradients of a fused qkv projection are
/// written by the attention backward where the projection's backward reads them. Returns, per
/// node, the concat and view of each value so stored, and whether a concat is written so.
fn concats_in_place(
    g: &Graph,
    live: &[bool],
    consumers: &[Vec<NodeId>],
    is_root: &[bool],
    forced: &[bool],
    apart: &dyn Fn(NodeId, NodeId) -> bool,
) -> (Vec<Option<(NodeId, View)>>, Vec<bool>) {
    let n = g.n_nodes();
    let mut placed: Vec<Option<(NodeId, View)>> = vec![None; n];
    let mut written = vec![false; n];
    for (c, node) in g.nodes() {
        let Op::Concat { axis } = node.op else { continue };
        if !live[c.index()] || node.dtype != crate::tensor::DType::F32 {
            continue;
        }
        let free = |x: NodeId| !is_root[x.index()] && !forced[x.index()] && !apart(x, c);
        if let Some(members) = concat_members(g, c, axis, consumers, &free) {
            for (m, v) in members {
                placed[m.index()] = Some((c, v));
            }
            written[c.index()] = true;
        }
    }
    (placed, written)
}

/// The values that write concat `c` (along `axis`) in place and their views in its buffer
/// ([`concats_in_place`]), `None` unless every input of `c` is such a chain. `free`: a node
/// that may be stored elsewhere than in a buffer of its own (not a root, not split off).
fn concat_members(
    g: &Graph,
    c: NodeId,
    axis: usize,
    consumers: &[Vec<NodeId>],
    free: &dyn Fn(NodeId) -> bool,
) -> Option<Vec<(NodeId, View)>> {
    let whole = View::contiguous(g.shape(c));
    let step = *whole.strides.get(axis)?;
    // Each input's chain (bottom up) from the value written, and the input's view in `c`.
    let mut chains: Vec<(NodeId, Vec<NodeId>, View)> = Vec::new();
    // The views of the slices of a sliced value: (value, slice axis, start, view of the value).
    let mut parts: Vec<(NodeId, usize, usize, View)> = Vec::new();
    let mut direct: Vec<(NodeId, View)> = Vec::new();
    let mut at = 0;
    for &x in &g.node(c).inputs {
        let top = View { offset: at * step, strides: whole.strides.clone() };
        at += *g.shape(x).get(axis)?;
        let (mut y, mut above, mut v, mut chain) = (x, c, top.clone(), Vec::new());
        loop {
            if consumers[y.index()] != [above] || !free(y) {
                return None;
            }
            let node = g.node(y);
            let below = *node.inputs.first()?;
            match node.op {
                ref op if writes_strided(op) => {
                    direct.push((y, v));
                    break;
                }
                Op::Slice { axis: a, start, end }
                    if end == start + 1 && writes_strided(&g.node(below).op) =>
                {
                    chain.push(y);
                    parts.push((below, a, start, v.before(g, y)?));
                    y = below;
                    break;
                }
                // Not a slice of part of a value: the value's kernel writes all of it, and
                // the rest would land on the other inputs' places (or past the buffer).
                Op::Reshape | Op::Permute { .. } => {
                    chain.push(y);
                    v = v.before(g, y)?;
                    (above, y) = (y, below);
                }
                _ => return None,
            }
        }
        chain.reverse();
        chains.push((y, chain, top));
    }
    // A sliced value: its slices along one axis, each once, all its readers; the view of each
    // slice's value agrees but on that axis, whose stride the slices' offsets give.
    let mut values: Vec<NodeId> = parts.iter().map(|p| p.0).collect();
    values.sort_unstable();
    values.dedup();
    for w in values {
        let mut mine: Vec<&(NodeId, usize, usize, View)> = parts.iter().filter(|p| p.0 == w).collect();
        mine.sort_by_key(|p| p.2);
        let (a, first) = (mine[0].1, &mine[0].3);
        let dim = *g.shape(w).get(a)?;
        let stride = match mine.get(1) {
            Some(p) => p.3.offset.checked_sub(first.offset)?,
            None => 0,
        };
        let same = |v: &View| (0..v.strides.len()).all(|k| k == a || v.strides[k] == first.strides[k]);
        let fits = mine.len() == dim
            && consumers[w.index()].len() == dim
            && free(w)
            && mine.iter().enumerate().all(|(k, p)| {
                p.1 == a && p.2 == k && same(&p.3) && p.3.offset == first.offset + k * stride
            });
        if !fits {
            return None;
        }
        let mut strides = first.strides.clone();
        strides[a] = stride;
        direct.push((w, View { offset: first.offset, strides }));
    }
    // Each input's elements where the concat has them: the chains walked forwards from the
    // values' views give back the inputs' views (what `before` undid), and the attention
    // kernels can write them (the head dimension contiguous).
    let view_of = |m: NodeId| direct.iter().find(|d| d.0 == m).map(|d| d.1.clone());
    for ((m, chain, top), &x) in chains.iter().zip(&g.node(c).inputs) {
        let mut v = view_of(*m)?;
        for &op in chain {
            v = v.through(g, op)?;
        }
        // A size-1 axis's stride addresses nothing.
        let shape = g.shape(x);
        let agree = (0..shape.len()).all(|k| shape[k] == 1 || v.strides.get(k) == top.strides.get(k));
        if v.offset != top.offset || !agree {
            return None;
        }
    }
    direct.iter().all(|(_, v)| v.strides.last() == Some(&1)).then_some(direct)
}

/// Whether elementwise node `id` is the base of a chain of reshapes and permutes (one consumer
/// each, a permute among them) whose top every reader reads through strides but none inlines
/// (a matmul operand): then `id` is better written in its own row-major order and the chain
/// read as a view of it. Inlined into the chain, its kernel would write the permuted order: a
/// transposing store (the rematerialized GELU that a weight gradient reads as `Hᵀ`, 4096x3072:
/// about 110 µs a dispatch profiled on an H200, about half that stored row-major).
#[allow(clippy::too_many_arguments)]
fn permuted_by_readers(
    g: &Graph,
    id: NodeId,
    consumers: &[Vec<NodeId>],
    is_root: &[bool],
    apart: &dyn Fn(NodeId, NodeId) -> bool,
    in_place: &[bool],
    flat: &[bool],
    prologue: &dyn Fn(NodeId, NodeId) -> bool,
) -> bool {
    if g.node(id).op.class() != OpClass::Elementwise {
        return false;
    }
    let (mut top, mut v, mut permuted) = (id, View::contiguous(g.shape(id)), false);
    while let [c] = consumers[top.index()][..] {
        match g.node(c).op {
            Op::Reshape => {}
            Op::Permute { .. } => permuted = true,
            _ => break,
        }
        if is_root[c.index()] || apart(top, c) {
            return false;
        }
        let Some(next) = v.through(g, c) else { return false };
        (top, v) = (c, next);
    }
    let readers = &consumers[top.index()];
    // A product that reads the chain through a prologue computes `id` itself.
    let prologue = matches!(readers[..], [r] if prologue(r, top));
    permuted
        && !prologue
        && readers.iter().all(|&r| !accepts_expression(g, flat, r, top) && view_fits(g, r, top, &v))
        && reads_view(g, top, readers, apart, in_place, flat)
}

/// The value a product `mm` reads through a prologue when its operand `top` is an
/// elementwise chain over one materialized f32 value: unary ops that map zero to zero (a rule
/// from when the conversion applied the chain to its zero padding too; it no longer does) and
/// layout ops (`reshape`, `permute`, `slice`), first a LayerNorm of A (`norm_prologue`), at
/// least one unary op or the LayerNorm, every node of it not materialized (`top` itself may
/// be undecided yet: fusion asks while deciding it), the chain addressable as a view of the
/// value that the product can read ([`super::view::chain_below`]). A forward GELU between
/// two linear layers, and its copy the weight gradient rematerializes: each was an
/// elementwise kernel that wrote the operand for the product's conversion to read.
pub fn prologue_base(
    g: &Graph,
    mm: NodeId,
    top: NodeId,
    materialized: &[bool],
    view: &[Option<View>],
) -> Option<NodeId> {
    prologue_chain(g, mm, top, materialized, view).map(|c| c.base)
}

/// The chain of [`prologue_base`].
fn prologue_chain(
    g: &Graph,
    mm: NodeId,
    top: NodeId,
    materialized: &[bool],
    view: &[Option<View>],
) -> Option<super::view::Chain> {
    if g.node(mm).op != Op::MatMul || !g.node(mm).inputs.contains(&top) {
        return None;
    }
    let stored = |x: NodeId| materialized[x.index()];
    let c = super::view::chain_below(g, top, &stored, &|x| view[x.index()].clone())?;
    let ops = c.ops.iter().all(|u| u.eval(0.0f64) == 0.0);
    // A LayerNorm's three buffers are bound by A's conversion only (its bindings then stay
    // within WebGPU's 8 storage buffers a stage, B's column sums included).
    let ins = &g.node(mm).inputs;
    let norm = c.norm.is_none() || ins[0] == top && ins[1] != top;
    let prologue = (c.norm.is_some() || !c.ops.is_empty()) && ops && norm;
    (prologue && view_fits(g, mm, top, &c.view)).then_some(c)
}

/// The longest rows whose LayerNorm stats a conversion computes (`norm_prologue`): each row is
/// read twice more by 16 invocations of its strip's workgroup, where the LayerNorm's own
/// kernel streams it at full bandwidth. On the H200 (2026-12-03, BENCHMARKS.md) gpt-small's
/// rows of 256 gained (4.63 -> 4.58 ms a step in `high`, 9 dispatches fewer) and gpt-medium's
/// of 1024 lost (57.18 -> 57.42 ms).
const STATS_ROW_MAX: usize = 256;

/// The product that reads LayerNorm `ln` through an operand prologue, and whether its
/// conversion computes the stats too, when only that product reads `ln`, as its A, through
/// layout ops (`chain_ok` and not `apart` each, one reader each). The conversion then
/// normalizes each element it reads with the stats, weight and bias, and `ln` has no kernel
/// of its own. The stats are stored when `ln` is a copy whose stats another LayerNorm kernel
/// computes (the copy a weight gradient's backward pass rematerializes); for the LayerNorm
/// that would compute them (a forward one) the conversion computes them, which it can when
/// each strip of A it converts holds whole rows of `ln`: a 2-D product reading `ln` as
/// `[M, K]` row-major with K its last axis, at most [`STATS_ROW_MAX`], and nothing but `ln`
/// reads the stats before the product.
fn norm_prologue(
    g: &Graph,
    ln: NodeId,
    consumers: &[Vec<NodeId>],
    chain_ok: &dyn Fn(NodeId) -> bool,
    apart: &dyn Fn(NodeId, NodeId) -> bool,
    materialized: &[bool],
    view: &[Option<View>],
) -> Option<(NodeId, bool)> {
    let stats = g.node(ln).inputs[1];
    let first = consumers[stats.index()].iter().find(|&&c| matches!(g.node(c).op, Op::LayerNorm))?;
    let computes = *first == ln;
    let mut top = ln;
    let mm = loop {
        let [c] = consumers[top.index()][..] else { return None };
        if apart(top, c) {
            return None;
        }
        match g.node(c).op {
            Op::Reshape | Op::Permute { .. } | Op::Slice { .. } if chain_ok(c) => top = c,
            Op::MatMul => break c,
            _ => return None,
        }
    };
    let chain = prologue_chain(g, mm, top, materialized, view)?;
    if !computes {
        return Some((mm, false));
    }
    let d = *g.shape(ln).last()?;
    let whole_rows = d <= STATS_ROW_MAX
        && g.shape(mm).len() == 2
        && g.shape(top).last() == Some(&d)
        && chain.ops.is_empty()
        && chain.view.is_contiguous(g.shape(top));
    let stats_read_before = consumers[stats.index()].iter().any(|&c| c != ln && c < mm);
    (whole_rows && !stats_read_before && !apart(stats, mm)).then_some((mm, true))
}

/// Whether the kernel of `op` writes its value through strides (a [`View`] in its own buffer,
/// or in a concat's: [`concats_in_place`]): the attention kernels' output, dq, and dK with dV.
fn writes_strided(op: &Op) -> bool {
    matches!(op, Op::Attention | Op::AttentionGradQ | Op::AttentionGradKv)
}

/// Whether reader `c` of `id` can address `id` viewed as `v`: a matmul needs one matrix per
/// batch with a unit row or column stride (what its fast kernels read), an attention kernel a
/// contiguous head dimension; generated kernels address any view.
fn view_fits(g: &Graph, c: NodeId, id: NodeId, v: &View) -> bool {
    match g.node(c).op {
        Op::MatMul => v
            .matrix(g.shape(id))
            .is_some_and(|[_, row, col]| row == 1 || col == 1),
        Op::Attention | Op::AttentionStats | Op::AttentionGradKv | Op::AttentionGradQ => {
            v.strides.last() == Some(&1) && g.dtype(id) == crate::tensor::DType::F32
        }
        _ => true,
    }
}

/// The value whose buffer layout op `id` reads and where in it, when the chain of layout ops
/// from `id` down to a materialized value can be addressed by strides.
fn strided_view(
    g: &Graph,
    id: NodeId,
    materialized: &[bool],
    alias: &[Option<NodeId>],
    view: &[Option<View>],
) -> Option<(NodeId, View)> {
    let x = *g.node(id).inputs.first()?;
    let (owner, below) = if materialized[x.index()] {
        let owner = alias[x.index()].unwrap_or(x);
        match &view[x.index()] {
            Some(v) => (owner, v.clone()),
            // A plain value, or a contiguous view sharing its owner's row-major layout.
            None => (owner, View::contiguous(g.shape(x))),
        }
    } else if matches!(g.node(x).op, Op::Slice { .. } | Op::Permute { .. } | Op::Reshape) {
        strided_view(g, x, materialized, alias, view)?
    } else {
        return None;
    };
    Some((owner, below.through(g, id)?))
}

/// When the materialized elementwise node `out` is an epilogue over a matmul, the matmul and the
/// node the epilogue reads as its accumulator (the matmul, or a reshape view of it): the matmul's
/// one use is that view or `out`'s inlined expression, the accumulator's one use is in `out`'s
/// expression, at `out`'s own shape, reached without index remapping.
fn epilogue_matmul(
    g: &Graph,
    out: NodeId,
    materialized: &[bool],
    alias: &[Option<NodeId>],
    consumers: &[Vec<NodeId>],
    is_root: &[bool],
) -> Option<(NodeId, NodeId)> {
    let shape = g.shape(out);
    let sole_use = |x: NodeId, user: NodeId| consumers[x.index()] == [user] && !is_root[x.index()];
    let mut stack = vec![out];
    while let Some(id) = stack.pop() {
        let node = g.node(id);
        // Only plain elementwise ops keep coordinates aligned with the accumulator's.
        if !node.op.is_pointwise() {
            return None;
        }
        for &x in &node.inputs {
            let xn = g.node(x);
            let mm = match xn.op {
                Op::MatMul => Some(x),
                Op::Reshape if alias[x.index()].is_some() => {
                    let src = xn.inputs[0];
                    (matches!(g.node(src).op, Op::MatMul) && sole_use(src, x)).then_some(src)
                }
                _ => None,
            };
            if let Some(mm) = mm {
                if xn.shape == shape && sole_use(x, id) {
                    return Some((mm, x));
                }
            } else if !materialized[x.index()] {
                stack.push(x);
            }
        }
    }
    None
}

/// The `add` that LayerNorm gradient `gi` can be written into by its own kernel: `gi`'s one
/// use, materialized and not a matmul's epilogue, adding `gi` to a plain buffer of the same
/// shape (no view, not `gi`) computed before `gi`, which the LayerNorm backward reads whole
/// (`codegen::layer_norm`'s addend).
#[allow(clippy::too_many_arguments)]
fn ln_addend(
    g: &Graph,
    gi: NodeId,
    materialized: &[bool],
    view: &[Option<View>],
    consumers: &[Vec<NodeId>],
    is_root: &[bool],
    epilogue_of: &[Option<(NodeId, NodeId)>],
    live: &[bool],
) -> Option<NodeId> {
    let &[a] = consumers[gi.index()].as_slice() else { return None };
    let node = g.node(a);
    let add = matches!(node.op, Op::Binary(op) if op == crate::graph::BinaryOp::Add);
    if !add || !live[a.index()] || !materialized[a.index()] || epilogue_of[a.index()].is_some() {
        return None;
    }
    let r = ln_other(g, a, gi);
    let plain = materialized[r.index()] && view[r.index()].is_none();
    let same = g.shape(r) == g.shape(gi) && g.shape(a) == g.shape(gi);
    let f32s = [r, a].iter().all(|&x| g.dtype(x) == crate::tensor::DType::F32);
    (plain && same && f32s && r != gi && r.index() < gi.index() && !is_root[gi.index()]).then_some(a)
}

/// A live `sum` of `x` (or of a reshape of `x` sharing its buffer) over every axis but the last.
fn column_sum(
    g: &Graph,
    x: NodeId,
    live: &[bool],
    alias: &[Option<NodeId>],
    consumers: &[Vec<NodeId>],
) -> Option<NodeId> {
    let reshapes = consumers[x.index()]
        .iter()
        .filter(|&&r| matches!(g.node(r).op, Op::Reshape) && alias[r.index()] == Some(x));
    let reads = std::iter::once(x).chain(reshapes.copied());
    reads.flat_map(|r| consumers[r.index()].iter().copied()).find(|&s| {
        let node = g.node(s);
        let Op::Reduce { op: crate::graph::ReduceOp::Sum, axes, .. } = &node.op else { return false };
        let xs = g.shape(node.inputs[0]);
        let over_rows = !xs.is_empty() && axes.len() == xs.len() - 1 && axes.iter().enumerate().all(|(k, &a)| a == k);
        live[s.index()] && over_rows && xs.last() == g.shape(x).last() && g.dtype(s) == crate::tensor::DType::F32
    })
}

/// Elementwise kernels merged into the later elementwise kernel that is the only reader of
/// their outputs: one kernel computes and writes both (an optimizer's moments and the parameter
/// update that reads them). Each output of the earlier kernel has the later one's shape and
/// reaches its output only through plain elementwise ops of that shape, so every thread reads
/// it at its own element, computed in registers; the merged kernel stays within the binding
/// limit and never joins nodes a micro-batch run separates.
fn merge_elementwise(
    g: &Graph,
    kernels: &mut Vec<Kernel>,
    alias: &[Option<NodeId>],
    consumers: &[Vec<NodeId>],
    max_bindings: Option<u32>,
    apart: &dyn Fn(NodeId, NodeId) -> bool,
) {
    let owner = |id: NodeId| alias[id.index()].unwrap_or(id).index();
    let mut a = 0;
    while a < kernels.len() {
        let into = merge_target(g, kernels, a, alias, consumers, apart);
        let Some(b) = into else {
            a += 1;
            continue;
        };
        let first = kernels[a].clone();
        let mut merged = kernels[b].clone();
        let mut outputs = first.outputs.clone();
        outputs.extend(&merged.outputs);
        let mut inputs: Vec<NodeId> = first.inputs.iter().chain(&merged.inputs).copied().collect();
        inputs.retain(|x| !first.outputs.contains(x));
        dedup_in_order(&mut inputs);
        merged.inputs = inputs;
        merged.outputs = outputs;
        merged.fused.extend(&first.fused);
        merged.fused.sort();
        merged.fused.dedup();
        let fits = max_bindings.is_none_or(|max| storage_bindings(g, &merged, &owner, true) <= max as usize);
        if !fits {
            a += 1;
            continue;
        }
        kernels[b] = merged;
        kernels.remove(a);
    }
}

/// The later kernel that elementwise kernel `a` can be merged into ([`merge_elementwise`]).
fn merge_target(
    g: &Graph,
    kernels: &[Kernel],
    a: usize,
    alias: &[Option<NodeId>],
    consumers: &[Vec<NodeId>],
    apart: &dyn Fn(NodeId, NodeId) -> bool,
) -> Option<usize> {
    let ka = &kernels[a];
    if ka.kind != KernelKind::Elementwise {
        return None;
    }
    let first = *ka.outputs.first()?;
    let b = (a + 1..kernels.len()).find(|&b| kernels[b].inputs.contains(&first))?;
    let kb = &kernels[b];
    let out = *kb.outputs.last()?;
    if kb.kind != KernelKind::Elementwise || g.dtype(out) != crate::tensor::DType::F32 {
        return None;
    }
    let plain = ka.outputs.iter().all(|&x| {
        alias[x.index()].is_none()
            && g.shape(x) == g.shape(out)
            && g.dtype(x) == crate::tensor::DType::F32
            && consumers[x.index()].iter().all(|c| kb.fused.contains(c))
    });
    // Everything in b computed from an output of a: plain elementwise ops at b's shape.
    let mut from_a: Vec<NodeId> = ka.outputs.clone();
    let mut aligned = true;
    for &id in &kb.fused {
        let node = g.node(id);
        if node.inputs.iter().any(|x| from_a.contains(x)) {
            aligned &= node.op.is_pointwise() && node.shape == g.shape(out);
            from_a.push(id);
        }
    }
    let together = ka.fused.iter().all(|&x| kb.fused.iter().all(|&y| !apart(x, y)));
    (plain && aligned && together).then_some(b)
}

/// The input of add `a` that is not `gi`.
fn ln_other(g: &Graph, a: NodeId, gi: NodeId) -> NodeId {
    let ins = &g.node(a).inputs;
    if ins[0] == gi {
        ins[1]
    } else {
        ins[0]
    }
}

/// Whether every kernel that reads `w` comes after node `at`: its readers' kernels, through
/// readers without a kernel of their own (inlined into their consumer's, or views).
fn read_after(
    w: NodeId,
    at: NodeId,
    consumers: &[Vec<NodeId>],
    materialized: &[bool],
    alias: &[Option<NodeId>],
) -> bool {
    consumers[w.index()].iter().all(|&c| {
        let own_kernel = materialized[c.index()] && alias[c.index()].is_none();
        if own_kernel {
            c.index() > at.index()
        } else {
            read_after(c, at, consumers, materialized, alias)
        }
    })
}

/// The `layer_norm_grad_weight` node computed from the same (x, stats, dy) as `gi`, if live.
fn ln_weight_grad(
    g: &Graph,
    gi: NodeId,
    consumers: &[Vec<NodeId>],
    live: &[bool],
) -> Option<NodeId> {
    let ins = &g.node(gi).inputs;
    consumers[ins[0].index()].iter().copied().find(|&c| {
        let n = g.node(c);
        live[c.index()]
            && matches!(n.op, Op::LayerNormGradWeight)
            && n.inputs == [ins[0], ins[1], ins[3]]
    })
}

/// Walk `id`'s inlined expression: record fused nodes and the buffers it reads.
fn collect(
    g: &Graph,
    id: NodeId,
    materialized: &[bool],
    kind: &KernelKind,
    fused: &mut Vec<NodeId>,
    inputs: &mut Vec<NodeId>,
) {
    fused.push(id);
    for &x in &g.node(id).inputs {
        if let KernelKind::MatMul { matmul, register, .. } = kind {
            if x == *register {
                // The matmul's own operands are this kernel's buffers.
                fused.extend([*matmul, *register]);
                for &y in &g.node(*matmul).inputs {
                    if !materialized[y.index()] {
                        collect(g, y, materialized, kind, fused, inputs);
                    } else if !inputs.contains(&y) {
                        inputs.push(y);
                    }
                }
                continue;
            }
        }
        if materialized[x.index()] {
            if !inputs.contains(&x) {
                inputs.push(x);
            }
        } else {
            collect(g, x, materialized, kind, fused, inputs);
        }
    }
}
