//! Models in scripts. A model block `m` is a function `m(#{ hyperparams })` returning a `Model`
//! (a template); `model.compile(#{ ... })` returns a `Trainer` (a compiled model on a device)
//! that trains, predicts, reports its plan, exposes parameters by name and saves and loads
//! checkpoints. Optimizers and schedules are maps built by `sgd`, `adam`, `adamw`, `step_lr`
//! and `cosine`, so scripts can print and tweak them.

use super::super::convert::{script_err, IntoScript, ScriptResult};
use super::super::{Ctx, Event};
use super::data::ScriptDataset;
use super::tensor::ScriptTensor;
use crate::checkpoint;
use crate::dsl::ast::{DimPat, SigParam};
use crate::dsl::{self, Module, Value};

use crate::error::Result;
use crate::graph::optim::is_host_input;
use crate::graph::{Graph, Op, OptimConfig, Optimizer};
use crate::session::{CompileConfig, Device, Dims, Loss, Model, Schedule, Trainer, TARGET_INPUT};
use crate::tensor::Tensor;
use rhai::{Array, Dynamic, Engine, Map, FLOAT, INT};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

/// A model template with its hyperparameters, as scripts hold it.
#[derive(Clone)]
pub struct ScriptModel {
    pub model: Model,
    module: Arc<Module>,
    hyper: Vec<(String, Value)>,
}

/// A compiled model, shared by every script variable that holds it.
#[derive(Clone)]
pub struct ScriptTrainer {
    pub trainer: Rc<RefCell<Trainer>>,
    /// The model's inputs in declaration order (not the target or the learning rate).
    pub inputs: Rc<Vec<String>>,
    /// The output the loss reads (and `predict(x)` returns).
    pub output: Rc<String>,
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
    let declared: Vec<String> = module
        .item(name)
        .map(|(item, _)| {
            item.params
                .iter()
                .flat_map(|p| match p {
                    SigParam::Tensor { dims, .. } => dims.as_slice(),
                    _ => &[],
                })
                .filter_map(|d| match d {
                    DimPat::Name(n) => Some(n.name.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let (m, n, h) = (module.clone(), name.to_string(), hyper.clone());
    let build = move |dims: &Dims| -> Result<Graph> {
        let mut bindings: Vec<(&str, Value)> =
            h.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        for (d, &size) in dims {
            if declared.contains(d) && !h.iter().any(|(k, _)| k == d) {
                bindings.push((d.as_str(), Value::Int(size as i64)));
            }
        }
        dsl::lower(&m, &n, &bindings, None)
    };
    let m = ScriptModel { model: Model::new(name, Arc::new(build)), module: module.clone(), hyper };
    // Instantiate once with every free dimension 1, so mistakes surface at this call.
    model_graph(&m).script()?;
    Ok(m)
}

/// A script value as a model-language value.
fn value(v: &Dynamic, key: &str) -> ScriptResult<Value> {
    if let Ok(i) = v.as_int() {
        Ok(Value::Int(i))
    } else if let Ok(f) = v.as_float() {
        Ok(Value::Float(f))
    } else if let Ok(b) = v.as_bool() {
        Ok(Value::Bool(b))
    } else if v.is_array() {
        let a = v.read_lock::<Array>().expect("is an array");
        Ok(Value::List(a.iter().map(|x| value(x, key)).collect::<ScriptResult<_>>()?))
    } else {
        Err(script_err(format!(
            "hyperparameter `{key}` must be a number, a boolean or a list, got {}",
            v.type_name()
        )))
    }
}

/// Register `Model`, `Trainer`, optimizers and schedules.
pub fn register(engine: &mut Engine, ctx: &Rc<Ctx>) {
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
            let feeds = vec![
                (t.inputs.first().cloned().unwrap_or_default(), x),
                (TARGET_INPUT.to_string(), y),
            ];
            train_step(&c, t, feeds)
        },
    );
    let c = ctx.clone();
    engine.register_fn("train_step", move |t: &mut ScriptTrainer, feeds: Map| {
        train_step(&c, t, tensors_of(&feeds)?)
    });
    engine.register_fn("predict", |t: &mut ScriptTrainer, x: ScriptTensor| {
        let feeds = vec![(t.inputs.first().cloned().unwrap_or_default(), x)];
        let out = predict(t, feeds)?;
        let output = t.output.clone();
        out.into_iter()
            .find(|(n, _)| *n == *output)
            .map(|(_, v)| ScriptTensor::new(v))
            .ok_or_else(|| script_err(format!("the model has no output `{output}`")))
    });
    engine.register_fn("predict", |t: &mut ScriptTrainer, feeds: Map| {
        let out = predict(t, tensors_of(&feeds)?)?;
        Ok::<_, Box<rhai::EvalAltResult>>(
            out.into_iter()
                .map(|(n, v)| (n.into(), Dynamic::from(ScriptTensor::new(v))))
                .collect::<Map>(),
        )
    });
    engine.register_fn("eval", |t: &mut ScriptTrainer, x: ScriptTensor| {
        let feeds = vec![(t.inputs.first().cloned().unwrap_or_default(), x)];
        let out = predict(t, feeds)?;
        Ok::<_, Box<rhai::EvalAltResult>>(
            out.into_iter()
                .map(|(n, v)| (n.into(), Dynamic::from(ScriptTensor::new(v))))
                .collect::<Map>(),
        )
    });
    engine.register_fn("accuracy", |t: &mut ScriptTrainer, d: ScriptDataset| {
        accuracy(t, d.0.x(), d.0.y())
    });
    engine.register_fn("accuracy", |t: &mut ScriptTrainer, x: ScriptTensor, y: ScriptTensor| {
        accuracy(t, x.tensor(), y.tensor())
    });
    engine.register_get("step", |t: &mut ScriptTrainer| t.trainer.borrow().step() as INT);
    engine.register_get("lr", |t: &mut ScriptTrainer| t.trainer.borrow().current_lr() as FLOAT);
    engine.register_get("device", |t: &mut ScriptTrainer| t.trainer.borrow().device_name());
    engine.register_fn("plan", |t: &mut ScriptTrainer| t.trainer.borrow().plan_report());
    engine.register_fn("params", |t: &mut ScriptTrainer| -> ScriptResult<Array> {
        let ps = t.trainer.borrow().parameters().script()?;
        Ok(ps.into_iter().map(|(n, _)| n.into()).collect())
    });
    engine.register_fn("param", |t: &mut ScriptTrainer, name: &str| {
        t.trainer.borrow().parameter(name).map(ScriptTensor::new).script()
    });
    engine.register_fn("set_param", |t: &mut ScriptTrainer, name: &str, v: ScriptTensor| {
        let mut tr = t.trainer.borrow_mut();
        tr.parameter(name).script()?; // parameters only, not optimizer state
        tr.load_state(&[(name.to_string(), v.into_tensor())]).script()
    });
    let c = ctx.clone();
    engine.register_fn("save", move |t: &mut ScriptTrainer, path: &str| {
        let p = c.sandbox.check_write(path).script()?;
        save(&t.trainer.borrow(), &p).script()
    });
    let c = ctx.clone();
    engine.register_fn("load", move |t: &mut ScriptTrainer, path: &str| {
        let p = c.sandbox.check_read(path).script()?;
        load(&mut t.trainer.borrow_mut(), &p).script()
    });
}

pub fn describe_trainer(t: &ScriptTrainer) -> String {
    let tr = t.trainer.borrow();
    format!("trainer on {} at step {}", tr.device_name(), tr.step())
}

fn tensors_of(m: &Map) -> ScriptResult<Vec<(String, ScriptTensor)>> {
    m.iter()
        .map(|(k, v)| match v.clone().try_cast::<ScriptTensor>() {
            Some(t) => Ok((k.to_string(), t)),
            None => Err(script_err(format!("`{k}` must be a tensor, got {}", v.type_name()))),
        })
        .collect()
}

fn train_step(
    ctx: &Ctx,
    t: &ScriptTrainer,
    feeds: Vec<(String, ScriptTensor)>,
) -> ScriptResult<FLOAT> {
    let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, v)| (n.as_str(), v.tensor())).collect();
    let mut tr = t.trainer.borrow_mut();
    let loss = tr.train_step(&feeds).script()?;
    ctx.last_step.set(tr.step());
    ctx.emit(Event::Step { step: tr.step(), loss });
    Ok(loss as FLOAT)
}

fn predict(
    t: &ScriptTrainer,
    feeds: Vec<(String, ScriptTensor)>,
) -> ScriptResult<Vec<(String, Tensor)>> {
    let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, v)| (n.as_str(), v.tensor())).collect();
    t.trainer.borrow_mut().predict(&feeds).script()
}

/// Fraction of rows whose largest output matches the label.
fn accuracy(t: &ScriptTrainer, x: &Tensor, y: &Tensor) -> ScriptResult<FLOAT> {
    let input = t.inputs.first().cloned().unwrap_or_default();
    let out = t.trainer.borrow_mut().predict(&[(input.as_str(), x)]).script()?;
    let logits = out
        .into_iter()
        .find(|(n, _)| *n == *t.output)
        .map(|(_, v)| v)
        .ok_or_else(|| script_err("the model has no output to score"))?;
    let labels = y.to_f32_vec();
    let Some(&classes) = logits.shape().last() else {
        return Err(script_err("accuracy: the output has no class axis"));
    };
    let v = logits.to_f32_vec();
    if classes == 0 || v.len() / classes != labels.len() {
        return Err(script_err(format!(
            "accuracy: {} rows of output for {} labels",
            v.len() / classes.max(1),
            labels.len()
        )));
    }
    let correct = v
        .chunks(classes)
        .zip(&labels)
        .filter(|(row, &l)| {
            let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            best as f32 == l
        })
        .count();
    Ok(correct as FLOAT / labels.len().max(1) as FLOAT)
}

/// Write every persistent value (parameters, optimizer state, step count) atomically.
pub fn save(t: &Trainer, path: &std::path::Path) -> Result<()> {
    let state = t.state_tensors()?;
    let refs: Vec<(&str, &Tensor)> = state.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "rumus".to_string());
    meta.insert("step".to_string(), t.step().to_string());
    checkpoint::save(path, &refs, &meta)
}

/// Load a checkpoint written by [`save`] (or parameters only, from elsewhere).
pub fn load(t: &mut Trainer, path: &std::path::Path) -> Result<()> {
    let ckpt = checkpoint::load(path)?;
    t.load_state(&ckpt.tensors)
}

fn get<'a>(m: &'a Map, key: &str) -> Option<&'a Dynamic> {
    m.get(key)
}

fn num(m: &Map, key: &str, default: f64) -> ScriptResult<f64> {
    match get(m, key) {
        None => Ok(default),
        Some(v) => v
            .as_float()
            .or_else(|_| v.as_int().map(|i| i as f64))
            .map_err(|t| script_err(format!("`{key}` must be a number, got {t}"))),
    }
}

fn int(m: &Map, key: &str, default: i64) -> ScriptResult<i64> {
    match get(m, key) {
        None => Ok(default),
        Some(v) => {
            v.as_int().map_err(|t| script_err(format!("`{key}` must be an integer, got {t}")))
        }
    }
}

fn string(m: &Map, key: &str, default: &str) -> ScriptResult<String> {
    match get(m, key) {
        None => Ok(default.to_string()),
        Some(v) => v
            .clone()
            .into_string()
            .map_err(|t| script_err(format!("`{key}` must be a string, got {t}"))),
    }
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
    "device",
    "seed",
];

fn compile(ctx: &Ctx, m: &ScriptModel, cfg: &Map) -> ScriptResult<ScriptTrainer> {
    if let Some(k) = cfg.keys().find(|k| !COMPILE_KEYS.contains(&k.as_str())) {
        return Err(script_err(format!(
            "compile: unknown setting `{k}` (settings: {})",
            COMPILE_KEYS.join(", ")
        )));
    }
    let mut dims = Dims::new();
    if let Some(d) = get(cfg, "dims") {
        let d = d
            .read_lock::<Map>()
            .ok_or_else(|| script_err("`dims` must be a map of dimension sizes"))?;
        for (k, v) in d.iter() {
            let n = v
                .as_int()
                .ok()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| script_err(format!("dimension `{k}` must be a size")))?;
            dims.insert(k.to_string(), n);
        }
    }
    let batch = int(cfg, "batch", 1)?;
    dims.insert(
        "B".into(),
        usize::try_from(batch).map_err(|_| script_err("`batch` must be positive"))?,
    );
    let probe = m.model.instantiate(&dims).script()?;
    let output = match get(cfg, "output") {
        Some(_) => string(cfg, "output", "")?,
        None => probe
            .outputs
            .first()
            .map(|(n, _)| n.clone())
            .ok_or_else(|| script_err("the model has no outputs"))?,
    };
    let inputs = input_names(&probe);
    let loss = match string(cfg, "loss", "cross_entropy")?.as_str() {
        "cross_entropy" => Loss::CrossEntropy {
            output: output.clone(),
            ignore_index: match get(cfg, "ignore_index") {
                Some(_) => Some(int(cfg, "ignore_index", 0)? as i32),
                None => None,
            },
        },
        "mse" => Loss::Mse { output: output.clone() },
        "output" => Loss::Output { output: output.clone() },
        other => {
            return Err(script_err(format!(
                "unknown loss `{other}`: expected \"cross_entropy\", \"mse\" or \"output\""
            )))
        }
    };
    let (optimizer, opt_lr) = optimizer(get(cfg, "optimizer"))?;
    let lr = num(cfg, "lr", opt_lr.unwrap_or(1e-3))? as f32;
    let schedule = schedule(get(cfg, "schedule"))?;
    let clip_norm = match get(cfg, "clip") {
        Some(_) => Some(num(cfg, "clip", 1.0)? as f32),
        None => None,
    };
    let device = device(&string(cfg, "device", &ctx.device.borrow())?)?;
    let seed = int(cfg, "seed", ctx.seed.get() as i64)? as u64;
    let cfg = CompileConfig {
        dims,
        loss,
        optimizer: OptimConfig { optimizer, clip_norm },
        lr,
        schedule,
        device,
        seed,
    };
    let trainer = m.model.compile(cfg).script()?;
    Ok(ScriptTrainer {
        trainer: Rc::new(RefCell::new(trainer)),
        inputs: Rc::new(inputs),
        output: Rc::new(output),
    })
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

/// An optimizer from a map made by `sgd`/`adam`/`adamw` (or a bare name); also its `lr`.
fn optimizer(v: Option<&Dynamic>) -> ScriptResult<(Optimizer, Option<f64>)> {
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
    let lr = match m.get("lr") {
        Some(_) => Some(num(&m, "lr", 0.0)?),
        None => None,
    };
    let kind = string(&m, "type", "adam")?;
    let opt = match kind.as_str() {
        "sgd" => Optimizer::Sgd {
            momentum: num(&m, "momentum", 0.0)?,
            weight_decay: num(&m, "weight_decay", 0.0)?,
        },
        "adam" | "adamw" => {
            let (beta1, beta2) = (num(&m, "beta1", 0.9)?, num(&m, "beta2", 0.999)?);
            let eps = num(&m, "eps", 1e-8)?;
            if kind == "adam" {
                Optimizer::Adam { beta1, beta2, eps, weight_decay: num(&m, "weight_decay", 0.0)? }
            } else {
                Optimizer::AdamW { beta1, beta2, eps, weight_decay: num(&m, "weight_decay", 0.01)? }
            }
        }
        other => {
            return Err(script_err(format!(
                "unknown optimizer `{other}`: expected sgd, adam or adamw"
            )))
        }
    };
    Ok((opt, lr))
}

fn schedule(v: Option<&Dynamic>) -> ScriptResult<Schedule> {
    let Some(v) = v else {
        return Ok(Schedule::Constant);
    };
    let m = v
        .read_lock::<Map>()
        .map(|m| m.clone())
        .ok_or_else(|| script_err("`schedule` must be step_lr(..) or cosine(..)"))?;
    match string(&m, "type", "")?.as_str() {
        "step" => Ok(Schedule::Step {
            every: int(&m, "every", 1)?.max(1) as u64,
            gamma: num(&m, "gamma", 0.1)? as f32,
        }),
        "cosine" => Ok(Schedule::Cosine {
            warmup: int(&m, "warmup", 0)?.max(0) as u64,
            total: int(&m, "total", 1)?.max(1) as u64,
            min_lr: num(&m, "min_lr", 0.0)? as f32,
        }),
        other => Err(script_err(format!(
            "unknown schedule `{other}`: expected step_lr(..) or cosine(..)"
        ))),
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
    let bindings: Vec<(&str, Value)> =
        m.hyper.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    dsl::lower(&m.module, &m.model.name, &bindings, Some(1))
}
