//! The adapter limits a plan must fit, and how fusion is split to fit them.
//!
//! Two limits of an adapter bound a plan: the storage buffers one kernel may bind
//! (`max_storage_buffers_per_shader_stage`: 8 under WebGPU's defaults, 16 on Mesa's OpenGL
//! adapter) and the bytes of one storage binding (`max_storage_buffer_binding_size`: 128 MiB under
//! WebGPU's defaults). No kernel kind binds a number of buffers that grows with the model:
//! - an expression that would read too many buffers (a long chain of additions) is split by
//!   materializing inlined subexpressions that fit, largest first ([`split_points`]), and a
//!   product's epilogue that splits below the product cannot fit ends earlier, the rest of it
//!   an elementwise kernel split as any expression (`epilogue_cut`); the optimizer reads flat
//!   arenas (`super::arena`), one buffer per kind however many parameters;
//! - a concat of many inputs runs as several kernels, each writing the part of the output that
//!   its inputs fill ([`concat_parts`]);
//! - and no kernel's expression grows without bound (`super::fuse::MAX_INLINED_NODES`), so
//!   that validating its WGSL stays fast.
//! - every other kind binds a fixed number of buffers ([`storage_bindings`]).
//!
//! A value larger than one binding cannot be split by the planner; [`check_binding_bytes`]
//! refuses it with an error naming the value and the limit.

use super::kernel::{Kernel, KernelKind};
use super::Plan;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId, Op};
use crate::tensor::fmt_shape;
use std::collections::HashMap;

/// The adapter limits a plan is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Storage buffers one kernel may bind (`max_storage_buffers_per_shader_stage`).
    pub max_storage_buffers: u32,
    /// Bytes of one storage binding (`max_storage_buffer_binding_size`).
    pub max_binding_bytes: u64,
    /// Bytes of one buffer (`max_buffer_size`): the most a heap of shared values takes.
    pub max_buffer_bytes: u64,
}

impl Limits {
    /// WebGPU's default limits, which every adapter meets: 8 storage buffers per stage,
    /// 128 MiB per binding and 256 MiB per buffer.
    pub const WEBGPU_DEFAULT: Limits =
        Limits { max_storage_buffers: 8, max_binding_bytes: 128 << 20, max_buffer_bytes: 256 << 20 };

    /// The tighter of two sets of limits, each field on its own: what fits both.
    pub fn within(self, other: Limits) -> Limits {
        Limits {
            max_storage_buffers: self.max_storage_buffers.min(other.max_storage_buffers),
            max_binding_bytes: self.max_binding_bytes.min(other.max_binding_bytes),
            max_buffer_bytes: self.max_buffer_bytes.min(other.max_buffer_bytes),
        }
    }

    /// The limits of an open wgpu device.
    pub fn of(limits: &wgpu::Limits) -> Limits {
        Limits {
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            max_binding_bytes: limits.max_storage_buffer_binding_size,
            max_buffer_bytes: limits.max_buffer_size,
        }
    }
}

/// Whether kernels of this kind check their data and report what is wrong through the plan's
/// status buffer (indices and labels out of range), which they bind after their own buffers.
pub fn checks_data(kind: &KernelKind) -> bool {
    matches!(
        kind,
        KernelKind::Embedding
            | KernelKind::EmbeddingGrad
            | KernelKind::CrossEntropy
            | KernelKind::CrossEntropyGrad
    )
}

/// The value a checking kernel checks (its indices or labels): pinned in the plan, so that the
/// host can read the bad element after the step and report it.
pub fn checked_operand(g: &Graph, k: &Kernel) -> Option<NodeId> {
    let node = g.node(*k.outputs.last()?);
    match node.op {
        Op::EmbeddingGrad { .. } => Some(node.inputs[0]),
        Op::Embedding | Op::CrossEntropy { .. } | Op::CrossEntropyGrad { .. } => {
            Some(node.inputs[1])
        }
        _ => None,
    }
}

/// Whether kernel `k` of `plan` commits a new value into a persistent buffer in place while some
/// kernel of the plan checks its data: it then binds the status buffer and writes nothing when
/// a check failed, so a step that reports an error leaves parameters and state as they were.
pub fn guarded(g: &Graph, plan: &Plan, k: &Kernel) -> bool {
    // In place into an update's target: a parameter or state, or a host arena of them.
    let commits = |t: NodeId| {
        g.node(t).op.is_persistent() || plan.updates.iter().any(|&(target, _)| target == t)
    };
    k.kind == KernelKind::Elementwise
        && k.outputs.iter().any(|&o| plan.alias[o.index()].is_some_and(commits))
        && plan.kernels.iter().any(|k| checks_data(&k.kind))
}

/// The storage buffers kernel `k` binds, with `buffer` naming the buffer of each value it
/// reads or writes (values in one buffer count once):
/// - the matmul template binds its operands and result (3), then each buffer its epilogue reads,
///   and the sum of an operand it computes too (its split-K sum binds the partials, the
///   result, the sum's partials and the sum);
/// - LayerNorm forward binds x, weight, bias, y and stats (5), its backward x, weight, stats,
///   dy, dx, the partial sums and dweight/dbias (7), and the addend when it adds one (8),
///   whatever the kernel's own values are;
/// - attention binds q, k, v, stats and the output (5) forward, q, k, v, stats, dy, the output
///   and the gradient (7) backward;
/// - a generated kernel binds each of its buffers once, plus the status buffer when it checks
///   its data ([`checks_data`]) or commits an update that a failed check must hold back
///   (`guarded`), plus the scratch its dispatches share: a two-stage reduction's first stage
///   binds its partials instead of its output, the second only the two; cross-entropy's
///   second dispatch binds the output and the rows' losses; its gradient with an ignored
///   label also binds the count; embedding backward's sort binds up to five scratch buffers
///   (keys and positions in and out, and the block counts).
pub fn storage_bindings(
    g: &Graph,
    k: &Kernel,
    buffer: &dyn Fn(NodeId) -> usize,
    guarded: bool,
) -> usize {
    let distinct = |ids: Vec<NodeId>| {
        let mut b: Vec<usize> = ids.into_iter().map(buffer).collect();
        b.sort_unstable();
        b.dedup();
        b.len()
    };
    match &k.kind {
        KernelKind::MatMul { register, sum, .. } => {
            let out = *k.outputs.last().expect("a kernel writes a value");
            let epilogue =
                if out == *register { Vec::new() } else { reads(g, k, &[out], Some(*register)) };
            let product = 3 + distinct(epilogue) + usize::from(sum.is_some());
            // A LayerNorm read through A's prologue: its conversion binds A, B, the
            // workspace, the exponents, the stats, weight and bias (and B's column sums).
            let norm = k.fused.iter().any(|&x| matches!(g.node(x).op, Op::LayerNorm));
            if norm { product.max(7 + usize::from(sum.is_some())) } else { product }
        }
        KernelKind::LayerNorm { .. } | KernelKind::LayerNormStats => 5,
        KernelKind::LayerNormGradInput { add: Some(_), .. } => 8,
        KernelKind::LayerNormGradInput { .. } | KernelKind::LayerNormGradWeight => 7,
        KernelKind::Attention { .. } | KernelKind::AttentionStats => 5,
        KernelKind::AttentionGradKv | KernelKind::AttentionGradQ => 7,
        kind => {
            let own = distinct(k.inputs.iter().chain(&k.outputs).copied().collect());
            let out = *k.outputs.last().expect("a kernel writes a value");
            let scratch = match g.node(out).op {
                Op::CrossEntropyGrad { ignore_index: Some(_) } | Op::EmbeddingGrad { .. } => 1,
                _ => 0,
            };
            own + usize::from(checks_data(kind) || guarded) + scratch
        }
    }
}

/// The materialized values the expressions rooted at `roots` read inside kernel `k` (nodes of
/// `k.fused` are computed inside it; `stop` is a register not to look through), each once.
pub fn reads(g: &Graph, k: &Kernel, roots: &[NodeId], stop: Option<NodeId>) -> Vec<NodeId> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    let mut stack: Vec<NodeId> = roots.iter().rev().copied().collect();
    while let Some(id) = stack.pop() {
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        for &x in g.node(id).inputs.iter().rev() {
            if Some(x) == stop || matches!(g.node(x).op, Op::Constant { .. }) {
                continue;
            }
            if k.fused.binary_search(&x).is_ok() {
                stack.push(x);
            } else if !out.contains(&x) {
                out.push(x);
            }
        }
    }
    out
}

/// The inlined nodes of over-limit kernel `k` to materialize so that it binds at most `max`
/// buffers, all chosen at once: among the inlined subexpressions whose own kernel would fit
/// (`2 ..= max − 1` buffers read), the one whose materialization saves the most bindings, then
/// the one that reads the most; then the same in what remains of `k` once it reads that node as
/// a buffer, and so on until the rest fits or nothing more can be split off. These are the
/// nodes, in order, that fusion passes splitting one node of `k` each would choose (the rest of
/// `k` is what the next pass fuses), at a fraction of the cost: each choice weighs every inlined
/// node in one walk of the kernel's expression tree (`Expr`) instead of recomputing the
/// kernel's reads per node (about n^4 in all for a sum of n layers, minutes at 1500). An
/// expression that is not a tree, and a kernel whose binding count is not that of its
/// expression's reads, give one node a call, chosen the old way ([`reads`] per candidate).
///
/// A product's epilogue is split that way only below the nodes that lead down to the product
/// (its register), which stay in the product's kernel. Where that cannot make it fit (a
/// gradient summed over many layers whose first term is the product,
/// `((mm + t1) + t2) + ... + tn`: every `t` split off, the sum still reads them all), the
/// epilogue is cut on that path instead (`epilogue_cut`), alone: the product's kernel ends
/// there, and the rest is an elementwise kernel reading it, which the next pass splits as it
/// splits any expression.
pub fn split_points(
    g: &Graph,
    k: &Kernel,
    max: u32,
    owner: &dyn Fn(NodeId) -> NodeId,
) -> Vec<NodeId> {
    let Some(mut expr) = Expr::new(g, k, owner) else {
        let c = split_point(g, k, max, owner).or_else(|| epilogue_cut(g, k, max, owner));
        return c.into_iter().collect();
    };
    let out = *k.outputs.last().expect("a kernel writes a value");
    // The bindings of what remains of `k`, from the buffers its expression reads.
    let fixed = match k.kind {
        KernelKind::Elementwise | KernelKind::Reduce if k.outputs.len() == 1 => Some(0),
        KernelKind::MatMul { register, sum, .. } if register != out => {
            Some(3 + usize::from(sum.is_some()))
        }
        _ => None,
    };
    let bindings = |reads: &HashMap<NodeId, u32>| match k.kind {
        KernelKind::MatMul { .. } => reads.len(),
        _ => reads.len() + usize::from(!reads.contains_key(&owner(out))),
    };
    let mut chosen = Vec::new();
    let (c, reads) = expr.split_point(max);
    let bound = storage_bindings(g, k, &|id| owner(id).index(), false);
    let exact = fixed.is_some_and(|f| f + bindings(&reads) == bound);
    // Nothing below the register splits the kernel enough: cut the path to it instead (the
    // splits chosen so far were for this kernel, whose rest the next pass weighs anew).
    let or_epilogue_cut =
        |chosen: Vec<NodeId>| epilogue_cut(g, k, max, owner).map_or(chosen, |c| vec![c]);
    let Some(mut c) = c else { return or_epilogue_cut(chosen) };
    loop {
        chosen.push(expr.ids[c]);
        if !exact {
            return chosen;
        }
        expr.cut(c);
        let (next, reads) = expr.split_point(max);
        if fixed.unwrap_or(0) + bindings(&reads) <= max as usize {
            return chosen;
        }
        match next {
            Some(n) => c = n,
            None => return or_epilogue_cut(chosen),
        }
    }
}

/// Where to cut the epilogue of over-limit product kernel `k` when splitting below its register
/// cannot make it fit: the inlined node, on the path from the kernel's output down to the
/// register (the output excluded), to materialize as the product kernel's output. The highest
/// one whose expression, as the product's epilogue, binds at most `max` buffers as it stands;
/// when none does, the lowest (the register's reader: an epilogue of one op, whose other
/// operands the next pass splits off). `None` for a kernel without an epilogue or one whose
/// output reads the register itself. Linear in the kernel's nodes: the nodes reaching the
/// register in arena order (a topological order), then each node's reads visited once.
fn epilogue_cut(
    g: &Graph,
    k: &Kernel,
    max: u32,
    owner: &dyn Fn(NodeId) -> NodeId,
) -> Option<NodeId> {
    let out = *k.outputs.last()?;
    let KernelKind::MatMul { register, matmul, sum } = k.kind else { return None };
    // The product's operands and output and its sum's output, then the epilogue's buffers.
    let room = (max as usize).checked_sub(3 + usize::from(sum.is_some()))?;
    let fused = |x: NodeId| k.fused.binary_search(&x).is_ok();
    // The inlined nodes that reach the register, in arena order (inputs first).
    let mut reaches: std::collections::HashSet<NodeId> = Default::default();
    for &c in &k.fused {
        let up = |x: &NodeId| *x == register || reaches.contains(x);
        if c != register && c != matmul && g.node(c).inputs.iter().any(up) {
            reaches.insert(c);
        }
    }
    // The path from the output down to the register's reader.
    let mut path = vec![out];
    while let Some(&p) = path.last() {
        let inputs = &g.node(p).inputs;
        if inputs.contains(&register) {
            break;
        }
        path.push(*inputs.iter().find(|x| reaches.contains(x))?);
    }
    // Up from the register's reader: the buffers each path node's expression reads.
    let mut buffers: std::collections::HashSet<NodeId> = Default::default();
    let mut seen: std::collections::HashSet<NodeId> = path.iter().copied().collect();
    let mut best = None;
    for &p in path.iter().skip(1).rev() {
        let mut stack = vec![p];
        while let Some(id) = stack.pop() {
            for &x in &g.node(id).inputs {
                if x == register || matches!(g.node(x).op, Op::Constant { .. }) {
                    continue;
                }
                if !fused(x) {
                    buffers.insert(owner(x));
                } else if seen.insert(x) {
                    stack.push(x);
                }
            }
        }
        // Along the path the buffers only grow: past the room, no higher node fits.
        if g.node(p).op.is_pointwise() && (best.is_none() || buffers.len() <= room) {
            best = Some(p);
        }
        if best.is_some() && buffers.len() > room {
            break;
        }
    }
    best
}

/// The inlined expression of a kernel as a tree, from its output through its inlined nodes
/// (each read once: an inlinable node is inlined into its one consumer), and the buffers each
/// node reads, by owner. A node cut off reads itself, a buffer; the nodes below it are gone.
struct Expr {
    /// The nodes, parents before children.
    ids: Vec<NodeId>,
    /// Each node's parent (the output's is itself).
    parent: Vec<usize>,
    /// The owners of the buffers each node reads, one per use.
    reads: Vec<Vec<NodeId>>,
    /// Whether a node may be materialized to split the kernel ([`split_point`]'s candidates).
    candidate: Vec<bool>,
    /// Whether a node is materialized since: the rest reads it as a buffer of its own.
    cut: Vec<bool>,
    /// Whether a node is below a cut node (computed by that node's kernel).
    gone: Vec<bool>,
}

impl Expr {
    /// The expression of `k`, or `None` when it is not a tree or some candidate of
    /// [`split_point`] lies outside it.
    fn new(g: &Graph, k: &Kernel, owner: &dyn Fn(NodeId) -> NodeId) -> Option<Expr> {
        let out = *k.outputs.last()?;
        let register = match k.kind {
            KernelKind::MatMul { register, matmul, .. } => Some((register, matmul)),
            _ => None,
        };
        let stop = register.map(|r| r.0);
        let fused = |x: NodeId| k.fused.binary_search(&x).is_ok();
        let mut e = Expr {
            ids: Vec::new(),
            parent: Vec::new(),
            reads: Vec::new(),
            candidate: Vec::new(),
            cut: Vec::new(),
            gone: Vec::new(),
        };
        let mut index: HashMap<NodeId, usize> = HashMap::new();
        let mut touches = Vec::new();
        let mut stack = vec![(out, 0)];
        while let Some((id, parent)) = stack.pop() {
            let i = e.ids.len();
            if index.insert(id, i).is_some() {
                return None; // read twice: not a tree
            }
            e.ids.push(id);
            e.parent.push(parent);
            let mut reads = Vec::new();
            let mut reaches = false;
            for &x in g.node(id).inputs.iter().rev() {
                reaches |= Some(x) == stop;
                if Some(x) == stop || matches!(g.node(x).op, Op::Constant { .. }) {
                    continue;
                }
                if fused(x) {
                    stack.push((x, i));
                } else {
                    reads.push(owner(x));
                }
            }
            e.reads.push(reads);
            touches.push(reaches);
        }
        // Whether each node reaches the register through inlined nodes (children come later).
        for i in (1..e.ids.len()).rev() {
            let p = e.parent[i];
            touches[p] |= touches[i];
        }
        let candidate = |c: NodeId, touches: bool| {
            let node = g.node(c);
            !k.outputs.contains(&c)
                && !matches!(node.op, Op::Constant { .. })
                && super::fuse::is_inlinable(&node.op)
                && register.is_none_or(|(r, mm)| c != r && c != mm && !touches)
        };
        let n = e.ids.len();
        e.candidate = (0..n).map(|i| candidate(e.ids[i], touches[i])).collect();
        // Every candidate is in the tree (a fused node outside it reaches the register or is
        // no candidate: the matmul, an output), or the tree cannot stand for the kernel.
        let outside = k.fused.iter().any(|&c| {
            !index.contains_key(&c) && candidate(c, depends_on(g, k, c, stop.unwrap_or(c)))
        });
        if outside {
            return None;
        }
        e.cut = vec![false; n];
        e.gone = vec![false; n];
        Some(e)
    }

    /// Materialize node `c`: the rest reads it as a buffer.
    fn cut(&mut self, c: usize) {
        self.cut[c] = true;
        for i in c + 1..self.ids.len() {
            let p = self.parent[i];
            if p == c || self.gone[p] {
                self.gone[i] = true;
            }
        }
    }

    /// [`split_point`] of what remains of the kernel, as an index, with the buffers the rest
    /// reads (owners, each with its number of uses). For each node, in one walk from the leaves
    /// up merging the children's reads into the largest child's: the buffers its subexpression
    /// reads, and how many of them nothing outside it reads (what materializing it saves,
    /// less its own buffer).
    fn split_point(&self, max: u32) -> (Option<usize>, HashMap<NodeId, u32>) {
        let n = self.ids.len();
        let own = |i: usize| -> &[NodeId] {
            match self.cut[i] {
                true => std::slice::from_ref(&self.ids[i]),
                false => &self.reads[i],
            }
        };
        let mut total: HashMap<NodeId, u32> = HashMap::new();
        for i in (0..n).filter(|&i| !self.gone[i]) {
            for &b in own(i) {
                *total.entry(b).or_insert(0) += 1;
            }
        }
        // Per node: its subexpression's buffers with their uses in it, and how many of them
        // are used there only.
        let mut sub: Vec<(HashMap<NodeId, u32>, usize)> = Vec::new();
        sub.resize_with(n, Default::default);
        let mut best: Option<(usize, usize, NodeId, usize)> = None;
        for i in (0..n).rev().filter(|&i| !self.gone[i]) {
            let (mut reads, mut only) = std::mem::take(&mut sub[i]);
            for &b in own(i) {
                let uses = reads.entry(b).or_insert(0);
                *uses += 1;
                only += usize::from(*uses == total[&b]);
            }
            let mine = reads.len();
            if self.candidate[i] && !self.cut[i] && (2..max as usize).contains(&mine) {
                let saved = only.saturating_sub(1);
                let key = (saved, mine, std::cmp::Reverse(self.ids[i]));
                if best.is_none_or(|b| key > (b.0, b.1, std::cmp::Reverse(b.2))) {
                    best = Some((saved, mine, self.ids[i], i));
                }
            }
            if i == 0 {
                return (best.map(|b| b.3), reads);
            }
            // Merge into the parent's, the smaller map into the larger.
            let (mut into, mut into_only) = std::mem::take(&mut sub[self.parent[i]]);
            if into.len() < reads.len() {
                std::mem::swap(&mut into, &mut reads);
                std::mem::swap(&mut into_only, &mut only);
            }
            for (b, u) in reads {
                let uses = into.entry(b).or_insert(0);
                let before = *uses;
                *uses += u;
                into_only += usize::from(before < total[&b] && *uses == total[&b]);
            }
            sub[self.parent[i]] = (into, into_only);
        }
        unreachable!("the output is the tree's root")
    }
}

/// The inlined node of kernel `k` to materialize so that `k` binds fewer buffers: among the
/// inlined subexpressions whose own kernel would fit (`2 ..= max − 1` buffers read), the one
/// whose materialization saves the most bindings, then the one that reads the most. `None` when
/// no inlined subexpression reads two buffers or more.
fn split_point(
    g: &Graph,
    k: &Kernel,
    max: u32,
    owner: &dyn Fn(NodeId) -> NodeId,
) -> Option<NodeId> {
    let out = *k.outputs.last()?;
    let register = match k.kind {
        KernelKind::MatMul { register, matmul, .. } => Some((register, matmul)),
        _ => None,
    };
    let owners = |ids: Vec<NodeId>| {
        let mut o: Vec<NodeId> = ids.into_iter().map(owner).collect();
        o.sort_unstable();
        o.dedup();
        o
    };
    let all = owners(reads(g, k, &[out], register.map(|r| r.0)));
    let mut best: Option<(usize, usize, NodeId)> = None;
    for &c in &k.fused {
        let node = g.node(c);
        let inlined = !k.outputs.contains(&c)
            && !matches!(node.op, Op::Constant { .. })
            && super::fuse::is_inlinable(&node.op)
            && register.is_none_or(|(r, mm)| c != r && c != mm && !depends_on(g, k, c, r));
        if !inlined {
            continue;
        }
        let mine = owners(reads(g, k, &[c], None));
        if mine.len() < 2 || mine.len() > max as usize - 1 {
            continue;
        }
        // What the rest of the kernel still reads once `c` is a buffer of its own.
        let rest = owners(reads_without(g, k, out, c, register.map(|r| r.0)));
        let saved = all.len().saturating_sub(rest.len());
        let key = (saved, mine.len(), c);
        if best.is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
            best = Some(key);
        }
    }
    best.map(|b| b.2)
}

/// Whether inlined node `c` of kernel `k` reaches `target` through inlined nodes.
fn depends_on(g: &Graph, k: &Kernel, c: NodeId, target: NodeId) -> bool {
    let mut stack = vec![c];
    while let Some(id) = stack.pop() {
        for &x in &g.node(id).inputs {
            if x == target {
                return true;
            }
            if k.fused.binary_search(&x).is_ok() {
                stack.push(x);
            }
        }
    }
    false
}

/// [`reads`] from `root` with node `cut` read as a buffer instead of computed.
fn reads_without(
    g: &Graph,
    k: &Kernel,
    root: NodeId,
    cut: NodeId,
    stop: Option<NodeId>,
) -> Vec<NodeId> {
    let mut fused = k.fused.clone();
    fused.retain(|&x| x != cut);
    let trimmed = Kernel { fused, ..k.clone() };
    reads(g, &trimmed, &[root], stop)
}

/// Split the inputs of a concat, given the buffers each reads and the nodes each one's
/// expression holds, into runs whose kernels fit: each run's distinct buffers plus the output
/// within `max`, and at most [`super::fuse::MAX_INLINED_NODES`] nodes in all (one kernel for
/// 5,000 inputs took `rumus plan` seconds to validate, 50,000 more than a minute: see
/// there). A run holds at least one input.
pub fn concat_parts(
    reads: &[Vec<NodeId>],
    nodes: &[usize],
    max: Option<u32>,
) -> Vec<std::ops::Range<usize>> {
    let max = max.map_or(usize::MAX, |m| m as usize);
    let mut parts = Vec::new();
    let mut start = 0;
    let mut seen: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    let mut held = 0;
    for (i, (r, &n)) in reads.iter().zip(nodes).enumerate() {
        let new = r.iter().filter(|x| !seen.contains(x)).count();
        let full = seen.len() + new + 1 > max || held + n > super::fuse::MAX_INLINED_NODES;
        if i > start && full {
            parts.push(start..i);
            start = i;
            seen.clear();
            held = 0;
        }
        seen.extend(r);
        held += n;
    }
    parts.push(start..reads.len());
    parts
}

/// Refuse a plan with a value larger than one storage binding: the error names the value (its
/// op, shape and bytes, at its position in the model when it has one) and the limit.
pub fn check_binding_bytes(g: &Graph, plan: &Plan, max_bytes: u64) -> Result<()> {
    check_values(g, plan, max_bytes, |bytes| {
        format!(
            "takes {bytes} bytes, more than the {max_bytes} bytes the adapter allows in one \
             storage binding (max_storage_buffer_binding_size); use smaller dimensions"
        )
    })
}

/// Refuse a plan with a value the kernels cannot address: they index elements, and count
/// workgroups, in WGSL's `u32`, so a value of 2^32 elements or more would wrap (its kernels
/// would dispatch nothing, without a word). Whatever the device's limits.
pub fn check_addressable(g: &Graph, plan: &Plan) -> Result<()> {
    let max_bytes = 4 * u64::from(u32::MAX);
    check_values(g, plan, max_bytes, |bytes| {
        format!(
            "takes {bytes} bytes, {} elements or more: the GPU kernels index at most 2^32 - 1 \
             (u32); use smaller dimensions",
            1u64 << 32
        )
    })
}

/// The first value of `plan` over `max_bytes`, as an error naming it with `why(bytes)`.
fn check_values(g: &Graph, plan: &Plan, max_bytes: u64, why: impl Fn(u64) -> String) -> Result<()> {
    let Some(v) = plan.values.iter().find(|v| v.bytes > max_bytes) else { return Ok(()) };
    let node = g.node(v.node);
    let what = match &node.op {
        Op::Input { name } => format!("input `{name}`"),
        Op::Parameter { name, .. } => format!("parameter `{name}`"),
        Op::State { name, .. } => format!("state `{name}`"),
        op => format!("the result of `{}`", op.name()),
    };
    Err(err!(Device, "{what} ({}{}) {}", node.dtype, fmt_shape(&node.shape), why(v.bytes))
        .at(node.span))
}
