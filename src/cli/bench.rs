//! `rumus plan` and `rumus bench`: a model file's training step, planned and reported, or run
//! and timed.
//!
//! The training step is the model's first output under cross-entropy against i32 targets (one
//! per row of the output, labels in range) with AdamW (lr 1e-3, PyTorch's defaults), as in
//! `scripts/bench/torch_baselines.py`, the PyTorch side. Hyperparameters come from the model's defaults, overridden by
//! `--set name=value`.

use super::model::{lower_model, Pick};
use crate::backend::{Backend, GradSync, RunOptions};
use crate::codegen::PlanPrograms;
use crate::codegen::{MatmulOptions, MatmulPrecision, Target};
use crate::cpu::CpuBackend;
use crate::dist::Communicator;
use crate::err;
use crate::error::Result;
use crate::graph::optim::is_host_input;
use crate::graph::{
    training_graph_with, Graph, NodeId, Op, OptimConfig, Optimizer, TrainGraph, TrainOptions,
};
use crate::plan::picture::{self, Phases};
use crate::plan::report::PlanReport;
use crate::plan::{plan, Plan, PlanOptions};
use crate::rng::Rng;
use crate::runtime::backend::GpuBackend;
use crate::runtime::{shared_gpu, DeviceChoice};
use crate::tensor::{DType, Tensor};
use crate::Source;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// Most steps (timed or warm-up) one benchmark runs.
pub const MAX_STEPS: u64 = 1_000_000;
/// Largest `n` of `rumus bench --cpu-matmul` (three `n × n` f32 matrices; memory is checked
/// too).
pub const MAX_CPU_MATMUL_SIZE: u64 = 1 << 16;

/// Which model of which file, with which hyperparameters.
#[derive(Clone, Debug, Default)]
pub struct ModelSpec {
    /// The model file (standalone or `.rms`).
    pub file: String,
    /// The model to take (`None`: the file's first model).
    pub model: Option<String>,
    /// `name=value` overrides of hyperparameters and dimensions.
    pub sets: Vec<(String, String)>,
    /// Plan the step without rematerialization (`--no-remat`).
    pub no_remat: bool,
    /// Recompute widening matmuls too (`--remat-matmuls`, [`TrainOptions::remat_matmuls`]).
    pub remat_matmuls: bool,
}

/// Lower the model of `spec` and extend it into a training step; the model file's source, for
/// the positions of later errors (the planner's and the code generator's point at an op).
pub fn training_step(spec: &ModelSpec) -> Result<(TrainGraph, Arc<Source>)> {
    let m = lower_model(&spec.file, spec.model.as_deref(), Pick::First, &spec.sets, None)?;
    let (mut g, src) = (m.graph, m.src);
    let loss = cross_entropy_on_first_output(&mut g).map_err(|e| e.in_source(&src))?;
    let cfg = OptimConfig::new(Optimizer::adamw());
    let opts = TrainOptions { remat: !spec.no_remat, remat_matmuls: spec.remat_matmuls };
    Ok((training_graph_with(g, loss, &cfg, opts).map_err(|e| e.in_source(&src))?, src))
}

/// The training step of `spec` planned and compiled for `target`, errors at their op in the
/// model file.
fn compiled(
    spec: &ModelSpec,
    fusion: bool,
    on: &PlanTarget,
) -> Result<(TrainGraph, Plan, PlanPrograms)> {
    let (t, src) = training_step(spec)?;
    let at = |e: crate::Error| e.in_source(&src);
    let target = &on.target;
    let opts = PlanOptions {
        fusion,
        limits: on.limits,
        matmul_prologues: target.converts_operands(),
        ..PlanOptions::default()
    };
    let p = plan(&t.graph, &[t.loss], true, opts).map_err(at)?;
    let programs = crate::codegen::compile(&t.graph, &p, target).map_err(at)?;
    Ok((t, p, programs))
}

fn cross_entropy_on_first_output(g: &mut Graph) -> Result<NodeId> {
    let &(_, out) = g.outputs.first().ok_or_else(|| err!(Usage, "the model has no output"))?;
    let shape = g.shape(out).to_vec();
    let labels = &shape[..shape.len().saturating_sub(1)];
    let target = g.input(crate::session::TARGET_INPUT, labels, DType::I32)?;
    g.cross_entropy(out, target, None)
}

/// The device `rumus plan` plans for, and one line saying which.
pub struct PlanTarget {
    /// What codegen plans for.
    pub target: Target,
    /// The adapter's limits the plan must fit (none for a modelled device).
    pub limits: Option<crate::plan::Limits>,
    /// `"this machine's adapter NAME"` or the modelled device.
    pub what: String,
}

/// The device `rumus plan` plans for. With `device` (`--device gpu`, or `auto` where there is
/// a hardware adapter) this machine's adapter: its limits and, where `precision` is not given,
/// its default mode, as `bench` and `run` compile. Otherwise a modelled device that needs no
/// GPU: WebGPU's default limits, or with `high` or `medium` an adapter with cooperative
/// matrices (the H200's limits), which a machine without one cannot show otherwise. The
/// cooperative tile from `RUMUS_MATMUL_COOP_TILE` when set, dispatches merged unless
/// `RUMUS_MERGE_DISPATCHES=0`.
pub fn plan_target(
    precision: Option<MatmulPrecision>,
    device: Option<DeviceChoice>,
) -> Result<PlanTarget> {
    let options = MatmulOptions::from_env()?;
    let merge_dispatches = crate::codegen::merge::from_env()?;
    let gpu = match device {
        Some(DeviceChoice::Cpu) => {
            return Err(err!(
                Usage,
                "--device cpu: the CPU runs no plan (it evaluates the graph op by op); use \
                 --device gpu for this machine's adapter, or leave --device out for a modelled one"
            ))
        }
        Some(DeviceChoice::Gpu) => shared_gpu(DeviceChoice::Gpu)?,
        // Not `shared_gpu(Auto)`, whose notice says the CPU backend runs.
        Some(DeviceChoice::Auto) => {
            crate::runtime::device::test_gpu().ok().filter(|g| !g.is_software())
        }
        None => None,
    };
    if let Some(gpu) = gpu {
        let mode = gpu.matmul_precision(precision);
        let target = gpu.target(MatmulOptions { precision: mode, ..options });
        let target = Target { merge_dispatches, ..target };
        let what = format!("this machine's adapter {}", gpu.describe());
        let limits = Some(crate::plan::Limits::of(&gpu.limits));
        return Ok(PlanTarget { target, limits, what });
    }
    let hint = if device.is_some() {
        "no hardware adapter found"
    } else {
        "--device gpu plans for this machine's"
    };
    Ok(match precision {
        Some(p) if p.is_cooperative() => PlanTarget {
            target: Target {
                matmul: MatmulOptions { precision: p, ..options },
                merge_dispatches,
                ..Target::COOPERATIVE
            },
            limits: None,
            what: format!(
                "a modelled adapter with cooperative matrices and the H200's limits ({hint})"
            ),
        },
        _ => PlanTarget {
            target: Target { matmul: options, merge_dispatches, ..Target::WEBGPU_DEFAULT },
            limits: None,
            what: format!("a modelled adapter with WebGPU's default limits ({hint})"),
        },
    })
}

/// `rumus plan`: the plan of the training step, as text (kernels listed, matmul kernels with
/// the kernel their product runs on) or JSON, for [`plan_target`].
pub fn plan_command(
    spec: &ModelSpec,
    fusion: bool,
    as_json: bool,
    on: &PlanTarget,
) -> Result<String> {
    let target = &on.target;
    let (t, p, programs) = compiled(spec, fusion, on)?;
    let dispatches = programs.all().count();
    let mut r = PlanReport::new(&t.graph, &p, dispatches, programs.scratch_bytes());
    let mut matmuls = Vec::new();
    for (i, k) in programs.kernels.iter().enumerate() {
        let Some(line) = r.kernel_lines.get_mut(i) else { continue };
        if let Some(tile) = k.matmul {
            line.push_str(&format!("  [{tile}]"));
            matmuls.push(json!({"kernel": i, "tile": tile}));
        }
        if k.programs.len() > 1 {
            let labels: Vec<&str> = k.programs.iter().map(|p| p.label.as_str()).collect();
            line.push_str(&format!("  ({} dispatches: {})", labels.len(), labels.join(", ")));
        }
    }
    let mode = target.matmul.precision;
    if as_json {
        let mut v = r.json();
        v["matmul_precision"] = json!(mode.to_string());
        v["planned_for"] = json!(on.what);
        v["matmul_kernels"] = json!(matmuls);
        let per_kernel: Vec<usize> = programs.kernels.iter().map(|k| k.programs.len()).collect();
        v["kernel_dispatches"] = json!(per_kernel);
        return Ok(format!("{v}\n"));
    }
    Ok(format!("matmul precision {mode}, planned for {}\n{}", on.what, r.text()))
}

/// `rumus plan --svg OUT`: the memory picture of the training step's plan
/// ([`crate::plan::picture`]) for [`plan_target`], written to `out`.
pub fn plan_svg(
    spec: &ModelSpec,
    fusion: bool,
    on: &PlanTarget,
    out: &std::path::Path,
) -> Result<()> {
    crate::files::check_output(
        "--svg",
        out,
        "the model file",
        std::path::Path::new(&spec.file),
        crate::files::Output::File,
    )?;
    let (t, p, programs) = compiled(spec, fusion, on)?;
    let scratch = programs.scratch_bytes();
    let phases = Phases { backward_start: t.backward_start, update_start: t.update_start };
    let layout = picture::layout(&t.graph, &p, phases, scratch);
    let title = format!(
        "{}: the training step's memory, {} kernels, {}",
        spec.file,
        layout.kernels,
        crate::memory::human(layout.total_bytes)
    );
    crate::files::write_atomic(out, layout.svg(&title)?.as_bytes())
}

/// `rumus plan --wgsl`: the WGSL of every kernel of the training step's plan, or of kernel
/// `kernel` (numbered as `rumus plan` lists them), for [`plan_target`].
pub fn plan_wgsl(
    spec: &ModelSpec,
    fusion: bool,
    kernel: Option<usize>,
    on: &PlanTarget,
) -> Result<String> {
    compiled(spec, fusion, on)?.2.listing(kernel)
}

/// Random inputs for every input of a training step: f32 normal, i32 in range of the logits'
/// classes, the learning rate 1e-3.
pub fn random_feeds(t: &TrainGraph, seed: u64) -> Result<Vec<(NodeId, Tensor)>> {
    let g = &t.graph;
    // Each i32 input in the range every op that reads it takes: an embedding's rows, a
    // cross-entropy's classes (the vocabulary may be smaller than the classes, or larger).
    let mut bound: std::collections::HashMap<NodeId, u64> = std::collections::HashMap::new();
    for (_, n) in g.nodes() {
        let (range, index) = match (&n.op, n.inputs.as_slice()) {
            (Op::Embedding, &[table, idx]) => (g.shape(table).first().copied(), idx),
            (Op::CrossEntropy { .. }, &[logits, labels]) => {
                (g.shape(logits).last().copied(), labels)
            }
            _ => continue,
        };
        let range = range.unwrap_or(1) as u64;
        bound.entry(index).and_modify(|b| *b = (*b).min(range)).or_insert(range);
    }
    let mut rng = Rng::new(seed);
    let mut feeds = t.optim.host_feeds(1e-3, 0);
    for (id, n) in g.nodes() {
        let Op::Input { name } = &n.op else { continue };
        let len: usize = n.shape.iter().product();
        let t = if is_host_input(name) {
            continue;
        } else if n.dtype == DType::I32 {
            let below = bound.get(&id).copied().unwrap_or(1).max(1);
            Tensor::i32(&n.shape, (0..len).map(|_| rng.below(below) as i32).collect())?
        } else {
            Tensor::f32(&n.shape, (0..len).map(|_| rng.normal() as f32).collect())?
        };
        feeds.push((id, t));
    }
    Ok(feeds)
}

/// What `rumus bench` measures.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// The model file.
    pub model: String,
    /// The device that ran the steps (`cpu` or the GPU adapter).
    pub adapter: String,
    /// Number of parameter elements.
    pub params: usize,
    /// Steps timed.
    pub steps: usize,
    /// Steps run before timing.
    pub warmup: usize,
    /// Median wall time of a timed step, in milliseconds.
    pub step_ms_median: f64,
    /// Fastest timed step, in milliseconds.
    pub step_ms_min: f64,
    /// The first step after compiling (warm-up or timed), in milliseconds: it includes any
    /// work the driver leaves to first use.
    pub first_step_ms: f64,
    /// Time to read the model, build its training step, open the device and place the
    /// initial parameters there, in milliseconds.
    pub setup_ms: f64,
    /// Time to plan the step and create its pipelines (from the pipeline cache when warm), in
    /// milliseconds.
    pub compile_ms: f64,
    /// The matmul precision the steps ran with (`highest` on the CPU backend).
    pub matmul_precision: MatmulPrecision,
    /// Graph ops the plan computes.
    pub ops: usize,
    /// Kernels of the plan.
    pub kernels: usize,
    /// Compute dispatches per step (0 on the CPU backend, which reports the GPU plan).
    pub dispatches_per_step: usize,
    /// Buffers of the plan.
    pub buffers: usize,
    /// Bytes of the plan's shared buffers.
    pub planned_bytes: u64,
    /// Planned, pinned and scratch bytes together: what the step holds on the device.
    pub device_bytes: u64,
    /// Forward values the backward pass recomputes (0 with `--no-remat`).
    pub recomputed: usize,
    /// Loss of the first step (warm-up included).
    pub first_loss: f32,
    /// Loss of the last step.
    pub last_loss: f32,
    /// Loss of every step, warm-up included, in order.
    pub losses: Vec<f32>,
    /// With profiling: milliseconds per kernel kind (summed over its dispatches), largest first.
    pub profile: Vec<(String, f64, usize)>,
    /// With profiling: every dispatch of the step in plan order, (label, milliseconds).
    pub profile_dispatches: Vec<(String, f64)>,
    /// Ranks of the data-parallel job (1 for a process on its own).
    pub ranks: usize,
    /// Each rank's median step, in milliseconds.
    pub step_ms_per_rank: Vec<f64>,
    /// Median time of a step's collectives on this rank, in milliseconds (0 with one rank).
    pub all_reduce_ms: f64,
    /// Median time a step waited for the gradients' staging copies on this rank, in
    /// milliseconds: the part of the transfers the backward pass did not cover.
    pub exchange_wait_ms: f64,
    /// Median time a step spent copying gradients out of mapped staging memory (rank 0), ms.
    pub exchange_read_ms: f64,
    /// Median time a step spent handing the averages to the queue (rank 0), ms.
    pub exchange_write_ms: f64,
    /// Median time a step waited after the last bucket's sync for every mean to be in place
    /// (`host-shared` only; rank 0), ms.
    pub exchange_tail_ms: f64,
    /// How the gradients were averaged (`host-shared`, `staged`; `none` with one rank).
    pub exchange: &'static str,
    /// Training samples (rows of the first input) per second for the whole job, at the
    /// slowest rank's median step.
    pub samples_per_s: f64,
}

impl BenchResult {
    /// The figures as a JSON object (`rumus bench --json`).
    pub fn json(&self) -> serde_json::Value {
        json!({
            "model": self.model,
            "adapter": self.adapter,
            "params": self.params,
            "steps": self.steps,
            "warmup": self.warmup,
            "step_ms_median": self.step_ms_median,
            "step_ms_min": self.step_ms_min,
            "setup_ms": self.setup_ms,
            "first_step_ms": self.first_step_ms,
            "compile_ms": self.compile_ms,
            "matmul_precision": self.matmul_precision.to_string(),
            "ops": self.ops,
            "kernels": self.kernels,
            "dispatches_per_step": self.dispatches_per_step,
            "buffers": self.buffers,
            "planned_bytes": self.planned_bytes,
            "device_bytes": self.device_bytes,
            "recomputed": self.recomputed,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "losses": self.losses,
            "ranks": self.ranks,
            "step_ms_per_rank": self.step_ms_per_rank,
            "all_reduce_ms": self.all_reduce_ms,
            "exchange_wait_ms": self.exchange_wait_ms,
            "exchange_read_ms": self.exchange_read_ms,
            "exchange_write_ms": self.exchange_write_ms,
            "exchange_tail_ms": self.exchange_tail_ms,
            "exchange": self.exchange,
            "samples_per_s": self.samples_per_s,
            "profile_ms": self.profile.iter().map(|(k, ms, n)| json!({"kind": k, "ms": ms, "dispatches": n})).collect::<Vec<_>>(),
            "profile_dispatches": self.profile_dispatches.iter().map(|(l, ms)| json!({"label": l, "ms": ms})).collect::<Vec<_>>(),
        })
    }

    /// The figures as lines of text.
    pub fn text(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "model {} ({} params) on {}\nstep {:.3} ms median over {} steps (min {:.3}, after {} warm-up; first {:.3})\nsetup {:.1} ms  compile {:.1} ms  matmul precision {}  ops {}  kernels {}  dispatches/step {}\nbuffers {}  planned {:.1} MiB  device total {:.1} MiB  recomputed {}\nloss {:.4} -> {:.4}\n",
            self.model,
            self.params,
            self.adapter,
            self.step_ms_median,
            self.steps,
            self.step_ms_min,
            self.warmup,
            self.first_step_ms,
            self.setup_ms,
            self.compile_ms,
            self.matmul_precision,
            self.ops,
            self.kernels,
            self.dispatches_per_step,
            self.buffers,
            mib(self.planned_bytes),
            mib(self.device_bytes),
            self.recomputed,
            self.first_loss,
            self.last_loss
        ) + self.job_text().as_str() + self.profile.iter().map(|(k, ms, n)| format!("  {k:<22} {ms:>9.3} ms in {n} dispatches\n")).collect::<String>().as_str()
    }
}

impl BenchResult {
    /// The data-parallel figures as text (a line per job of several ranks, else nothing).
    fn job_text(&self) -> String {
        if self.ranks == 1 {
            return format!("{:.1} samples/s\n", self.samples_per_s);
        }
        let per_rank: Vec<String> =
            self.step_ms_per_rank.iter().map(|ms| format!("{ms:.3}")).collect();
        format!(
            "{} ranks ({} exchange): {:.1} samples/s; step ms per rank [{}]; rank 0: collectives {:.3} ms, waiting for segments {:.3} ms, reading staging {:.3} ms, writing back {:.3} ms, waiting for the means {:.3} ms\n",
            self.ranks,
            self.exchange,
            self.samples_per_s,
            per_rank.join(", "),
            self.all_reduce_ms,
            self.exchange_wait_ms,
            self.exchange_read_ms,
            self.exchange_write_ms,
            self.exchange_tail_ms
        )
    }
}

/// Compile the training step of `spec` on `device` with matmul `precision` (`None`: the
/// device's default; the CPU backend computes in fp32), run `warmup` steps, then time `steps`
/// steps (each ends when its loss is back on the host, as PyTorch's loop synchronizes). In a
/// data-parallel job (`comm` of several ranks) every rank runs the same steps on its own device
/// with the gradients averaged across ranks, as training does.
pub fn bench_model(
    spec: &ModelSpec,
    (device, precision): (DeviceChoice, Option<MatmulPrecision>),
    steps: usize,
    warmup: usize,
    profile: bool,
    comm: &Arc<dyn Communicator>,
) -> Result<BenchResult> {
    let max = MAX_STEPS as usize;
    if !(1..=max).contains(&steps) || warmup > max {
        return Err(err!(Usage, "--steps must be from 1 to {max} and --warmup from 0 to {max}"));
    }
    let start = Instant::now();
    let (t, src) = training_step(spec)?;
    let numel = |id: NodeId| t.graph.shape(id).iter().map(|&d| d as u128).product::<u128>();
    let params = t.graph.parameters().iter().map(|&(id, _)| numel(id)).sum::<u128>();
    // What the backend and the feeds will hold, against the default memory budget, so that a
    // model too large for the machine is an error before anything is allocated.
    let f = crate::session::footprint(&t.graph, &[t.loss], true);
    let budget = crate::memory::Budget::new(crate::memory::default_limit());
    let what = format!("benchmarking `{}`", spec.file);
    let _held =
        budget.charge(f.persistent.saturating_add(f.peak).saturating_add(f.readback), what)?;
    let gpu = shared_gpu(device)?;
    if profile && gpu.is_none() {
        return Err(err!(
            Usage,
            "--profile times each GPU dispatch alone, and this benchmark runs on the CPU (--device cpu, or no GPU adapter): drop --profile, or run it on a GPU"
        ));
    }
    let params = usize::try_from(params).map_err(|_| err!(Limit, "too many parameters"))?;
    let mut gpu_backend = None;
    let mut cpu_backend = None;
    let mut report = None;
    let mut mode = MatmulPrecision::Highest;
    let sync = (comm.world_size() > 1).then(|| GradSync::of(&t, comm));
    let setup_ms;
    match gpu {
        Some(gpu) => {
            let mut b = GpuBackend::new(gpu, t.graph.clone(), 0, PlanOptions::default())?;
            b.matmul.precision = gpu.matmul_precision(precision);
            mode = b.matmul.precision;
            b.sync = sync;
            setup_ms = start.elapsed().as_secs_f64() * 1e3;
            let p = b.plan_for(&[t.loss], true).map_err(|e| e.in_source(&src))?;
            report = Some(PlanReport::new(&t.graph, &p.plan, p.n_dispatches(), p.scratch_bytes));
            gpu_backend = Some(b);
        }
        None => {
            let b = CpuBackend::new(t.graph.clone(), 0)?;
            cpu_backend = Some(match sync {
                Some(sync) => b.with_grad_sync(sync),
                None => b,
            });
            setup_ms = start.elapsed().as_secs_f64() * 1e3;
        }
    }
    if gpu_backend.is_none() && cpu_backend.is_none() {
        return Err(err!(Invariant, "no backend"));
    }
    let compile_ms = start.elapsed().as_secs_f64() * 1e3 - setup_ms;
    let feeds = random_feeds(&t, 1)?;
    let refs: Vec<(NodeId, &Tensor)> = feeds.iter().map(|(id, t)| (*id, t)).collect();
    let mut times = Vec::with_capacity(steps);
    let mut losses = Vec::new();
    let mut first_step_ms = f64::NAN;
    let (mut all_reduce, mut waits, mut reads, mut writes, mut tails) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut exchange = "none";
    for step in 0..warmup + steps {
        let t0 = Instant::now();
        let opts = RunOptions { training: true, step: step as u64 };
        let out = match (&mut gpu_backend, &mut cpu_backend) {
            (Some(b), _) => b.run(&refs, &[t.loss], opts)?,
            (None, Some(b)) => b.run(&refs, &[t.loss], opts)?,
            (None, None) => Vec::new(),
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if step == 0 {
            first_step_ms = ms;
        }
        if step >= warmup {
            times.push(ms);
            let plan = gpu_backend.as_mut().map(|b| b.plan_for(&[t.loss], true)).transpose()?;
            if let Some(ex) = plan.and_then(|p| p.exchange.as_ref()) {
                let last = ex.last.get();
                all_reduce.push(last.all_reduce * 1e3);
                waits.push(last.wait * 1e3);
                reads.push(last.read * 1e3);
                writes.push(last.write * 1e3);
                tails.push(last.tail * 1e3);
                exchange = ex.kind();
            }
        }
        let loss = out.first().and_then(|t| t.as_f32()).and_then(|v| v.first().copied());
        losses.push(loss.unwrap_or(f32::NAN));
    }
    times.sort_by(f64::total_cmp);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let step_ms_median = times[times.len() / 2];
    // Each rank's median, gathered as a mean over ranks of vectors with one rank's slot set.
    let ranks = comm.world_size();
    let mut per_rank = vec![0f32; ranks];
    per_rank[comm.rank()] = (step_ms_median * ranks as f64) as f32;
    comm.all_reduce_mean(&mut per_rank)?;
    let step_ms_per_rank: Vec<f64> = per_rank.iter().map(|&ms| f64::from(ms)).collect();
    let slowest = step_ms_per_rank.iter().copied().fold(step_ms_median, f64::max);
    let first_input = t.graph.nodes().find_map(|(id, n)| match &n.op {
        Op::Input { name } if !is_host_input(name) => Some(id),
        _ => None,
    });
    let rows = first_input.and_then(|id| t.graph.shape(id).first().copied()).unwrap_or(1);
    let samples_per_s = (rows * ranks) as f64 / (slowest / 1e3);
    let adapter = match (&gpu_backend, &cpu_backend) {
        (Some(b), _) => b.device_name(),
        _ => "cpu".to_string(),
    };
    let mut by_kind: Vec<(String, f64, usize)> = Vec::new();
    let mut profile_dispatches = Vec::new();
    if let (true, Some(gpu), Some(b)) = (profile, gpu, gpu_backend.as_mut()) {
        profile_dispatches = b.plan_for(&[t.loss], true)?.profile(gpu, 5)?;
        for (label, ms) in &profile_dispatches {
            let kind = label.split(' ').next().unwrap_or("").to_string();
            match by_kind.iter_mut().find(|(k, _, _)| *k == kind) {
                Some(slot) => {
                    slot.1 += ms;
                    slot.2 += 1;
                }
                None => by_kind.push((kind, *ms, 1)),
            }
        }
        by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    // The CPU backend has no plan of its own; report the plan the GPU would run.
    let r = match report {
        Some(r) => r,
        None => {
            let p = plan(&t.graph, &[t.loss], true, PlanOptions::default())
                .map_err(|e| e.in_source(&src))?;
            PlanReport::new(&t.graph, &p, 0, 0)
        }
    };
    Ok(BenchResult {
        model: spec.file.clone(),
        adapter,
        params,
        steps,
        warmup,
        step_ms_median,
        step_ms_min: times[0],
        setup_ms,
        first_step_ms,
        compile_ms,
        matmul_precision: mode,
        ops: r.ops,
        kernels: r.kernels,
        dispatches_per_step: r.dispatches,
        buffers: r.buffers,
        planned_bytes: r.planned_bytes,
        device_bytes: r
            .planned_bytes
            .saturating_add(r.pinned_bytes)
            .saturating_add(r.scratch_bytes),
        recomputed: r.recomputed,
        first_loss: losses[0],
        last_loss: *losses.last().unwrap_or(&f32::NAN),
        losses,
        profile: by_kind,
        profile_dispatches,
        ranks,
        step_ms_per_rank,
        all_reduce_ms: median(&mut all_reduce),
        exchange_wait_ms: median(&mut waits),
        exchange_read_ms: median(&mut reads),
        exchange_write_ms: median(&mut writes),
        exchange_tail_ms: median(&mut tails),
        exchange,
        samples_per_s,
    })
}

/// Kernel throughput on the GPU: the matmul of precision mode `precision` (`None`: the
/// device's default) at `n` (TFLOP/s, with its error against an f64 reference on sampled
/// elements), every fp32 matmul tile at `n`, and LayerNorm forward+backward at `rows × d`
/// and at `rows` × 256 and 768 (GB/s).
pub fn bench_kernels(
    (device, precision): (DeviceChoice, Option<MatmulPrecision>),
    n: u32,
    rows: usize,
    d: usize,
) -> Result<String> {
    let gpu = shared_gpu(device)?
        .ok_or_else(|| err!(Device, "kernel benchmarks need a GPU (--device gpu)"))?;
    use crate::codegen::matmul::MatmulTile;
    use crate::codegen::matmul_simt::SIMT_TILES;
    use crate::runtime::kernel_bench::{bench_matmul, bench_matmul_mode};
    let options =
        MatmulOptions { precision: gpu.matmul_precision(precision), ..MatmulOptions::from_env()? };
    let mode = bench_matmul_mode(gpu, n, 20, options)?;
    let mut tiles = serde_json::Map::new();
    let simt = SIMT_TILES.iter().map(|&(name, t)| (name, MatmulTile::Simt(t)));
    let templates = [
        ("register8", MatmulTile::Register8),
        ("register", MatmulTile::Register),
        ("large", MatmulTile::Large),
        ("small", MatmulTile::Small),
    ];
    for (name, tile) in simt.chain(templates) {
        tiles.insert(name.to_string(), json!(bench_matmul(gpu, n, 20, tile)?));
    }
    let gbps = crate::runtime::kernel_bench::bench_layer_norm(gpu, rows, d, 20)?;
    // The widths of the GPT benchmark models too.
    let mut by_d = serde_json::Map::new();
    for width in [256, 768] {
        let g = crate::runtime::kernel_bench::bench_layer_norm(gpu, rows, width, 20)?;
        by_d.insert(width.to_string(), json!(g));
    }
    Ok(format!(
        "{}\n",
        json!({
            "adapter": gpu.describe(),
            "matmul_n": n,
            "matmul_precision": options.precision.to_string(),
            "matmul_kernel": mode.tile,
            "matmul_tflops": mode.tflops,
            "matmul_product_tflops": mode.product_tflops,
            "matmul_error_median": mode.error_median,
            "matmul_error_max": mode.error_max,
            "matmul_tflops_by_tile": tiles,
            "layer_norm_rows": rows,
            "layer_norm_d": d,
            "layer_norm_gbps": gbps,
            "layer_norm_gbps_by_d": by_d,
        })
    ))
}

/// CPU matmul throughput at `n × n × n` in f32 (GFLOP/s), median of `reps` runs. Refuses an
/// `n` whose three matrices do not fit in the memory available.
pub fn bench_cpu_matmul(n: usize, reps: usize) -> Result<String> {
    if !(1..=MAX_CPU_MATMUL_SIZE as usize).contains(&n) {
        return Err(err!(Usage, "--size must be from 1 to {MAX_CPU_MATMUL_SIZE}, got {n}"));
    }
    check_host_memory(3 * (n as u128).pow(2) * 4, &format!("a {n} x {n} matmul"))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n >= 4096 {
        // Long work says what it is doing: a 20000³ product takes minutes on a small machine.
        eprintln!(
            "note: timing {n} x {n} x {n} f32 products on {threads} threads: a warm-up, then \
             {reps} timed runs, fewer once {} s have passed (Ctrl-C stops)",
            crate::cpu::LONG_RUN_S
        );
    }
    let gflops = crate::cpu::bench_matmul(n, reps.max(1));
    Ok(format!("{}\n", json!({"cpu_matmul_n": n, "threads": threads, "gflops": gflops})))
}

/// Refuse to start on `bytes` of host memory when the machine does not have them available
/// (Linux's `MemAvailable`; elsewhere only sizes past the address space are refused), instead
/// of aborting half-way with "memory allocation failed".
fn check_host_memory(bytes: u128, what: &str) -> Result<()> {
    let available = available_memory().map_or(isize::MAX as u128, u128::from);
    if bytes > available {
        return Err(err!(
            Limit,
            "{what} needs {bytes} bytes of memory; {available} bytes are available"
        ));
    }
    Ok(())
}

/// Bytes of memory available to new allocations: `/proc/meminfo`'s, or what the process may
/// use where that is less ([`crate::memory::usable_memory`]: `ulimit -v` aborted a benchmark
/// the machine had room for).
fn available_memory() -> Option<u64> {
    let meminfo = || {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    [meminfo(), crate::memory::usable_memory()].into_iter().flatten().min()
}
