//! Rematerialization: forward values that the backward pass reads, and that are cheap to
//! recompute from values it keeps alive anyway, are recomputed in the backward pass right
//! before their first use there instead of being kept alive across the step.
//!
//! A training step's memory peaks where the backward pass starts: every forward value the
//! backward reads is alive at once. Some of them are cheap functions of others that are alive
//! there anyway: a LayerNorm output of its input and its stats (both read by the LayerNorm
//! gradient), a GELU output of its input (read by the GELU gradient), a permuted copy of an
//! attention output (read by the attention gradient). The backward reads a copy of such a
//! node instead (and copies of the cheap nodes between it and the kept values), appended to
//! the arena right before the first backward node that reads it. Plans run kernels in arena
//! order, so the copy is computed there and freed after its last use, and the forward value
//! dies with its last forward use. The CPU interpreter runs the same graph, so the reference
//! backend checks the rematerialized step too.
//!
//! The rule, for a forward value `v` that a backward node reads:
//! - `v` is cheap ([`is_cheap`]): an elementwise op (a fused chain of them costs one pass),
//!   a view, or `layer_norm` (its stats are an input, so one pass over a row);
//! - the host does not read it: an output, the loss or an update's new value is kept anyway;
//! - recomputing it reads only sources, kept values that the backward still reads at or after
//!   `v`'s first backward use, and cheap forward values recomputed the same way (at most
//!   [`MAX_CHAIN`] nodes).
//!
//! So no value lives longer than it did without rematerialization, and each forward node is
//! recomputed at most once (its copy serves every backward use).

use super::ir::{Graph, Node, NodeId, Op, OpClass};
use std::collections::HashSet;

/// The most forward nodes one recomputation reads through (cheap nodes recomputed with it and
/// the values it reads): a longer chain is kept instead.
pub const MAX_CHAIN: usize = 64;

/// Whether an op is cheap enough to compute twice: one read of its inputs per output element
/// (elementwise ops and views) or per row (`layer_norm`, given its stats).
pub fn is_cheap(op: &Op) -> bool {
    match op.class() {
        OpClass::Elementwise => true,
        OpClass::Layout => op.is_view(),
        OpClass::Special => matches!(op, Op::LayerNorm),
        OpClass::Source | OpClass::Reduce | OpClass::MatMul => false,
    }
}

/// Rematerialize the forward values (arena indices below `backward_start`) that the backward
/// nodes of `g` read, as the module documentation says; `keep` are values the host reads
/// besides `g`'s outputs and updates (the loss). Records the recomputed values in
/// [`Graph::recomputed`] and returns, for each node index of the graph before the pass, the
/// node that holds its value after it (the backward nodes move to make room for the copies).
pub fn rematerialize(g: &mut Graph, backward_start: usize, keep: &[NodeId]) -> Vec<NodeId> {
    let n = g.n_nodes();
    let bs = backward_start.min(n);
    let mut map: Vec<NodeId> = (0..n).map(|i| NodeId(i as u32)).collect();
    // The first and last backward node that reads each forward value.
    let mut first = vec![usize::MAX; bs];
    let mut last = vec![0; bs];
    for (i, node) in g.nodes.iter().enumerate().skip(bs) {
        for x in node.inputs.iter().filter(|x| x.index() < bs) {
            first[x.index()] = first[x.index()].min(i);
            last[x.index()] = i;
        }
    }
    let mut root = vec![false; bs];
    let roots = keep.iter().chain(g.outputs.iter().map(|(_, id)| id));
    for r in roots.chain(g.updates.iter().map(|u| &u.value)).filter(|r| r.index() < bs) {
        root[r.index()] = true;
    }
    // Decided in arena order, so every input's fate is known when a node is considered.
    let mut remat = vec![false; bs];
    for v in 0..bs {
        let node = &g.nodes[v];
        if first[v] != usize::MAX && !root[v] && is_cheap(&node.op) {
            remat[v] = recomputable(g, NodeId(v as u32), first[v], &first, &last, &root, &remat);
        }
    }
    if !remat.contains(&true) {
        return map;
    }
    // A forward value the backward reads as it is: a source, one the host reads, or one the
    // backward reads and does not recompute.
    let kept = |x: NodeId| {
        g.nodes[x.index()].op.class() == OpClass::Source
            || root[x.index()]
            || (first[x.index()] != usize::MAX && !remat[x.index()])
    };
    let kept: Vec<bool> = (0..bs).map(|i| kept(NodeId(i as u32))).collect();
    let mut copy: Vec<Option<NodeId>> = vec![None; bs];
    for (k, node) in g.split_off(bs).into_iter().enumerate() {
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &x in &node.inputs {
            inputs.push(match x.index() {
                i if i >= bs => map[i],
                i if remat[i] => copy_of(g, x, &kept, &mut copy),
                _ => x,
            });
        }
        map[bs + k] = g.push_node(Node { inputs, ..node });
    }
    let moved = |id: &mut NodeId| *id = map[id.index()];
    g.outputs.iter_mut().for_each(|(_, id)| moved(id));
    for u in &mut g.updates {
        moved(&mut u.target);
        moved(&mut u.value);
    }
    for (v, c) in copy.iter().enumerate() {
        if let (true, Some(c)) = (remat[v], c) {
            g.recomputed.push((NodeId(v as u32), *c));
        }
    }
    map
}

/// Whether forward value `v` can be recomputed before backward node `at`: every forward node
/// it is computed from is a source, a value the host reads, a kept value the backward still
/// reads at or after `at`, or a cheap node recomputed with it (at most [`MAX_CHAIN`] nodes).
fn recomputable(
    g: &Graph,
    v: NodeId,
    at: usize,
    first: &[usize],
    last: &[usize],
    root: &[bool],
    remat: &[bool],
) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(u) = stack.pop() {
        for &x in &g.nodes[u.index()].inputs {
            let i = x.index();
            if !seen.insert(x) {
                continue;
            }
            if seen.len() > MAX_CHAIN {
                return false;
            }
            let op = &g.nodes[i].op;
            if op.class() == OpClass::Source || root[i] {
                continue;
            }
            let saved = first[i] != usize::MAX;
            if saved && !remat[i] {
                if last[i] < at {
                    return false; // kept, but dead by then: recomputing would extend it
                }
            } else if is_cheap(op) {
                stack.push(x);
            } else {
                return false; // neither kept nor cheap
            }
        }
    }
    true
}

/// The backward copy of forward node `x`, appended (after copies of the inputs it needs) the
/// first time it is asked for.
fn copy_of(g: &mut Graph, x: NodeId, kept: &[bool], copy: &mut [Option<NodeId>]) -> NodeId {
    if let Some(c) = copy[x.index()] {
        return c;
    }
    let node = g.nodes[x.index()].clone();
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for &y in &node.inputs {
        inputs.push(if kept[y.index()] { y } else { copy_of(g, y, kept, copy) });
    }
    let c = g.push_node(Node { inputs, ..node });
    copy[x.index()] = Some(c);
    c
}
