//! The [`Executor`]: persistent values (parameters and state) between steps, and one step's run
//! of a graph on the CPU.
//!
//! A run evaluates only the nodes that the wanted values and the updates depend on, in arena
//! order (a topological order), and frees each intermediate value right after its last reader,
//! so memory stays bounded by the live values rather than the graph's size. Inputs are read from
//! the feeds and persistent values from the executor in place, without copies.

use super::interp::{eval, Val};
use super::{Buf, Float, RunOptions};
use crate::err;
use crate::error::Result;
use crate::graph::init::init_values;
use crate::graph::{verify, Graph, NodeId, Op};
use crate::tensor::fmt_shape;

/// A host step inside a run: once every node before arena index `before` is evaluated and
/// before any node from it on, the f32 values of `values` are packed into one slice in order,
/// `step` rewrites the slice, and the values are unpacked from it. Data-parallel training
/// averages the loss and the gradients across ranks here, between backward and update.
pub struct HostStep<'a, T> {
    /// The arena index the step runs before.
    pub before: usize,
    /// The values it reads and rewrites (computed, f32 nodes before `before`).
    pub values: &'a [NodeId],
    /// What it does to them.
    pub step: &'a mut dyn FnMut(&mut [T]) -> Result<()>,
}

/// Runs graphs on the CPU in `T` (f32 or f64), holding the graph's parameters and state.
#[derive(Clone, Debug)]
pub struct Executor<T: Float> {
    /// Seed of the initializers (see [`init_values`]).
    seed: u64,
    /// The value of each persistent node, by node index; `None` for other nodes.
    values: Vec<Option<Vec<T>>>,
}

impl<T: Float> Executor<T> {
    /// An executor for `g` with every parameter and state initialized by [`init_values`] under
    /// `seed` (so the CPU and GPU backends start from the same numbers). Persistent nodes added
    /// to the graph later are initialized the same way on the first run that needs them.
    pub fn new(g: &Graph, seed: u64) -> Result<Self> {
        verify(g)?;
        let mut exec = Executor { seed, values: Vec::new() };
        for (id, node) in g.nodes() {
            if node.op.is_persistent() {
                exec.init_value(g, id);
            }
        }
        Ok(exec)
    }

    /// The current value of a parameter or state node.
    pub fn persistent(&self, id: NodeId) -> Option<&[T]> {
        self.values.get(id.index())?.as_deref()
    }

    /// Replace the value of a parameter or state node (loading a checkpoint, a test setting
    /// weights); `data` must hold exactly the node's element count.
    pub fn set_persistent(&mut self, g: &Graph, id: NodeId, data: Vec<T>) -> Result<()> {
        let Some(node) = g.nodes.get(id.index()) else {
            return Err(err!(Invariant, "set_persistent: node {} is not in the graph", id.0));
        };
        let name = match &node.op {
            Op::Parameter { name, .. } | Op::State { name, .. } => name,
            op => {
                return Err(err!(
                    Invariant,
                    "set_persistent: node {} ({}) is not a parameter or state",
                    id.0,
                    op.name()
                ))
            }
        };
        let want: usize = node.shape.iter().product();
        if data.len() != want {
            return Err(err!(
                Shape,
                "`{name}` is {}{} ({want} elements), got {} elements",
                node.dtype,
                fmt_shape(&node.shape),
                data.len()
            ));
        }
        self.store(id, data);
        Ok(())
    }

    /// Evaluate the nodes needed for `want` and for every update in `g.updates`, feeding the
    /// Input nodes from `feeds` (missing or mis-shaped feed → Err naming the input), return the
    /// values of `want` in order, then apply the updates (all updates read pre-step values).
    pub fn run(
        &mut self,
        g: &Graph,
        feeds: &[(NodeId, Buf<T>)],
        want: &[NodeId],
        opts: RunOptions,
    ) -> Result<Vec<Buf<T>>> {
        self.run_with(g, feeds, want, opts, None)
    }

    /// [`Executor::run`] with a [`HostStep`] inside it.
    pub fn run_with(
        &mut self,
        g: &Graph,
        feeds: &[(NodeId, Buf<T>)],
        want: &[NodeId],
        opts: RunOptions,
        mut host_step: Option<HostStep<'_, T>>,
    ) -> Result<Vec<Buf<T>>> {
        verify(g)?;
        let n = g.n_nodes();
        if let Some(w) = want.iter().find(|w| w.index() >= n) {
            return Err(err!(Invariant, "run: wanted node {} is not in the graph", w.0));
        }

        // Which nodes to evaluate: everything the wanted values and the updates read.
        let mut keep = vec![false; n];
        for &w in want {
            keep[w.index()] = true;
        }
        for u in &g.updates {
            keep[u.value.index()] = true;
        }
        if let Some(h) = &host_step {
            for &v in h.values {
                if v.index() >= h.before.min(n) {
                    return Err(err!(Invariant, "host step reads node {}, computed after it", v.0));
                }
                keep[v.index()] = true;
            }
        }
        let mut needed = keep.clone();
        for i in (0..n).rev() {
            if needed[i] {
                for &j in &g.nodes[i].inputs {
                    needed[j.index()] = true;
                }
            }
        }

        let fed = check_feeds(g, feeds, &needed)?;
        for (id, node) in g.nodes() {
            if needed[id.index()] && node.op.is_persistent() && self.persistent(id).is_none() {
                self.init_value(g, id);
            }
        }

        // Each value's last reader, so it can be freed right after (kept values never are).
        let mut last_use = vec![None; n];
        for i in (0..n).filter(|&i| needed[i]) {
            for &j in &g.nodes[i].inputs {
                last_use[j.index()] = Some(i);
            }
        }

        let mut computed: Vec<Option<Buf<T>>> = vec![None; n];
        for (id, node) in g.nodes() {
            let i = id.index();
            if host_step.as_ref().is_some_and(|h| h.before == i) {
                run_host_step(host_step.take(), &mut computed)?;
            }
            if !needed[i] || node.op.is_host_value() {
                continue;
            }
            let value = {
                let ins = node
                    .inputs
                    .iter()
                    .map(|&j| self.view(g, j, &fed, &computed))
                    .collect::<Result<Vec<_>>>()?;
                let shapes: Vec<&[usize]> = node.inputs.iter().map(|&j| g.shape(j)).collect();
                eval(node, &ins, &shapes, opts).map_err(|e| e.at(node.span))?
            };
            computed[i] = Some(value);
            for &j in &node.inputs {
                if last_use[j.index()] == Some(i) && !keep[j.index()] {
                    computed[j.index()] = None;
                }
            }
        }

        run_host_step(host_step, &mut computed)?; // when it runs after the last node
        let outputs = want
            .iter()
            .map(|&w| Ok(to_buf(self.view(g, w, &fed, &computed)?)))
            .collect::<Result<Vec<_>>>()?;
        // Read every update's new value before writing any.
        let mut new_values = Vec::with_capacity(g.updates.len());
        for u in &g.updates {
            match self.view(g, u.value, &fed, &computed)? {
                Val::F(v) => new_values.push((u.target, v.to_vec())),
                Val::I(_) => {
                    return Err(err!(Invariant, "update of node {} from i32 data", u.target.0));
                }
            }
        }
        for (target, v) in new_values {
            self.store(target, v);
        }
        Ok(outputs)
    }

    /// The elements of node `id` during a run: a feed, a persistent value, or a computed value.
    fn view<'a>(
        &'a self,
        g: &Graph,
        id: NodeId,
        fed: &[Option<&'a Buf<T>>],
        computed: &'a [Option<Buf<T>>],
    ) -> Result<Val<'a, T>> {
        let i = id.index();
        let node = &g.nodes[i];
        let found = match &node.op {
            Op::Input { .. } => fed[i].map(Val::of),
            _ if node.op.is_persistent() => self.persistent(id).map(Val::F),
            _ => computed[i].as_ref().map(Val::of),
        };
        found.ok_or_else(|| {
            err!(Invariant, "node {} ({}) has no value when it is read", i, node.op.name())
        })
    }

    fn init_value(&mut self, g: &Graph, id: NodeId) {
        let node = g.node(id);
        if let Op::Parameter { name, init } | Op::State { name, init } = &node.op {
            let v = init_values(init, &node.shape, self.seed, name)
                .into_iter()
                .map(|x| T::from_f64(x as f64))
                .collect();
            self.store(id, v);
        }
    }

    fn store(&mut self, id: NodeId, data: Vec<T>) {
        if self.values.len() <= id.index() {
            self.values.resize(id.index() + 1, None);
        }
        self.values[id.index()] = Some(data);
    }
}

/// Pack the step's values, run it, unpack them (nothing when there is no step).
fn run_host_step<T: Float>(
    host_step: Option<HostStep<'_, T>>,
    computed: &mut [Option<Buf<T>>],
) -> Result<()> {
    let Some(h) = host_step else { return Ok(()) };
    let mut packed = Vec::new();
    for &v in h.values {
        match &computed[v.index()] {
            Some(Buf::F(x)) => packed.extend_from_slice(x),
            _ => return Err(err!(Invariant, "host step reads node {}, which has no f32 value", v.0)),
        }
    }
    (h.step)(&mut packed)?;
    let mut rest = &packed[..];
    for &v in h.values {
        if let Some(Buf::F(x)) = &mut computed[v.index()] {
            let (head, tail) = rest.split_at(x.len());
            x.copy_from_slice(head);
            rest = tail;
        }
    }
    Ok(())
}

/// Match feeds to Input nodes ([`crate::graph::check_feeds`]: each names an input, at most once,
/// with its dtype and element count; every needed input is fed).
fn check_feeds<'a, T: Float>(
    g: &Graph,
    feeds: &'a [(NodeId, Buf<T>)],
    needed: &[bool],
) -> Result<Vec<Option<&'a Buf<T>>>> {
    let described: Vec<_> = feeds.iter().map(|(id, b)| (*id, b.dtype(), b.len())).collect();
    crate::graph::check_feeds(g, &described, &|id| needed[id.index()])?;
    let mut fed: Vec<Option<&Buf<T>>> = vec![None; g.n_nodes()];
    for (id, buf) in feeds {
        fed[id.index()] = Some(buf);
    }
    Ok(fed)
}

fn to_buf<T: Float>(v: Val<T>) -> Buf<T> {
    match v {
        Val::F(x) => Buf::F(x.to_vec()),
        Val::I(x) => Buf::I(x.to_vec()),
    }
}
