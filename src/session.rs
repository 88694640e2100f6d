//! Compiled models on a device: what the script runner, the REPL and host applications drive.
//!
//! A [`Model`] is a template: a function from named dimensions (the batch size `B`, ...) to a
//! forward graph. [`Model::compile`] instantiates it, appends loss, backward and optimizer, and
//! places the training graph on a [`Backend`]. The resulting [`Trainer`] runs training steps,
//! predicts (instantiating forward graphs at other batch sizes as needed, with the trained
//! parameters copied over), and reads and writes persistent values by name for checkpoints.

use crate::cpu::{Buf, Executor, RunOptions};
use crate::err;
use crate::error::{Error, Result};
use crate::graph::optim::is_host_input;
use crate::graph::{training_graph, Graph, NodeId, Op, OptimConfig, TrainGraph};
use crate::plan::PlanOptions;
use crate::runtime::backend::GpuBackend;
use crate::runtime::{shared_gpu, DeviceChoice};
use crate::tensor::{fmt_shape, DType, Tensor, TensorData};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sizes of a model's named dimensions (`B` is the batch).
pub type Dims = BTreeMap<String, usize>;

/// Builds a model's forward graph for given dimensions.
pub type GraphBuilder = Arc<dyn Fn(&Dims) -> Result<Graph> + Send + Sync>;

/// A device that holds a graph's persistent values and evaluates it.
pub trait Backend {
    /// What runs the graph: `cpu`, or the GPU adapter's name.
    fn device_name(&self) -> String;
    /// Feed inputs, evaluate `want` (and, when `opts.training`, apply the graph's updates).
    fn run(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
    ) -> Result<Vec<Tensor>>;
    /// Current value of a parameter or state node.
    fn read(&self, id: NodeId) -> Result<Tensor>;
    /// Overwrite a parameter or state node.
    fn write(&mut self, id: NodeId, value: &Tensor) -> Result<()>;
    /// A human-readable description of how the graph is executed.
    fn plan_report(&self) -> String;
}

/// The CPU reference interpreter as a backend.
pub struct CpuBackend {
    graph: Graph,
    /// The same graph without its updates, for evaluation runs.
    eval_graph: Graph,
    exec: Executor<f32>,
}

impl CpuBackend {
    pub fn new(graph: Graph, seed: u64) -> Result<CpuBackend> {
        let exec = Executor::new(&graph, seed)?;
        let mut eval_graph = graph.clone();
        eval_graph.updates.clear();
        Ok(CpuBackend { graph, eval_graph, exec })
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
        let bufs: Vec<(NodeId, Buf<f32>)> = feeds.iter().map(|(id, t)| (*id, to_buf(t))).collect();
        let g = if opts.training { &self.graph } else { &self.eval_graph };
        let out = self.exec.run(g, &bufs, want, opts)?;
        want.iter().zip(out).map(|(&id, b)| from_buf(self.graph.shape(id), b)).collect()
    }

    fn read(&self, id: NodeId) -> Result<Tensor> {
        let data = self
            .exec
            .persistent(id)
            .ok_or_else(|| err!(Invariant, "node {} is not persistent", id.index()))?;
        Tensor::f32(self.graph.shape(id), data.to_vec())
    }

    fn write(&mut self, id: NodeId, value: &Tensor) -> Result<()> {
        let data =
            value.as_f32().ok_or_else(|| err!(Shape, "persistent values are f32, got i32"))?;
        self.exec.set_persistent(&self.graph, id, data.to_vec())
    }

    fn plan_report(&self) -> String {
        let n = self.graph.n_nodes();
        format!("device cpu (reference interpreter): {n} ops, evaluated one by one, no fusion")
    }
}

/// Which device a model is compiled for (see [`DeviceChoice`]).
pub type Device = DeviceChoice;

/// A backend for `graph` on the device `choice` resolves to.
fn backend_for(choice: DeviceChoice, graph: Graph, seed: u64) -> Result<Box<dyn Backend>> {
    Ok(match shared_gpu(choice)? {
        Some(gpu) => Box::new(GpuBackend::new(gpu, graph, seed, PlanOptions::default())?),
        None => Box::new(CpuBackend::new(graph, seed)?),
    })
}

/// Learning rate as a function of the step.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    Constant,
    /// Multiply by `gamma` every `every` steps.
    Step {
        every: u64,
        gamma: f32,
    },
    /// Linear warm-up over `warmup` steps, then cosine decay to `min_lr` at step `total`.
    Cosine {
        warmup: u64,
        total: u64,
        min_lr: f32,
    },
}

impl Schedule {
    /// The learning rate for (0-based) step `step` with base rate `lr`.
    pub fn lr_at(&self, lr: f32, step: u64) -> f32 {
        match *self {
            Schedule::Constant => lr,
            Schedule::Step { every, gamma } => {
                lr * gamma.powi((step / every.max(1)).min(i32::MAX as u64) as i32)
            }
            Schedule::Cosine { warmup, total, min_lr } => {
                if step < warmup {
                    return lr * (step + 1) as f32 / warmup as f32;
                }
                let span = total.saturating_sub(warmup).max(1);
                let t = (step - warmup).min(span) as f32 / span as f32;
                min_lr + 0.5 * (lr - min_lr) * (1.0 + (std::f32::consts::PI * t).cos())
            }
        }
    }
}

/// What the training step minimizes.
#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    /// Cross-entropy of output `output` (logits) against i32 labels fed as input `target`.
    CrossEntropy { output: String, ignore_index: Option<i32> },
    /// Mean squared error of output `output` against f32 values fed as input `target`.
    Mse { output: String },
    /// The model computes its own scalar loss as output `output`.
    Output { output: String },
}

/// Everything `compile` needs besides the model.
#[derive(Clone, Debug)]
pub struct CompileConfig {
    pub dims: Dims,
    pub loss: Loss,
    pub optimizer: OptimConfig,
    pub lr: f32,
    pub schedule: Schedule,
    pub device: Device,
    pub seed: u64,
}

/// Name of the input a compiled model's targets are fed through.
pub const TARGET_INPUT: &str = "target";

/// A model template.
#[derive(Clone)]
pub struct Model {
    pub name: String,
    build: GraphBuilder,
}

impl Model {
    pub fn new(name: &str, build: GraphBuilder) -> Model {
        Model { name: name.to_string(), build }
    }

    /// The forward graph at the given dimensions.
    pub fn instantiate(&self, dims: &Dims) -> Result<Graph> {
        (self.build)(dims)
    }

    /// Instantiate, append loss, backward and optimizer, and place the result on a device.
    pub fn compile(&self, cfg: CompileConfig) -> Result<Trainer> {
        if !(cfg.lr.is_finite() && cfg.lr >= 0.0) {
            return Err(err!(Usage, "learning rate must be a finite number >= 0, got {}", cfg.lr));
        }
        let mut g = self.instantiate(&cfg.dims)?;
        let loss = attach_loss(&mut g, &cfg.loss)?;
        let train = training_graph(g, loss, &cfg.optimizer)?;
        let backend = backend_for(cfg.device, train.graph.clone(), cfg.seed)?;
        Ok(Trainer { model: self.clone(), cfg, train, backend, evals: BTreeMap::new(), step: 0 })
    }
}

/// Add the target input (when the loss has one) and the loss node.
fn attach_loss(g: &mut Graph, loss: &Loss) -> Result<NodeId> {
    let output = match loss {
        Loss::CrossEntropy { output, .. } | Loss::Mse { output } | Loss::Output { output } => {
            output
        }
    };
    let out = g.output(output).ok_or_else(|| {
        let names: Vec<&str> = g.outputs.iter().map(|(n, _)| n.as_str()).collect();
        err!(Name, "the model has no output `{output}` (outputs: {})", names.join(", "))
    })?;
    let shape = g.shape(out).to_vec();
    Ok(match loss {
        Loss::CrossEntropy { ignore_index, .. } => {
            let labels = &shape[..shape.len().saturating_sub(1)];
            let t = g.input(TARGET_INPUT, labels, DType::I32)?;
            g.cross_entropy(out, t, *ignore_index)?
        }
        Loss::Mse { .. } => {
            let t = g.input(TARGET_INPUT, &shape, DType::F32)?;
            g.mse(out, t)?
        }
        Loss::Output { .. } => out,
    })
}

/// A forward graph at other dimensions on its own backend, with the training step its
/// parameters were last copied at.
type EvalGraph = (Graph, Box<dyn Backend>, Option<u64>);

/// A compiled model: trains, predicts, and exposes its persistent values by name.
pub struct Trainer {
    model: Model,
    cfg: CompileConfig,
    train: TrainGraph,
    backend: Box<dyn Backend>,
    /// Forward graphs at other dimensions, with the step their parameters were copied at.
    evals: BTreeMap<Vec<(String, usize)>, EvalGraph>,
    step: u64,
}

impl Trainer {
    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn device_name(&self) -> String {
        self.backend.device_name()
    }

    pub fn graph(&self) -> &Graph {
        &self.train.graph
    }

    pub fn plan_report(&self) -> String {
        self.backend.plan_report()
    }

    /// The learning rate the next step will use.
    pub fn current_lr(&self) -> f32 {
        self.cfg.schedule.lr_at(self.cfg.lr, self.step)
    }

    /// One training step: feeds the named inputs (and `target`), returns the loss.
    pub fn train_step(&mut self, inputs: &[(&str, &Tensor)]) -> Result<f32> {
        let g = &self.train.graph;
        let mut feeds = resolve_feeds(g, inputs)?;
        let host = self.train.optim.host_feeds(self.current_lr(), self.step);
        feeds.extend(host.iter().map(|(id, t)| (*id, t)));
        let opts = RunOptions { training: true, step: self.step };
        let out = self.backend.run(&feeds, &[self.train.loss], opts)?;
        self.step += 1;
        let loss = out[0].as_f32().and_then(|v| v.first().copied()).unwrap_or(f32::NAN);
        Ok(loss)
    }

    /// Evaluate the model's outputs (dropout off) on inputs whose leading dimension is any
    /// batch size; other named dimensions are those the model was compiled with.
    pub fn predict(&mut self, inputs: &[(&str, &Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let batch = inputs.first().and_then(|(_, t)| t.shape().first().copied()).unwrap_or(0);
        let mut dims = self.cfg.dims.clone();
        dims.insert("B".to_string(), batch);
        let key: Vec<(String, usize)> = dims.clone().into_iter().collect();
        if !self.evals.contains_key(&key) {
            let g = self.model.instantiate(&dims)?;
            let backend = backend_for(self.cfg.device, g.clone(), self.cfg.seed)?;
            self.evals.insert(key.clone(), (g, backend, None));
        }
        // Copy the trained parameters over when they changed since the last copy.
        let params = self.parameters()?;
        let (g, backend, synced) = self.evals.get_mut(&key).expect("inserted above");
        if *synced != Some(self.step) {
            for (name, value) in &params {
                if let Some(id) = g.persistent_named(name) {
                    backend.write(id, value)?;
                }
            }
            *synced = Some(self.step);
        }
        let feeds = resolve_feeds(g, inputs)?;
        let want: Vec<NodeId> = g.outputs.iter().map(|&(_, id)| id).collect();
        let out = backend.run(&feeds, &want, RunOptions { training: false, step: self.step })?;
        Ok(g.outputs.iter().map(|(n, _)| n.clone()).zip(out).collect())
    }

    /// Parameters by name, in graph order.
    pub fn parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let g = &self.train.graph;
        g.parameters()
            .into_iter()
            .map(|(id, name)| Ok((name.to_string(), self.backend.read(id)?)))
            .collect()
    }

    /// One parameter by name.
    pub fn parameter(&self, name: &str) -> Result<Tensor> {
        let g = &self.train.graph;
        match g.persistent_named(name) {
            Some(id) if matches!(g.node(id).op, Op::Parameter { .. }) => self.backend.read(id),
            _ => Err(err!(Name, "no parameter named `{name}`")),
        }
    }

    /// Every persistent value (parameters, optimizer state, step count) by name: what a
    /// checkpoint holds.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let g = &self.train.graph;
        g.nodes()
            .filter_map(|(id, n)| match &n.op {
                Op::Parameter { name, .. } | Op::State { name, .. } => Some((id, name.clone())),
                _ => None,
            })
            .map(|(id, name)| Ok((name, self.backend.read(id)?)))
            .collect()
    }

    /// Overwrite persistent values by name. Every name must exist with the same shape; values
    /// the list does not mention keep their current contents. The step counter follows the
    /// optimizer's step state when it is given.
    pub fn load_state(&mut self, values: &[(String, Tensor)]) -> Result<()> {
        let g = &self.train.graph;
        let mut writes = Vec::new();
        for (name, t) in values {
            let id = g.persistent_named(name).ok_or_else(|| {
                err!(Checkpoint, "unexpected tensor `{name}`: the model has no such value")
            })?;
            if t.shape() != g.shape(id) || t.dtype() != DType::F32 {
                return Err(err!(
                    Checkpoint,
                    "tensor `{name}` is {}{}, the model expects f32{}",
                    t.dtype(),
                    fmt_shape(t.shape()),
                    fmt_shape(g.shape(id))
                ));
            }
            writes.push((id, t));
        }
        for (id, t) in writes {
            self.backend.write(id, t)?;
        }
        if let Some(id) = g.persistent_named(crate::graph::optim::STEP_STATE) {
            let s = self.backend.read(id)?;
            self.step =
                s.as_f32().and_then(|v| v.first()).map_or(self.step, |&v| v.max(0.0) as u64);
        }
        Ok(())
    }
}

/// Map `(name, tensor)` feeds onto a graph's inputs, checking shapes and dtypes; every input
/// except those the optimizer driver feeds (learning rate, bias corrections) must be fed.
fn resolve_feeds<'a>(
    g: &Graph,
    inputs: &[(&str, &'a Tensor)],
) -> Result<Vec<(NodeId, &'a Tensor)>> {
    let mut feeds = Vec::new();
    for (name, t) in inputs {
        let id = g.input_named(name).ok_or_else(|| {
            let names: Vec<String> = g
                .nodes()
                .filter_map(|(_, n)| match &n.op {
                    Op::Input { name } if !is_host_input(name) => Some(format!("`{name}`")),
                    _ => None,
                })
                .collect();
            err!(Name, "the model has no input `{name}` (inputs: {})", names.join(", "))
        })?;
        let (shape, dtype) = (g.shape(id), g.dtype(id));
        if t.shape() != shape || t.dtype() != dtype {
            return Err(Error::shape(format!(
                "input `{name}` must be {dtype}{}, got {}{}",
                fmt_shape(shape),
                t.dtype(),
                fmt_shape(t.shape())
            )));
        }
        feeds.push((id, *t));
    }
    for (_, n) in g.nodes() {
        if let Op::Input { name } = &n.op {
            if !is_host_input(name) && !inputs.iter().any(|(m, _)| m == name) {
                return Err(err!(Usage, "input `{name}` was not fed"));
            }
        }
    }
    Ok(feeds)
}
