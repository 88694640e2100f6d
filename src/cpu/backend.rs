//! The CPU reference interpreter as a [`Backend`]: host tensors in and out of the
//! [`Executor`], a second graph without updates for evaluation runs and a third with only the
//! micro-batch updates for gradient accumulation's micro-batch runs, and data-parallel
//! training's [`GradSync`] as the executor's host step between backward and update.

use super::{Buf, Executor, HostStep};
use crate::backend::{Backend, GradSync, RunOptions};
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::tensor::{Tensor, TensorData};

/// The CPU reference interpreter as a backend.
pub struct CpuBackend {
    graph: Graph,
    /// The same graph without its updates, for evaluation runs.
    eval_graph: Graph,
    /// The same graph with only the updates every micro-batch applies (the executor then
    /// evaluates only what they and the wanted values need).
    micro_graph: Graph,
    exec: Executor<f32>,
    /// The average across ranks inside each training run (data-parallel training).
    sync: Option<GradSync>,
}

impl CpuBackend {
    pub fn new(graph: Graph, seed: u64) -> Result<CpuBackend> {
        let exec = Executor::new(&graph, seed)?;
        let mut eval_graph = graph.clone();
        eval_graph.updates.clear();
        let mut micro_graph = graph.clone();
        micro_graph.updates.retain(|u| u.every_micro_batch);
        Ok(CpuBackend { graph, eval_graph, micro_graph, exec, sync: None })
    }

    /// Average `sync.values` across ranks inside every training run.
    pub fn with_grad_sync(mut self, sync: GradSync) -> CpuBackend {
        self.sync = Some(sync);
        self
    }
}

fn to_buf(t: &Tensor) -> Buf<f32> {
    match t.data() {
        TensorData::F32(v) => Buf::F(v.clone()),
        TensorData::I32(v) => Buf::I(v.clone()),
    }
}

fn from_buf(shape: &[usize], b: Buf<f32>) -> Result<Tensor> {
    match b {
        Buf::F(v) => Tensor::f32(shape, v),
        Buf::I(v) => Tensor::i32(shape, v),
    }
}

impl CpuBackend {
    /// A run of the training graph (`opts.training`), its micro-batch updates only (`micro`),
    /// or the evaluation graph.
    fn run_graph(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
        micro: bool,
    ) -> Result<Vec<Tensor>> {
        let g = match (opts.training, micro) {
            (true, true) => &self.micro_graph,
            (true, false) => &self.graph,
            (false, _) => &self.eval_graph,
        };
        crate::graph::check_feed_shapes(g, feeds)?;
        let bufs: Vec<(NodeId, Buf<f32>)> = feeds.iter().map(|(id, t)| (*id, to_buf(t))).collect();
        let mut average = |d: &mut [f32]| self.sync.as_ref().map_or(Ok(()), |s| s.comm.all_reduce_mean(d));
        let host_step = match &self.sync {
            Some(s) if opts.training => {
                Some(HostStep { before: s.before, values: &s.values, step: &mut average })
            }
            _ => None,
        };
        let out = self.exec.run_with(g, &bufs, want, opts, host_step)?;
        want.iter().zip(out).map(|(&id, b)| from_buf(self.graph.shape(id), b)).collect()
    }
}

impl Backend for CpuBackend {
    fn device_name(&self) -> String {
        "cpu".to_string()
    }

    fn run(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
    ) -> Result<Vec<Tensor>> {
        self.run_graph(feeds, want, opts, false)
    }

    fn run_micro_batch(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        step: u64,
    ) -> Result<Vec<Tensor>> {
        self.run_graph(feeds, want, RunOptions { training: true, step }, true)
    }

    fn read(&self, id: NodeId) -> Result<Tensor> {
        crate::backend::persistent_node(&self.graph, id)?;
        let data = self
            .exec
            .persistent(id)
            .ok_or_else(|| err!(Invariant, "node {} is not persistent", id.index()))?;
        Tensor::f32(self.graph.shape(id), data.to_vec())
    }

    fn write(&mut self, id: NodeId, value: &Tensor) -> Result<()> {
        crate::backend::persistent_node(&self.graph, id)?;
        let data =
            value.as_f32().ok_or_else(|| err!(Shape, "persistent values are f32, got {}", value.dtype()))?;
        self.exec.set_persistent(&self.graph, id, data.to_vec())
    }

    fn plan_report(&self) -> String {
        let n = self.graph.n_nodes();
        let mut s =
            format!("device cpu (reference interpreter): {n} ops, evaluated one by one, no fusion");
        // Gradient accumulation (the accumulators update every micro-batch, the plan's rule):
        // a micro-batch run stops before the optimizer. Without it no update is every micro
        // batch's, and the note said so of steps that accumulate nothing.
        let first = crate::graph::optim::FIRST_MICRO_BATCH_INPUT;
        if !self.micro_graph.updates.is_empty() || self.graph.input_named(first).is_some() {
            s.push_str("; a micro-batch that only accumulates gradients evaluates what its accumulators need and skips the optimizer");
        }
        s
    }
}
