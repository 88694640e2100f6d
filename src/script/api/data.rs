//! Datasets in scripts: `csv(path, #{ ... })` (plain or gzip), `text(path, #{ seq_len, stride })`
//! (bytes into next-byte sequences), `dataset(x, y)`; `split`, `shuffle`, `batches`. Paths go
//! through the sandbox's file policy; sizes through its memory budget.

use super::super::convert::{script_err, IntoScript, ScriptResult};
use super::super::Ctx;
use super::tensor::ScriptTensor;
use crate::data::{self, CsvOptions, Dataset, Header, Labels};
use rhai::{Array, Dynamic, Engine, Map, INT};
use std::rc::Rc;

/// A dataset as scripts hold it (shared, immutable).
#[derive(Clone)]
pub struct ScriptDataset(pub Rc<Dataset>);

/// One mini-batch.
#[derive(Clone)]
pub struct ScriptBatch {
    pub x: ScriptTensor,
    pub y: ScriptTensor,
}

/// Register `Dataset`, `Batch` and the loaders.
pub fn register(engine: &mut Engine, ctx: &Rc<Ctx>) {
    engine.register_type_with_name::<ScriptDataset>("Dataset");
    engine.register_type_with_name::<ScriptBatch>("Batch");
    let c = ctx.clone();
    engine.register_fn("csv", move |path: &str, opts: Map| csv(&c, path, &opts));
    let c = ctx.clone();
    engine.register_fn("csv", move |path: &str| csv(&c, path, &Map::new()));
    let c = ctx.clone();
    engine.register_fn("text", move |path: &str, opts: Map| text(&c, path, &opts));
    engine.register_fn("dataset", |x: ScriptTensor, y: ScriptTensor| {
        Dataset::new(x.into_tensor(), y.into_tensor()).map(|d| ScriptDataset(Rc::new(d))).script()
    });
    engine.register_fn("len", |d: &mut ScriptDataset| d.0.len() as INT);
    engine.register_get("x", |d: &mut ScriptDataset| ScriptTensor::new(d.0.x().clone()));
    engine.register_get("y", |d: &mut ScriptDataset| ScriptTensor::new(d.0.y().clone()));
    engine.register_get("classes", |d: &mut ScriptDataset| {
        d.0.classes().iter().map(|c| Dynamic::from(c.clone())).collect::<Array>()
    });
    engine.register_fn("to_string", |d: &mut ScriptDataset| describe(&d.0));
    engine.register_fn("to_debug", |d: &mut ScriptDataset| describe(&d.0));
    engine.register_fn("split", |d: &mut ScriptDataset, fraction: f64, seed: INT| {
        let (a, b) = d.0.split(fraction, seed as u64).script()?;
        let mut m = Map::new();
        m.insert("train".into(), Dynamic::from(ScriptDataset(Rc::new(a))));
        m.insert("test".into(), Dynamic::from(ScriptDataset(Rc::new(b))));
        Ok::<_, Box<rhai::EvalAltResult>>(m)
    });
    engine.register_fn("shuffle", |d: &mut ScriptDataset, seed: INT| {
        let mut order: Vec<usize> = (0..d.0.len()).collect();
        crate::rng::Rng::new(seed as u64).shuffle(&mut order);
        d.0.select(&order).map(|d| ScriptDataset(Rc::new(d))).script()
    });
    engine.register_fn("batches", |d: &mut ScriptDataset, size: INT, seed: INT| {
        batches(&d.0, size, seed, false)
    });
    engine.register_fn(
        "batches",
        |d: &mut ScriptDataset, size: INT, seed: INT, keep_last: bool| {
            batches(&d.0, size, seed, keep_last)
        },
    );
    engine.register_get("x", |b: &mut ScriptBatch| b.x.clone());
    engine.register_get("y", |b: &mut ScriptBatch| b.y.clone());
}

pub fn describe(d: &Dataset) -> String {
    format!(
        "dataset of {} examples: x {}{:?}, y {}{:?}",
        d.len(),
        d.x().dtype(),
        d.x().shape(),
        d.y().dtype(),
        d.y().shape()
    )
}

/// Shuffled batches; only full ones unless `keep_last` (compiled models have a fixed batch).
fn batches(d: &Dataset, size: INT, seed: INT, keep_last: bool) -> ScriptResult<Array> {
    let size = usize::try_from(size).map_err(|_| script_err("batch size must be positive"))?;
    let mut out = Array::new();
    for b in d.batches(size, seed as u64).script()? {
        let b = b.script()?;
        if !keep_last && b.x.shape().first() != Some(&size) {
            continue;
        }
        out.push(Dynamic::from(ScriptBatch {
            x: ScriptTensor::new(b.x),
            y: ScriptTensor::new(b.y),
        }));
    }
    Ok(out)
}

fn opt_int(m: &Map, key: &str) -> ScriptResult<Option<i64>> {
    m.get(key)
        .map(|v| v.as_int().map_err(|t| script_err(format!("`{key}` must be an integer, got {t}"))))
        .transpose()
}

fn csv(ctx: &Ctx, path: &str, m: &Map) -> ScriptResult<ScriptDataset> {
    let p = ctx.sandbox.check_read(path).script()?;
    let mut opts = CsvOptions { max_bytes: ctx.sandbox.memory_budget, ..CsvOptions::default() };
    if let Some(c) = opt_int(m, "label_col")? {
        opts.label_col =
            Some(usize::try_from(c).map_err(|_| script_err("`label_col` must be >= 0"))?);
    }
    if let Some(v) = m.get("scale") {
        opts.scale = v
            .as_float()
            .or_else(|_| v.as_int().map(|i| i as f64))
            .map_err(|t| script_err(format!("`scale` must be a number, got {t}")))?
            as f32;
    }
    if let Some(v) = m.get("header") {
        opts.header = match v.as_bool() {
            Ok(true) => Header::Present,
            Ok(false) => Header::Absent,
            Err(_) => return Err(script_err("`header` must be true or false")),
        };
    }
    if let Some(v) = m.get("labels") {
        opts.labels = match v.clone().into_string().as_deref() {
            Ok("classes") => Labels::Classes,
            Ok("targets") => Labels::Targets,
            _ => return Err(script_err("`labels` must be \"classes\" or \"targets\"")),
        };
    }
    let d = data::read_csv(&p, &opts).script()?;
    Ok(ScriptDataset(Rc::new(d)))
}

fn text(ctx: &Ctx, path: &str, m: &Map) -> ScriptResult<ScriptDataset> {
    let p = ctx.sandbox.check_read(path).script()?;
    let seq_len = opt_int(m, "seq_len")?.unwrap_or(64);
    let stride = opt_int(m, "stride")?.unwrap_or(seq_len);
    let (Ok(seq_len), Ok(stride)) = (usize::try_from(seq_len), usize::try_from(stride)) else {
        return Err(script_err("`seq_len` and `stride` must be positive"));
    };
    let bytes = data::read_text(&p, ctx.sandbox.memory_budget / 8).script()?;
    let n = bytes.len().saturating_sub(seq_len) / stride.max(1) + 1;
    ctx.sandbox.check_alloc(&[n, seq_len, 2]).script()?;
    let d = data::text_sequences(&bytes, seq_len, stride).script()?;
    Ok(ScriptDataset(Rc::new(d)))
}
