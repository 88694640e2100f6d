//! Tensors in scripts: built from arrays, ranges and shapes, inspected (shape, dtype, elements,
//! `to_array`), combined with elementwise arithmetic (NumPy broadcasting) for data preparation,
//! reduced (`sum`, `argmax`) and sampled from (`sample`, seeded, for generating text). Every
//! tensor a binding creates is checked against the memory budget first.

use super::super::convert::{script_err, IntoScript, ScriptResult};
use super::super::Ctx;
use crate::rng::Rng;
use crate::tensor::{checked_numel, fmt_shape, DType, Tensor, TensorData};
use rhai::{Array, Dynamic, Engine, FLOAT, INT};
use std::fmt;
use std::ops::{Range, RangeInclusive};
use std::rc::Rc;

/// A tensor as scripts hold it: cheap to copy (scripts copy values freely), copied on write.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptTensor(pub Rc<Tensor>);

impl ScriptTensor {
    pub fn new(t: Tensor) -> ScriptTensor {
        ScriptTensor(Rc::new(t))
    }

    pub fn tensor(&self) -> &Tensor {
        &self.0
    }

    pub fn into_tensor(self) -> Tensor {
        Rc::try_unwrap(self.0).unwrap_or_else(|rc| (*rc).clone())
    }
}

/// Register the `Tensor` type and its functions.
pub fn register(engine: &mut Engine, ctx: &Rc<Ctx>) {
    engine.register_type_with_name::<ScriptTensor>("Tensor");

    // Construction.
    let c = ctx.clone();
    engine.register_fn("tensor", move |a: Array| from_array(&c, &a, DType::F32));
    let c = ctx.clone();
    engine.register_fn("tensor", move |a: Array, dtype: &str| {
        from_array(&c, &a, parse_dtype(dtype)?)
    });
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: Range<INT>| from_range(&c, r.start, r.end));
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: RangeInclusive<INT>| {
        from_range(&c, *r.start(), r.end().saturating_add(1))
    });
    let c = ctx.clone();
    engine.register_fn("zeros", move |shape: Array| filled(&c, &shape, 0.0));
    let c = ctx.clone();
    engine.register_fn("ones", move |shape: Array| filled(&c, &shape, 1.0));
    let c = ctx.clone();
    engine.register_fn("full", move |shape: Array, v: FLOAT| filled(&c, &shape, v));
    let c = ctx.clone();
    engine
        .register_fn("randn", move |shape: Array, seed: INT| random(&c, &shape, seed, Rng::normal));
    let c = ctx.clone();
    engine
        .register_fn("rand", move |shape: Array, seed: INT| random(&c, &shape, seed, Rng::uniform));

    // Inspection.
    engine.register_get("shape", |t: &mut ScriptTensor| shape_array(t.0.shape()));
    engine.register_get("dtype", |t: &mut ScriptTensor| t.0.dtype().name().to_string());
    engine.register_fn("numel", |t: &mut ScriptTensor| t.0.numel() as INT);
    engine.register_fn("rank", |t: &mut ScriptTensor| t.0.shape().len() as INT);
    engine.register_fn("len", |t: &mut ScriptTensor| {
        t.0.shape().first().copied().unwrap_or(1) as INT
    });
    engine.register_fn("to_array", |t: &mut ScriptTensor| to_array(&t.0));
    engine.register_fn("item", |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        if t.0.numel() != 1 {
            return Err(script_err(format!(
                "item: tensor of shape {} has {} elements, not one",
                fmt_shape(t.0.shape()),
                t.0.numel()
            )));
        }
        Ok(t.0.to_f32_vec()[0] as FLOAT)
    });
    engine.register_fn("to_string", |t: &mut ScriptTensor| t.to_string());
    engine.register_fn("to_debug", |t: &mut ScriptTensor| t.to_string());
    engine.register_indexer_get(|t: &mut ScriptTensor, i: INT| index_get(t, &[i]));
    engine.register_indexer_get(|t: &mut ScriptTensor, idx: Array| {
        index_get(t, &ints(&idx, "index")?)
    });
    engine.register_indexer_set(|t: &mut ScriptTensor, i: INT, v: Dynamic| index_set(t, &[i], v));
    engine.register_indexer_set(|t: &mut ScriptTensor, idx: Array, v: Dynamic| {
        index_set(t, &ints(&idx, "index")?, v)
    });

    // Conversion.
    engine.register_fn("reshape", |t: &mut ScriptTensor, shape: Array| {
        let shape = dims(&shape)?;
        t.0.as_ref().clone().reshape(&shape).map(ScriptTensor::new).script()
    });
    engine.register_fn("to_f32", |t: &mut ScriptTensor| ScriptTensor::new(map(&t.0, |x| x)));
    engine.register_fn("to_i32", |t: &mut ScriptTensor| {
        let v = t.0.to_f32_vec().iter().map(|&x| x as i32).collect();
        ScriptTensor::new(Tensor::i32(t.0.shape(), v).expect("same shape"))
    });

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
        engine.register_fn(name, move |a: ScriptTensor, b: ScriptTensor| broadcast(&a.0, &b.0, f));
        engine.register_fn(name, move |a: ScriptTensor, b: FLOAT| {
            Ok::<_, Box<rhai::EvalAltResult>>(ScriptTensor::new(map(&a.0, |x| f(x, b as f32))))
        });
        engine.register_fn(name, move |a: ScriptTensor, b: INT| {
            Ok::<_, Box<rhai::EvalAltResult>>(ScriptTensor::new(map(&a.0, |x| f(x, b as f32))))
        });
        engine.register_fn(name, move |a: FLOAT, b: ScriptTensor| {
            Ok::<_, Box<rhai::EvalAltResult>>(ScriptTensor::new(map(&b.0, |x| f(a as f32, x))))
        });
        engine.register_fn(name, move |a: INT, b: ScriptTensor| {
            Ok::<_, Box<rhai::EvalAltResult>>(ScriptTensor::new(map(&b.0, |x| f(a as f32, x))))
        });
    }
    engine.register_fn("-", |a: ScriptTensor| ScriptTensor::new(map(&a.0, |x| -x)));
    for (name, f) in [
        ("exp", f32::exp as fn(f32) -> f32),
        ("ln", f32::ln),
        ("sqrt", f32::sqrt),
        ("abs", f32::abs),
        ("relu", |x: f32| x.max(0.0)),
    ] {
        engine.register_fn(name, move |a: &mut ScriptTensor| ScriptTensor::new(map(&a.0, f)));
    }
    engine.register_fn("sum", |t: &mut ScriptTensor| {
        t.0.to_f32_vec().iter().map(|&x| x as f64).sum::<f64>()
    });
    engine.register_fn("mean", |t: &mut ScriptTensor| {
        let v = t.0.to_f32_vec();
        v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
    });
    engine.register_fn("max", |t: &mut ScriptTensor| {
        t.0.to_f32_vec().into_iter().fold(f32::NEG_INFINITY, f32::max) as FLOAT
    });
    engine.register_fn("min", |t: &mut ScriptTensor| {
        t.0.to_f32_vec().into_iter().fold(f32::INFINITY, f32::min) as FLOAT
    });
    engine.register_fn("argmax", |t: &mut ScriptTensor| argmax(&t.0));
    engine.register_fn("sample", |t: &mut ScriptTensor, temperature: FLOAT, seed: INT| {
        sample(&t.0, temperature, seed)
    });
    engine.register_fn("sample", |t: &mut ScriptTensor, temperature: INT, seed: INT| {
        sample(&t.0, temperature as FLOAT, seed)
    });
    engine.register_fn("==", |a: ScriptTensor, b: ScriptTensor| a == b);
    engine.register_fn("!=", |a: ScriptTensor, b: ScriptTensor| a != b);
}

/// A script array of dimensions → shape.
pub fn dims(a: &Array) -> ScriptResult<Vec<usize>> {
    ints(a, "shape")?
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| script_err(format!("shape: negative dimension {d}")))
        })
        .collect()
}

fn ints(a: &Array, what: &str) -> ScriptResult<Vec<INT>> {
    a.iter()
        .map(|d| d.as_int().map_err(|t| script_err(format!("{what}: expected integers, got {t}"))))
        .collect()
}

pub fn shape_array(shape: &[usize]) -> Array {
    shape.iter().map(|&d| Dynamic::from(d as INT)).collect()
}

fn parse_dtype(s: &str) -> ScriptResult<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "i32" => Ok(DType::I32),
        _ => Err(script_err(format!("unknown dtype `{s}`: expected \"f32\" or \"i32\""))),
    }
}

fn number(d: &Dynamic) -> ScriptResult<f64> {
    if let Ok(i) = d.as_int() {
        Ok(i as f64)
    } else if let Ok(f) = d.as_float() {
        Ok(f)
    } else if let Ok(b) = d.as_bool() {
        Ok(b as u8 as f64)
    } else {
        Err(script_err(format!("tensor elements must be numbers, got {}", d.type_name())))
    }
}

/// A nested array (rectangular) into a tensor.
fn from_array(ctx: &Ctx, a: &Array, dtype: DType) -> ScriptResult<ScriptTensor> {
    let mut shape = Vec::new();
    let mut flat = Vec::new();
    flatten(a, 0, &mut shape, &mut flat)?;
    ctx.sandbox.check_alloc(&shape).script()?;
    let data = match dtype {
        DType::F32 => TensorData::F32(flat.iter().map(|&x| x as f32).collect()),
        DType::I32 => TensorData::I32(flat.iter().map(|&x| x as i32).collect()),
    };
    Tensor::new(&shape, data).map(ScriptTensor::new).script()
}

/// Walk a nested array depth-first, recording the shape at first visit and checking it after.
fn flatten(
    a: &Array,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<f64>,
) -> ScriptResult<()> {
    if depth > 16 {
        return Err(script_err("tensor: arrays nested more than 16 deep"));
    }
    if shape.len() == depth {
        shape.push(a.len());
    } else if shape[depth] != a.len() {
        return Err(script_err(format!(
            "tensor: ragged array: rows of length {} and {} at depth {depth}",
            shape[depth],
            a.len()
        )));
    }
    let nested = a.first().is_some_and(|d| d.is_array());
    for d in a {
        match (nested, d.is_array()) {
            (true, true) => {
                let inner = d.read_lock::<Array>().expect("is an array");
                flatten(&inner, depth + 1, shape, out)?;
            }
            (false, false) => out.push(number(d)?),
            _ => return Err(script_err("tensor: mixed numbers and arrays at one depth")),
        }
    }
    if !nested && shape.len() > depth + 1 {
        return Err(script_err("tensor: ragged array"));
    }
    Ok(())
}

fn from_range(ctx: &Ctx, start: INT, end: INT) -> ScriptResult<ScriptTensor> {
    let n = usize::try_from(end.saturating_sub(start)).unwrap_or(0);
    ctx.sandbox.check_alloc(&[n]).script()?;
    let v = (0..n).map(|i| (start + i as INT) as f32).collect();
    Tensor::f32(&[n], v).map(ScriptTensor::new).script()
}

fn filled(ctx: &Ctx, shape: &Array, v: FLOAT) -> ScriptResult<ScriptTensor> {
    let shape = dims(shape)?;
    let n = ctx.sandbox.check_alloc(&shape).script()?;
    Tensor::f32(&shape, vec![v as f32; n]).map(ScriptTensor::new).script()
}

fn random(
    ctx: &Ctx,
    shape: &Array,
    seed: INT,
    f: fn(&mut Rng) -> f64,
) -> ScriptResult<ScriptTensor> {
    let shape = dims(shape)?;
    let n = ctx.sandbox.check_alloc(&shape).script()?;
    let mut rng = Rng::new(seed as u64);
    let v = (0..n).map(|_| f(&mut rng) as f32).collect();
    Tensor::f32(&shape, v).map(ScriptTensor::new).script()
}

/// Elementwise map, keeping the shape; the result is f32.
fn map(t: &Tensor, f: impl Fn(f32) -> f32) -> Tensor {
    let v = t.to_f32_vec().into_iter().map(f).collect();
    Tensor::f32(t.shape(), v).expect("same shape")
}

/// Elementwise `f(a, b)` with NumPy broadcasting.
fn broadcast(a: &Tensor, b: &Tensor, f: fn(f32, f32) -> f32) -> ScriptResult<ScriptTensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let rank = sa.len().max(sb.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(sa), pad(sb));
    let mut out_shape = Vec::with_capacity(rank);
    for (&x, &y) in pa.iter().zip(&pb) {
        if x != y && x != 1 && y != 1 {
            return Err(script_err(format!(
                "cannot broadcast shapes {} and {}",
                fmt_shape(sa),
                fmt_shape(sb)
            )));
        }
        out_shape.push(if x == 1 { y } else { x });
    }
    let n = checked_numel(&out_shape).script()?;
    let strides = |p: &[usize]| -> Vec<usize> {
        let mut s = vec![0; rank];
        let mut acc = 1;
        for i in (0..rank).rev() {
            s[i] = if p[i] == 1 { 0 } else { acc };
            acc *= p[i];
        }
        s
    };
    let (st_a, st_b) = (strides(&pa), strides(&pb));
    let (va, vb) = (a.to_f32_vec(), b.to_f32_vec());
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; rank];
    for _ in 0..n {
        let ia: usize = idx.iter().zip(&st_a).map(|(i, s)| i * s).sum();
        let ib: usize = idx.iter().zip(&st_b).map(|(i, s)| i * s).sum();
        out.push(f(va[ia], vb[ib]));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Tensor::f32(&out_shape, out).map(ScriptTensor::new).script()
}

/// Index of the largest element along the last axis (i32, the last axis removed).
fn argmax(t: &Tensor) -> ScriptResult<ScriptTensor> {
    let Some((&d, lead)) = t.shape().split_last() else {
        return Err(script_err("argmax: tensor has no axes"));
    };
    if d == 0 {
        return Err(script_err("argmax: last axis is empty"));
    }
    let v = t.to_f32_vec();
    let out = v
        .chunks(d)
        .map(|row| {
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = i;
                }
            }
            best as i32
        })
        .collect();
    Tensor::i32(lead, out).map(ScriptTensor::new).script()
}

/// One index per row of the last axis, drawn from `softmax(logits / temperature)` (i32, the last
/// axis removed, like [`argmax`]). The draws come from an [`Rng`] seeded with `seed`, one uniform
/// number per row, so the same logits and seed give the same indices on every device.
/// Temperature 0 picks the largest logit (argmax); a logit of `-inf` is never drawn.
fn sample(t: &Tensor, temperature: FLOAT, seed: INT) -> ScriptResult<ScriptTensor> {
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(script_err(format!(
            "sample: temperature must be a finite number >= 0, got {temperature}"
        )));
    }
    if temperature == 0.0 {
        return argmax(t);
    }
    let Some((&d, lead)) = t.shape().split_last() else {
        return Err(script_err("sample: tensor has no axes"));
    };
    if d == 0 {
        return Err(script_err("sample: last axis is empty"));
    }
    let v = t.to_f32_vec();
    let mut rng = Rng::new(seed as u64);
    let mut out = Vec::with_capacity(v.len() / d);
    let mut weights = vec![0.0f64; d];
    for row in v.chunks(d) {
        let top = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        if row.iter().any(|x| x.is_nan()) || !top.is_finite() {
            return Err(script_err("sample: a row of logits is NaN, infinite or all -inf"));
        }
        let mut total = 0.0;
        for (w, &x) in weights.iter_mut().zip(row) {
            *w = ((x as f64 - top) / temperature).exp();
            total += *w;
        }
        // The first index whose running sum passes u * total; the largest logit has weight 1,
        // so total >= 1 and the fallback (rounding at the very end) is the last nonzero weight.
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
    Tensor::i32(lead, out).map(ScriptTensor::new).script()
}

fn flat_index(t: &Tensor, idx: &[INT]) -> ScriptResult<usize> {
    let shape = t.shape();
    if idx.len() != shape.len() {
        return Err(script_err(format!(
            "index of {} numbers into a tensor of shape {}",
            idx.len(),
            fmt_shape(shape)
        )));
    }
    let mut flat = 0usize;
    for (&i, &d) in idx.iter().zip(shape) {
        let i = if i < 0 { i + d as INT } else { i };
        if i < 0 || i as usize >= d {
            return Err(script_err(format!(
                "index {:?} is out of range for shape {}",
                idx,
                fmt_shape(shape)
            )));
        }
        flat = flat * d + i as usize;
    }
    Ok(flat)
}

/// `t[i]`: an element of a vector, or row `i` of a higher-rank tensor; `t[[i, j]]`: an element.
fn index_get(t: &mut ScriptTensor, idx: &[INT]) -> ScriptResult<Dynamic> {
    let shape = t.0.shape();
    if idx.len() == 1 && shape.len() > 1 {
        let d = shape[0];
        let i = if idx[0] < 0 { idx[0] + d as INT } else { idx[0] };
        if i < 0 || i as usize >= d {
            return Err(script_err(format!(
                "row {} is out of range for shape {}",
                idx[0],
                fmt_shape(shape)
            )));
        }
        let row: usize = shape[1..].iter().product();
        let (lo, hi) = (i as usize * row, (i as usize + 1) * row);
        let data = match t.0.data() {
            TensorData::F32(v) => TensorData::F32(v[lo..hi].to_vec()),
            TensorData::I32(v) => TensorData::I32(v[lo..hi].to_vec()),
        };
        let sub = Tensor::new(&shape[1..], data).script()?;
        return Ok(Dynamic::from(ScriptTensor::new(sub)));
    }
    let i = flat_index(&t.0, idx)?;
    Ok(match t.0.data() {
        TensorData::F32(v) => Dynamic::from_float(v[i] as FLOAT),
        TensorData::I32(v) => Dynamic::from_int(v[i] as INT),
    })
}

fn index_set(t: &mut ScriptTensor, idx: &[INT], v: Dynamic) -> ScriptResult<()> {
    let i = flat_index(&t.0, idx)?;
    let x = number(&v)?;
    let t = Rc::make_mut(&mut t.0);
    match t.as_f32_mut() {
        Some(d) => d[i] = x as f32,
        None => {
            let mut v = t.as_i32().expect("i32 when not f32").to_vec();
            v[i] = x as i32;
            *t = Tensor::i32(t.shape(), v).script()?;
        }
    }
    Ok(())
}

/// Nested arrays of the elements (floats for f32, integers for i32).
pub fn to_array(t: &Tensor) -> Dynamic {
    fn build(t: &Tensor, shape: &[usize], offset: usize) -> Dynamic {
        match shape.split_first() {
            None => match t.data() {
                TensorData::F32(v) => Dynamic::from_float(v[offset] as FLOAT),
                TensorData::I32(v) => Dynamic::from_int(v[offset] as INT),
            },
            Some((&d, rest)) => {
                let row: usize = rest.iter().product();
                let a: Array = (0..d).map(|i| build(t, rest, offset + i * row)).collect();
                Dynamic::from_array(a)
            }
        }
    }
    build(t, t.shape(), 0)
}

impl fmt::Display for ScriptTensor {
    /// `tensor f32[2, 2] [[1, 2], [3, 4]]`, long axes elided with `...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn rows(t: &Tensor, shape: &[usize], offset: usize, out: &mut String) {
            match shape.split_first() {
                None => match t.data() {
                    TensorData::F32(v) => out.push_str(&format!("{}", v[offset])),
                    TensorData::I32(v) => out.push_str(&v[offset].to_string()),
                },
                Some((&d, rest)) => {
                    let row: usize = rest.iter().product();
                    out.push('[');
                    for i in 0..d {
                        if d > 8 && i == 3 {
                            out.push_str("..., ");
                        }
                        if d > 8 && (3..d - 3).contains(&i) {
                            continue;
                        }
                        rows(t, rest, offset + i * row, out);
                        if i + 1 < d {
                            out.push_str(", ");
                        }
                    }
                    out.push(']');
                }
            }
        }
        let t = self.tensor();
        let mut s = String::new();
        if t.numel() > 0 || t.shape().is_empty() {
            rows(t, t.shape(), 0, &mut s);
        } else {
            s.push_str("[]");
        }
        write!(f, "tensor {}{} {}", t.dtype(), fmt_shape(t.shape()), s)
    }
}
