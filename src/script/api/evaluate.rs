//! Scoring a compiled model on held-out data: `net.evaluate(x, y)`, `net.evaluate(dataset)`
//! (each with an optional `#{ batch }`) and `net.accuracy(...)`. Evaluation runs the forward
//! graph (dropout off) through `Trainer::predict`, so it never touches parameters, optimizer
//! state or the step count; the loss is computed on the host in f64 from the outputs, summed over
//! every example of every batch (the last, partial one included) and divided once by the number
//! of targets, so the mean does not depend on the batch size.

use super::super::convert::{script_err, IntoScript, Opts, ScriptResult};
use super::super::Ctx;
use super::data::ScriptDataset;
use super::model::ScriptTrainer;
use super::tensor::ScriptTensor;
use crate::data;
use crate::session::Loss;
use crate::tensor::{fmt_shape, Tensor, TensorData};
use rhai::{Dynamic, Engine, Map, FLOAT};
use std::sync::Arc;

/// Register `evaluate` and `accuracy` on `Trainer`.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    let c = ctx.clone();
    engine.register_fn(
        "evaluate",
        move |t: &mut ScriptTrainer, x: ScriptTensor, y: ScriptTensor| {
            evaluate(&c, t, x.tensor(), y.tensor(), &Map::new())
        },
    );
    let c = ctx.clone();
    engine.register_fn(
        "evaluate",
        move |t: &mut ScriptTrainer, x: ScriptTensor, y: ScriptTensor, opts: Map| {
            evaluate(&c, t, x.tensor(), y.tensor(), &opts)
        },
    );
    let c = ctx.clone();
    engine.register_fn("evaluate", move |t: &mut ScriptTrainer, d: ScriptDataset| {
        evaluate(&c, t, d.x.tensor(), d.y.tensor(), &Map::new())
    });
    let c = ctx.clone();
    engine.register_fn("evaluate", move |t: &mut ScriptTrainer, d: ScriptDataset, opts: Map| {
        evaluate(&c, t, d.x.tensor(), d.y.tensor(), &opts)
    });
    engine.register_fn("accuracy", |t: &mut ScriptTrainer, d: ScriptDataset| {
        accuracy(t, d.x.tensor(), d.y.tensor())
    });
    engine.register_fn("accuracy", |t: &mut ScriptTrainer, x: ScriptTensor, y: ScriptTensor| {
        accuracy(t, x.tensor(), y.tensor())
    });
}

/// Running sums over the batches of one evaluation.
#[derive(Default)]
struct Tally {
    /// Sum of the per-target losses.
    loss: f64,
    /// Targets counted (labels other than `ignore_index`, or elements for mse).
    count: u64,
    /// Labels the largest output matched.
    correct: u64,
    /// Some row of outputs predicts nothing (NaN, +inf, or all -inf): accuracy is NaN.
    undefined: bool,
}

/// `net.evaluate(...)`: `#{ loss }`, plus `accuracy` for a cross-entropy model.
fn evaluate(ctx: &Ctx, t: &ScriptTrainer, x: &Tensor, y: &Tensor, opts: &Map) -> ScriptResult<Map> {
    let o = Opts::new(opts, "evaluate", &["batch"])?;
    let batch = o.dim("batch")?.unwrap_or(t.batch);
    let ignore = match &t.loss {
        Loss::CrossEntropy { ignore_index, .. } => Some(*ignore_index),
        Loss::Mse { .. } => None,
        Loss::Output { .. } => {
            return Err(script_err(
                "evaluate needs a model compiled with loss \"cross_entropy\" or \"mse\"; with loss \"output\" call predict and read the loss output",
            ))
        }
    };
    let input = t.only_input("evaluate")?;
    let n = examples("evaluate", x, y)?;
    let mut tally = Tally::default();
    for start in (0..n).step_by(batch) {
        ctx.check_interrupt()?;
        let rows: Vec<usize> = (start..n.min(start + batch)).collect();
        // A batch other than the whole set is a copy of its rows, charged while it is held.
        let copies = if rows.len() == n {
            None
        } else {
            let bytes = (x.bytes() + y.bytes()) / n as u64 * rows.len() as u64;
            let held = ctx.budget.charge(bytes, "a batch being evaluated").script()?;
            let xb = data::gather_rows(x, &rows).script()?;
            Some((xb, data::gather_rows(y, &rows).script()?, held))
        };
        let (xb, yb) = match &copies {
            Some((a, b, _)) => (a, b),
            None => (x, y),
        };
        let out = output(t, input, xb)?;
        match ignore {
            Some(ignore) => score_classes("evaluate", &out, yb, ignore, n, &mut tally)?,
            None => score_mse(&out, yb, &mut tally)?,
        }
    }
    let mean = |sum: f64| if tally.count == 0 { FLOAT::NAN } else { sum / tally.count as f64 };
    let mut m = Map::new();
    m.insert("loss".into(), Dynamic::from_float(mean(tally.loss)));
    if ignore.is_some() {
        let acc = if tally.undefined { FLOAT::NAN } else { mean(tally.correct as f64) };
        m.insert("accuracy".into(), Dynamic::from_float(acc));
    }
    Ok(m)
}

/// Fraction of labels whose row's largest output matches; NaN when any row of outputs holds
/// NaN or +inf, or is all -inf. Labels equal to the model's `ignore_index` are not counted.
fn accuracy(t: &ScriptTrainer, x: &Tensor, y: &Tensor) -> ScriptResult<FLOAT> {
    let ignore = match &t.loss {
        Loss::CrossEntropy { ignore_index, .. } => *ignore_index,
        _ => None,
    };
    let input = t.only_input("accuracy")?;
    let n = examples("accuracy", x, y)?;
    let mut tally = Tally::default();
    score_classes("accuracy", &output(t, input, x)?, y, ignore, n, &mut tally)?;
    // No label counted (every one ignored) leaves the fraction undefined, as in `evaluate`.
    Ok(if tally.undefined || tally.count == 0 {
        FLOAT::NAN
    } else {
        tally.correct as FLOAT / tally.count as FLOAT
    })
}

/// The number of examples of `x` and `y` (their first dimension), or an error for `what` when
/// they differ or there are none (no score of nothing, which `predict` would refuse less
/// clearly).
fn examples(what: &str, x: &Tensor, y: &Tensor) -> ScriptResult<usize> {
    let n = x.shape().first().copied().unwrap_or(0);
    if n == 0 || y.shape().first() != Some(&n) {
        return Err(script_err(format!(
            "{what} needs x and y with the same number of examples (at least one), got {} and {}",
            fmt_shape(x.shape()),
            fmt_shape(y.shape())
        )));
    }
    Ok(n)
}

/// The scored output of the model for `x` fed as its input `input`, charged while it is held.
fn output(
    t: &ScriptTrainer,
    input: &str,
    x: &Tensor,
) -> ScriptResult<(Tensor, crate::memory::Charge)> {
    let (out, budget) = {
        let mut tr = t.lock().script()?;
        (tr.predict(&[(input, x)]).script()?, tr.budget().clone())
    };
    let v = out
        .into_iter()
        .find(|(n, _)| *n == t.output)
        .map(|(_, v)| v)
        .ok_or_else(|| script_err("the model has no output to score"))?;
    let held = budget.charge(v.bytes(), "the outputs being scored").script()?;
    Ok((v, held))
}

/// Add cross-entropy and correct predictions of `logits` (`[..., classes]`) against `labels`
/// (one per row, in the rows' shape, i32 or whole f32 numbers) to `tally`; `what` names the
/// caller in errors, `n_examples` the whole set's size (which errors show, not the batch's).
fn score_classes(
    what: &str,
    (logits, _held): &(Tensor, crate::memory::Charge),
    labels: &Tensor,
    ignore: Option<i32>,
    n_examples: usize,
    tally: &mut Tally,
) -> ScriptResult<()> {
    let labels_shape = labels.shape();
    let labels: Vec<f64> = match labels.data() {
        TensorData::F32(v) => v.iter().map(|&l| l as f64).collect(),
        TensorData::I32(v) => v.iter().map(|&l| l as f64).collect(),
    };
    let Some(&classes) = logits.shape().last() else {
        return Err(script_err(format!("{what}: the output has no class axis")));
    };
    let v = logits.as_f32().ok_or_else(|| script_err(format!("{what}: the output is not f32")))?;
    // One label per row of outputs, in the rows' shape: labels of another shape with as many
    // elements (`[B, 1]`, or `[T, B]` for outputs `[B, T, C]`) would be paired with rows they
    // do not belong to, as `train_step` refuses too.
    let rows = &logits.shape()[..logits.shape().len() - 1];
    if classes == 0 || labels_shape != rows {
        // Shapes of the whole set, not of the batch.
        let whole = |s: &[usize]| {
            let mut s = s.to_vec();
            if let Some(first) = s.first_mut() {
                *first = n_examples;
            }
            fmt_shape(&s)
        };
        return Err(script_err(format!(
            "{what}: labels of shape {} for outputs of shape {}: give one label per row of outputs, shape {}",
            whole(labels_shape),
            whole(logits.shape()),
            whole(rows)
        )));
    }
    for (row, &label) in v.chunks(classes).zip(&labels) {
        if ignore.is_some_and(|i| f64::from(i) == label) {
            continue;
        }
        if !(label.fract() == 0.0 && (0.0..classes as f64).contains(&label)) {
            return Err(script_err(format!(
                "{what}: label {label} is not a class index in 0..{classes}"
            )));
        }
        // A row with NaN or +inf, or all -inf, predicts nothing: accuracy is NaN, never a
        // count that treats the first class as the prediction.
        let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        tally.undefined |= row.iter().any(|x| x.is_nan()) || !row[best].is_finite();
        tally.correct += u64::from(best == label as usize);
        let max = f64::from(row[best]);
        let sum: f64 = row.iter().map(|&z| (f64::from(z) - max).exp()).sum();
        tally.loss += max + sum.ln() - f64::from(row[label as usize]);
        tally.count += 1;
    }
    Ok(())
}

/// Add the squared errors of `out` against `target` (same shape) to `tally`.
fn score_mse(
    (out, _held): &(Tensor, crate::memory::Charge),
    target: &Tensor,
    tally: &mut Tally,
) -> ScriptResult<()> {
    let (Some(o), Some(y)) = (out.as_f32(), target.as_f32()) else {
        return Err(script_err(format!("evaluate: mse needs f32 targets, got {}", target.dtype())));
    };
    if out.shape().get(1..) != target.shape().get(1..) {
        return Err(script_err(format!(
            "evaluate: an output row is {} but a target row is {}",
            fmt_shape(out.shape().get(1..).unwrap_or(&[])),
            fmt_shape(target.shape().get(1..).unwrap_or(&[]))
        )));
    }
    tally.loss +=
        o.iter().zip(y).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum::<f64>();
    tally.count += o.len() as u64;
    Ok(())
}
