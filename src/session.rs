//! Compiled models on a device: what the script runner, the REPL and host applications drive.
//!
//! A [`Model`] is a template: a function from named dimensions (the batch size `B`, ...) to a
//! forward graph. [`Model::compile`] instantiates it, appends loss, backward and optimizer, and
//! places the training graph on a backend (GPU or CPU). The resulting [`Trainer`] runs training steps,
//! predicts (instantiating forward graphs at other batch sizes as needed, with the trained
//! parameters copied over), and reads and writes persistent values by name for checkpoints.
//!
//! Every graph placed on a backend is first charged to the compile configuration's memory
//! budget for its [`footprint`]: what the backend keeps for as long as it lives, and what
//! each run needs for as long as the run lasts.
//!
//! Data-parallel training (a [`CompileConfig::comm`] of more than one rank): every rank
//! compiles the same model, rank 0's parameters and state are broadcast to the others after
//! compile and after each checkpoint load, and each training step averages the loss and the
//! gradients across ranks between backward and update ([`GradSync`]; the CPU backend only, for
//! now), so every rank applies the same update and returns the same loss.

use crate::backend::{Backend, GradSync, RunOptions};
pub use crate::codegen::MatmulPrecision;
use crate::cpu::CpuBackend;
use crate::dist::Communicator;
use crate::err;
use crate::error::{Error, Result, Source};
use crate::graph::optim::{is_host_input, STEP_STATE};
use crate::graph::{training_graph_with, Graph, NodeId, Op, OptimConfig, TrainGraph, TrainOptions};
use crate::memory::{Budget, Charge};
use crate::num::show;
use crate::plan::PlanOptions;
use crate::runtime::backend::GpuBackend;
use crate::runtime::{shared_gpu, DeviceChoice};
use crate::tensor::{fmt_shape, DType, Tensor};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Sizes of a model's named dimensions (`B` is the batch).
pub type Dims = BTreeMap<String, usize>;

/// Builds a model's forward graph for given dimensions.
pub type GraphBuilder = Arc<dyn Fn(&Dims) -> Result<Graph> + Send + Sync>;

/// Which device a model is compiled for: `Auto` (a hardware GPU adapter if there is one, else
/// the CPU backend), `Gpu` (any wgpu adapter, software ones included; an error when there is
/// none) or `Cpu` (the CPU reference backend). Parsed from `auto`, `gpu` or `cpu`.
pub type Device = DeviceChoice;

/// A graph on a backend, with what the backend keeps between runs charged to the budget, and
/// what each run needs on top of that.
struct Placed {
    backend: Box<dyn Backend>,
    _held: Charge,
    per_run: u64,
}

impl Placed {
    /// Place `graph` on the device of `cfg`, charging its [`footprint`] (named `what`) first: on
    /// a GPU every buffer lives as long as the backend; the CPU interpreter frees a run's
    /// intermediate values when the run ends, so those are charged per run.
    /// Training runs average across ranks when `sync` is given (the CPU backend only).
    fn new(
        cfg: &CompileConfig,
        graph: Graph,
        want: &[NodeId],
        training: bool,
        what: &str,
        sync: Option<GradSync>,
    ) -> Result<Placed> {
        let f = footprint(&graph, want, training);
        let gpu = shared_gpu(cfg.device)?;
        let (held, per_run) = match gpu {
            Some(_) => (f.persistent.saturating_add(f.peak), f.readback),
            None => (f.persistent, f.peak),
        };
        let held = cfg.budget.charge(held, what)?;
        let backend: Box<dyn Backend> = match gpu {
            Some(gpu) => {
                let mut b = GpuBackend::new(gpu, graph, cfg.seed, PlanOptions::default())?;
                b.matmul.precision = gpu.matmul_precision(cfg.matmul_precision);
                b.sync = sync;
                Box::new(b)
            }
            None => {
                let cpu = CpuBackend::new(graph, cfg.seed)?;
                Box::new(match sync {
                    Some(sync) => cpu.with_grad_sync(sync),
                    None => cpu,
                })
            }
        };
        Ok(Placed { backend, _held: held, per_run })
    }

    /// Run, with the run's own bytes charged to `budget` while it lasts; a micro-batch run of
    /// gradient accumulation when `micro` (`opts.step` draws its dropout masks).
    fn run(
        &mut self,
        budget: &Budget,
        what: &str,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
        micro: bool,
    ) -> Result<Vec<Tensor>> {
        let _run = budget.charge(self.per_run, what)?;
        match micro {
            true => self.backend.run_micro_batch(feeds, want, opts.step),
            false => self.backend.run(feeds, want, opts),
        }
    }
}

/// Learning rate as a function of the step.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// The base rate at every step.
    Constant,
    /// Multiply by `gamma` every `every` steps.
    Step {
        /// Steps between decays.
        every: u64,
        /// Factor applied at each decay.
        gamma: f32,
    },
    /// Linear warm-up over `warmup` steps, then cosine decay to `min_lr` at step `total`.
    Cosine {
        /// Steps of linear warm-up.
        warmup: u64,
        /// The step at which the rate reaches `min_lr` (and stays there).
        total: u64,
        /// The final rate.
        min_lr: f32,
    },
}

impl Schedule {
    /// An error unless the schedule's settings are consistent with the base rate `lr`: every
    /// rate and factor a finite number >= 0 (a NaN factor would turn every later learning rate
    /// into NaN), a cosine's `min_lr` at most `lr` (it decays from `lr` to `min_lr`) and its
    /// warm-up no longer than `total`.
    pub fn check(&self, lr: f32) -> Result<()> {
        let (what, v) = match *self {
            Schedule::Constant => return Ok(()),
            Schedule::Step { gamma, .. } => ("step_lr: gamma", gamma),
            Schedule::Cosine { min_lr, .. } => ("cosine: min_lr", min_lr),
        };
        if !(v.is_finite() && v >= 0.0) {
            return Err(err!(InvalidArgument, "{what} must be a finite number >= 0, got {v}"));
        }
        if let Schedule::Cosine { warmup, total, min_lr } = *self {
            if min_lr > lr {
                return Err(err!(
                    InvalidArgument,
                    "cosine: min_lr {} is above the learning rate {}: the schedule decays from the learning rate down to min_lr; give a smaller min_lr or a larger lr",
                    show(min_lr),
                    show(lr)
                ));
            }
            if warmup > total {
                return Err(err!(
                    InvalidArgument,
                    "cosine: warmup {warmup} is longer than total {total}: the rate warms up over the first `warmup` steps and reaches min_lr at step `total`; give a total of at least {warmup}"
                ));
            }
        }
        Ok(())
    }

    /// The learning rate for (0-based) step `step` with base rate `lr`, computed in f64 (as
    /// PyTorch computes schedules) and rounded once to f32, the type the step is fed. An error
    /// naming the schedule and the step when it is not a finite f32 (a `gamma` above 1 grows
    /// the rate past f32's range), never an infinite rate that turns the model into NaN.
    pub fn lr_at(&self, lr: f32, step: u64) -> Result<f32> {
        let base = f64::from(lr);
        let (rate, name) = match *self {
            Schedule::Constant => (base, "the constant schedule"),
            Schedule::Step { every, gamma } => {
                let decays = (step / every.max(1)).min(i32::MAX as u64) as i32;
                // 0 × an overflowed power would be NaN; a rate of 0 stays 0.
                let rate = if lr == 0.0 { 0.0 } else { base * f64::from(gamma).powi(decays) };
                (rate, "step_lr")
            }
            Schedule::Cosine { warmup, total, min_lr } => {
                let rate = if step < warmup {
                    base * (step + 1) as f64 / warmup as f64
                } else {
                    // Decayed by `total`: with no steps between the warm-up and `total`,
                    // the first step after the warm-up is at `min_lr` already.
                    let span = total.saturating_sub(warmup);
                    let t = if span == 0 {
                        1.0
                    } else {
                        (step - warmup).min(span) as f64 / span as f64
                    };
                    let min = f64::from(min_lr);
                    min + 0.5 * (base - min) * (1.0 + (std::f64::consts::PI * t).cos())
                };
                (rate, "cosine")
            }
        };
        match crate::num::f32_of(rate) {
            Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
            _ => Err(match *self {
                Schedule::Step { every, gamma } => err!(
                    InvalidArgument,
                    "step_lr: the learning rate for step {step}, lr {} × gamma {}^{}, is beyond f32's range (about 3.4e38): use a gamma of at most 1, or a larger `every`",
                    show(lr),
                    show(gamma),
                    step / every.max(1)
                ),
                _ => err!(
                    InvalidArgument,
                    "{name}: the learning rate for step {step} is {}, not a finite f32 >= 0",
                    show(rate)
                ),
            }),
        }
    }
}

/// What the training step minimizes.
#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    /// Cross-entropy of output `output` (logits) against i32 labels fed as input `target`.
    CrossEntropy {
        /// The output holding the logits.
        output: String,
        /// A label that contributes nothing (PyTorch's `ignore_index`).
        ignore_index: Option<i32>,
    },
    /// Mean squared error of output `output` against f32 values fed as input `target`.
    Mse {
        /// The output holding the predictions.
        output: String,
    },
    /// The model computes its own scalar loss as output `output`.
    Output {
        /// The scalar output that is the loss.
        output: String,
    },
}

/// Everything `compile` needs besides the model.
#[derive(Clone, Debug)]
pub struct CompileConfig {
    /// Sizes of the model's named dimensions for the training graph (`B`: the batch).
    pub dims: Dims,
    /// What the training step minimizes.
    pub loss: Loss,
    /// The update rule and gradient clipping.
    pub optimizer: OptimConfig,
    /// The base learning rate (a finite number >= 0).
    pub lr: f32,
    /// How the learning rate changes with the step.
    pub schedule: Schedule,
    /// Where the model runs.
    pub device: Device,
    /// Seeds the random initializers of parameters and state.
    pub seed: u64,
    /// How accurately a GPU computes matrix products (`None`: `high` where the adapter has
    /// cooperative matrices, `highest` elsewhere; `high` or `medium` without them fall back to
    /// `highest` with a notice). The CPU backend always computes in fp32.
    pub matmul_precision: Option<MatmulPrecision>,
    /// What the compiled model's buffers (host and device) are charged to.
    pub budget: Budget,
    /// The ranks of a data-parallel job ([`crate::dist::single`] for one process).
    pub comm: Arc<dyn Communicator>,
    /// What the backward pass recomputes instead of keeping alive across the step
    /// (rematerialization, [`crate::graph::remat`]: cheap values unless a script says
    /// `remat: false`, the widening matmuls too with `remat: "matmuls"`). Results are the same
    /// either way.
    pub remat: TrainOptions,
}

/// Name of the input a compiled model's targets are fed through.
pub const TARGET_INPUT: &str = "target";

/// A model template.
#[derive(Clone)]
pub struct Model {
    /// The model's name, used in error messages.
    pub name: String,
    build: GraphBuilder,
    /// The text the spans of the graph's nodes point into (a model written in the model
    /// language), so that an error raised at a node later (building the training step,
    /// planning, checking a step's values) points at its line there.
    source: Option<Arc<Source>>,
}

impl Model {
    /// A model called `name` whose forward graph `build` makes.
    pub fn new(name: &str, build: GraphBuilder) -> Model {
        Model { name: name.to_string(), build, source: None }
    }

    /// The model with the text its graphs' spans point into.
    pub fn with_source(self, source: Arc<Source>) -> Model {
        Model { source: Some(source), ..self }
    }

    /// `e` pointing into the model's text, where it has a span there and no text yet.
    fn placed(&self, e: Error) -> Error {
        match &self.source {
            Some(s) => e.in_source(s),
            None => e,
        }
    }

    /// The forward graph at the given dimensions.
    pub fn instantiate(&self, dims: &Dims) -> Result<Graph> {
        (self.build)(dims).map_err(|e| self.placed(e))
    }

    /// Instantiate, append loss, backward and optimizer, and place the result on a device.
    pub fn compile(&self, cfg: CompileConfig) -> Result<Trainer> {
        self.compile_at(cfg).map_err(|e| self.placed(e))
    }

    fn compile_at(&self, cfg: CompileConfig) -> Result<Trainer> {
        if !(cfg.lr.is_finite() && cfg.lr >= 0.0) {
            return Err(err!(
                InvalidArgument,
                "learning rate must be a finite number >= 0, got {}",
                cfg.lr
            ));
        }
        cfg.schedule.check(cfg.lr)?;
        let mut g = self.instantiate(&cfg.dims)?;
        let loss = attach_loss(&mut g, &cfg.loss)?;
        let train = training_graph_with(g, loss, &cfg.optimizer, cfg.remat)?;
        let what = format!("model `{}` compiled for training", self.name);
        let sync = (cfg.comm.world_size() > 1).then(|| GradSync::of(&train, &cfg.comm));
        let placed = Placed::new(&cfg, train.graph.clone(), &[train.loss], true, &what, sync)?;
        let mut trainer = Trainer {
            model: self.clone(),
            cfg,
            train,
            placed,
            evals: BTreeMap::new(),
            step: 0,
            micro: 0,
            micro_losses: 0.0,
            update_loss: f32::NAN,
            generation: 0,
        };
        trainer.broadcast_state()?;
        Ok(trainer)
    }
}

/// What a backend holds for a graph, in bytes (see [`footprint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Every input, parameter and state value.
    pub persistent: u64,
    /// The most intermediate values alive at once during a run.
    pub peak: u64,
    /// The host copies of the values a run reads back.
    pub readback: u64,
}

/// The bytes a backend holds for `g` to evaluate `want` (and, when `training`, the updates).
/// The peak assumes each intermediate value is freed after its last reader (the CPU
/// interpreter's order); the GPU plan shares buffers about as tightly, give or take its scratch.
pub fn footprint(g: &Graph, want: &[NodeId], training: bool) -> Footprint {
    let n = g.n_nodes();
    let bytes = |id: NodeId| g.shape(id).iter().product::<usize>().max(1) as u64 * 4;
    let source = |id: NodeId| g.node(id).op.is_host_value();
    let mut kept = vec![false; n];
    for &w in want {
        kept[w.index()] = true;
    }
    if training {
        for u in &g.updates {
            kept[u.value.index()] = true;
        }
    }
    let mut needed = kept.clone();
    let mut last_use = vec![None; n];
    for i in (0..n).rev() {
        if needed[i] {
            for &j in &g.node(NodeId(i as u32)).inputs {
                needed[j.index()] = true;
                last_use[j.index()].get_or_insert(i);
            }
        }
    }
    let (mut live, mut peak) = (0u64, 0u64);
    for i in (0..n).filter(|&i| needed[i]) {
        let id = NodeId(i as u32);
        if source(id) {
            continue;
        }
        live += bytes(id);
        peak = peak.max(live);
        if last_use[i].is_none() && !kept[i] {
            live -= bytes(id);
        }
        for &j in &g.node(id).inputs {
            if last_use[j.index()] == Some(i) && !kept[j.index()] && !source(j) {
                live -= bytes(j);
                last_use[j.index()] = None; // an input read twice by this node is freed once
            }
        }
    }
    Footprint {
        persistent: g.nodes().filter(|&(id, _)| source(id)).map(|(id, _)| bytes(id)).sum(),
        peak,
        readback: want.iter().map(|&w| bytes(w)).sum(),
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
    check_loss_input(loss, output, g.dtype(out), &shape)?;
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

/// That `loss` can read model output `output` of `dtype` and `shape`: every loss needs f32
/// values (and "output" a scalar), said with the loss's name and what to do rather than by the
/// op inside the loss that refuses them (`sub: operand must be f32`).
fn check_loss_input(loss: &Loss, output: &str, dtype: DType, shape: &[usize]) -> Result<()> {
    let (name, needs) = match loss {
        Loss::CrossEntropy { .. } => ("cross_entropy", "f32 logits"),
        Loss::Mse { .. } => ("mse", "f32 predictions"),
        Loss::Output { .. } => ("output", "an f32 scalar, the loss itself"),
    };
    let scalar = !matches!(loss, Loss::Output { .. }) || shape.is_empty();
    if dtype == DType::F32 && scalar {
        return Ok(());
    }
    let todo = if dtype != DType::F32 {
        "return f32 values from the model (i32 values are indices: `embedding` turns them into f32 vectors)"
    } else {
        "make the model reduce it to a scalar (`mean` or `sum`), or use another loss"
    };
    Err(err!(
        Shape,
        "the \"{name}\" loss needs {needs}, and the model's output `{output}` is {dtype}{}: {todo}",
        fmt_shape(shape)
    ))
}

/// A forward graph at other dimensions on its own backend, with the generation of the
/// persistent values its parameters were last copied from.
struct EvalGraph {
    graph: Graph,
    placed: Placed,
    synced: Option<u64>,
}

/// What a checkpoint load left out (both lists are empty after a strict load).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Values of the model the load did not set; they keep their current contents: those the
    /// checkpoint lacks, and the whole optimizer state where it has only part of it.
    pub missing: Vec<String>,
    /// Tensors of the checkpoint the model has no value for; they were ignored.
    pub unexpected: Vec<String>,
}

/// A compiled model: trains, predicts, and exposes its persistent values by name.
pub struct Trainer {
    model: Model,
    cfg: CompileConfig,
    train: TrainGraph,
    /// The training graph on its backend.
    placed: Placed,
    /// Forward graphs at other dimensions, with the generation their parameters were copied at.
    evals: BTreeMap<Vec<(String, usize)>, EvalGraph>,
    /// Updates applied so far.
    step: u64,
    /// Gradient accumulation: micro-batches accumulated toward the next update, and the sum
    /// of their losses.
    micro: usize,
    micro_losses: f64,
    /// The mean loss of the micro-batches of the last update (its loss without accumulation).
    update_loss: f32,
    /// Counts writes to the persistent values (training steps, loads, `set_param`), so that
    /// evaluation copies know when they are stale.
    generation: u64,
}

impl Trainer {
    /// Optimizer updates applied so far (with gradient accumulation, one per `accumulate`
    /// training steps).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Set the step count to `exact`, a count [`exact_step`] gave for the checkpoint just loaded.
    pub fn set_loaded_step(&mut self, exact: u64) {
        self.step = exact;
    }

    /// The base learning rate: the compiled one, or the last set by [`Trainer::set_lr`] or a
    /// checkpoint (a schedule scales it).
    pub fn base_lr(&self) -> f32 {
        self.cfg.lr
    }

    /// The base learning rate of a checkpoint whose step count was loaded ([`saved_lr`]), for
    /// a model without a schedule (whose rate `net.lr` sets). A schedule owns the rate, and
    /// its own settings are the script's, not the file's: it keeps the compiled one.
    pub fn set_loaded_lr(&mut self, lr: f32) {
        if self.cfg.schedule == Schedule::Constant {
            self.cfg.lr = lr;
        }
    }

    /// Micro-batches per update (1 without gradient accumulation).
    pub fn accumulate(&self) -> usize {
        self.train.optim.accumulation.as_ref().map_or(1, |a| a.micro_batches)
    }

    /// Micro-batches accumulated toward the next update (0 right after an update).
    pub fn micro_batch(&self) -> usize {
        self.micro
    }

    /// The loss of the last update: the mean loss of its micro-batches (NaN before the first).
    pub fn update_loss(&self) -> f32 {
        self.update_loss
    }

    /// An error when micro-batches are accumulated toward the next update: a checkpoint
    /// holds what an update leaves, not a partial sum of gradients.
    pub fn check_between_updates(&self, what: &str) -> Result<()> {
        self.check_between_updates_as(what, "a checkpoint holds no partial sums of gradients")
    }

    /// An error when micro-batches are accumulated toward the next update, for `what`, which
    /// cannot come between them `why` (a message fragment).
    pub fn check_between_updates_as(&self, what: &str, why: &str) -> Result<()> {
        if self.micro == 0 {
            return Ok(());
        }
        let k = self.accumulate();
        Err(err!(
            InvalidArgument,
            "cannot {what} with {} of {k} micro-batches of the next update accumulated ({why}); {what} after a multiple of {k} train_step calls",
            self.micro
        ))
    }

    /// Whether a persistent value belongs in a checkpoint (not a gradient accumulator).
    fn checkpointed(&self, id: NodeId) -> bool {
        let acc = self.train.optim.accumulation.as_ref();
        !acc.is_some_and(|a| a.accumulators.contains(&id))
    }

    /// `cpu`, or a description of the GPU adapter the model runs on.
    pub fn device_name(&self) -> String {
        self.placed.backend.device_name()
    }

    /// The training graph (forward, loss, backward and optimizer update).
    pub fn graph(&self) -> &Graph {
        &self.train.graph
    }

    /// A readable account of how the training step runs on its backend (kernels and buffers
    /// on a GPU).
    pub fn plan_report(&self) -> String {
        self.placed.backend.plan_report()
    }

    /// What this model's buffers are charged to.
    pub fn budget(&self) -> &Budget {
        &self.cfg.budget
    }

    /// The learning rate the next step will use; an error when the schedule gives one that is
    /// not a finite f32 ([`Schedule::lr_at`]).
    pub fn current_lr(&self) -> Result<f32> {
        self.cfg.schedule.lr_at(self.cfg.lr, self.step)
    }

    /// Set the base learning rate from the next step on: the rate is an input of the compiled
    /// step, fed every step, so nothing is recompiled. An error unless `lr` is a finite number
    /// >= 0, or when the model was compiled with a schedule (which owns the rate).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(err!(
                InvalidArgument,
                "learning rate must be a finite number >= 0, got {lr}"
            ));
        }
        if self.cfg.schedule != Schedule::Constant {
            return Err(err!(
                InvalidArgument,
                "the learning rate follows the model's schedule; compile without `schedule` to set it from the script"
            ));
        }
        self.cfg.lr = lr;
        Ok(())
    }

    /// One training step: feeds the named inputs (and `target`), returns the loss. With
    /// gradient accumulation each step is a micro-batch: its gradients are added to the
    /// accumulators, and every `accumulate`-th step also applies the update (the step count,
    /// the learning rate and its schedule count updates).
    pub fn train_step(&mut self, inputs: &[(&str, &Tensor)]) -> Result<f32> {
        self.train_step_at(inputs).map_err(|e| self.model.placed(e))
    }

    fn train_step_at(&mut self, inputs: &[(&str, &Tensor)]) -> Result<f32> {
        // Past 2^53 neither the step count nor a checkpoint of it would be exact (`load`
        // refuses such a count, so `save` must never write one).
        if self.step >= 1 << 53 {
            return Err(err!(
                Limit,
                "model `{}` has taken 2^53 steps, the most a step count (and a checkpoint) holds exactly: start a new run",
                self.model.name
            ));
        }
        let g = &self.train.graph;
        let mut feeds = resolve_feeds(g, inputs)?;
        let mut host = self.train.optim.host_feeds(self.current_lr()?, self.step);
        host.extend(self.train.optim.micro_batch_feed(self.micro));
        feeds.extend(host.iter().map(|(id, t)| (*id, t)));
        let k = self.accumulate();
        // Dropout draws a fresh mask for every micro-batch (the step alone without accumulation).
        let mask_step = self.step.wrapping_mul(k as u64).wrapping_add(self.micro as u64);
        let opts = RunOptions { training: true, step: mask_step };
        let update = self.micro + 1 == k;
        let what = format!("a training step of model `{}`", self.model.name);
        let want = [self.train.loss];
        let out = self.placed.run(&self.cfg.budget, &what, &feeds, &want, opts, !update)?;
        let loss = out[0].as_f32().and_then(|v| v.first().copied()).unwrap_or(f32::NAN);
        self.micro_losses += f64::from(loss);
        if update {
            self.update_loss = (self.micro_losses / k as f64) as f32;
            (self.micro, self.micro_losses) = (0, 0.0);
            self.step += 1;
            self.generation += 1;
        } else {
            self.micro += 1;
        }
        Ok(loss)
    }

    /// Evaluate the model's outputs (dropout off, batch norm on its running statistics) on inputs whose leading dimension is any
    /// batch size; other named dimensions are those the model was compiled with.
    pub fn predict(&mut self, inputs: &[(&str, &Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.predict_at(inputs).map_err(|e| self.model.placed(e))
    }

    fn predict_at(&mut self, inputs: &[(&str, &Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let batch = inputs.first().and_then(|(_, t)| t.shape().first().copied()).unwrap_or(0);
        if batch == 0 {
            let shape =
                inputs.first().map_or("no input".to_string(), |(_, t)| fmt_shape(t.shape()));
            return Err(err!(InvalidArgument, "predict needs at least one example, got {shape}"));
        }
        let mut dims = self.cfg.dims.clone();
        dims.insert("B".to_string(), batch);
        let key: Vec<(String, usize)> = dims.clone().into_iter().collect();
        let what = format!("model `{}` evaluated on a batch of {batch}", self.model.name);
        let fresh = !self.evals.contains_key(&key);
        if fresh {
            let graph = self.model.instantiate(&dims)?;
            // A parameter whose shape follows `B` cannot take the trained values at another
            // batch (copying them said only "got 8 elements").
            for (id, n) in graph.nodes() {
                let (Op::Parameter { name, .. } | Op::State { name, .. }) = &n.op else { continue };
                let Some(from) = self.train.graph.persistent_named(name) else { continue };
                let (trained, here) = (self.train.graph.shape(from), graph.shape(id));
                if trained != here {
                    return Err(err!(
                        Shape,
                        "predict at a batch of {batch}: `{name}` is {} in the trained model and would be {} here: its shape follows the batch dimension `B`, so the model predicts only at the batch it was compiled with; predict at that batch, or give `{name}` a shape without `B`",
                        fmt_shape(trained),
                        fmt_shape(here)
                    ));
                }
            }
            let want: Vec<NodeId> = graph.outputs.iter().map(|&(_, id)| id).collect();
            // Copies at batch sizes used before are dropped when they are what stands in the way.
            let placed = match Placed::new(&self.cfg, graph.clone(), &want, false, &what, None) {
                Err(e) if e.kind == crate::ErrorKind::Limit && !self.evals.is_empty() => {
                    self.evals.clear();
                    Placed::new(&self.cfg, graph.clone(), &want, false, &what, None)?
                }
                p => p?,
            };
            self.evals.insert(key.clone(), EvalGraph { graph, placed, synced: None });
        }
        let out = self.run_eval(&key, inputs, &what);
        if out.is_err() && fresh {
            // A copy that failed its first run (a value beyond the device's binding limit) is
            // no use kept, and would hold its charge for as long as the model lives.
            self.evals.remove(&key);
        }
        out
    }

    /// Run the evaluation copy `key` (made by [`Trainer::predict`]) on `inputs`.
    fn run_eval(
        &mut self,
        key: &[(String, usize)],
        inputs: &[(&str, &Tensor)],
        what: &str,
    ) -> Result<Vec<(String, Tensor)>> {
        // Copy the parameters (and the model's state, batch norm's running statistics) over
        // when anything wrote them since the last copy.
        let e = self
            .evals
            .get_mut(key)
            .ok_or_else(|| err!(Invariant, "no evaluation copy for {what}"))?;
        if e.synced != Some(self.generation) {
            let pairs: Vec<(NodeId, NodeId)> = e
                .graph
                .nodes()
                .filter_map(|(to, n)| match &n.op {
                    Op::Parameter { name, .. } | Op::State { name, .. } => {
                        self.train.graph.persistent_named(name).map(|from| (from, to))
                    }
                    _ => None,
                })
                .collect();
            // One value at a time goes through the host: a copy read, a copy written.
            let largest = pairs.iter().map(|&(from, _)| bytes_of(&self.train.graph, from)).max();
            let _copies = self
                .cfg
                .budget
                .charge(2 * largest.unwrap_or(0), "copying parameters to an evaluation graph")?;
            for (from, to) in pairs {
                e.placed.backend.write(to, &self.placed.backend.read(from)?)?;
            }
            e.synced = Some(self.generation);
        }
        let feeds = resolve_feeds(&e.graph, inputs)?;
        let want: Vec<NodeId> = e.graph.outputs.iter().map(|&(_, id)| id).collect();
        let opts = RunOptions { training: false, step: self.step };
        let out = e.placed.run(&self.cfg.budget, what, &feeds, &want, opts, false)?;
        Ok(e.graph.outputs.iter().map(|(n, _)| n.clone()).zip(out).collect())
    }

    /// Parameters by name, in graph order.
    pub fn parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let g = &self.train.graph;
        g.parameters()
            .into_iter()
            .map(|(id, name)| Ok((name.to_string(), self.placed.backend.read(id)?)))
            .collect()
    }

    /// One parameter by name.
    pub fn parameter(&self, name: &str) -> Result<Tensor> {
        let g = &self.train.graph;
        match g.persistent_named(name) {
            Some(id) if matches!(g.node(id).op, Op::Parameter { .. }) => {
                self.placed.backend.read(id)
            }
            _ => Err(err!(Name, "no parameter named `{name}`")),
        }
    }

    /// Every persistent value (parameters, optimizer state, step count) by name: what a
    /// checkpoint holds. An error between the micro-batches of an update (gradient
    /// accumulation), whose partial sums a checkpoint does not hold.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.check_between_updates("save")?;
        let g = &self.train.graph;
        g.nodes()
            .filter(|&(id, _)| self.checkpointed(id))
            .filter_map(|(id, n)| match &n.op {
                Op::Parameter { name, .. } | Op::State { name, .. } => Some((id, name.clone())),
                _ => None,
            })
            .map(|(id, name)| Ok((name, self.placed.backend.read(id)?)))
            .collect()
    }

    /// Overwrite persistent values by name. Every name must exist with the same shape, and
    /// come once; values the list does not mention keep their current contents. The step
    /// counter follows the optimizer's step state when it is given, which must be a whole
    /// number of steps.
    pub fn load_state(&mut self, values: &[(&str, &Tensor)]) -> Result<()> {
        let g = &self.train.graph;
        let mut writes = Vec::new();
        let mut step = None;
        let mut given = HashSet::with_capacity(values.len());
        for &(name, t) in values {
            let id = g.persistent_named(name).ok_or_else(|| {
                err!(Checkpoint, "unexpected tensor `{name}`: the model has no such value")
            })?;
            if !given.insert(name) {
                return Err(err!(
                    Checkpoint,
                    "tensor `{name}` is given twice: give each value once"
                ));
            }
            if t.shape() != g.shape(id) || t.dtype() != DType::F32 {
                return Err(err!(
                    Checkpoint,
                    "tensor `{name}` is {}{}, the model expects f32{}",
                    t.dtype(),
                    fmt_shape(t.shape()),
                    fmt_shape(g.shape(id))
                ));
            }
            if name == STEP_STATE {
                let v = t.as_f32().and_then(|v| v.first().copied()).unwrap_or(f32::NAN);
                step = Some(steps(v).ok_or_else(|| {
                    err!(
                        Checkpoint,
                        "`{STEP_STATE}` must be a whole number of steps from 0 to 2^53, got {}",
                        show(v)
                    )
                })?);
            }
            writes.push((id, t));
        }
        // A backend copies each value as it writes it.
        let largest = writes.iter().map(|(_, t)| t.bytes()).max().unwrap_or(0);
        let _copy = self.cfg.budget.charge(largest, "copying values into the model")?;
        self.generation += 1; // before writing: a write that fails part-way leaves copies stale
        for (id, t) in writes {
            self.placed.backend.write(id, t)?;
        }
        self.step = step.unwrap_or(self.step);
        Ok(())
    }

    /// Load persistent values from a checkpoint's tensors. Strict: every parameter and the
    /// model's state (running statistics) must be there, the optimizer state entirely or not at all, and nothing else (like PyTorch's
    /// `strict=True`). Not strict: what matches is loaded and the rest is reported. A tensor
    /// whose shape differs is an error either way, and nothing is written when there is one.
    /// An error between the micro-batches of an update (gradient accumulation).
    pub fn load_checkpoint(
        &mut self,
        tensors: &[(&str, &Tensor)],
        strict: bool,
    ) -> Result<LoadReport> {
        self.check_between_updates("load")?;
        let g = &self.train.graph;
        let mut present: HashSet<&str> = HashSet::with_capacity(tensors.len());
        for &(name, _) in tensors {
            if !present.insert(name) {
                return Err(err!(
                    Checkpoint,
                    "tensor `{name}` is given twice: give each value once"
                ));
            }
        }
        let has = |name: &str| present.contains(name);
        let known = |name: &str| g.persistent_named(name).filter(|&id| self.checkpointed(id));
        // The model's own state (batch norm's running statistics) is needed like its
        // parameters; the optimizer's (made after `update_start`) entirely or not at all;
        // gradient accumulators not at all (never checkpointed).
        let (mut model_states, mut states) = (Vec::new(), Vec::new());
        for (id, n) in g.nodes() {
            if let Op::State { name, .. } = &n.op {
                if !self.checkpointed(id) {
                    continue;
                }
                let forward = id.index() < self.train.update_start;
                if forward { &mut model_states } else { &mut states }.push(name.as_str());
            }
        }
        let any_state = states.iter().any(|s| has(s));
        // Part of the optimizer state: none of it is loaded (below).
        let partial = any_state && !states.iter().all(|s| has(s));
        let params = g.parameters().into_iter().map(|(_, n)| n).chain(model_states);
        let missing: Vec<String> = params
            .chain(states.iter().copied().filter(|_| any_state))
            .filter(|n| !has(n))
            .map(str::to_string)
            .collect();
        let unexpected: Vec<String> = tensors
            .iter()
            .filter(|(n, _)| known(n).is_none())
            .map(|(n, _)| n.to_string())
            .collect();
        if strict && !(missing.is_empty() && unexpected.is_empty()) {
            let mut problems = Vec::new();
            if !missing.is_empty() {
                problems.push(format!("missing {}", crate::error::name_list(&missing)));
            }
            if !unexpected.is_empty() {
                problems.push(format!("unexpected {}", crate::error::name_list(&unexpected)));
            }
            return Err(err!(
                Checkpoint,
                "checkpoint does not match the model: {}; a non-strict load takes the tensors that match",
                problems.join("; ")
            ));
        }
        // Part of the optimizer state (a non-strict load): none of it is loaded, so no moment
        // or step count from the file is mixed with the model's own (Adam's first moments and
        // step from a file, its second moments fresh, trained on silently); all of it is
        // reported as not set.
        let skipped: HashSet<&str> = states.iter().copied().filter(|_| partial).collect();
        let missing = if partial {
            let params = missing.iter().filter(|n| !skipped.contains(n.as_str())).cloned();
            params.chain(states.iter().map(|s| s.to_string())).collect()
        } else {
            missing
        };
        let known: Vec<(&str, &Tensor)> = tensors
            .iter()
            .copied()
            .filter(|(n, _)| known(n).is_some() && !skipped.contains(n))
            .collect();
        // A file's values must be ones a run could have made (a host or script setting a value
        // itself may set any).
        for &(name, t) in known.iter().filter(|(n, _)| *n != STEP_STATE) {
            crate::checkpoint::check_state_values(name, t)?; // the step is checked as a count
        }
        self.load_state(&known)?;
        self.broadcast_state()?;
        Ok(LoadReport { missing, unexpected })
    }

    /// Data-parallel training: make every parameter and state value rank 0's, in one broadcast
    /// of all of them packed together (nothing to do for one process).
    fn broadcast_state(&mut self) -> Result<()> {
        if self.cfg.comm.world_size() == 1 {
            return Ok(());
        }
        let g = &self.train.graph;
        let ids: Vec<NodeId> =
            g.nodes().filter(|(_, n)| n.op.is_persistent()).map(|(id, _)| id).collect();
        let bytes: u64 = ids.iter().map(|&id| bytes_of(g, id)).sum();
        let _copies = self.cfg.budget.charge(2 * bytes, "broadcasting the model from rank 0")?;
        let mut packed = Vec::new();
        for &id in &ids {
            let t = self.placed.backend.read(id)?;
            let v = t
                .as_f32()
                .ok_or_else(|| err!(Invariant, "persistent value {} is not f32", id.0))?;
            packed.extend_from_slice(v);
        }
        self.cfg.comm.broadcast(&mut packed)?;
        self.generation += 1;
        let mut rest = &packed[..];
        for id in ids {
            let shape = g.shape(id);
            let (head, tail) = rest.split_at(shape.iter().product::<usize>().min(rest.len()));
            self.placed.backend.write(id, &Tensor::f32(shape, head.to_vec())?)?;
            rest = tail;
        }
        Ok(())
    }
}

/// Bytes of a node's value.
fn bytes_of(g: &Graph, id: NodeId) -> u64 {
    g.shape(id).iter().product::<usize>() as u64 * 4
}

/// A step count stored as f32: a whole number in `0..=2^53` (so that counting on never wraps).
/// The step count of a checkpoint whose f32 `optim.step` tensor holds `tensor` and whose
/// metadata (written by `save`) says `metadata`. The tensor counts exactly only to 2^24, as
/// PyTorch's does (adding 1 to 2^24 in f32 gives 2^24 again), so past that it holds exactly 2^24
/// and the metadata is the count; below, the two must be equal. At most 2^53, as the tensor.
/// `None` when the tensor is not a count at all (loading reports that).
pub fn exact_step(tensor: f32, metadata: &str) -> Result<Option<u64>> {
    const EXACT: u64 = 1 << 24;
    let Some(t) = steps(tensor) else { return Ok(None) };
    // Digits only: `parse` takes a leading `+`, which `save` never writes.
    let digits = !metadata.is_empty() && metadata.bytes().all(|b| b.is_ascii_digit());
    let exact =
        metadata.parse::<u64>().ok().filter(|&n| digits && n <= 1 << 53).ok_or_else(|| {
            err!(
                Checkpoint,
                "the metadata's step `{metadata}` is not a whole number of steps from 0 to 2^53"
            )
        })?;
    check_step_tensor(tensor)?;
    if exact == t || (t == EXACT && exact > EXACT) {
        return Ok(Some(exact));
    }
    Err(err!(
        Checkpoint,
        "the metadata's step {exact} does not match `{STEP_STATE}`, which holds {t}"
    ))
}

/// The base learning rate a checkpoint's metadata (`lr`, written by `save`) holds: a finite
/// number >= 0, as `net.lr` takes.
pub fn saved_lr(text: &str) -> Result<f32> {
    match text.parse::<f32>() {
        Ok(lr) if lr.is_finite() && lr >= 0.0 => Ok(lr),
        _ => Err(err!(
            Checkpoint,
            "the metadata's learning rate `{text}` is not a finite number >= 0"
        )),
    }
}

/// An error for an `optim.step` tensor above 2^24, where no f32 step counter gets (a count
/// beyond it is the metadata's `step`, the tensor staying at 2^24): loaded, the tensor would
/// stay at that value while the count went on, and the next save would not load.
pub fn check_step_tensor(tensor: f32) -> Result<()> {
    if steps(tensor).is_some_and(|t| t > 1 << 24) {
        return Err(err!(
            Checkpoint,
            "`{STEP_STATE}` holds {tensor}, more than 2^24, where an f32 step counter stops: a \
             count beyond it is the metadata's `step`, with `{STEP_STATE}` at 2^24 (16777216)"
        ));
    }
    Ok(())
}

fn steps(v: f32) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= (1u64 << 53) as f32).then_some(v as u64)
}

/// Map `(name, tensor)` feeds onto a graph's inputs, checking shapes and dtypes; every input
/// except those the optimizer driver feeds (learning rate, bias corrections) must be fed, and
/// each at most once: a name given twice, or one the driver feeds, is an error (a backend given
/// two values for one input would take one of them without a word).
fn resolve_feeds<'a>(
    g: &Graph,
    inputs: &[(&str, &'a Tensor)],
) -> Result<Vec<(NodeId, &'a Tensor)>> {
    let mut feeds = Vec::with_capacity(inputs.len());
    let mut fed = HashSet::with_capacity(inputs.len());
    for &(name, t) in inputs {
        if is_host_input(name) && g.input_named(name).is_some() {
            return Err(err!(
                InvalidArgument,
                "input `{name}` is the optimizer's own, fed by rumus at every step: leave it out \
                 of the feeds"
            ));
        }
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
        if !fed.insert(name) {
            return Err(err!(
                InvalidArgument,
                "input `{name}` is given twice: give each input one tensor"
            ));
        }
        let (shape, dtype) = (g.shape(id), g.dtype(id));
        if t.shape() != shape || t.dtype() != dtype {
            return Err(Error::shape(format!(
                "input `{name}` must be {dtype}{}, got {}{}",
                fmt_shape(shape),
                t.dtype(),
                fmt_shape(t.shape())
            )));
        }
        feeds.push((id, t));
    }
    for (_, n) in g.nodes() {
        if let Op::Input { name } = &n.op {
            if !is_host_input(name) && !fed.contains(name.as_str()) {
                return Err(err!(InvalidArgument, "input `{name}` was not fed"));
            }
        }
    }
    Ok(feeds)
}
