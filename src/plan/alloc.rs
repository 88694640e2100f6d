//! Liveness and buffer assignment.
//!
//! Each materialized value (a node with a buffer, views folded into the value they view) lives
//! from the kernel that writes it to the last kernel that reads it. Pinned values (inputs,
//! parameters, state, and every value the host reads or writes back after a step) get a buffer
//! of their own for the whole plan. The others share buffers, assigned greedily by size: largest
//! value first, each into the best-fitting buffer none of whose values' lifetimes overlap its
//! own, so a buffer is reused only by values that are never live at the same time.
//!
//! A value placed inside a flat concat (`super::arena`) gets a buffer of its own that is a
//! range of the concat's buffer (`BufferInfo::within`); the concat's lifetime covers its
//! members', so nothing else takes that buffer while a member is alive.

use super::fuse::Fusion;
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
    /// A range of another buffer: (that buffer, offset in bytes). Such a buffer holds one
    /// value, a member of the flat concat that owns the other buffer.
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

/// Compute lifetimes and assign buffers. `pinned_roots` are the values the host reads or that
/// are written back after the step. With `reuse` off every value gets its own buffer.
pub fn assign(
    g: &Graph,
    f: &Fusion,
    pinned_roots: &[NodeId],
    reuse: bool,
) -> (Vec<Value>, Vec<BufferInfo>) {
    let n = g.n_nodes();
    let owner = |id: NodeId| f.alias[id.index()].unwrap_or(id);
    let mut lifetime: Vec<Option<Lifetime>> = vec![None; n];
    let mut pinned = vec![false; n];
    for (id, node) in g.nodes() {
        let arena = f.arenas.iter().any(|a| a.node == id);
        if f.live[id.index()] && (node.op.is_host_value() || arena) {
            lifetime[id.index()] = Some(Lifetime { first: -1, last: -1 });
            pinned[id.index()] = true;
        }
    }
    for &r in pinned_roots {
        pinned[owner(r).index()] = true;
    }
    for (k, kernel) in f.kernels.iter().enumerate() {
        let k = k as i64;
        for &o in &kernel.outputs {
            let o = owner(o);
            let lt = lifetime[o.index()].get_or_insert(Lifetime { first: k, last: k });
            lt.first = lt.first.min(k);
            lt.last = lt.last.max(k);
        }
        for &i in &kernel.inputs {
            let i = owner(i);
            let lt = lifetime[i.index()].get_or_insert(Lifetime { first: k, last: k });
            lt.last = lt.last.max(k);
        }
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
    // Lifetimes already placed in each shared buffer.
    let mut occupied: Vec<Vec<Lifetime>> = Vec::new();
    // The shared buffers, the only candidates for reuse (a model has a pinned buffer per
    // parameter and moment; scanning those for every value made planning quadratic).
    let mut shared: Vec<usize> = Vec::new();
    let mut order: Vec<usize> = (0..values.len()).collect();
    // Largest first; ties by node order so the plan is deterministic.
    order.sort_by_key(|&v| (std::cmp::Reverse(values[v].bytes), values[v].node));
    for v in order {
        let val = values[v];
        if f.within[val.node.index()].is_some() {
            continue; // a range of its concat's buffer, below
        }
        if val.pinned || !reuse {
            values[v].buffer = buffers.len();
            buffers.push(BufferInfo { bytes: val.bytes, pinned: val.pinned, within: None });
            occupied.push(vec![val.lifetime]);
            continue;
        }
        let free = |b: usize| occupied[b].iter().all(|lt| !lt.overlaps(val.lifetime));
        let best_fit = (shared.iter().copied())
            .filter(|&b| free(b) && buffers[b].bytes >= val.bytes)
            .min_by_key(|&b| buffers[b].bytes);
        let b = match best_fit.or_else(|| {
            shared.iter().copied().filter(|&b| free(b)).max_by_key(|&b| buffers[b].bytes)
        }) {
            Some(b) => {
                buffers[b].bytes = buffers[b].bytes.max(val.bytes);
                b
            }
            None => {
                shared.push(buffers.len());
                buffers.push(BufferInfo { bytes: val.bytes, pinned: false, within: None });
                occupied.push(Vec::new());
                buffers.len() - 1
            }
        };
        occupied[b].push(val.lifetime);
        values[v].buffer = b;
    }
    values.sort_by_key(|v| v.node);
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
