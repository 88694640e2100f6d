//! Datasets in scripts: `csv(path, #{ ... })` (plain or gzip), `text(path, #{ seq_len, stride })`
//! (bytes into next-byte sequences), `dataset(x, y)`; `split`, `shuffle`, `batches` (each
//! rank of a data-parallel job its share of every batch). Paths go through the sandbox's file
//! policy; sizes through its memory budget.

use super::super::convert::{script_err, to_u64, to_usize, IntoScript, Opts, ScriptResult};
use super::super::Ctx;
use super::tensor::{self, held_bytes, ScriptTensor, HEAP_BLOCK};
use crate::data::{self, CsvOptions, Dataset, Header, Labels};
use crate::memory::Charge;
use crate::tensor::{fmt_shape, Tensor};
use rhai::{Array, Dynamic, Engine, Map, INT};
use std::sync::Arc;

/// A dataset as scripts hold it: two tensors with the same first dimension (shared with the
/// script values they came from, never copied), and class names.
#[derive(Clone)]
pub struct ScriptDataset {
    pub x: ScriptTensor,
    pub y: ScriptTensor,
    classes: Arc<Classes>,
}

/// Class names with the charge that pays for them.
struct Classes {
    names: Vec<String>,
    _charge: Charge,
}

/// One mini-batch.
#[derive(Clone)]
pub struct ScriptBatch {
    pub x: ScriptTensor,
    pub y: ScriptTensor,
}

impl ScriptDataset {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.x.tensor().shape().first().copied().unwrap_or(0)
    }

    /// A dataset read by a loader, whose charge covers its tensors' elements and its names;
    /// the rest of what the two script tensors hold is charged here, before they are made.
    fn from_loaded(d: Dataset, mut charge: Charge) -> ScriptResult<ScriptDataset> {
        let (x, y, names) = d.into_parts();
        let mut held = |t: &Tensor| -> ScriptResult<Charge> {
            let mut c = charge.split_off(t.bytes());
            c.resize(held_bytes(t.shape()), tensor::what(t.shape())).script()?;
            Ok(c)
        };
        let (cx, cy) = (held(&x)?, held(&y)?);
        Ok(ScriptDataset {
            x: ScriptTensor::new(x, cx),
            y: ScriptTensor::new(y, cy),
            classes: Arc::new(Classes { names, _charge: charge }),
        })
    }

    /// The examples at `rows` (in that order), charged before they are copied.
    fn select(&self, ctx: &Ctx, rows: &[usize]) -> ScriptResult<ScriptDataset> {
        let pick = |t: &ScriptTensor| -> ScriptResult<ScriptTensor> {
            let shape = rows_shape(t, rows.len());
            let charge = ctx.budget.charge(held_bytes(&shape), tensor::what(&shape)).script()?;
            Ok(ScriptTensor::new(data::gather_rows(t.tensor(), rows).script()?, charge))
        };
        Ok(ScriptDataset { x: pick(&self.x)?, y: pick(&self.y)?, classes: self.classes.clone() })
    }

    /// `0..len` shuffled by `seed`, its bytes charged while it is held.
    fn order(&self, ctx: &Ctx, seed: INT) -> ScriptResult<(Vec<usize>, Charge)> {
        let n = self.len();
        let charge = ctx.budget.charge(n as u64 * 8, format!("a shuffle of {n} rows")).script()?;
        Ok((data::shuffled(n, to_u64(seed, "seed")?), charge))
    }
}

/// The shape of `n` rows of `t`.
fn rows_shape(t: &ScriptTensor, n: usize) -> Vec<usize> {
    let mut shape = t.tensor().shape().to_vec();
    if let Some(first) = shape.first_mut() {
        *first = n;
    }
    shape
}

/// What a batch holds besides its two tensors: its slot in the array of batches, and the
/// script value's two boxes around the batch (rhai boxes a custom type twice).
const BATCH_OVERHEAD: u64 = (std::mem::size_of::<Dynamic>()
    + std::mem::size_of::<Box<dyn std::any::Any>>()
    + std::mem::size_of::<ScriptBatch>()) as u64
    + 2 * HEAP_BLOCK;

/// Register `Dataset`, `Batch` and the loaders.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    engine.register_type_with_name::<ScriptDataset>("Dataset");
    engine.register_type_with_name::<ScriptBatch>("Batch");
    let c = ctx.clone();
    engine.register_fn("csv", move |path: &str, opts: Map| csv(&c, path, &opts));
    let c = ctx.clone();
    engine.register_fn("csv", move |path: &str| csv(&c, path, &Map::new()));
    let c = ctx.clone();
    engine.register_fn("text", move |path: &str, opts: Map| text(&c, path, &opts));
    let c = ctx.clone();
    engine.register_fn("dataset", move |x: ScriptTensor, y: ScriptTensor| {
        let (sx, sy) = (x.tensor().shape(), y.tensor().shape());
        match (sx.first(), sy.first()) {
            (Some(a), Some(b)) if a == b => {}
            _ => {
                return Err(script_err(format!(
                    "dataset needs x and y with the same first dimension, got {} and {}",
                    fmt_shape(sx),
                    fmt_shape(sy)
                )))
            }
        }
        let classes = Arc::new(Classes { names: Vec::new(), _charge: c.budget.empty() });
        Ok(ScriptDataset { x, y, classes })
    });
    engine.register_fn("len", |d: &mut ScriptDataset| d.len() as INT);
    let new = "make a new dataset with `dataset(x, y)`";
    super::read_only(engine, "Dataset", "x", new, |d: &mut ScriptDataset| Ok(d.x.clone()));
    super::read_only(engine, "Dataset", "y", new, |d: &mut ScriptDataset| Ok(d.y.clone()));
    super::read_only(engine, "Batch", "x", new, |b: &mut ScriptBatch| Ok(b.x.clone()));
    super::read_only(engine, "Batch", "y", new, |b: &mut ScriptBatch| Ok(b.y.clone()));
    let names = "they are the label column's names";
    super::read_only(engine, "Dataset", "classes", names, |d: &mut ScriptDataset| {
        Ok(d.classes.names.iter().map(|c| Dynamic::from(c.clone())).collect::<Array>())
    });
    engine.register_fn("to_string", |d: &mut ScriptDataset| describe(d));
    engine.register_fn("to_debug", |d: &mut ScriptDataset| describe(d));
    let c = ctx.clone();
    engine.register_fn("split", move |d: &mut ScriptDataset, fraction: f64, seed: INT| {
        let cut = data::split_point(d.len(), fraction).script()?;
        let (order, _held) = d.order(&c, seed)?;
        let mut m = Map::new();
        m.insert("train".into(), Dynamic::from(d.select(&c, &order[..cut])?));
        m.insert("test".into(), Dynamic::from(d.select(&c, &order[cut..])?));
        Ok::<_, Box<rhai::EvalAltResult>>(m)
    });
    let c = ctx.clone();
    engine.register_fn("shuffle", move |d: &mut ScriptDataset, seed: INT| {
        let (order, _held) = d.order(&c, seed)?;
        d.select(&c, &order)
    });
    let c = ctx.clone();
    engine.register_fn("batches", move |d: &mut ScriptDataset, size: INT, seed: INT| {
        batches(&c, d, size, seed, false)
    });
    let c = ctx.clone();
    engine.register_fn(
        "batches",
        move |d: &mut ScriptDataset, size: INT, seed: INT, keep_last: bool| {
            batches(&c, d, size, seed, keep_last)
        },
    );
}

pub fn describe(d: &ScriptDataset) -> String {
    let (x, y) = (d.x.tensor(), d.y.tensor());
    format!(
        "dataset of {} examples: x {}{:?}, y {}{:?}",
        d.len(),
        x.dtype(),
        x.shape(),
        y.dtype(),
        y.shape()
    )
}

/// Shuffled batches; only full ones unless `keep_last` (compiled models have a fixed batch).
/// In a data-parallel job each rank takes its share of each global batch of `size × ranks`
/// ([`data::rank_batches`]). Everything the list holds (each batch's tensors with their
/// overhead, the batch values, the array) is counted against the array size limit and charged
/// to the memory budget before any of it is built: a batch of one row costs a few hundred bytes,
/// not the 8 of its elements.
fn batches(
    ctx: &Ctx,
    d: &ScriptDataset,
    size: INT,
    seed: INT,
    keep_last: bool,
) -> ScriptResult<Array> {
    // One message for every size out of range (-1 said ">= 0", then 0 "must be positive").
    if size < 1 {
        return Err(script_err(format!("batch size must be an integer >= 1, got {size}")));
    }
    let size = to_usize(size, "batch size")?;
    let (order, _held) = d.order(ctx, seed)?;
    let (rank, ranks) = (ctx.comm.rank(), ctx.comm.world_size());
    let parts = data::rank_batch_rows(&order, size, rank, ranks, keep_last);
    let count = parts.clone().count();
    // A training loop over no batches does nothing, without a word. Decided from the whole
    // dataset, so that every rank of a data-parallel job decides alike.
    if !keep_last && !order.is_empty() && order.len() < size.saturating_mul(ranks) {
        let n = order.len();
        return Err(script_err(match (ranks, n / ranks) {
            (1, most) => format!(
                "batches: no batch of {size} is full in a dataset of {n} rows, so there are none: use a batch of at most {most}, or keep_last: true for the partial one"
            ),
            (r, 0) => format!(
                "batches: a dataset of {n} rows has fewer rows than the job's {r} ranks: each rank needs one at least"
            ),
            (r, most) => format!(
                "batches: no batch of {size} a rank is full in a dataset of {n} rows over {r} ranks, so there are none: use a batch of at most {most}, or keep_last: true for the partial one"
            ),
        }));
    }
    let limit = ctx.sandbox.max_array_size;
    if limit > 0 && count > limit {
        return Err(crate::err!(
            Limit,
            "batches: batch size {size} makes {count} batches, over the array size limit of {limit}: use larger batches"
        ))
        .script();
    }
    let held = |t: &ScriptTensor, rows: &[usize]| held_bytes(&rows_shape(t, rows.len()));
    let cost = |rows: &[usize]| held(&d.x, rows) + held(&d.y, rows) + BATCH_OVERHEAD;
    let bytes = parts.clone().map(cost).fold(0u64, u64::saturating_add);
    let what = format!("a list of {count} batches");
    let mut charge = ctx.budget.charge(bytes, what).script()?;
    let mut out = Array::with_capacity(count);
    for rows in parts {
        // Each tensor takes its part of the charge; the batch's own bytes go with its x.
        let take = |t: &ScriptTensor, charge: Charge| -> ScriptResult<ScriptTensor> {
            Ok(ScriptTensor::new(data::gather_rows(t.tensor(), rows).script()?, charge))
        };
        let x = take(&d.x, charge.split_off(held(&d.x, rows) + BATCH_OVERHEAD))?;
        let y = take(&d.y, charge.split_off(held(&d.y, rows)))?;
        out.push(Dynamic::from(ScriptBatch { x, y }));
    }
    Ok(out)
}

fn csv(ctx: &Ctx, path: &str, m: &Map) -> ScriptResult<ScriptDataset> {
    let o = Opts::new(m, "csv", &["label_col", "labels", "scale", "header"])?;
    let p = ctx.sandbox.check_read(path).script()?;
    let mut opts = CsvOptions {
        max_bytes: ctx.sandbox.memory_budget,
        stop: Some(ctx.interrupt.flag()),
        ..CsvOptions::default()
    };
    opts.label_col = o.usize("label_col", 0)?;
    if let Some(scale) = o.f32("scale")? {
        opts.scale = scale;
    }
    if let Some(h) = o.bool("header")? {
        opts.header = if h { Header::Present } else { Header::Absent };
    }
    opts.labels = match o.string("labels")?.as_deref() {
        None | Some("classes") => Labels::Classes,
        Some("targets") => Labels::Targets,
        Some(_) => return Err(script_err("csv: `labels` must be \"classes\" or \"targets\"")),
    };
    // `labels` says how the label column reads: without one it would be ignored silently.
    if opts.label_col.is_none() && o.get("labels").is_some() {
        return Err(script_err(
            "csv: `labels` says how the label column reads, and there is none: give `label_col` \
             too, or drop `labels` (without `label_col` every column is a feature)",
        ));
    }
    let mut charge = ctx.budget.empty();
    let d = data::read_csv(&p, &opts, &mut charge).script()?;
    ScriptDataset::from_loaded(d, charge)
}

fn text(ctx: &Ctx, path: &str, m: &Map) -> ScriptResult<ScriptDataset> {
    let o = Opts::new(m, "text", &["seq_len", "stride"])?;
    let p = ctx.sandbox.check_read(path).script()?;
    let seq_len = o.usize("seq_len", 1)?.unwrap_or(64);
    let stride = o.usize("stride", 1)?.unwrap_or(seq_len);
    let mut charge = ctx.budget.empty();
    let bytes = data::read_text(&p, &mut charge).script()?;
    let d = data::text_sequences(&bytes, seq_len, stride, &mut charge)
        .map_err(|e| crate::Error::new(e.kind, format!("{path}: {}", e.message)))
        .script()?;
    drop(bytes);
    let held = d.x().bytes() + d.y().bytes();
    charge.resize(held, "").script()?;
    ScriptDataset::from_loaded(d, charge)
}
