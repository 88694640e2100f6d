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
///   [`storage_bindings`] counts them.
pub fn verify(g: &Graph, plan: &Plan, max_storage_buffers: Option<u32>) -> Result<()> {
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
