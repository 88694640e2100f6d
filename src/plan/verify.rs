//! `verify(&Plan)`: the plan's invariants, checked after it is built (and by tests on plans
//! broken on purpose).

use super::limits::{guarded, storage_bindings};
use super::{Lifetime, Plan, Value};
use std::collections::HashMap;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use std::collections::HashSet;

/// Check that:
/// - every value has a buffer large enough for it;
/// - a pinned value's bytes hold nothing else, and two values whose bytes overlap (in one
///   buffer, or in ranges of one buffer) never have overlapping lifetimes (`check_overlaps`);
/// - every value a kernel reads is a source or was written by an earlier kernel;
/// - every value a kernel reads or writes has a buffer (views through their owner);
/// - no kernel binds more storage buffers than `max_storage_buffers` (when given), counted as
///   [`storage_bindings`] counts them;
/// - a buffer that is a range of another lies inside it (the other of a lower index), and no
///   kernel binds two ranges of one buffer, one read-only and the other written (wgpu refuses
///   a buffer bound both read-only and writable in one dispatch; two written ranges are fine);
/// - a micro-batch run's kernels compute exactly the nodes its wanted values and updates need
///   ([`verify_micro_batch`]).
pub fn verify(g: &Graph, plan: &Plan, max_storage_buffers: Option<u32>) -> Result<()> {
    verify_micro_batch(g, plan)?;
    // Each buffer's root (the buffer it lies in that lies in no other) and offset in it. A
    // parent comes before the buffers lying in it, so this is one pass.
    let mut place: Vec<(usize, u64)> = Vec::with_capacity(plan.buffers.len());
    for (i, b) in plan.buffers.iter().enumerate() {
        let Some((parent, offset)) = b.within else {
            place.push((i, 0));
            continue;
        };
        let fits = parent < i
            && offset.checked_add(b.bytes).is_some_and(|end| end <= plan.buffers[parent].bytes);
        if !fits {
            return Err(err!(
                Invariant,
                "plan: buffer {i} ({} bytes at {offset}) does not lie inside buffer {parent}",
                b.bytes
            ));
        }
        let (root, at) = place[parent];
        place.push((root, at + offset));
    }
    let root = |slot: usize| place.get(slot).map_or(slot, |p| p.0);
    for v in &plan.values {
        let Some(b) = plan.buffers.get(v.buffer) else {
            return Err(err!(Invariant, "plan: value of node {} has no buffer", v.node.index()));
        };
        if b.bytes < v.bytes {
            return Err(err!(
                Invariant,
                "plan: buffer {} has {} bytes, node {} needs {}",
                v.buffer,
                b.bytes,
                v.node.index(),
                v.bytes
            ));
        }
        if v.lifetime.first > v.lifetime.last {
            return Err(err!(Invariant, "plan: node {} dies before it is written", v.node.index()));
        }
    }
    check_overlaps(plan, &place)?;
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let mut bound: Vec<(usize, usize, bool, NodeId)> = Vec::new(); // (root, slot, written, node)
        let uses = kernel.inputs.iter().map(|&i| (i, false));
        for (id, write) in uses.chain(kernel.outputs.iter().map(|&o| (o, true))) {
            let Some(v) = plan.value_of(id) else { continue };
            bound.push((root(v.buffer), v.buffer, write, v.node));
        }
        for &(r, slot, write, a) in &bound {
            let clash = bound.iter().find(|&&(r2, s2, w2, _)| r2 == r && s2 != slot && write != w2);
            if let Some(&(_, _, _, b)) = clash {
                return Err(err!(
                    Invariant,
                    "plan: kernel {k} ({}) binds two ranges of buffer {r} (nodes {} and {}), one read-only and one written",
                    kernel.kind.name(),
                    a.index(),
                    b.index()
                ));
            }
        }
    }
    // Every value a kernel reads is a source (filled before the first kernel) or was written
    // by an earlier kernel.
    let mut written: HashSet<NodeId> =
        plan.values.iter().filter(|v| v.lifetime.first < 0).map(|v| v.node).collect();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &id in &kernel.inputs {
            let owner = plan.alias.get(id.index()).copied().flatten().unwrap_or(id);
            if !written.contains(&owner) {
                return Err(err!(
                    Invariant,
                    "plan: kernel {k} reads node {} ({}), which no earlier kernel writes",
                    id.index(),
                    g.nodes.get(id.index()).map_or("not in the graph", |n| n.op.name())
                ));
            }
        }
        written.extend(
            kernel
                .outputs
                .iter()
                .map(|&o| plan.alias.get(o.index()).copied().flatten().unwrap_or(o)),
        );
    }
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &id in kernel.inputs.iter().chain(&kernel.outputs) {
            if plan.value_of(id).is_none() {
                return Err(err!(
                    Invariant,
                    "plan: kernel {k} uses node {}, which has no buffer",
                    id.index()
                ));
            }
        }
        if let Some(max) = max_storage_buffers {
            let buffer = |id: NodeId| plan.value_of(id).map_or(usize::MAX, |v| v.buffer);
            let n = storage_bindings(g, kernel, &buffer, guarded(g, plan, kernel));
            if n > max as usize {
                return Err(err!(
                    Device,
                    "plan: kernel {k} ({}) binds {n} storage buffers, the adapter allows {max}",
                    kernel.kind.name()
                ));
            }
        }
    }
    Ok(())
}

/// No two values hold the same bytes at the same time: for each pair whose byte ranges in one
/// root buffer overlap (`place`: each buffer's root and offset), neither is pinned and their
/// lifetimes are disjoint. A flat concat and the members placed inside it are exempt (the
/// members are the concat's bytes). A sweep over lifetimes compares each value only with the
/// values of its root alive at its start, so the check is linear in the values times the
/// values alive at once.
fn check_overlaps(plan: &Plan, place: &[(usize, u64)]) -> Result<()> {
    // A pinned value holds its bytes for ever.
    let alive = |v: &Value| {
        if v.pinned { Lifetime { first: i64::MIN, last: i64::MAX } } else { v.lifetime }
    };
    let range = |v: &Value| (place[v.buffer].1, place[v.buffer].1 + v.bytes);
    // Whether buffer `inner` lies (at any depth) inside buffer `outer`.
    let inside = |inner: usize, outer: usize| {
        let mut b = inner;
        while let Some((parent, _)) = plan.buffers[b].within {
            if parent == outer {
                return true;
            }
            b = parent;
        }
        false
    };
    let mut order: Vec<&Value> = plan.values.iter().collect();
    order.sort_by_key(|v| (alive(v).first, alive(v).last, v.node));
    let mut active: HashMap<usize, Vec<&Value>> = HashMap::new();
    for b in order {
        let list = active.entry(place[b.buffer].0).or_default();
        list.retain(|a| alive(a).last >= alive(b).first);
        for &a in list.iter() {
            let ((a0, a1), (b0, b1)) = (range(a), range(b));
            let related = inside(a.buffer, b.buffer) || inside(b.buffer, a.buffer);
            if a0 >= b1 || b0 >= a1 || related {
                continue;
            }
            let root = place[b.buffer].0;
            if a.pinned || b.pinned {
                let (p, o) = if a.pinned { (a, b) } else { (b, a) };
                return Err(err!(
                    Invariant,
                    "plan: pinned value of node {} shares buffer {root} with node {}",
                    p.node.index(),
                    o.node.index()
                ));
            }
            return Err(err!(
                Invariant,
                "plan: nodes {} and {} share bytes of buffer {root} ({a0}..{a1} and {b0}..{b1}) with overlapping lifetimes {:?} and {:?}",
                a.node.index(),
                b.node.index(),
                (a.lifetime.first, a.lifetime.last),
                (b.lifetime.first, b.lifetime.last)
            ));
        }
        list.push(b);
    }
    Ok(())
}

/// The kernels of a plan's micro-batch run compute every node (constants aside) that its
/// wanted values and micro-batch updates need, and nothing else: a kernel either runs whole
/// or not at all, so no kernel of the run may leave out a node it needs, nor a skipped kernel
/// hold one.
pub fn verify_micro_batch(g: &Graph, plan: &Plan) -> Result<()> {
    let Some(m) = &plan.micro else { return Ok(()) };
    let mut roots = plan.wanted.clone();
    for &u in &m.updates {
        let &(_, value) = plan.updates.get(u).ok_or_else(|| {
            err!(Invariant, "plan: the micro-batch run applies update {u}, which does not exist")
        })?;
        roots.push(value);
    }
    let live = super::needed(g, &roots);
    let mut runs = vec![false; plan.kernels.len()];
    for &k in &m.kernels {
        *runs.get_mut(k).ok_or_else(|| {
            err!(Invariant, "plan: the micro-batch run runs kernel {k}, which does not exist")
        })? = true;
    }
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &id in &kernel.fused {
            if matches!(g.node(id).op, crate::graph::Op::Constant { .. }) || live[id.index()] == runs[k] {
                continue;
            }
            return Err(err!(
                Invariant,
                "plan: kernel {k} computes node {} ({}), which a micro-batch run {}, but the run {} the kernel",
                id.index(),
                g.node(id).op.name(),
                if live[id.index()] { "needs" } else { "does not need" },
                if runs[k] { "runs" } else { "skips" }
            ));
        }
    }
    Ok(())
}
