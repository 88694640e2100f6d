//! `verify(&Plan)`: the plan's invariants, checked after it is built (and by tests on plans
//! broken on purpose).

use super::limits::{guarded, storage_bindings};
use super::{Plan, Value};
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use std::collections::HashSet;

/// Check that:
/// - every value has a buffer large enough for it;
/// - a pinned value's buffer holds nothing else;
/// - two values sharing a buffer never have overlapping lifetimes;
/// - every value a kernel reads is a source or was written by an earlier kernel;
/// - every value a kernel reads or writes has a buffer (views through their owner);
/// - no kernel binds more storage buffers than `max_storage_buffers` (when given), counted as
///   [`storage_bindings`] counts them;
/// - a buffer that is a range of another lies inside it, and no kernel binds two ranges of one
///   buffer when it writes either (wgpu refuses a buffer bound both read-only and writable);
/// - a micro-batch run's kernels compute exactly the nodes its wanted values and updates need
///   ([`verify_micro_batch`]).
pub fn verify(g: &Graph, plan: &Plan, max_storage_buffers: Option<u32>) -> Result<()> {
    verify_micro_batch(g, plan)?;
    for (i, b) in plan.buffers.iter().enumerate() {
        let Some((parent, offset)) = b.within else { continue };
        let fits = plan.buffers.get(parent).is_some_and(|p| {
            p.within.is_none() && offset.checked_add(b.bytes).is_some_and(|end| end <= p.bytes)
        });
        if !fits {
            return Err(err!(
                Invariant,
                "plan: buffer {i} ({} bytes at {offset}) does not lie inside buffer {parent}",
                b.bytes
            ));
        }
    }
    let root = |slot: usize| plan.buffers.get(slot).and_then(|b| b.within).map_or(slot, |w| w.0);
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let mut bound: Vec<(usize, usize, bool)> = Vec::new(); // (root, slot, written)
        let uses = kernel.inputs.iter().map(|&i| (i, false));
        for (id, write) in uses.chain(kernel.outputs.iter().map(|&o| (o, true))) {
            let Some(v) = plan.value_of(id) else { continue };
            bound.push((root(v.buffer), v.buffer, write));
        }
        for &(r, slot, write) in &bound {
            let clash = bound.iter().any(|&(r2, s2, w2)| r2 == r && s2 != slot && (write || w2));
            if clash {
                return Err(err!(
                    Invariant,
                    "plan: kernel {k} ({}) binds two ranges of buffer {r} and writes one",
                    kernel.kind.name()
                ));
            }
        }
    }
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
    // Values by buffer, each buffer's in order of first use: an overlap shows between
    // neighbours, so the check is linear in the values, not quadratic.
    let mut by_buffer: Vec<&Value> = plan.values.iter().collect();
    by_buffer.sort_by_key(|v| (v.buffer, v.lifetime.first, v.lifetime.last));
    for pair in by_buffer.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.buffer != b.buffer {
            continue;
        }
        if a.pinned || b.pinned {
            return Err(err!(
                Invariant,
                "plan: pinned value of node {} shares buffer {} with node {}",
                if a.pinned { a.node.index() } else { b.node.index() },
                a.buffer,
                if a.pinned { b.node.index() } else { a.node.index() }
            ));
        }
    }
    let mut last: Option<&Value> = None;
    for &b in &by_buffer {
        match last {
            Some(a) if a.buffer == b.buffer && a.lifetime.overlaps(b.lifetime) => {
                return Err(err!(
                    Invariant,
                    "plan: nodes {} and {} share buffer {} with overlapping lifetimes {:?} and {:?}",
                    a.node.index(),
                    b.node.index(),
                    a.buffer,
                    (a.lifetime.first, a.lifetime.last),
                    (b.lifetime.first, b.lifetime.last)
                ));
            }
            // No overlap: `b` starts after every earlier value of its buffer ends, so it is the
            // one a later value must start after.
            _ => last = Some(b),
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
                    "plan: kernel {k} reads node {}, which no earlier kernel writes",
                    id.index()
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
