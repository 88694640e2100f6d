//! Liveness and buffer assignment.
//!
//! Each materialized value (a node with a buffer, views folded into the value they view) lives
//! from the kernel that writes it to the last kernel that reads it. Pinned values (inputs,
//! parameters, state, and every value the host reads or writes back after a step) get a buffer
//! of their own for the whole plan. The others share a few large buffers (heaps), each value a
//! range at an offset that no value alive at the same time overlaps ([`super::offsets`]), so a
//! byte is reused only by values that are never live at the same time. Each such range is a
//! buffer of the plan lying within its heap (`BufferInfo::within`).
//!
//! A value placed inside a flat concat (`super::arena`) gets a buffer of its own that is a
//! range of the concat's buffer (`BufferInfo::within`, nested when the concat lies in a heap);
//! the concat's lifetime covers its members', so nothing else takes those bytes while a member
//! is alive.

use super::fuse::Fusion;
use super::offsets::{self, Item};
use crate::graph::{Graph, NodeId};

/// Kernel index range `[first, last]` (inclusive) in which a value's buffer holds it. Sources,
/// and only sources, start at `-1` (filled before the first kernel); pinned values end at
/// `i64::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub first: i64,
    pub last: i64,
}

impl Lifetime {
    pub fn overlaps(self, other: Lifetime) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// A device buffer of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    pub bytes: u64,
    /// Holds one pinned value; never shared.
    pub pinned: bool,
    /// A range of another buffer, of a lower index: (that buffer, offset in bytes). Such a
    /// buffer holds one value: a shared value in its heap, or a member of the flat concat
    /// that owns the other buffer.
    pub within: Option<(usize, u64)>,
}

/// One materialized value: the node that owns the buffer contents (views resolve to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    pub node: NodeId,
    pub bytes: u64,
    pub lifetime: Lifetime,
    pub pinned: bool,
    pub buffer: usize,
}

/// Bytes of a node's value (at least 4, so that no binding is empty).
pub fn value_bytes(g: &Graph, id: NodeId) -> u64 {
    let n: usize = g.shape(id).iter().product();
    (n.max(1) as u64) * 4
}

/// For each node owning a buffer (views resolve to what they view): the kernels from the
/// first that writes or reads it to the last that does; `None` where no kernel does.
pub fn kernel_spans(f: &Fusion) -> Vec<Option<Lifetime>> {
    let owner = |id: NodeId| f.alias[id.index()].unwrap_or(id);
    let mut lifetime: Vec<Option<Lifetime>> = vec![None; f.live.len()];
    for (k, kernel) in f.kernels.iter().enumerate() {
        let k = k as i64;
        for &o in kernel.outputs.iter().chain(&kernel.inputs) {
            let lt = lifetime[owner(o).index()].get_or_insert(Lifetime { first: k, last: k });
            lt.last = lt.last.max(k);
        }
    }
    lifetime
}

/// Compute lifetimes and assign buffers. `pinned_roots` are the values the host reads or that
/// are written back after the step. With `reuse` off every value gets its own buffer. A heap
/// holds at most `max_buffer_bytes` (unless one value alone is larger).
pub fn assign(
    g: &Graph,
    f: &Fusion,
    pinned_roots: &[NodeId],
    reuse: bool,
    max_buffer_bytes: u64,
) -> (Vec<Value>, Vec<BufferInfo>) {
    let n = g.n_nodes();
    let owner = |id: NodeId| f.alias[id.index()].unwrap_or(id);
    let mut lifetime = kernel_spans(f);
    let mut pinned = vec![false; n];
    for (id, node) in g.nodes() {
        let arena = f.arenas.iter().any(|a| a.node == id);
        if f.live[id.index()] && (node.op.is_host_value() || arena) {
            let last = lifetime[id.index()].map_or(-1, |lt| lt.last);
            lifetime[id.index()] = Some(Lifetime { first: -1, last });
            pinned[id.index()] = true;
        }
    }
    for &r in pinned_roots {
        pinned[owner(r).index()] = true;
    }
    // A concat's buffer holds its members from the first write of any of them to the last
    // read of any.
    for i in 0..n {
        if let (Some((c, _)), Some(m)) = (f.within[i], lifetime[i]) {
            let lt = lifetime[c.index()].get_or_insert(m);
            lt.first = lt.first.min(m.first);
            lt.last = lt.last.max(m.last);
        }
    }
    for i in 0..n {
        if let Some((c, _)) = f.within[i] {
            if lifetime[i].is_some() && pinned[i] {
                pinned[c.index()] = true;
            }
        }
    }
    let mut values: Vec<Value> = (0..n)
        .filter_map(|i| {
            let lt = lifetime[i]?;
            let id = NodeId(i as u32);
            // A pinned value keeps its buffer from its first write to the end of the plan.
            let lifetime =
                if pinned[i] { Lifetime { first: lt.first, last: i64::MAX } } else { lt };
            Some(Value {
                node: id,
                bytes: value_bytes(g, id),
                lifetime,
                pinned: pinned[i],
                buffer: usize::MAX,
            })
        })
        .collect();

    let mut buffers: Vec<BufferInfo> = Vec::new();
    // A buffer of its own for each pinned value, and for every value without reuse.
    let mut shared: Vec<usize> = Vec::new();
    for (v, val) in values.iter_mut().enumerate() {
        if f.within[val.node.index()].is_some() {
            continue; // a range of its concat's buffer, below
        }
        if val.pinned || !reuse {
            val.buffer = buffers.len();
            buffers.push(BufferInfo { bytes: val.bytes, pinned: val.pinned, within: None });
        } else {
            shared.push(v);
        }
    }
    // The others at offsets in heaps (`super::offsets`): a buffer per heap, and a range of it
    // per value.
    let mut unit = vec![usize::MAX; n]; // node -> index into `shared`
    for (u, &v) in shared.iter().enumerate() {
        unit[values[v].node.index()] = u;
    }
    // A member of a concat's buffer goes where its concat goes.
    let unit_of = |id: NodeId| {
        let o = owner(id);
        let o = f.within[o.index()].map_or(o, |(c, _)| c);
        Some(unit[o.index()]).filter(|&u| u != usize::MAX)
    };
    let mut apart: Vec<Vec<usize>> = vec![Vec::new(); shared.len()];
    for kernel in &f.kernels {
        for o in kernel.outputs.iter().filter_map(|&o| unit_of(o)) {
            for i in kernel.inputs.iter().filter_map(|&i| unit_of(i)) {
                if i != o && !apart[o].contains(&i) {
                    apart[o].push(i);
                    apart[i].push(o);
                }
            }
        }
    }
    let items: Vec<Item> =
        shared.iter().map(|&v| Item { bytes: values[v].bytes, lifetime: values[v].lifetime }).collect();
    let layout = offsets::place(&items, &apart, max_buffer_bytes);
    let first_heap = buffers.len();
    for &bytes in &layout.heaps {
        buffers.push(BufferInfo { bytes, pinned: false, within: None });
    }
    for (&v, &(heap, at)) in shared.iter().zip(&layout.at) {
        values[v].buffer = buffers.len();
        let within = Some((first_heap + heap, at));
        buffers.push(BufferInfo { bytes: values[v].bytes, pinned: false, within });
    }
    for v in 0..values.len() {
        let Some((c, at)) = f.within[values[v].node.index()] else { continue };
        let parent = values.binary_search_by_key(&c, |x| x.node).map(|p| values[p].buffer);
        let Ok(parent) = parent else { continue }; // left for the plan checker
        values[v].buffer = buffers.len();
        let within = Some((parent, at as u64 * 4));
        buffers.push(BufferInfo { bytes: values[v].bytes, pinned: values[v].pinned, within });
    }
    (values, buffers)
}
