//! Flat arenas: values placed inside the buffer of a concat that joins them, so that the concat
//! costs nothing and one kernel can run over all of them.
//!
//! The optimizer (`graph::optim`) joins the parameters, their gradients and each moment into
//! flat 1-D concats (an *arena* per kind), every member at an offset that is a multiple of
//! [`ALIGN`] elements (zero constants pad the gaps), and runs its update over the arenas. The
//! plan then places members where the concat would copy them:
//! - a concat of persistent values (a *host arena*, [`host_arenas`]) is itself persistent: the
//!   backend allocates one buffer for it and each member lives at its offset in it, for every
//!   plan of the graph. Its update, when every member's new value is the matching slice of one
//!   flat value, is that one value ([`fold_updates`]);
//! - a concat of values computed by kernels (the gradient arena) has each member written by its
//!   own kernel straight into its place ([`place_members`]); the concat kernel writes only the
//!   padding.
//!
//! A member is bound at its offset (a binding offset, hence the alignment: 256 bytes is the
//! largest `min_storage_buffer_offset_alignment` WebGPU allows), so kernels need not know.

use super::alloc::{value_bytes, Lifetime};
use super::fuse::Fusion;
use super::kernel::KernelKind;
use crate::graph::{Graph, NodeId, Op};
use crate::tensor::DType;
use std::collections::HashMap;

/// Elements between the starts of two arena members: 64 f32 = 256 bytes.
pub use crate::graph::optim::ARENA_ALIGN as ALIGN;

/// A host arena: a flat concat of persistent values (and zero padding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arena {
    /// The concat node.
    pub node: NodeId,
    /// Each persistent member with its offset in elements.
    pub members: Vec<(NodeId, usize)>,
}

/// Whether `c` is a flat concat: 1-D, f32, every input a zero constant or at an offset that
/// is a multiple of [`ALIGN`] (an arena). Linear in `c`'s inputs: a caller asking per reader
/// or per input of a concat asks [`flat_concats`] once instead.
pub fn is_flat(g: &Graph, c: NodeId) -> bool {
    flat_inputs(g, c).is_some()
}

/// For each node of `g`, whether it is a flat concat ([`is_flat`]): linear in the graph's
/// edges. Fusion asks it for every input and reader of the gradient arena, which has one
/// input per parameter (and padding): asked of the concat each time, that was quadratic in
/// the parameters.
pub fn flat_concats(g: &Graph) -> Vec<bool> {
    g.nodes().map(|(id, n)| matches!(n.op, Op::Concat { axis: 0 }) && is_flat(g, id)).collect()
}

/// The inputs of a flat concat with their offsets (elements), `None` for zero constants;
/// `None` when `c` is not a 1-D f32 concat or an input is neither a zero constant nor at an
/// aligned offset.
fn flat_inputs(g: &Graph, c: NodeId) -> Option<Vec<(usize, Option<NodeId>)>> {
    let node = g.node(c);
    if !matches!(node.op, Op::Concat { axis: 0 }) || node.shape.len() != 1 {
        return None;
    }
    let mut at = 0;
    let mut out = Vec::with_capacity(node.inputs.len());
    for &x in &node.inputs {
        let n = g.shape(x)[0];
        match g.node(x).op {
            Op::Constant { value: 0.0 } => out.push((at, None)),
            _ => {
                if at % ALIGN != 0 || g.dtype(x) != DType::F32 {
                    return None;
                }
                out.push((at, Some(x)));
            }
        }
        at += n;
    }
    Some(out)
}

/// Every host arena of `g`: a 1-D concat (axis 0) whose inputs are zero constants and
/// persistent values (through reshapes) at offsets that are multiples of [`ALIGN`], each value
/// in no earlier arena. The layout depends on the graph alone, so every plan of a graph and its
/// backend agree on it.
pub fn host_arenas(g: &Graph) -> Vec<Arena> {
    let mut taken = vec![false; g.n_nodes()];
    let mut out = Vec::new();
    for (id, _) in g.nodes() {
        let Some(inputs) = flat_inputs(g, id) else { continue };
        let members: Option<Vec<(NodeId, usize)>> = inputs
            .iter()
            .filter_map(|&(at, x)| x.map(|x| (viewed(g, x), at)))
            .map(|(s, at)| {
                let ok = g.node(s).op.is_persistent() && !taken[s.index()];
                ok.then_some((s, at))
            })
            .collect();
        let Some(members) = members.filter(|m| !m.is_empty()) else { continue };
        let mut distinct: Vec<NodeId> = members.iter().map(|m| m.0).collect();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != members.len() {
            continue;
        }
        for &(s, _) in &members {
            taken[s.index()] = true;
        }
        out.push(Arena { node: id, members });
    }
    out
}

/// What a chain of reshapes starting at `x` reads.
fn viewed(g: &Graph, mut x: NodeId) -> NodeId {
    while matches!(g.node(x).op, Op::Reshape) {
        x = g.node(x).inputs[0];
    }
    x
}

/// Replace the updates of every member of a host arena by one update of the arena, when each
/// member's new value is (a reshape of) the slice of one flat value `W` at the member's own
/// offset: the arena takes `W`.
pub fn fold_updates(
    g: &Graph,
    arenas: &[Arena],
    updates: &[(NodeId, NodeId)],
) -> Vec<(NodeId, NodeId)> {
    let index: HashMap<NodeId, usize> =
        updates.iter().enumerate().map(|(i, &(t, _))| (t, i)).collect();
    let mut drop = vec![false; updates.len()];
    let mut folded = Vec::new();
    for a in arenas {
        let len = g.shape(a.node)[0];
        let mut source = None;
        let mut ok = true;
        for &(m, at) in &a.members {
            let n: usize = g.shape(m).iter().product();
            let slice_of = index.get(&m).and_then(|&i| {
                let v = viewed(g, updates[i].1);
                match g.node(v).op {
                    Op::Slice { axis: 0, start, end } if start == at && end == at + n => {
                        Some(g.node(v).inputs[0])
                    }
                    _ => None,
                }
            });
            match slice_of {
                Some(w) if g.shape(w) == [len] && source.is_none_or(|s| s == w) => {
                    source = Some(w)
                }
                _ => ok = false,
            }
        }
        if let (true, Some(w)) = (ok, source) {
            for &(m, _) in &a.members {
                drop[index[&m]] = true;
            }
            folded.push((a.node, w));
        }
    }
    let mut out: Vec<(NodeId, NodeId)> =
        updates.iter().zip(&drop).filter(|(_, &d)| !d).map(|(&u, _)| u).collect();
    out.extend(folded);
    out
}

/// Place the members of the flat concats that kernels compute (the gradient arena) in the
/// concat's buffer: each member (the value a concat input views, placed so that a strided view
/// lies at its input's offset) that a kernel writes, that
/// lives in no other buffer arrangement (not a source, view, root or update written in place)
/// and whose kernels bind nothing else of the concat's buffer, is written at its offset, and
/// the concat kernel stops reading it. `pinned` are the plan's roots.
///
/// The concat's buffer is live from the first write of a member placed in it, all its bytes
/// at once. Where that would raise the plan's peak of live bytes (a gradient written at the
/// start of the backward pass, while every activation is still live, would hold the whole
/// arena there), the members written before a later kernel stay in buffers of their own and
/// the concat kernel copies them: of the kernels members are written at, the arena starts at
/// the one that gives the lowest peak ([`arena_start`]), the earliest of those.
pub fn place_members(g: &Graph, f: &mut Fusion, pinned: &[NodeId]) {
    let owner = |f: &Fusion, id: NodeId| f.alias[id.index()].unwrap_or(id);
    let mut writers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    let mut readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (k, kernel) in f.kernels.iter().enumerate() {
        for &o in &kernel.outputs {
            writers.entry(owner(f, o)).or_default().push(k);
        }
        for &i in &kernel.inputs {
            readers.entry(owner(f, i)).or_default().push(k);
        }
    }
    // Each concat once (a concat of many inputs runs as several kernels), asked once whether
    // it is flat.
    let mut concats: Vec<NodeId> = Vec::new();
    let mut seen = vec![false; g.n_nodes()];
    for k in f.kernels.iter().filter(|k| matches!(k.kind, KernelKind::Concat { .. })) {
        let c = k.outputs[0];
        if !std::mem::replace(&mut seen[c.index()], true)
            && f.within[c.index()].is_none()
            && is_flat(g, c)
        {
            concats.push(c);
        }
    }
    // Bytes live at each kernel in the buffers the heaps will hold, every member of a concat
    // still in a buffer of its own (as the concat kernel would copy it), the concats not yet.
    let spans = super::alloc::kernel_spans(f);
    let mut load = vec![0u64; f.kernels.len()];
    let add = |load: &mut [u64], lt: Lifetime, bytes: u64, sign: bool| {
        for l in during(load, lt) {
            *l = if sign { *l + bytes } else { *l - bytes };
        }
    };
    for (i, lt) in spans.iter().enumerate() {
        let id = NodeId(i as u32);
        let shared = !g.node(id).op.is_host_value() && !pinned.contains(&id);
        if let (Some(lt), true, false) = (lt, shared, concats.contains(&id)) {
            add(&mut load, *lt, value_bytes(g, id), true);
        }
    }
    for c in concats {
        let chosen = placeable(g, f, c, pinned, &writers, &readers, 0);
        let Some(span) = spans[c.index()] else { continue };
        let members: Vec<(Lifetime, u64)> = (chosen.iter())
            .filter_map(|&(m, _)| Some((spans[m.index()]?, value_bytes(g, m))))
            .collect();
        for &(lt, bytes) in &members {
            add(&mut load, lt, bytes, false);
        }
        let start = arena_start(&load, span, value_bytes(g, c), &members);
        add(&mut load, Lifetime { first: start, last: span.last }, value_bytes(g, c), true);
        for &(lt, bytes) in members.iter().filter(|(lt, _)| lt.first < start) {
            add(&mut load, lt, bytes, true);
        }
        for (m, at) in placeable(g, f, c, pinned, &writers, &readers, start) {
            f.within[m.index()] = Some((c, at));
        }
        // The concat kernels stop reading an input every use of which is placed.
        let node = g.node(c);
        let mut at: usize = 0;
        let mut still_read = Vec::new();
        for &x in &node.inputs {
            let place = at.checked_sub(view_offset(f, x)).map(|at| (c, at));
            if place.is_none() || f.within[owner(f, x).index()] != place {
                still_read.push(owner(f, x));
            }
            at += g.shape(x)[0];
        }
        for kernel in &mut f.kernels {
            if matches!(kernel.kind, KernelKind::Concat { .. }) && kernel.outputs[0] == c {
                kernel.inputs.retain(|&x| still_read.contains(&owner_of(&f.alias, x)));
            }
        }
    }
}

/// The kernel from which concat `c`'s buffer holds its members: the members written before it
/// keep buffers of their own until the concat kernel copies them. Of the kernels the
/// `members` (each its span as a buffer of its own, and bytes) are written at, and the concat
/// kernel (none placed), the one with the least peak of `load` (the other values' live bytes
/// per kernel) plus the concat's `bytes` from it to the end of its `span` plus the members
/// not placed; the earliest of those.
pub fn arena_start(load: &[u64], span: Lifetime, bytes: u64, members: &[(Lifetime, u64)]) -> i64 {
    let mut order: Vec<&(Lifetime, u64)> = members.iter().collect();
    order.sort_by_key(|(lt, _)| lt.first);
    let mut starts: Vec<i64> = order.iter().map(|(lt, _)| lt.first).collect();
    starts.push(span.first);
    starts.retain(|&s| s <= span.first);
    starts.sort_unstable();
    starts.dedup();
    // `load` plus the members not placed for the start looked at: those written before it,
    // added as the starts grow (linear in the members' spans, not quadratic).
    let mut live = load.to_vec();
    let mut unplaced = order.iter().peekable();
    let mut best: Option<(u64, i64)> = None;
    for &s in &starts {
        while let Some((lt, b)) = unplaced.next_if(|(lt, _)| lt.first < s) {
            during(&mut live, *lt).for_each(|l| *l += b);
        }
        let arena = |k: usize| if (s..=span.last).contains(&(k as i64)) { bytes } else { 0 };
        let peak = live.iter().enumerate().map(|(k, &l)| l + arena(k)).max().unwrap_or(0);
        if best.is_none_or(|(p, _)| peak < p) {
            best = Some((peak, s));
        }
    }
    best.map_or(span.first, |(_, s)| s)
}

/// The entries of `load` (one per kernel) during `lt`.
fn during(load: &mut [u64], lt: Lifetime) -> impl Iterator<Item = &mut u64> {
    let (a, b) = (lt.first.max(0) as usize, lt.last.max(0) as usize);
    load.iter_mut().take(b.saturating_add(1)).skip(a)
}

/// The members of concat `c` that can be placed in its buffer, with their offsets (elements),
/// among those written at or after kernel `from`.
fn placeable(
    g: &Graph,
    f: &Fusion,
    c: NodeId,
    pinned: &[NodeId],
    writers: &HashMap<NodeId, Vec<usize>>,
    readers: &HashMap<NodeId, Vec<usize>>,
    from: i64,
) -> Vec<(NodeId, usize)> {
    let owner = |id: NodeId| f.alias[id.index()].unwrap_or(id);
    let Some(inputs) = flat_inputs(g, c) else { return Vec::new() };
    // The values living in c's buffer so far: c and the members placed.
    let mut inside = vec![c];
    let mut out = Vec::new();
    for (at, src) in inputs {
        let Some(s) = src else { continue };
        let m = owner(s);
        // A view of m (fusion's `arena_views`) puts m at its own offset before it.
        let Some(at) = at.checked_sub(view_offset(f, s)) else { continue };
        let placeable = at % ALIGN == 0
            && f.materialized[m.index()]
            && !g.node(m).op.is_host_value()
            && f.alias[m.index()].is_none()
            && f.within[m.index()].is_none()
            && !inside.contains(&m)
            && !pinned.contains(&m)
            && g.dtype(m) == DType::F32
            && writers.get(&m).is_some_and(|w| w.len() == 1 && w[0] as i64 >= from);
        if !placeable {
            continue;
        }
        // No kernel may read one place of c's buffer and write another (wgpu refuses a buffer
        // bound read-only and writable in one dispatch): m's writer reads nothing inside c,
        // and m's readers (but c's own kernels) write nothing inside. A writer may write
        // several places (a LayerNorm backward its weight's and a bias's gradients, a weight
        // gradient's kernel its bias's): two written ranges are fine.
        let is_inside = |x: &NodeId| inside.contains(&owner(*x));
        let writer = &f.kernels[writers[&m][0]];
        let mut conflict = writer.inputs.iter().any(is_inside);
        for &k in readers.get(&m).into_iter().flatten() {
            let kernel = &f.kernels[k];
            let own =
                matches!(kernel.kind, KernelKind::Concat { .. }) && kernel.outputs[0] == c;
            conflict |= !own && kernel.outputs.iter().any(is_inside);
        }
        if conflict {
            continue;
        }
        out.push((m, at));
        inside.push(m);
    }
    out
}

/// Where a view's elements start in its owner's buffer (0 for anything else).
fn view_offset(f: &Fusion, x: NodeId) -> usize {
    f.view[x.index()].as_ref().map_or(0, |v| v.offset)
}

fn owner_of(alias: &[Option<NodeId>], id: NodeId) -> NodeId {
    alias[id.index()].unwrap_or(id)
}
