//! Models in scripts. A model block `m` is a function `m(#{ hyperparams })` returning a `Model`
//! (a template); `model.compile(#{ ... })` returns a `Trainer` (a compiled model on a device)
//! that trains, predicts, reports its plan, exposes parameters by name and saves and loads
//! checkpoints. Optimizers and schedules are maps built by `sgd`, `adam`, `adamw`, `step_lr`
//! and `cosine`, so scripts can print and tweak them.

use super::super::convert::{
    not_finite, script_err, to_dim, to_f32, IntoScript, Opts, ScriptResult,
};
use super::super::{lock, Ctx, Event};
use super::tensor::{held_bytes, ScriptTensor};
use crate::checkpoint::{self, torch};
use crate::dsl::ast::{DimPat, SigParam};
use crate::dsl::{self, Module, Value};

use crate::error::Result;
use crate::graph::optim::{is_host_input, MAX_ACCUMULATE};
use crate::graph::{Graph, Op, OptimConfig, Optimizer, ParamGroup, TrainOptions};
use crate::session::{
    CompileConfig, Device, Dims, LoadReport, Loss, MatmulPrecision, Model, Schedule, Trainer,
    TARGET_INPUT,
};
use crate::tensor::Tensor;
use rhai::{Array, Dynamic, Engine, Map, FLOAT, INT};
use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

/// A model template with its hyperparameters, as scripts hold it.
#[derive(Clone)]
pub struct ScriptModel {
    pub model: Model,
    module: Arc<Module>,
    hyper: Vec<(String, Value)>,
    /// The names of the model's input dimensions and hyperparameters, to check `compile`'s
    /// `dims` against.
    names: Arc<ModelNames>,
}

/// What a model's signature names.
struct ModelNames {
    /// The named dimensions of its tensor inputs, in order, each once.
    dims: Vec<String>,
    /// Its hyperparameters.
    hyper: Vec<String>,
    /// The first input with the batch dimension `B`, and B's axis in it.
    batch_axis: Option<(String, usize)>,
}

/// The batch dimension: `compile`'s `batch` sets it, and `predict` sets it to its input's rows.
const BATCH: &str = "B";

impl ModelNames {
    /// Whether the sizes `compile` and `predict` give (`Dims`) set dimension `d` of a model
    /// given hyperparameters `hyper`: a dimension of the model's inputs, unless `hyper` sets it;
    /// the batch `B` always (`compile` refuses a `batch` that differs from a `B` in `hyper`).
    /// The one rule for which dimensions a script sets, for building the graph and for
    /// checking `dims`.
    fn set_by_dims(&self, hyper: &[(String, Value)], d: &str) -> bool {
        self.dims.iter().any(|x| x == d) && (d == BATCH || !hyper.iter().any(|(k, _)| k == d))
    }
}

/// A compiled model, shared by every script variable (and every host handle) that holds it,
/// on any thread.
#[derive(Clone)]
pub struct ScriptTrainer(Arc<HeldTrainer>);

/// What a [`ScriptTrainer`] shares: the trainer, behind a mutex, and what the script API
/// needs to feed it and read it.
pub struct HeldTrainer {
    /// The compiled model; [`ScriptTrainer::lock`] it for each call, never across a call into
    /// rhai or a host sink.
    trainer: Mutex<Trainer>,
    /// The thread holding `trainer`'s lock, if any: a second lock on that thread would wait
    /// for itself forever, so it is refused instead.
    holder: Mutex<Option<ThreadId>>,
    /// The model's inputs in declaration order (not the target or the learning rate).
    pub inputs: Vec<String>,
    /// The output the loss reads (and `predict(x)` returns).
    pub output: String,
    /// What the training step minimizes (and `evaluate` reports).
    pub loss: Loss,
    /// The batch size the model was compiled for (`evaluate`'s default).
    pub batch: usize,
}

impl ScriptTrainer {
    /// The model's one input, which the positional forms feed (`call`: `train_step(x, y)`,
    /// `predict(x)`, `evaluate`, `accuracy`); an error for a model of none or several, which
    /// were "the model has no input ``" and "input `y` was not fed" (of a model whose second
    /// input is `y`, not the labels given).
    pub fn only_input(&self, call: &str) -> ScriptResult<&str> {
        if let [input] = self.inputs.as_slice() {
            return Ok(input);
        }
        let has = match self.inputs.as_slice() {
            [] => "none".to_string(),
            several => format!(
                "{}, {}",
                several.len(),
                several.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        let advice = match call {
            "train_step" => "give the inputs by name, with the labels as `target`: net.train_step(#{ input: x, ..., target: y })",
            "predict" => "give the inputs by name: net.predict(#{ input: x, ... })",
            _ => "it scores models of one input; score the outputs of net.predict(#{ input: x, ... }) instead",
        };
        Err(script_err(format!(
            "net.{call}(x, ..) feeds x to a model's one input, and this model has {has}: {advice}"
        )))
    }

    /// The trainer, locked until the guard is dropped; waits while another thread holds it,
    /// and is an error where this thread already does (a host holding
    /// `Compiled::trainer()`'s guard while it runs script code that uses the model), which
    /// would otherwise wait for itself forever.
    pub fn lock(&self) -> Result<TrainerGuard<'_>> {
        let me = std::thread::current().id();
        if *lock(&self.0.holder) == Some(me) {
            return Err(crate::err!(
                Usage,
                "this model is already in use on this thread (a guard from `Compiled::trainer()` is alive): drop it before using the model again"
            ));
        }
        let guard = lock(&self.0.trainer);
        *lock(&self.0.holder) = Some(me);
        Ok(TrainerGuard { guard, holder: &self.0.holder })
    }
}

/// A locked trainer ([`ScriptTrainer::lock`], `Compiled::trainer`); dereferences to it.
pub struct TrainerGuard<'a> {
    guard: MutexGuard<'a, Trainer>,
    holder: &'a Mutex<Option<ThreadId>>,
}

impl Deref for TrainerGuard<'_> {
    type Target = Trainer;
    fn deref(&self) -> &Trainer {
        &self.guard
    }
}

impl std::ops::DerefMut for TrainerGuard<'_> {
    fn deref_mut(&mut self) -> &mut Trainer {
        &mut self.guard
    }
}

impl std::fmt::Debug for TrainerGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrainerGuard(step {})", self.guard.step())
    }
}

impl Drop for TrainerGuard<'_> {
    fn drop(&mut self) {
        // Before the trainer's own lock is released (fields drop after this).
        *lock(self.holder) = None;
    }
}

impl Deref for ScriptTrainer {
    type Target = HeldTrainer;
    fn deref(&self) -> &HeldTrainer {
        &self.0
    }
}

/// A model function for each model of `module`, registered in `engine`.
pub fn define(engine: &mut Engine, module: &Arc<Module>) {
    let names: Vec<String> = module.models().map(|m| m.name.name.clone()).collect();
    for name in names {
        let (m, n) = (module.clone(), name.clone());
        engine.register_fn(name.as_str(), move |hp: Map| instantiate(&m, &n, &hp));
        let (m, n) = (module.clone(), name.clone());
        engine.register_fn(name.as_str(), move || instantiate(&m, &n, &Map::new()));
    }
}

fn instantiate(module: &Arc<Module>, name: &str, hp: &Map) -> ScriptResult<ScriptModel> {
    let hyper: Vec<(String, Value)> =
        hp.iter().map(|(k, v)| Ok((k.to_string(), value(v, k)?))).collect::<ScriptResult<_>>()?;
    // Dimensions the model's inputs name (others, like a `B` the model does not use, are
    // not passed on).
    let mut names = ModelNames { dims: Vec::new(), hyper: Vec::new(), batch_axis: None };
    for p in module.item(name).map_or(&[][..], |(item, _)| &item.params) {
        match p {
            SigParam::Tensor { dims, name: input, .. } => {
                for (axis, d) in dims.iter().enumerate() {
                    if let DimPat::Name(n) = d {
                        if !names.dims.contains(&n.name) {
                            names.dims.push(n.name.clone());
                        }
                        if n.name == BATCH && names.batch_axis.is_none() {
                            names.batch_axis = Some((input.name.clone(), axis));
                        }
                    }
                }
            }
            SigParam::Hyper { name, .. } => names.hyper.push(name.name.clone()),
        }
    }
    let names = Arc::new(names);
    let (m, n, h, known) = (module.clone(), name.to_string(), hyper.clone(), names.clone());
    let build = move |dims: &Dims| -> Result<Graph> {
        // The sizes come after the hyperparameters, so a batch size replaces a `B` among them.
        let mut bindings: Vec<(&str, Value)> =
            h.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        for (d, &size) in dims {
            if known.set_by_dims(&h, d) {
                bindings.push((d.as_str(), Value::Int(size as i64)));
            }
        }
        dsl::lower(&m, &n, &bindings, None)
    };
    let m = ScriptModel {
        model: match module.item(name) {
            Some((_, src)) => Model::new(name, Arc::new(build)).with_source(src.clone()),
            None => Model::new(name, Arc::new(build)),
        },
        module: module.clone(),
        hyper,
        names,
    };
    // Instantiate once with every free dimension 1, so mistakes surface at this call. Only
    // mistakes whatever the free dimensions are: a model may need them to be more than 1
    // (`x @ x` of an `f32[B, 4]` at batch 4, `B / 2`), and `compile` and `predict` lower it at
    // the real sizes, where a mistake is reported with them.
    if let Err(e) = model_graph(&m) {
        if !dsl::size_dependent(&m.module, &m.model.name, &hyper_bindings(&m), 1, &e) {
            return Err(e).script();
        }
    }
    Ok(m)
}

/// A script value as a model-language value. A float must be finite, as every number of the
/// model language is (its literals and its arithmetic refuse NaN and infinities, and so does
/// `--set`): `m(#{ scale: 0.0 / 0.0 })` made `x * scale` a NaN constant without a word.
fn value(v: &Dynamic, key: &str) -> ScriptResult<Value> {
    if let Ok(i) = v.as_int() {
        Ok(Value::Int(i))
    } else if let Ok(f) = v.as_float() {
        if !f.is_finite() {
            return Err(script_err(format!("hyperparameter `{key}`: {}", not_finite(f))));
        }
        Ok(Value::Float(f))
    } else if let Ok(b) = v.as_bool() {
        Ok(Value::Bool(b))
    } else if v.is_array() {
        let a = v.read_lock::<Array>().expect("is an array");
        Ok(Value::List(a.iter().map(|x| value(x, key)).collect::<ScriptResult<_>>()?))
    } else {
        Err(script_err(format!(
            "hyperparameter `{key}` must be a number, a boolean or a list, got {}",
            super::type_name(v)
        )))
    }
}

/// Register `Model`, `Trainer`, optimizers and schedules.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    engine.register_type_with_name::<ScriptModel>("Model");
    engine.register_type_with_name::<ScriptTrainer>("Trainer");
    engine.register_fn("to_string", |m: &mut ScriptModel| format!("model {}", m.model.name));
    engine.register_fn("to_debug", |m: &mut ScriptModel| format!("model {}", m.model.name));
    engine.register_fn("to_string", |t: &mut ScriptTrainer| describe_trainer(t));
    engine.register_fn("to_debug", |t: &mut ScriptTrainer| describe_trainer(t));

    // Optimizers and schedules: plain maps with a `type`.
    for kind in ["sgd", "adam", "adamw"] {
        engine.register_fn(kind, move |mut m: Map| {
            m.insert("type".into(), kind.into());
            m
        });
        engine.register_fn(kind, move || {
            let mut m = Map::new();
            m.insert("type".into(), kind.into());
            m
        });
    }
    engine.register_fn("step_lr", |mut m: Map| {
        m.insert("type".into(), "step".into());
        m
    });
    engine.register_fn("cosine", |mut m: Map| {
        m.insert("type".into(), "cosine".into());
        m
    });

    let c = ctx.clone();
    engine.register_fn("compile", move |m: &mut ScriptModel, cfg: Map| compile(&c, m, &cfg));
    let c = ctx.clone();
    engine.register_fn("compile", move |m: &mut ScriptModel| compile(&c, m, &Map::new()));

    let c = ctx.clone();
    engine.register_fn(
        "train_step",
        move |t: &mut ScriptTrainer, x: ScriptTensor, y: ScriptTensor| {
            let feeds =
                vec![(t.only_input("train_step")?.to_string(), x), (TARGET_INPUT.to_string(), y)];
            train_step(&c, t, feeds)
        },
    );
    let c = ctx.clone();
    engine.register_fn("train_step", move |t: &mut ScriptTrainer, feeds: Map| {
        train_step(&c, t, tensors_of(&feeds)?)
    });
    let c = ctx.clone();
    engine.register_fn("predict", move |t: &mut ScriptTrainer, x: ScriptTensor| {
        let feeds = vec![(t.only_input("predict")?.to_string(), x)];
        let out = predict(t, feeds)?;
        let output = t.output.clone();
        let v = out
            .into_iter()
            .find(|(n, _)| *n == *output)
            .map(|(_, v)| v)
            .ok_or_else(|| script_err(format!("the model has no output `{output}`")))?;
        ScriptTensor::adopt(&c.budget, v).script()
    });
    let c = ctx.clone();
    engine.register_fn("predict", move |t: &mut ScriptTrainer, feeds: Map| {
        outputs_map(&c, predict(t, tensors_of(&feeds)?)?)
    });
    engine.register_get("lr", |t: &mut ScriptTrainer| -> ScriptResult<FLOAT> {
        Ok(t.lock().script()?.current_lr().script()? as FLOAT)
    });
    engine.register_set("lr", |t: &mut ScriptTrainer, lr: FLOAT| set_lr(t, lr));
    engine.register_set("lr", |t: &mut ScriptTrainer, lr: INT| set_lr(t, lr as FLOAT));
    let steps = "it counts the optimizer's updates";
    super::read_only(engine, "Trainer", "step", steps, |t: &mut ScriptTrainer| {
        Ok(t.lock().script()?.step() as INT)
    });
    let device = "choose it with `compile`'s `device`";
    super::read_only(engine, "Trainer", "device", device, |t: &mut ScriptTrainer| {
        Ok(t.lock().script()?.device_name())
    });
    engine.register_fn("plan", |t: &mut ScriptTrainer| -> ScriptResult<String> {
        Ok(t.lock().script()?.plan_report())
    });
    engine.register_fn("params", |t: &mut ScriptTrainer| -> ScriptResult<Array> {
        let tr = t.lock().script()?;
        Ok(tr.graph().parameters().into_iter().map(|(_, n)| n.into()).collect())
    });
    let c = ctx.clone();
    engine.register_fn("param", move |t: &mut ScriptTrainer, name: &str| {
        let tr = t.lock().script()?;
        // Charged before the copy is read; a name that is no parameter charges nothing.
        let shape = tr.graph().persistent_named(name).map(|id| tr.graph().shape(id).to_vec());
        let bytes = shape.as_deref().map_or(0, held_bytes);
        let what = format!("a copy of parameter `{name}`");
        let charge = c.budget.charge(bytes, what).script()?;
        Ok::<_, Box<rhai::EvalAltResult>>(ScriptTensor::new(tr.parameter(name).script()?, charge))
    });
    engine.register_fn("set_param", |t: &mut ScriptTrainer, name: &str, v: ScriptTensor| {
        let mut tr = t.lock().script()?;
        // Parameters only, not optimizer state; refused where save and load are, as the
        // accumulated gradients belong to the old values.
        tr.parameter(name).script()?;
        let why = "their gradients were taken at the parameters' current values, and the update \
                   would apply them to the new ones";
        tr.check_between_updates_as("set_param", why).script()?;
        tr.load_state(&[(name, v.tensor())]).script()
    });
    let c = ctx.clone();
    engine.register_fn("save", move |t: &mut ScriptTrainer, path: &str| {
        let p = c.sandbox.check_write(path).script()?;
        // Rank 0 writes; the others go on once it has (a broadcast from rank 0 waits for it).
        if c.comm.rank() == 0 {
            save(&*t.lock().script()?, &p).script()?;
        }
        c.comm.broadcast(&mut [0.0]).script()
    });
    let c = ctx.clone();
    engine.register_fn("load", move |t: &mut ScriptTrainer, path: &str| {
        let p = c.sandbox.check_read(path).script()?;
        load(&mut *t.lock().script()?, &p, true, None).script().map(drop)
    });
    let c = ctx.clone();
    engine.register_fn("load", move |t: &mut ScriptTrainer, path: &str, opts: Map| {
        let (strict, from) = load_options(&opts)?;
        let p = c.sandbox.check_read(path).script()?;
        let report = load(&mut *t.lock().script()?, &p, strict, from.as_ref()).script()?;
        let names =
            |v: Vec<String>| Dynamic::from_array(v.into_iter().map(Dynamic::from).collect());
        let mut m = Map::new();
        m.insert("missing".into(), names(report.missing));
        m.insert("unexpected".into(), names(report.unexpected));
        Ok::<_, Box<rhai::EvalAltResult>>(m)
    });
}

/// `net.lr = value`: the base learning rate from the next step on.
fn set_lr(t: &ScriptTrainer, lr: FLOAT) -> ScriptResult<()> {
    let lr = to_f32(lr, "lr")?;
    t.lock().script()?.set_lr(lr).script()
}

/// How a trainer prints in scripts and the REPL: its device and step (or, where this thread
/// holds its lock, only that).
pub fn describe_trainer(t: &ScriptTrainer) -> String {
    match t.lock() {
        Ok(tr) => format!("trainer on {} at step {}", tr.device_name(), tr.step()),
        Err(_) => "trainer (in use on this thread)".to_string(),
    }
}

/// Outputs by name, each charged as a script tensor.
fn outputs_map(ctx: &Ctx, out: Vec<(String, Tensor)>) -> ScriptResult<Map> {
    out.into_iter()
        .map(|(n, v)| Ok((n.into(), Dynamic::from(ScriptTensor::adopt(&ctx.budget, v).script()?))))
        .collect()
}

fn tensors_of(m: &Map) -> ScriptResult<Vec<(String, ScriptTensor)>> {
    m.iter()
        .map(|(k, v)| match v.clone().try_cast::<ScriptTensor>() {
            Some(t) => Ok((k.to_string(), t)),
            None => Err(script_err(format!("`{k}` must be a tensor, got {}", super::type_name(v)))),
        })
        .collect()
}

fn train_step(
    ctx: &Ctx,
    t: &ScriptTrainer,
    feeds: Vec<(String, ScriptTensor)>,
) -> ScriptResult<FLOAT> {
    let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, v)| (n.as_str(), v.tensor())).collect();
    let mut tr = t.lock().script()?;
    let lr = tr.current_lr().script()?;
    let loss = tr.train_step(&feeds).script()?;
    let (step, update) = (tr.step(), (tr.micro_batch() == 0).then(|| tr.update_loss()));
    drop(tr); // the event sink may use the trainer
    ctx.last_step.store(step, Ordering::Relaxed);
    // Progress and metrics count updates: with gradient accumulation, the mean loss of the
    // update's micro-batches once it is applied.
    if let Some(loss) = update {
        ctx.emit(Event::Step { step, loss, lr, epoch: *lock(&ctx.epoch) });
    }
    Ok(loss as FLOAT)
}

fn predict(
    t: &ScriptTrainer,
    feeds: Vec<(String, ScriptTensor)>,
) -> ScriptResult<Vec<(String, Tensor)>> {
    let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, v)| (n.as_str(), v.tensor())).collect();
    t.lock().script()?.predict(&feeds).script()
}

/// Write every persistent value (parameters, optimizer state, step count) atomically, with the
/// step count and the base learning rate in the metadata. The host
/// copies and the file's bytes are charged to the model's budget while they are held.
pub fn save(t: &Trainer, path: &std::path::Path) -> Result<()> {
    let g = t.graph();
    let state_bytes: u64 = g
        .nodes()
        .filter(|(_, n)| n.op.is_persistent())
        .map(|(id, _)| g.shape(id).iter().product::<usize>() as u64 * 4)
        .sum();
    let _held = t.budget().charge(2 * state_bytes, "saving a checkpoint")?;
    let state = t.state_tensors()?;
    let refs: Vec<(&str, &Tensor)> = state.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "rumus".to_string());
    meta.insert("step".to_string(), t.step().to_string());
    meta.insert("lr".to_string(), t.base_lr().to_string());
    checkpoint::save(path, &refs, &meta)
}

/// Load a checkpoint written by [`save`] (or parameters only, from elsewhere), or with `torch`
/// a PyTorch state dict mapped onto the model's names ([`torch::map`]); see
/// [`Trainer::load_checkpoint`] for what `strict` requires. Errors start with the path.
pub fn load(
    t: &mut Trainer,
    path: &std::path::Path,
    strict: bool,
    torch: Option<&torch::Options>,
) -> Result<LoadReport> {
    let at_path =
        |e: crate::Error| crate::Error::new(e.kind, format!("{}: {}", path.display(), e.message));
    t.check_between_updates("load").map_err(at_path)?; // before reading the file
    let mut held = t.budget().empty();
    let ckpt = checkpoint::load(path, &mut held)?;
    let exact_step = ckpt.metadata.get("step").cloned();
    let lr = match ckpt.metadata.get("lr") {
        None => None,
        Some(text) => Some(crate::session::saved_lr(text).map_err(at_path)?),
    };
    let tensors = match torch {
        None => ckpt.tensors,
        Some(opts) => {
            torch::map(ckpt, &torch::targets(t.graph()), opts, &mut held).map_err(at_path)?
        }
    };
    let values: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, v)| (n.as_str(), v)).collect();
    // The step count beyond f32's whole numbers (2^24), from the metadata `save` writes:
    // checked before anything is loaded.
    let step_tensor = values.iter().find(|(n, _)| *n == crate::graph::optim::STEP_STATE);
    let tensor_step = step_tensor.and_then(|(_, v)| v.as_f32()).and_then(|v| v.first().copied());
    let exact = match (exact_step, tensor_step) {
        (Some(text), Some(v)) => crate::session::exact_step(v, &text).map_err(at_path)?,
        // A file without the metadata (`save_file(tensors)` in Python drops it).
        (None, Some(v)) => {
            crate::session::check_step_tensor(v).map_err(at_path)?;
            None
        }
        _ => None,
    };
    let report = t.load_checkpoint(&values, strict).map_err(at_path)?;
    // Only where the step count itself was loaded (not with a partial optimizer state).
    let loaded = !report.missing.iter().any(|m| m == crate::graph::optim::STEP_STATE);
    if let Some(n) = exact.filter(|_| loaded) {
        t.set_loaded_step(n);
        // The learning rate the saving trainer had (`net.lr = ...` included), with its step:
        // a resumed run goes on as the saved one would have (PyTorch's optimizer state dict
        // restores its rate likewise). A file of weights alone changes no rate, nor does any
        // file a model with a schedule (`set_loaded_lr`).
        if let Some(lr) = lr {
            t.set_loaded_lr(lr);
        }
    }
    Ok(report)
}

/// `load`'s options: `strict`, and for `from: "pytorch"` how the state dict maps (`rename`,
/// `transpose`; see [`torch`]).
fn load_options(opts: &Map) -> ScriptResult<(bool, Option<torch::Options>)> {
    let o = Opts::new(opts, "load", &["strict", "from", "rename", "transpose"])?;
    let strict = o.bool("strict")?.unwrap_or(true);
    let bad = |e: crate::Error| script_err(format!("load: {}", e.message));
    match o.string("from")?.as_deref() {
        None | Some("rumus") => {
            if let Some(k) = ["rename", "transpose"].into_iter().find(|k| o.get(k).is_some()) {
                return Err(script_err(format!(
                    "load: `{k}` applies to PyTorch state dicts: add `from: \"pytorch\"`"
                )));
            }
            Ok((strict, None))
        }
        Some("pytorch") => {
            let mut rename = Vec::new();
            for (from, to) in o.map("rename")?.unwrap_or_default() {
                let targets = strings(&to).ok_or_else(|| {
                    script_err(format!(
                        "load: rename `{from}` must map to a name or a list of names, got {}",
                        super::type_name(&to)
                    ))
                })?;
                rename.push(torch::Rename::new(&from, &targets).map_err(bad)?);
            }
            let transpose = match o.get("transpose") {
                None => torch::Transpose::Linear,
                Some(v) if v.as_bool() == Ok(true) => torch::Transpose::Linear,
                Some(v) if v.as_bool() == Ok(false) => torch::Transpose::Never,
                Some(v) => {
                    let patterns = strings(v).filter(|_| v.is_array()).ok_or_else(|| {
                        script_err(format!(
                            "load: `transpose` must be true, false or a list of name patterns, got {}",
                            super::type_name(v)
                        ))
                    })?;
                    let patterns = patterns.iter().map(|p| torch::Pattern::parse(p));
                    torch::Transpose::Only(patterns.collect::<Result<_>>().map_err(bad)?)
                }
            };
            let opts = torch::Options { rename, transpose };
            opts.check().map_err(bad)?;
            Ok((strict, Some(opts)))
        }
        Some(other) => Err(script_err(format!(
            "load: unknown `from` \"{other}\": expected \"rumus\" or \"pytorch\""
        ))),
    }
}

/// A string, or an array of strings, as a list.
fn strings(v: &Dynamic) -> Option<Vec<String>> {
    if let Ok(s) = v.clone().into_string() {
        return Some(vec![s]);
    }
    let a = v.read_lock::<Array>()?;
    a.iter().map(|x| x.clone().into_string().ok()).collect()
}

const COMPILE_KEYS: &[&str] = &[
    "batch",
    "dims",
    "loss",
    "output",
    "ignore_index",
    "optimizer",
    "lr",
    "schedule",
    "clip",
    "accumulate",
    "device",
    "seed",
    "matmul_precision",
    "remat",
];

/// The `remat` compile option: `true` (the default: recompute cheap values), `false`
/// (keep every value) or `"matmuls"` (the widening matmuls too: less memory, more FLOPs).
fn remat(v: Option<&Dynamic>) -> ScriptResult<TrainOptions> {
    let Some(v) = v else { return Ok(TrainOptions::default()) };
    if let Ok(on) = v.as_bool() {
        return Ok(TrainOptions { remat: on, remat_matmuls: false });
    }
    match v.clone().into_string().as_deref() {
        Ok("matmuls") => Ok(TrainOptions { remat: true, remat_matmuls: true }),
        Ok(other) => Err(script_err(format!(
            "compile: unknown `remat` setting \"{other}\": expected true, false or \"matmuls\""
        ))),
        Err(t) => {
            Err(script_err(format!("compile: `remat` must be true, false or \"matmuls\", got {t}")))
        }
    }
}

fn compile(ctx: &Ctx, m: &ScriptModel, cfg: &Map) -> ScriptResult<ScriptTrainer> {
    let o = Opts::new(cfg, "compile", COMPILE_KEYS)?;
    let mut dims = Dims::new();
    if let Some(d) = o.map("dims")? {
        for (k, v) in d.iter() {
            check_dim_key(m, k)?;
            let n = v.as_int().map_err(|_| {
                script_err(format!(
                    "compile: dimension `{k}` must be an integer, got {}",
                    super::type_name(v)
                ))
            })?;
            dims.insert(k.to_string(), to_dim(n, &format!("compile: dimension `{k}`"))?);
        }
    }
    let batch = batch_size(m, o.dim("batch")?)?;
    if let Some(b) = batch {
        dims.insert(BATCH.into(), b);
    }
    let probe = m.model.instantiate(&dims).script()?;
    // Without a batch given, a model whose `B` has a default trains at that size.
    let batch = batch.unwrap_or_else(|| {
        let input = m.names.batch_axis.as_ref().and_then(|(input, axis)| {
            probe.input_named(input).and_then(|id| probe.shape(id).get(*axis).copied())
        });
        input.unwrap_or(1)
    });
    let output = match o.string("output")? {
        Some(out) => out,
        None => probe
            .outputs
            .first()
            .map(|(n, _)| n.clone())
            .ok_or_else(|| script_err("the model has no outputs"))?,
    };
    let inputs = input_names(&probe);
    let loss_name = o.string("loss")?.unwrap_or_else(|| "cross_entropy".into());
    let no_ignore_index = || -> ScriptResult<()> {
        if o.get("ignore_index").is_some() {
            return Err(script_err(format!(
                "compile: `ignore_index` applies to the \"cross_entropy\" loss, not \"{loss_name}\": remove it"
            )));
        }
        Ok(())
    };
    let loss = match loss_name.as_str() {
        "cross_entropy" => Loss::CrossEntropy {
            output: output.clone(),
            ignore_index: o.int("ignore_index", i32::MIN.into(), i32::MAX.into())?,
        },
        "mse" => {
            no_ignore_index()?;
            Loss::Mse { output: output.clone() }
        }
        "output" => {
            no_ignore_index()?;
            Loss::Output { output: output.clone() }
        }
        other => {
            return Err(script_err(format!(
                "unknown loss `{other}`: expected \"cross_entropy\", \"mse\" or \"output\""
            )))
        }
    };
    let (optimizer, opt_lr, groups) = optimizer(o.get("optimizer"))?;
    let lr = match (o.f32("lr")?, opt_lr) {
        (Some(a), Some(b)) if a != b => {
            return Err(script_err(format!(
                "compile: the learning rate is given twice, as `lr: {a}` and as the optimizer's `lr: {b}`: give it in one place"
            )))
        }
        (a, b) => a.or(b).unwrap_or(1e-3),
    };
    let schedule = schedule(o.get("schedule"))?;
    let clip_norm = o.f32("clip")?;
    let accumulate = o.int("accumulate", 1, MAX_ACCUMULATE as i64)?.unwrap_or(1);
    let device = device(&o.string("device")?.unwrap_or_else(|| lock(&ctx.device).clone()))?;
    let seed = o.u64("seed", 0)?.unwrap_or(ctx.seed.load(Ordering::Relaxed));
    let matmul_precision = match o.string("matmul_precision")? {
        Some(p) => Some(
            p.parse::<MatmulPrecision>()
                .map_err(|e| script_err(format!("compile: {}", e.message)))?,
        ),
        None => ctx.matmul_precision,
    };
    let cfg = CompileConfig {
        dims,
        loss: loss.clone(),
        optimizer: OptimConfig { optimizer, clip_norm, groups, accumulate },
        lr,
        schedule,
        device,
        seed,
        matmul_precision,
        budget: ctx.budget.clone(),
        comm: ctx.comm.clone(),
        remat: remat(o.get("remat"))?,
    };
    let trainer = m.model.compile(cfg).script()?;
    Ok(ScriptTrainer(Arc::new(HeldTrainer {
        trainer: Mutex::new(trainer),
        holder: Mutex::new(None),
        inputs,
        output,
        loss,
        batch,
    })))
}

/// The batch size `compile` sets `B` to, from its `batch` (`given`): `None` where the model's
/// own default for `B` stands. A `B` passed to the model is the batch size, and `batch` may
/// repeat it but not differ; a model whose inputs have no `B` takes no `batch`, which would be
/// ignored.
fn batch_size(m: &ScriptModel, given: Option<usize>) -> ScriptResult<Option<usize>> {
    let name = &m.model.name;
    let passed = m.hyper.iter().find(|(k, _)| k == BATCH).map(|(_, v)| v);
    if m.names.batch_axis.is_none() {
        return match given {
            Some(b) => Err(script_err(format!(
                "compile: `batch: {b}` sets the batch dimension `B`, and model `{name}`'s inputs have none: remove `batch`, or name the inputs' batch dimension `B`"
            ))),
            None => Ok(None),
        };
    }
    let passed = match passed {
        None => None,
        // Lowering the model refused any other `B` when it was instantiated.
        Some(v) => Some(
            match v {
                Value::Int(b) => usize::try_from(*b).ok().filter(|&b| b >= 1),
                _ => None,
            }
            .ok_or_else(|| {
                script_err(format!(
                    "compile: `B` given to model `{name}` is the batch size, and must be a whole number >= 1"
                ))
            })?,
        ),
    };
    match (given, passed) {
        (Some(b), Some(p)) if b != p => Err(script_err(format!(
            "compile: the batch size is given twice, as `batch: {b}` and as `{name}(#{{ B: {p} }})`: give it once (`batch` sets `B`)"
        ))),
        (Some(b), _) | (None, Some(b)) => Ok(Some(b)),
        // No batch given: the model's default for `B` where it has one, else 1.
        (None, None) if m.names.hyper.iter().any(|h| h == BATCH) => Ok(None),
        (None, None) => Ok(Some(1)),
    }
}

/// An error unless `key` of `compile`'s `dims` names a dimension of the model's inputs that
/// the script may set ([`ModelNames::set_by_dims`]): not the batch `B` (set by `batch`), not one
/// the model's hyperparameters already set, and not a name the model does not have (which would
/// be silently ignored).
fn check_dim_key(m: &ScriptModel, key: &str) -> ScriptResult<()> {
    let name = &m.model.name;
    let names = &m.names;
    let settable: Vec<&str> = names
        .dims
        .iter()
        .map(String::as_str)
        .filter(|d| *d != BATCH && names.set_by_dims(&m.hyper, d))
        .collect();
    if settable.contains(&key) {
        return Ok(());
    }
    let valid = match settable.as_slice() {
        [] => format!("model `{name}` has no input dimensions to set besides the batch"),
        some => format!("the dimensions of model `{name}`'s inputs: {}", some.join(", ")),
    };
    Err(script_err(if key == BATCH {
        "compile: `B` is the batch dimension: set it with `batch:`, as in `compile(#{ batch: 32 })`, not in `dims`".to_string()
    } else if m.hyper.iter().any(|(k, _)| k == key) {
        format!("compile: dimension `{key}` is already set by the model's hyperparameters, `{name}(#{{ {key}: ... }})`: set it in one place")
    } else if names.hyper.iter().any(|h| h == key) {
        format!("compile: `{key}` is a hyperparameter of model `{name}`, not a dimension of its inputs: pass it to the model, as in `{name}(#{{ {key}: ... }})` ({valid})")
    } else {
        format!("compile: `dims` names `{key}`, which is not a dimension of model `{name}`'s inputs ({valid})")
    }))
}

fn input_names(g: &Graph) -> Vec<String> {
    g.nodes()
        .filter_map(|(_, n)| match &n.op {
            Op::Input { name } if !is_host_input(name) && name != TARGET_INPUT => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect()
}

fn device(name: &str) -> ScriptResult<Device> {
    name.parse::<Device>().map_err(|e| script_err(e.message))
}

/// An optimizer from a map made by `sgd`/`adam`/`adamw` (or a bare name); also its `lr` and
/// parameter groups.
fn optimizer(v: Option<&Dynamic>) -> ScriptResult<(Optimizer, Option<f32>, Vec<ParamGroup>)> {
    let m: Map = match v {
        None => {
            let mut m = Map::new();
            m.insert("type".into(), "adam".into());
            m
        }
        Some(v) if v.is_string() => {
            let mut m = Map::new();
            m.insert("type".into(), v.clone());
            m
        }
        Some(v) => v
            .read_lock::<Map>()
            .map(|m| m.clone())
            .ok_or_else(|| script_err("`optimizer` must be sgd(..), adam(..) or adamw(..)"))?,
    };
    let kind = match m.get("type").map(|t| t.clone().into_string()) {
        Some(Ok(k)) => k,
        _ => return Err(script_err("`optimizer` must be sgd(..), adam(..) or adamw(..)")),
    };
    let keys: &[&str] = match kind.as_str() {
        "sgd" => &["type", "lr", "momentum", "weight_decay", "groups"],
        "adam" | "adamw" => &["type", "lr", "beta1", "beta2", "eps", "weight_decay", "groups"],
        other => {
            return Err(script_err(format!(
                "unknown optimizer `{other}`: expected sgd, adam or adamw"
            )))
        }
    };
    let o = Opts::new(&m, &kind, keys)?;
    // Hyperparameters stay f64, as PyTorch keeps them: 1 - beta and the bias corrections are
    // computed on the host in f64.
    let f = |key: &str, default: f64| -> ScriptResult<f64> { Ok(o.f64(key)?.unwrap_or(default)) };
    let opt = match kind.as_str() {
        "sgd" => {
            Optimizer::Sgd { momentum: f("momentum", 0.0)?, weight_decay: f("weight_decay", 0.0)? }
        }
        "adam" => Optimizer::Adam {
            beta1: f("beta1", 0.9)?,
            beta2: f("beta2", 0.999)?,
            eps: f("eps", 1e-8)?,
            weight_decay: f("weight_decay", 0.0)?,
        },
        _ => Optimizer::AdamW {
            beta1: f("beta1", 0.9)?,
            beta2: f("beta2", 0.999)?,
            eps: f("eps", 1e-8)?,
            weight_decay: f("weight_decay", 0.01)?,
        },
    };
    let groups = match o.get("groups") {
        Some(v) => param_groups(&kind, v)?,
        None => Vec::new(),
    };
    Ok((opt, o.f32("lr")?, groups))
}

/// `groups: [#{ params: ["*.bias", ...], weight_decay, lr_scale }, ...]` of optimizer `kind`.
fn param_groups(kind: &str, v: &Dynamic) -> ScriptResult<Vec<ParamGroup>> {
    let list = v.read_lock::<Array>().map(|a| a.clone()).ok_or_else(|| {
        script_err(format!(
            "{kind}: `groups` must be an array of maps, got {}",
            super::type_name(v)
        ))
    })?;
    let mut groups = Vec::with_capacity(list.len());
    for (i, g) in list.iter().enumerate() {
        let at = format!("{kind}: groups[{i}]");
        let m = g.read_lock::<Map>().map(|m| m.clone()).ok_or_else(|| {
            script_err(format!(
                "{at} must be a map like #{{ params: [\"*.bias\"], weight_decay: 0.0 }}, got {}",
                super::type_name(g)
            ))
        })?;
        let o = Opts::new(&m, &at, &["params", "weight_decay", "lr_scale"])?;
        let strings = |v: &Dynamic| -> Option<Vec<String>> {
            let a = v.read_lock::<Array>()?;
            a.iter().map(|p| p.clone().into_string().ok()).collect()
        };
        let params = match o.get("params") {
            Some(v) => strings(v).ok_or_else(|| {
                script_err(format!(
                    "{at}: `params` must be an array of name patterns like [\"*.bias\"], got {}",
                    super::type_name(v)
                ))
            })?,
            None => return Err(script_err(format!("{at}: `params` is missing"))),
        };
        groups.push(ParamGroup {
            params,
            weight_decay: o.f64("weight_decay")?,
            lr_scale: o.f64("lr_scale")?.unwrap_or(1.0),
        });
    }
    Ok(groups)
}

fn schedule(v: Option<&Dynamic>) -> ScriptResult<Schedule> {
    let Some(v) = v else {
        return Ok(Schedule::Constant);
    };
    let m = v
        .read_lock::<Map>()
        .map(|m| m.clone())
        .ok_or_else(|| script_err("`schedule` must be step_lr(..) or cosine(..)"))?;
    match m.get("type").and_then(|t| t.clone().into_string().ok()).as_deref() {
        Some("step") => {
            let o = Opts::new(&m, "step_lr", &["type", "every", "gamma"])?;
            Ok(Schedule::Step {
                every: o.u64("every", 1)?.unwrap_or(1),
                gamma: o.f32("gamma")?.unwrap_or(0.1),
            })
        }
        Some("cosine") => {
            let o = Opts::new(&m, "cosine", &["type", "warmup", "total", "min_lr"])?;
            Ok(Schedule::Cosine {
                warmup: o.u64("warmup", 0)?.unwrap_or(0),
                total: o.u64("total", 1)?.unwrap_or(1),
                min_lr: o.f32("min_lr")?.unwrap_or(0.0),
            })
        }
        _ => Err(script_err("`schedule` must be step_lr(..) or cosine(..)")),
    }
}

/// Parameter names and shapes, one a line.
pub fn params_text(g: &Graph) -> String {
    let mut s = String::new();
    for (id, name) in g.parameters() {
        s.push_str(&format!("{name} {}\n", crate::tensor::fmt_shape(g.shape(id))));
    }
    s
}

/// The forward graph of a model with every dimension it does not fix set to 1, for `:graph`.
pub fn model_graph(m: &ScriptModel) -> Result<Graph> {
    dsl::lower(&m.module, &m.model.name, &hyper_bindings(m), Some(1))
}

/// A model's hyperparameters as the model language's bindings.
fn hyper_bindings(m: &ScriptModel) -> Vec<(&str, Value)> {
    m.hyper.iter().map(|(k, v)| (k.as_str(), v.clone())).collect()
}
