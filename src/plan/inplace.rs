//! In-place updates: an optimizer's new value written straight into the persistent buffer it
//! replaces, so the step needs neither a second buffer per parameter and moment nor a copy.
//!
//! Update (target T, new value V) is done in place when V is an output of an elementwise kernel
//! k (which computes every value before it stores any) that reads T element-for-element (T reaches V's expression only through plain
//! elementwise ops of T's own shape, so each thread reads T exactly where it writes V) and no
//! kernel after k reads T. V then becomes a view of T's buffer, like a reshape.

use super::fuse::Fusion;
use super::kernel::KernelKind;
use crate::graph::{Graph, NodeId};
use std::collections::HashMap;

pub fn write_updates_in_place(g: &Graph, f: &mut Fusion, updates: &[(NodeId, NodeId)]) {
    // Indexed once, so the pass is linear in the plan's size, not updates x kernels. The aliases
    // made below only redirect an update's own value to its own target, which no other update's
    // question is about, so the index stays right as they are made.
    let owner = |f: &Fusion, id: NodeId| f.alias[id.index()].unwrap_or(id);
    let mut producer = HashMap::new();
    let mut last_reader = vec![None; g.n_nodes()];
    for (k, kernel) in f.kernels.iter().enumerate() {
        if kernel.kind == KernelKind::Elementwise || kernel.outputs.len() == 1 {
            for &out in &kernel.outputs {
                producer.entry(out).or_insert(k);
            }
        }
        for &i in &kernel.inputs {
            last_reader[owner(f, i).index()] = Some(k);
        }
    }
    // A host arena is read wherever one of its members is read, and a kernel that writes the
    // arena may not read a member (a range of the buffer it writes).
    let mut members = vec![Vec::new(); g.n_nodes()];
    for a in &f.arenas {
        for &(m, _) in &a.members {
            let at = last_reader[m.index()];
            let c = &mut last_reader[a.node.index()];
            *c = (*c).max(at);
            members[a.node.index()].push(m);
        }
    }
    for &(target, value) in updates {
        let Some(&k) = producer.get(&value) else { continue };
        let kernel = &f.kernels[k];
        if kernel.kind != KernelKind::Elementwise
            || g.shape(value) != g.shape(target)
            || f.alias[value.index()].is_some()
        {
            continue;
        }
        let read_later = last_reader[target.index()].is_some_and(|last| last > k);
        let reads_member = kernel.inputs.iter().any(|&i| members[target.index()].contains(&owner(f, i)));
        if read_later || reads_member || !reads_elementwise(g, &kernel.fused, target) {
            continue;
        }
        f.alias[value.index()] = Some(target);
    }
}

/// Whether every node of `fused` that reads `target` is a plain elementwise op of its shape.
fn reads_elementwise(g: &Graph, fused: &[NodeId], target: NodeId) -> bool {
    fused.iter().all(|&id| {
        let n = g.node(id);
        !n.inputs.contains(&target) || (n.op.is_pointwise() && n.shape == g.shape(target))
    })
}
