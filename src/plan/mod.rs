//! The planner: a graph and the values wanted from it become a static plan of kernels over
//! pre-assigned buffers.
//!
//! ```text
//! fuse (kernels, materialized values) → schedule (arena order) → liveness → assign offsets → verify
//! ```
//!
//! Given the adapter's limits ([`Limits`]), every kernel of the plan binds at most its storage
//! buffers per stage and every value fits one storage binding.
//!
//! A training plan of a graph with gradient accumulation also says what a micro-batch run
//! executes ([`MicroBatch`]): the kernels the wanted values and the accumulators need, and
//! the accumulators' updates, so one plan (one set of buffers) serves both kinds of run.
//!
//! The plan is device-neutral; `codegen` turns each kernel into WGSL and `runtime` executes it.

pub mod alloc;
pub mod arena;
pub mod fuse;
pub mod inplace;
pub mod kernel;
pub mod limits;
pub mod offsets;
pub mod picture;
pub mod report;
pub mod verify;
pub mod view;

pub use alloc::{BufferInfo, Lifetime, Value};
pub use kernel::{Kernel, KernelKind};
pub use limits::Limits;

use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use std::collections::HashSet;

/// How to plan.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// Fuse elementwise work into kernels (off: one kernel per op).
    pub fusion: bool,
    /// Let values with disjoint lifetimes share buffers (off: one buffer per value).
    pub reuse: bool,
    /// The adapter's limits the plan must fit (none: unbounded, for reports without a device).
    /// The GPU backend plans for the tighter of these and its device's.
    pub limits: Option<Limits>,
    /// Products convert their operands in a pass of their own (the cooperative kernels of
    /// `high` and `medium`): an elementwise chain that only a product reads is computed there,
    /// as the operand is read (a prologue, [`fuse`]), instead of by a kernel of its own.
    pub matmul_prologues: bool,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions { fusion: true, reuse: true, limits: None, matmul_prologues: false }
    }
}

/// A static plan: kernels in execution order over assigned buffers.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kernels: Vec<Kernel>,
    /// Every materialized value, sorted by node.
    pub values: Vec<Value>,
    pub buffers: Vec<BufferInfo>,
    /// For each node: the node owning the buffer it lives in (itself, or what a view views).
    pub alias: Vec<Option<NodeId>>,
    /// For a strided view ([`view::View`]): where its elements are in its alias's buffer.
    pub view: Vec<Option<view::View>>,
    /// Values the host reads after a step.
    pub wanted: Vec<NodeId>,
    /// Write-backs after the step: (persistent target, new value).
    pub updates: Vec<(NodeId, NodeId)>,
    /// What a micro-batch run of gradient accumulation executes (training plans of graphs
    /// with updates marked [`crate::graph::Update::every_micro_batch`] only).
    pub micro: Option<MicroBatch>,
    /// Graph ops the plan evaluates (live nodes other than inputs, parameters and state).
    pub n_ops: usize,
    /// Bytes of one buffer per evaluated op, pinned values excluded: the no-reuse baseline.
    pub naive_bytes: u64,
}

/// The part of a training plan a micro-batch run executes: what the wanted values and the
/// micro-batch updates need (forward, backward, the accumulators), not the optimizer.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroBatch {
    /// The kernels it runs (indices into [`Plan::kernels`], in order): those whose outputs
    /// the wanted values or the micro-batch updates need. Fusion keeps these nodes out of the
    /// other kernels, so each runs whole.
    pub kernels: Vec<usize>,
    /// The updates it applies (indices into [`Plan::updates`]).
    pub updates: Vec<usize>,
}

impl Plan {
    /// The value (and so the buffer) holding node `id`, following views.
    pub fn value_of(&self, id: NodeId) -> Option<&Value> {
        let owner = self.alias.get(id.index()).copied().flatten().unwrap_or(id);
        self.values.binary_search_by_key(&owner, |v| v.node).ok().map(|i| &self.values[i])
    }

    pub fn n_dispatches(&self) -> usize {
        self.kernels.len()
    }

    /// Whether the host reads `id` as it was before the step (as the CPU reference evaluates
    /// it): a source (input, parameter, state, or an arena of them) or a view of one, which no
    /// kernel computes, so the buffer it lives in is the source's and the step's updates
    /// overwrite it. Anything a kernel computes, an update's new value written in place
    /// included, is read after the step.
    pub fn read_before_step(&self, g: &Graph, id: NodeId) -> bool {
        let computed = |x: NodeId| self.kernels.iter().any(|k| k.outputs.contains(&x));
        let mut x = id;
        loop {
            let node = g.node(x);
            if node.op.is_host_value() {
                return true;
            }
            if computed(x) {
                return false;
            }
            match node.inputs[..] {
                [below] if node.op.is_view() => x = below,
                _ => return self.value_of(x).is_some_and(|v| v.lifetime.first < 0),
            }
        }
    }

    /// Bytes of the shared (reusable) buffers: the heaps.
    pub fn planned_bytes(&self) -> u64 {
        self.buffers.iter().filter(|b| !b.pinned && b.within.is_none()).map(|b| b.bytes).sum()
    }

    /// Bytes of the pinned buffers (inputs, parameters, state, results).
    pub fn pinned_bytes(&self) -> u64 {
        self.buffers.iter().filter(|b| b.pinned && b.within.is_none()).map(|b| b.bytes).sum()
    }
}

/// For each node of `g`: whether evaluating `roots` needs it (a root or an input of one, at any
/// depth).
pub fn needed(g: &Graph, roots: &[NodeId]) -> Vec<bool> {
    let mut live = vec![false; g.n_nodes()];
    for r in roots {
        live[r.index()] = true;
    }
    for i in (0..g.n_nodes()).rev() {
        if live[i] {
            for x in &g.node(NodeId(i as u32)).inputs {
                live[x.index()] = true;
            }
        }
    }
    live
}

/// Plan the evaluation of `wanted` plus every update of `g` (when `train`).
pub fn plan(g: &Graph, wanted: &[NodeId], train: bool, opts: PlanOptions) -> Result<Plan> {
    let pairs = |micro_only: bool| -> Vec<(NodeId, NodeId)> {
        let chosen = g.updates.iter().filter(|u| train && (u.every_micro_batch || !micro_only));
        // The members of a host arena updated from one flat value: the arena takes that value.
        arena::fold_updates(g, &arena::host_arenas(g), &chosen.map(|u| (u.target, u.value)).collect::<Vec<_>>())
    };
    let updates = pairs(false);
    let micro_updates = pairs(true);
    let mut roots = wanted.to_vec();
    roots.extend(updates.iter().map(|&(_, v)| v));
    // Gradient accumulation: the nodes a micro-batch run evaluates. A graph that accumulates
    // but has nothing to accumulate (no parameters) still has micro-batch runs: the wanted
    // values, no update.
    let first_micro_batch = |n: &crate::graph::Node| {
        matches!(&n.op, crate::graph::Op::Input { name } if name == crate::graph::optim::FIRST_MICRO_BATCH_INPUT)
    };
    let accumulates = !micro_updates.is_empty() || (train && g.nodes().any(|(_, n)| first_micro_batch(n)));
    let micro_live = accumulates.then(|| {
        let mut micro_roots = wanted.to_vec();
        micro_roots.extend(micro_updates.iter().map(|&(_, v)| v));
        needed(g, &micro_roots)
    });
    let max_bindings = opts.limits.map(|l| l.max_storage_buffers);
    let fusion = fuse::Fusing { on: opts.fusion, prologues: opts.fusion && opts.matmul_prologues };
    let mut f = fuse::fuse(g, &roots, fusion, max_bindings, micro_live.as_deref()); // kernels in arena order
    if opts.reuse {
        inplace::write_updates_in_place(g, &mut f, &updates); // new values into their targets
        arena::place_members(g, &mut f, &roots); // gradients written into their arena
    }
    // Pinned: what the host reads, what is written back, and what checking kernels check.
    let mut pinned = roots.clone();
    pinned.extend(f.kernels.iter().filter_map(|k| limits::checked_operand(g, k)));
    let max_buffer = opts.limits.map_or(u64::MAX, |l| l.max_buffer_bytes);
    let (values, buffers) = alloc::assign(g, &f, &pinned, opts.reuse, max_buffer); // liveness + offsets
    let n_ops = g.nodes().filter(|(id, n)| f.live[id.index()] && !n.op.is_host_value()).count();
    // Every byte count of the plan (naive, planned, pinned) is a sum over some of the live
    // values, so none overflows once the sum over all of them does not.
    let live = g.nodes().filter(|(id, _)| f.live[id.index()]);
    live.map(|(id, _)| alloc::value_bytes(g, id))
        .try_fold(0u64, u64::checked_add)
        .ok_or_else(|| err!(Limit, "the values of this graph need more than 2^64 bytes"))?;
    let root_set: HashSet<NodeId> = roots.iter().copied().collect();
    let naive_bytes = g
        .nodes()
        .filter(|(id, n)| f.live[id.index()] && !root_set.contains(id) && !n.op.is_host_value())
        .map(|(id, _)| alloc::value_bytes(g, id))
        .sum();
    let micro = match &micro_live {
        None => None,
        Some(live) => Some(MicroBatch {
            kernels: (f.kernels.iter().enumerate())
                .filter(|(_, k)| k.outputs.iter().any(|o| live[o.index()]))
                .map(|(i, _)| i)
                .collect(),
            updates: micro_updates
                .iter()
                .map(|u| updates.iter().position(|v| v == u))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| err!(Invariant, "plan: a micro-batch update is not an update"))?,
        }),
    };
    let plan = Plan {
        kernels: f.kernels,
        values,
        buffers,
        alias: f.alias,
        view: f.view,
        wanted: wanted.to_vec(),
        updates,
        micro,
        n_ops,
        naive_bytes,
    };
    if let Some(l) = opts.limits {
        limits::check_binding_bytes(g, &plan, l.max_binding_bytes)?; // before the checker's
    }
    verify::verify(g, &plan, max_bindings)?; // the plan is checked before anyone runs it
    Ok(plan)
}
