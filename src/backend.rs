//! The seam between a compiled model and the device that runs it: the [`Backend`] trait, which
//! the CPU interpreter (`cpu::CpuBackend`) and the GPU (`runtime::backend::GpuBackend`)
//! implement and `session` drives, the per-step [`RunOptions`] both read, and the
//! [`GradSync`] of data-parallel training. It sits below both backends, so neither imports the
//! session that uses it.

use crate::dist::Communicator;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId, TrainGraph};
use crate::tensor::Tensor;
use std::sync::Arc;

/// Options of one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Training mode: dropout drops. When false, dropout is the identity.
    pub training: bool,
    /// The step number, mixed into dropout masks so each step draws a fresh mask.
    pub step: u64,
}

/// Data-parallel training's step between backward and update: once every node before arena
/// index `before` (the first optimizer node) is evaluated, `values` (the loss, then each
/// computed gradient) are replaced by their mean over the ranks of `comm`, in one collective
/// over all of them packed together.
#[derive(Clone, Debug)]
pub struct GradSync {
    /// The ranks that average.
    pub comm: Arc<dyn Communicator>,
    /// The arena index of the first node that runs after the average.
    pub before: usize,
    /// The values averaged, in order.
    pub values: Vec<NodeId>,
}

impl GradSync {
    /// What a data-parallel training step of `train` averages over `comm`: the loss and every
    /// gradient the backward pass computes (a gradient that is a constant, the same on every
    /// rank, is left out), each once.
    pub fn of(train: &TrainGraph, comm: &Arc<dyn Communicator>) -> GradSync {
        let g = &train.graph;
        let mut values = vec![train.loss];
        for &(_, d) in &train.grads {
            if !g.node(d).op.is_host_value() && !values.contains(&d) {
                values.push(d);
            }
        }
        GradSync { comm: comm.clone(), before: train.update_start, values }
    }
}

/// A device that holds a graph's persistent values and evaluates it.
pub trait Backend: Send {
    /// What runs the graph: `cpu`, or the GPU adapter's name.
    fn device_name(&self) -> String;
    /// Feed inputs, evaluate `want` (and, when `opts.training`, apply the graph's updates).
    fn run(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
    ) -> Result<Vec<Tensor>>;
    /// A micro-batch run of gradient accumulation (training mode, dropout drawn for step
    /// `step`): evaluate `want` and what the updates marked [`Update::every_micro_batch`] need
    /// (forward, backward, the accumulators), apply those updates and no others.
    ///
    /// [`Update::every_micro_batch`]: crate::graph::Update::every_micro_batch
    fn run_micro_batch(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        step: u64,
    ) -> Result<Vec<Tensor>>;
    /// Current value of a parameter or state node (any other node is an error:
    /// [`persistent_node`]).
    fn read(&self, id: NodeId) -> Result<Tensor>;
    /// Overwrite a parameter or state node (any other node is an error: [`persistent_node`]).
    fn write(&mut self, id: NodeId, value: &Tensor) -> Result<()>;
    /// A human-readable description of how the graph is executed.
    fn plan_report(&self) -> String;
}

/// The rule of [`Backend::read`] and [`Backend::write`] on every backend: `id` is a parameter
/// or optimizer state of `g`. The flat arena the GPU keeps them in (a concat of them) has a
/// buffer too, but it is not a value a caller can name on the CPU, so neither backend takes it.
pub fn persistent_node(g: &Graph, id: NodeId) -> Result<()> {
    match g.nodes.get(id.index()) {
        Some(n) if n.op.is_persistent() => Ok(()),
        Some(n) => Err(err!(
            InvalidArgument,
            "node {} ({}) is not a parameter or optimizer state: only those can be read or written",
            id.index(),
            n.op.name()
        )),
        None => Err(err!(InvalidArgument, "node {} is not in the graph", id.index())),
    }
}
