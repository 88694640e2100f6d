//! Arithmetic on script tensors, for data preparation: elementwise operators and functions with
//! NumPy broadcasting, reductions (`sum`, `mean`, `max`, `min`), `argmax`, and `sample` (seeded,
//! for generating text). NaN is never hidden: it propagates through `max` and `min` and counts
//! as the largest element for `argmax`.

use super::super::convert::{script_err, to_f32, to_u64, ScriptResult};
use super::super::Ctx;
use super::tensor::{alloc, reader, ScriptTensor};
use crate::rng::Rng;
use crate::tensor::{fmt_shape, Tensor, TensorData};
use rhai::{Engine, FLOAT, INT};
use std::sync::Arc;

/// Register the operators and functions on `Tensor`.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    // Arithmetic.
    for (name, f) in [
        ("+", (|a, b| a + b) as fn(f32, f32) -> f32),
        ("-", |a, b| a - b),
        ("*", |a, b| a * b),
        ("/", |a, b| a / b),
        ("pow", f32::powf),
        ("max", f32::max),
        ("min", f32::min),
    ] {
        let c = ctx.clone();
        engine.register_fn(name, move |a: ScriptTensor, b: ScriptTensor| {
            broadcast(&c, a.tensor(), b.tensor(), f)
        });
        let c = ctx.clone();
        engine.register_fn(name, move |a: ScriptTensor, b: FLOAT| {
            let b = to_f32(b, &format!("`{name}`"))?;
            map(&c, a.tensor(), |x| f(x, b))
        });
        let c = ctx.clone();
        engine.register_fn(name, move |a: ScriptTensor, b: INT| {
            map(&c, a.tensor(), |x| f(x, b as f32))
        });
        let c = ctx.clone();
        engine.register_fn(name, move |a: FLOAT, b: ScriptTensor| {
            let a = to_f32(a, &format!("`{name}`"))?;
            map(&c, b.tensor(), |x| f(a, x))
        });
        let c = ctx.clone();
        engine.register_fn(name, move |a: INT, b: ScriptTensor| {
            map(&c, b.tensor(), |x| f(a as f32, x))
        });
    }
    let c = ctx.clone();
    engine.register_fn("-", move |a: ScriptTensor| map(&c, a.tensor(), |x| -x));
    for (name, f) in [
        ("exp", f32::exp as fn(f32) -> f32),
        ("ln", f32::ln),
        ("sqrt", f32::sqrt),
        ("abs", f32::abs),
        ("relu", |x: f32| x.max(0.0)),
    ] {
        let c = ctx.clone();
        engine.register_fn(name, move |a: &mut ScriptTensor| map(&c, a.tensor(), f));
    }
    engine.register_fn("sum", |t: &mut ScriptTensor| {
        let t = t.tensor();
        let get = reader(t);
        (0..t.numel()).map(|i| get(i) as f64).sum::<f64>()
    });
    engine.register_fn("mean", |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "mean")?;
        let get = reader(t);
        Ok((0..t.numel()).map(|i| get(i) as f64).sum::<f64>() / t.numel() as f64)
    });
    // NaN anywhere makes the largest and smallest element NaN (as in NumPy and PyTorch), not
    // the largest of the other elements.
    let nan_or = |f: fn(f32, f32) -> f32| {
        move |a: f32, b: f32| if a.is_nan() || b.is_nan() { f32::NAN } else { f(a, b) }
    };
    engine.register_fn("max", move |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "max")?;
        let get = reader(t);
        Ok((0..t.numel()).map(get).fold(f32::NEG_INFINITY, nan_or(f32::max)) as FLOAT)
    });
    engine.register_fn("min", move |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "min")?;
        let get = reader(t);
        Ok((0..t.numel()).map(get).fold(f32::INFINITY, nan_or(f32::min)) as FLOAT)
    });
    let c = ctx.clone();
    engine.register_fn("argmax", move |t: &mut ScriptTensor| argmax(&c, t.tensor()));
    let c = ctx.clone();
    engine.register_fn("sample", move |t: &mut ScriptTensor, temperature: FLOAT, seed: INT| {
        sample(&c, t.tensor(), temperature, seed)
    });
    let c = ctx.clone();
    engine.register_fn("sample", move |t: &mut ScriptTensor, temperature: INT, seed: INT| {
        sample(&c, t.tensor(), temperature as FLOAT, seed)
    });
    engine.register_fn("==", |a: ScriptTensor, b: ScriptTensor| a == b);
    engine.register_fn("!=", |a: ScriptTensor, b: ScriptTensor| a != b);
}

/// `t`, or an error for `what` (a reduction with no answer on no elements: NumPy and PyTorch
/// refuse `max` and `min` of nothing; the mean of nothing is not 0).
fn nonempty<'t>(t: &'t Tensor, what: &str) -> ScriptResult<&'t Tensor> {
    if t.numel() == 0 {
        return Err(script_err(format!(
            "{what}: the tensor of shape {} has no elements",
            fmt_shape(t.shape())
        )));
    }
    Ok(t)
}

/// Elementwise map, keeping the shape; the result is f32.
pub(super) fn map(ctx: &Ctx, t: &Tensor, f: impl Fn(f32) -> f32) -> ScriptResult<ScriptTensor> {
    let get = reader(t);
    alloc(ctx, t.shape(), |n| Ok(TensorData::F32((0..n).map(|i| f(get(i))).collect())))
}

/// Elementwise `f(a, b)` with NumPy broadcasting.
fn broadcast(
    ctx: &Ctx,
    a: &Tensor,
    b: &Tensor,
    f: fn(f32, f32) -> f32,
) -> ScriptResult<ScriptTensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let out_shape = crate::graph::shape::broadcast_shapes(sa, sb).ok_or_else(|| {
        script_err(format!("cannot broadcast shapes {} and {}", fmt_shape(sa), fmt_shape(sb)))
    })?;
    let rank = out_shape.len();
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let strides = |p: &[usize]| -> Vec<usize> {
        let mut s = vec![0; rank];
        let mut acc = 1;
        for i in (0..rank).rev() {
            s[i] = if p[i] == 1 { 0 } else { acc };
            acc *= p[i];
        }
        s
    };
    let (st_a, st_b) = (strides(&pad(sa)), strides(&pad(sb)));
    let (ga, gb) = (reader(a), reader(b));
    alloc(ctx, &out_shape, |n| {
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            let ia: usize = idx.iter().zip(&st_a).map(|(i, s)| i * s).sum();
            let ib: usize = idx.iter().zip(&st_b).map(|(i, s)| i * s).sum();
            out.push(f(ga(ia), gb(ib)));
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < out_shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(TensorData::F32(out))
    })
}

/// The rows of the last axis of `t` (which must have one, non-empty), for `op`'s errors.
fn rows(op: &str, t: &Tensor) -> ScriptResult<(usize, Vec<usize>)> {
    let Some((&d, lead)) = t.shape().split_last() else {
        return Err(script_err(format!("{op}: tensor has no axes")));
    };
    if d == 0 {
        return Err(script_err(format!("{op}: last axis is empty")));
    }
    Ok((d, lead.to_vec()))
}

/// Index of the largest element along the last axis (i32, the last axis removed); a NaN counts
/// as the largest (its first index), as in NumPy and PyTorch.
fn argmax(ctx: &Ctx, t: &Tensor) -> ScriptResult<ScriptTensor> {
    let (d, lead) = rows("argmax", t)?;
    let get = reader(t);
    alloc(ctx, &lead, |n| {
        let best = |r: usize| {
            let mut best = 0;
            for i in 1..d {
                let (x, b) = (get(r * d + i), get(r * d + best));
                if !b.is_nan() && (x > b || x.is_nan()) {
                    best = i;
                }
            }
            best as i32
        };
        Ok(TensorData::I32((0..n).map(best).collect()))
    })
}

/// One index per row of the last axis, drawn from `softmax(logits / temperature)` (i32, the last
/// axis removed, like [`argmax`]). The draws come from an [`Rng`] seeded with `seed`, one uniform
/// number per row, so the same logits and seed give the same indices on every device.
/// Temperature 0 picks the largest logit (argmax); a logit of `-inf` is never drawn.
fn sample(ctx: &Ctx, t: &Tensor, temperature: FLOAT, seed: INT) -> ScriptResult<ScriptTensor> {
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(script_err(format!(
            "sample: temperature must be a finite number >= 0, got {temperature}"
        )));
    }
    if temperature == 0.0 {
        return argmax(ctx, t);
    }
    let (d, lead) = rows("sample", t)?;
    let get = reader(t);
    let mut rng = Rng::new(to_u64(seed, "sample: seed")?);
    let mut weights = vec![0.0f64; d];
    alloc(ctx, &lead, |n| {
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            let row = (0..d).map(|i| get(r * d + i));
            let top = row.clone().fold(f32::NEG_INFINITY, |m, x| m.max(x)) as f64;
            if row.clone().any(|x| x.is_nan()) || !top.is_finite() {
                return Err(script_err("sample: a row of logits is NaN, infinite or all -inf"));
            }
            let mut total = 0.0;
            for (w, x) in weights.iter_mut().zip(row) {
                *w = ((x as f64 - top) / temperature).exp();
                total += *w;
            }
            // The first index whose running sum passes u * total; the largest logit has weight
            // 1, so total >= 1 and the fallback (rounding at the very end) is the last nonzero
            // weight.
            let target = rng.uniform() * total;
            let mut acc = 0.0;
            let mut pick = weights.iter().rposition(|&w| w > 0.0).unwrap_or(0);
            for (i, &w) in weights.iter().enumerate() {
                acc += w;
                if acc > target {
                    pick = i;
                    break;
                }
            }
            out.push(pick as i32);
        }
        Ok(TensorData::I32(out))
    })
}
