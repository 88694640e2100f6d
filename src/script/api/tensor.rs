//! Tensors in scripts: the `Tensor` type, built from arrays, ranges and shapes, inspected
//! (shape, dtype, elements, `to_array`), indexed and converted; arithmetic and reductions are in
//! [`super::math`]. Every tensor a binding creates is charged to the session's memory budget before it is allocated,
//! and holds that charge until the last script value sharing it is dropped.

use super::super::convert::{
    not_finite, script_err, to_f32, to_i32, to_u64, IntoScript, ScriptResult,
};
use super::super::Ctx;
use crate::dsl::lower::MAX_DIM;
use crate::memory::{Budget, Charge};
use crate::num;
use crate::rng::Rng;
use crate::tensor::{checked_numel, fmt_shape, DType, Tensor, TensorData};
use rhai::{Array, Dynamic, Engine, FLOAT, INT};
use std::fmt;
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;

/// A tensor as scripts hold it: cheap to copy (scripts copy values freely), copied on write,
/// charged to the memory budget for as long as any copy is alive.
#[derive(Clone, Debug)]
pub struct ScriptTensor(Arc<Held>);

#[derive(Debug)]
struct Held {
    tensor: Tensor,
    _charge: Charge,
}

/// A script's `==`: the same shape and equal elements compared as numbers, whatever the dtypes
/// (as `torch.equal`: `zeros([3]) == tensor([0, 0, 0], "i32")`); an f32 and an i32 element
/// compare exactly (both widen to f64), and a NaN equals nothing.
impl PartialEq for ScriptTensor {
    fn eq(&self, other: &ScriptTensor) -> bool {
        use TensorData::{F32, I32};
        let (a, b) = (self.tensor(), other.tensor());
        a.shape() == b.shape()
            && match (a.data(), b.data()) {
                (F32(x), F32(y)) => x == y,
                (I32(x), I32(y)) => x == y,
                (F32(x), I32(y)) | (I32(y), F32(x)) => {
                    x.iter().zip(y).all(|(&f, &i)| f64::from(f) == f64::from(i))
                }
            }
    }
}

impl ScriptTensor {
    /// A tensor whose bytes `charge` covers: [`held_bytes`] of its shape, charged before the
    /// tensor was allocated.
    pub fn new(tensor: Tensor, charge: Charge) -> ScriptTensor {
        ScriptTensor(Arc::new(Held { tensor, _charge: charge }))
    }

    /// Whether `other` is this tensor, not a copy of it.
    pub fn same(&self, other: &ScriptTensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Charge an existing tensor (one allocated under a charge of its own that ends now, such
    /// as a model's output) to `budget`.
    pub fn adopt(budget: &Budget, tensor: Tensor) -> crate::Result<ScriptTensor> {
        let charge = budget.charge(held_bytes(tensor.shape()), what(tensor.shape()))?;
        Ok(ScriptTensor::new(tensor, charge))
    }

    pub fn tensor(&self) -> &Tensor {
        &self.0.tensor
    }
}

/// The bytes a script tensor of `shape` holds, what its charge covers: its elements, and
/// besides them the shared block (reference counts, the tensor's vectors, its charge), its
/// shape's buffer, and a heap block's rounding for each of those three allocations. A script
/// that makes millions of small tensors (the batches of a large data set at batch size 1) is
/// charged what they really take, not 4 bytes each.
pub fn held_bytes(shape: &[usize]) -> u64 {
    let numel = shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
    let header = (2 * std::mem::size_of::<usize>() + std::mem::size_of::<Held>()) as u64;
    numel.saturating_mul(4).saturating_add(header + 3 * HEAP_BLOCK + 8 * shape.len() as u64)
}

/// How a tensor is named in an over-budget error.
pub(super) fn what(shape: &[usize]) -> String {
    format!("a tensor of shape {}", fmt_shape(shape))
}

/// Charge a tensor of `shape` to the budget, then build its elements with `fill` (given the
/// element count).
pub(super) fn alloc(
    ctx: &Ctx,
    shape: &[usize],
    fill: impl FnOnce(usize) -> ScriptResult<TensorData>,
) -> ScriptResult<ScriptTensor> {
    let n = checked_shape(shape).script()?;
    let charge = ctx.budget.charge(held_bytes(shape), what(shape)).script()?;
    let t = Tensor::new(shape, fill(n)?).script()?;
    Ok(ScriptTensor::new(t, charge))
}

/// Largest dimension of a script tensor: the model language's limit ([`MAX_DIM`]), so every
/// script tensor has a shape a model could be given, and one whose element count is 0 (which
/// the element limit lets through at any size) cannot make `to_array` build 10^12 arrays.
pub const MAX_SCRIPT_DIM: u64 = MAX_DIM as u64;

/// The element count of a script tensor of `shape`, or an error when a dimension is over
/// [`MAX_SCRIPT_DIM`] or the shape over the element or rank limit ([`checked_numel`]).
pub fn checked_shape(shape: &[usize]) -> crate::Result<usize> {
    let n = checked_numel(shape)?;
    if let Some(&d) = shape.iter().find(|&&d| d as u64 > MAX_SCRIPT_DIM) {
        return Err(crate::Error::shape(format!(
            "shape {}: dimension {d} is over the limit of {MAX_SCRIPT_DIM} (2^31), the largest the model language accepts",
            fmt_shape(shape)
        )));
    }
    Ok(n)
}

/// The smallest block a heap allocation takes, and the most an allocator rounds one up: what a
/// small object costs besides its own bytes, for charging many small objects honestly.
pub(super) const HEAP_BLOCK: u64 = 32;

/// Element `i` of a tensor as f64, which holds every f32 and every i32 exactly, without
/// copying the tensor: for comparisons and sums that must not round i32 elements through f32.
pub(super) fn reader(t: &Tensor) -> impl Fn(usize) -> f64 + '_ {
    let data = t.data();
    move |i| match data {
        TensorData::F32(v) => f64::from(v[i]),
        TensorData::I32(v) => f64::from(v[i]),
    }
}

/// A script number on its way into a tensor (an element, a fill value, an operand).
#[derive(Clone, Copy, Debug)]
pub(super) enum Number {
    Int(INT),
    Float(FLOAT),
    /// An infinity written on purpose, as the string `"inf"` or `"-inf"` (`negative`): a float
    /// that is infinite may be a literal that overflowed (1e400), so it is refused.
    Infinity {
        negative: bool,
    },
}

/// How a script writes an infinity into a tensor, for messages.
const INFINITY_HINT: &str = "write an infinity on purpose as the string \"inf\" or \"-inf\"";

impl Number {
    /// A script number (or a boolean, as 0 or 1, or the string `"inf"` or `"-inf"`).
    pub(super) fn of(d: &Dynamic) -> ScriptResult<Number> {
        if let Ok(i) = d.as_int() {
            Ok(Number::Int(i))
        } else if let Ok(f) = d.as_float() {
            Ok(Number::Float(f))
        } else if let Ok(b) = d.as_bool() {
            Ok(Number::Int(INT::from(b)))
        } else if let Some(s) = d.read_lock::<rhai::ImmutableString>() {
            Number::infinity(&s).ok_or_else(|| {
                script_err(format!(
                    "tensor elements must be numbers, got the string {:?} (the only strings taken are \"inf\" and \"-inf\", for an infinity)",
                    s.as_str()
                ))
            })
        } else {
            Err(not_a_number(d))
        }
    }

    /// The infinity a string names: `"inf"` (or `"+inf"`) or `"-inf"`.
    pub(super) fn infinity(s: &str) -> Option<Number> {
        match s {
            "inf" | "+inf" => Some(Number::Infinity { negative: false }),
            "-inf" => Some(Number::Infinity { negative: true }),
            _ => None,
        }
    }

    /// The number as f32: the one conversion every script number going into an f32 tensor
    /// takes. An integer must have an exact f32 value (every integer up to 2^24 has; beyond,
    /// f32 skips some, and 16777217 would silently become 16777216); a float goes through
    /// [`to_f32`]: it must be finite (a literal beyond f64's range, such as 1e400, reads as
    /// infinity) and within f32's range, and rounds to the nearest f32, as every float does;
    /// an infinity written as a string is one. `what` starts the error.
    pub(super) fn f32(self, what: &str) -> ScriptResult<f32> {
        match self {
            Number::Int(i) => num::f32_of_int(i).map_err(|m| {
                script_err(format!(
                    "{what}: {m}: make the tensor \"i32\", or write the number as a float to accept rounding"
                ))
            }),
            Number::Float(v) => to_f32(v, what),
            Number::Infinity { negative: false } => Ok(f32::INFINITY),
            Number::Infinity { negative: true } => Ok(f32::NEG_INFINITY),
        }
    }

    /// [`Number::f32`] of a value a script writes into a tensor (an element, `full`'s value),
    /// where an infinity is written as a string: the error for a float that is infinite says so.
    pub(super) fn stored_f32(self, what: &str) -> ScriptResult<f32> {
        match self {
            Number::Float(v) if v.is_infinite() => {
                Err(script_err(format!("{what}: {}: {INFINITY_HINT}", not_finite(v))))
            }
            n => n.f32(what),
        }
    }

    /// The number as i32: a whole number in i32's range.
    pub(super) fn i32(self, what: &str) -> ScriptResult<i32> {
        match self {
            Number::Int(i) => to_i32(i, what),
            Number::Float(f) => num::i32_of(f).map_err(|m| script_err(format!("{what} {m}"))),
            Number::Infinity { negative } => {
                let v = if negative { f64::NEG_INFINITY } else { f64::INFINITY };
                num::i32_of(v).map_err(|m| script_err(format!("{what} {m}")))
            }
        }
    }
}

/// An error unless every element of `v` has an exact f32 value, for an i32 tensor used where
/// f32 is computed (`what` names the operation); an explicit `to_f32()` rounds instead.
pub(super) fn exact_in_f32(v: &[i32], what: &str) -> ScriptResult<()> {
    match v.iter().find_map(|&x| num::f32_of_int(x.into()).err()) {
        None => Ok(()),
        Some(m) => Err(script_err(format!(
            "{what}: the i32 element {m}: keep the computation in i32 (integers), or convert with to_f32(), which rounds"
        ))),
    }
}

/// Register the `Tensor` type and its functions.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    engine.register_type_with_name::<ScriptTensor>("Tensor");

    // Construction.
    let c = ctx.clone();
    engine.register_fn("tensor", move |a: Array| from_array(&c, &a, DType::F32));
    let c = ctx.clone();
    engine.register_fn("tensor", move |a: Array, dtype: &str| {
        from_array(&c, &a, parse_dtype(dtype)?)
    });
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: Range<INT>| {
        from_range(&c, r.start, r.end.into(), DType::F32)
    });
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: RangeInclusive<INT>| {
        from_range(&c, *r.start(), i128::from(*r.end()) + 1, DType::F32)
    });
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: Range<INT>, dtype: &str| {
        from_range(&c, r.start, r.end.into(), parse_dtype(dtype)?)
    });
    let c = ctx.clone();
    engine.register_fn("tensor", move |r: RangeInclusive<INT>, dtype: &str| {
        from_range(&c, *r.start(), i128::from(*r.end()) + 1, parse_dtype(dtype)?)
    });
    let c = ctx.clone();
    engine.register_fn("zeros", move |shape: Array| filled(&c, &shape, 0.0));
    let c = ctx.clone();
    engine.register_fn("ones", move |shape: Array| filled(&c, &shape, 1.0));
    let c = ctx.clone();
    engine.register_fn("full", move |shape: Array, v: FLOAT| {
        filled(&c, &shape, Number::Float(v).stored_f32("full")?)
    });
    let c = ctx.clone();
    engine.register_fn("full", move |shape: Array, v: INT| {
        filled(&c, &shape, Number::Int(v).f32("full")?)
    });
    let c = ctx.clone();
    engine.register_fn("full", move |shape: Array, v: &str| {
        let n = Number::infinity(v).ok_or_else(|| {
            script_err(format!(
                "full: the value must be a number, or the string \"inf\" or \"-inf\" for an infinity, got the string {v:?}"
            ))
        })?;
        filled(&c, &shape, n.f32("full")?)
    });
    let c = ctx.clone();
    engine.register_fn("randn", move |shape: Array, seed: INT| {
        random(&c, &shape, seed, |r| r.normal() as f32)
    });
    let c = ctx.clone();
    engine.register_fn("rand", move |shape: Array, seed: INT| {
        random(&c, &shape, seed, Rng::uniform_f32)
    });

    // Inspection.
    super::read_only(
        engine,
        "Tensor",
        "shape",
        "use `t.reshape(shape)`",
        |t: &mut ScriptTensor| Ok(shape_array(t.tensor().shape())),
    );
    super::read_only(
        engine,
        "Tensor",
        "dtype",
        "use `t.to_f32()` or `t.to_i32()`",
        |t: &mut ScriptTensor| Ok(t.tensor().dtype().name().to_string()),
    );
    engine.register_fn("numel", |t: &mut ScriptTensor| t.tensor().numel() as INT);
    engine.register_fn("rank", |t: &mut ScriptTensor| t.tensor().shape().len() as INT);
    // A tensor of rank 0 has no first dimension: its `len` was 1, where NumPy and PyTorch
    // refuse (`numel()` counts its one element).
    engine.register_fn("len", |t: &mut ScriptTensor| -> ScriptResult<INT> {
        match t.tensor().shape().first() {
            Some(&n) => Ok(n as INT),
            None => Err(script_err(
                "len: a tensor of shape [] (rank 0) has no first dimension; numel() counts its element",
            )),
        }
    });
    let c = ctx.clone();
    engine.register_fn("to_array", move |t: &mut ScriptTensor| to_array(&c, t.tensor()));
    // A float, as the reductions are (every i32 is exact in f64).
    engine.register_fn("item", |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = t.tensor();
        if t.numel() != 1 {
            return Err(script_err(format!(
                "item: tensor of shape {} has {} elements, not one",
                fmt_shape(t.shape()),
                t.numel()
            )));
        }
        Ok(match t.data() {
            TensorData::F32(v) => v[0].into(),
            TensorData::I32(v) => v[0].into(),
        })
    });
    engine.register_fn("to_string", |t: &mut ScriptTensor| t.to_string());
    engine.register_fn("to_debug", |t: &mut ScriptTensor| t.to_string());
    let c = ctx.clone();
    engine.register_indexer_get(move |t: &mut ScriptTensor, i: INT| index_get(&c, t, &[i]));
    let c = ctx.clone();
    engine.register_indexer_get(move |t: &mut ScriptTensor, idx: Array| {
        index_get(&c, t, &ints(&idx, "index")?)
    });
    let c = ctx.clone();
    engine.register_indexer_set(move |t: &mut ScriptTensor, i: INT, v: Dynamic| {
        index_set(&c, t, &[i], v)
    });
    let c = ctx.clone();
    engine.register_indexer_set(move |t: &mut ScriptTensor, idx: Array, v: Dynamic| {
        index_set(&c, t, &ints(&idx, "index")?, v)
    });

    // Conversion.
    let c = ctx.clone();
    engine.register_fn("reshape", move |t: &mut ScriptTensor, shape: Array| {
        let t = t.tensor();
        let shape = reshape_dims(&shape, t.shape())?;
        if checked_shape(&shape).script()? != t.numel() {
            return Err(script_err(format!(
                "cannot reshape {} into {}",
                fmt_shape(t.shape()),
                fmt_shape(&shape)
            )));
        }
        alloc(&c, &shape, |_| Ok(t.data().clone()))
    });
    let c = ctx.clone();
    engine.register_fn("to_f32", move |t: &mut ScriptTensor| {
        // An explicit conversion: i32 elements beyond 2^24 round to the nearest f32, as
        // NumPy's `astype` rounds (implicit conversions refuse them instead).
        let t = t.tensor();
        alloc(&c, t.shape(), |_| {
            Ok(match t.data() {
                TensorData::F32(v) => TensorData::F32(v.clone()),
                TensorData::I32(v) => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            })
        })
    });
    let c = ctx.clone();
    engine.register_fn("to_i32", move |t: &mut ScriptTensor| {
        // Rounds toward zero, like `as` and NumPy's `astype`; NaN, infinities and numbers
        // outside i32's range are errors.
        let t = t.tensor();
        let whole = |x: f32| {
            num::i32_of(f64::from(x.trunc())).map_err(|m| script_err(format!("to_i32: {m}")))
        };
        alloc(&c, t.shape(), |n| {
            Ok(TensorData::I32(match t.data() {
                TensorData::F32(v) => {
                    // Filled to the element count charged, never grown past it.
                    let mut out = Vec::with_capacity(n);
                    for &x in v {
                        out.push(whole(x)?);
                    }
                    out
                }
                TensorData::I32(v) => v.clone(),
            }))
        })
    });
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

/// The shape `t.reshape(a)` asks for, of a tensor of shape `from`: one `-1` entry is inferred
/// from the element count, as in the model language and PyTorch.
fn reshape_dims(a: &Array, from: &[usize]) -> ScriptResult<Vec<usize>> {
    let asked = ints(a, "reshape")?;
    let written = || {
        let dims: Vec<String> = asked.iter().map(ToString::to_string).collect();
        format!("[{}]", dims.join(", "))
    };
    let mut out = Vec::with_capacity(asked.len());
    let mut infer = None;
    for (k, &d) in asked.iter().enumerate() {
        match d {
            -1 if infer.is_some() => {
                return Err(script_err(format!(
                    "reshape: {} has more than one -1; only one dimension can be inferred",
                    written()
                )))
            }
            -1 => {
                infer = Some(k);
                out.push(1);
            }
            _ => out.push(usize::try_from(d).map_err(|_| {
                script_err(format!(
                    "reshape: dimension {d} of {} is negative; only -1 (one dimension inferred from the element count) is allowed",
                    written()
                ))
            })?),
        }
    }
    let Some(k) = infer else { return Ok(out) };
    let known = checked_shape(&out).script()?;
    let n: usize = from.iter().product();
    if known == 0 || !n.is_multiple_of(known) {
        let why = if known == 0 {
            "the other dimensions hold 0 elements, so -1 could be any size".to_string()
        } else {
            format!("{n} is not a multiple of {known}, the product of the other dimensions")
        };
        return Err(script_err(format!(
            "cannot reshape {} ({n} elements) into {}: {why}",
            fmt_shape(from),
            written()
        )));
    }
    out[k] = n / known;
    Ok(out)
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

/// A script number (or boolean, as 0 or 1, or `"inf"` or `"-inf"`) as an f32 element, checked
/// ([`Number::stored_f32`]).
fn f32_element(d: &Dynamic) -> ScriptResult<f32> {
    Number::of(d)?.stored_f32("tensor element")
}

/// A script number (or boolean) as an i32 element: a whole number in i32's range.
fn i32_element(d: &Dynamic) -> ScriptResult<i32> {
    Number::of(d)?.i32("tensor element")
}

fn not_a_number(d: &Dynamic) -> Box<rhai::EvalAltResult> {
    script_err(format!("tensor elements must be numbers, got {}", super::type_name(d)))
}

/// A nested array (rectangular) into a tensor: one walk checks it and finds its shape, the
/// tensor is charged, a second walk fills it.
fn from_array(ctx: &Ctx, a: &Array, dtype: DType) -> ScriptResult<ScriptTensor> {
    let mut shape = Vec::new();
    walk(a, 0, &mut shape, &mut |d| Number::of(d).map(drop))?;
    alloc(ctx, &shape, |n| {
        let mut shape = Vec::new();
        Ok(match dtype {
            DType::F32 => {
                let mut v = Vec::with_capacity(n);
                walk(a, 0, &mut shape, &mut |d| {
                    v.push(f32_element(d)?);
                    Ok(())
                })?;
                TensorData::F32(v)
            }
            DType::I32 => {
                let mut v = Vec::with_capacity(n);
                walk(a, 0, &mut shape, &mut |d| {
                    v.push(i32_element(d)?);
                    Ok(())
                })?;
                TensorData::I32(v)
            }
        })
    })
}

/// Walk a nested array depth-first, recording the shape at first visit and checking it after,
/// calling `leaf` on every element.
fn walk(
    a: &Array,
    depth: usize,
    shape: &mut Vec<usize>,
    leaf: &mut dyn FnMut(&Dynamic) -> ScriptResult<()>,
) -> ScriptResult<()> {
    // As deep as a tensor has dimensions: `to_array` of any tensor reads back (the bound was
    // "more than 16", checked one level late, and `to_array` gives up to 32).
    if depth >= crate::tensor::MAX_RANK {
        return Err(script_err(format!(
            "tensor: arrays nested more than {} deep, the most dimensions a tensor has",
            crate::tensor::MAX_RANK
        )));
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
                walk(&inner, depth + 1, shape, leaf)?;
            }
            (false, false) => leaf(d)?,
            _ => return Err(script_err("tensor: mixed numbers and arrays at one depth")),
        }
    }
    if !nested && shape.len() > depth + 1 {
        return Err(script_err("tensor: ragged array"));
    }
    Ok(())
}

/// `start..end` (`end` exclusive, wide enough for `..=i64::MAX`) as a vector of `dtype`; every
/// element is checked as a script integer written out would be ([`Number`]): once for the whole
/// range where both ends are within the range every element converts exactly (±2^24 for f32,
/// i32's range), else element by element, so the error names the first that does not.
fn from_range(ctx: &Ctx, start: INT, end: i128, dtype: DType) -> ScriptResult<ScriptTensor> {
    let n = (end - i128::from(start)).max(0); // an empty range is an empty tensor
    let n = usize::try_from(n)
        .map_err(|_| script_err(format!("tensor: a range of {n} elements is too long")))?;
    // Every element lies in i64's range: the range's ends do, and it holds no more than them.
    let at = |i: usize| (i128::from(start) + i as i128) as INT;
    let within = |lo: i128, hi: i128| {
        n == 0 || ((lo..=hi).contains(&i128::from(start)) && (lo..=hi).contains(&(end - 1)))
    };
    alloc(ctx, &[n], |n| {
        // Filled to the element count charged, never grown past it.
        Ok(match dtype {
            DType::F32 => {
                let exact = num::F32_EXACT as i128;
                let mut v = Vec::with_capacity(n);
                if within(-exact, exact) {
                    v.extend((0..n).map(|i| at(i) as f32));
                } else {
                    for i in 0..n {
                        v.push(Number::Int(at(i)).f32("tensor")?);
                    }
                }
                TensorData::F32(v)
            }
            DType::I32 => {
                let mut v = Vec::with_capacity(n);
                if within(i32::MIN.into(), i32::MAX.into()) {
                    v.extend((0..n).map(|i| at(i) as i32));
                } else {
                    for i in 0..n {
                        v.push(Number::Int(at(i)).i32("tensor: element")?);
                    }
                }
                TensorData::I32(v)
            }
        })
    })
}

fn filled(ctx: &Ctx, shape: &Array, v: f32) -> ScriptResult<ScriptTensor> {
    alloc(ctx, &dims(shape)?, |n| Ok(TensorData::F32(vec![v; n])))
}

fn random(
    ctx: &Ctx,
    shape: &Array,
    seed: INT,
    f: fn(&mut Rng) -> f32,
) -> ScriptResult<ScriptTensor> {
    let mut rng = Rng::new(to_u64(seed, "seed")?);
    alloc(ctx, &dims(shape)?, |n| Ok(TensorData::F32((0..n).map(|_| f(&mut rng)).collect())))
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
fn index_get(ctx: &Ctx, t: &mut ScriptTensor, idx: &[INT]) -> ScriptResult<Dynamic> {
    let t = t.tensor();
    let shape = t.shape();
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
        let sub = alloc(ctx, &shape[1..], |_| {
            Ok(match t.data() {
                TensorData::F32(v) => TensorData::F32(v[lo..hi].to_vec()),
                TensorData::I32(v) => TensorData::I32(v[lo..hi].to_vec()),
            })
        })?;
        return Ok(Dynamic::from(sub));
    }
    let i = flat_index(t, idx)?;
    Ok(match t.data() {
        TensorData::F32(v) => Dynamic::from_float(v[i] as FLOAT),
        TensorData::I32(v) => Dynamic::from_int(v[i] as INT),
    })
}

/// `t[..] = v`: the tensor is copied first when another script value shares it (the copy is
/// charged like any new tensor).
fn index_set(ctx: &Ctx, t: &mut ScriptTensor, idx: &[INT], v: Dynamic) -> ScriptResult<()> {
    if let ([i], true) = (idx, t.tensor().shape().len() > 1) {
        return row_set(ctx, t, *i, v);
    }
    let i = flat_index(t.tensor(), idx)?;
    let (xf, xi) = match t.tensor().dtype() {
        DType::F32 => (f32_element(&v)?, 0),
        DType::I32 => (0.0, i32_element(&v)?),
    };
    if Arc::get_mut(&mut t.0).is_none() {
        *t = alloc(ctx, t.tensor().shape(), |_| Ok(t.tensor().data().clone()))?;
    }
    let held = unshared(&mut t.0)?;
    if let Some(d) = held.tensor.as_f32_mut() {
        d[i] = xf;
    } else if let Some(d) = held.tensor.as_i32_mut() {
        d[i] = xi;
    }
    Ok(())
}

/// The tensor of a script value just copied for writing (the copy is this value's alone).
fn unshared(t: &mut Arc<Held>) -> ScriptResult<&mut Held> {
    Arc::get_mut(t)
        .ok_or_else(|| crate::err!(Invariant, "a tensor copied for writing is still shared"))
        .script()
}

/// `t[i] = row`: row `i` of a tensor of rank 2 or more, from a tensor of the row's shape and
/// dtype. rhai also writes a row back this way after a method call on it (`t[0].sum()`), so a
/// row equal to the one there changes nothing and copies nothing.
fn row_set(ctx: &Ctx, t: &mut ScriptTensor, i: INT, v: Dynamic) -> ScriptResult<()> {
    let (shape, dtype) = (t.tensor().shape().to_vec(), t.tensor().dtype());
    let d = shape[0];
    let r = if i < 0 { i + d as INT } else { i };
    if r < 0 || r as usize >= d {
        return Err(script_err(format!("row {i} is out of range for shape {}", fmt_shape(&shape))));
    }
    let (row_shape, r) = (&shape[1..], r as usize);
    let wrong = |got: String| {
        script_err(format!(
            "row {i} of a tensor {dtype}{} takes a tensor {dtype}{}, got {got}",
            fmt_shape(&shape),
            fmt_shape(row_shape)
        ))
    };
    let Some(row) = v.read_lock::<ScriptTensor>() else {
        return Err(wrong(super::type_name(&v).to_string()));
    };
    let row = row.tensor();
    if row.shape() != row_shape || row.dtype() != dtype {
        return Err(wrong(format!("{}{}", row.dtype(), fmt_shape(row.shape()))));
    }
    let len = row.numel();
    let span = r * len..(r + 1) * len;
    let same = match (t.tensor().data(), row.data()) {
        (TensorData::F32(a), TensorData::F32(b)) => {
            a[span.clone()].iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        (TensorData::I32(a), TensorData::I32(b)) => a[span.clone()] == b[..],
        _ => false,
    };
    if same {
        return Ok(());
    }
    if Arc::get_mut(&mut t.0).is_none() {
        *t = alloc(ctx, &shape, |_| Ok(t.tensor().data().clone()))?;
    }
    let held = unshared(&mut t.0)?;
    match (held.tensor.as_f32_mut(), row.data()) {
        (Some(a), TensorData::F32(b)) => a[span].copy_from_slice(b),
        _ => {
            if let (Some(a), TensorData::I32(b)) = (held.tensor.as_i32_mut(), row.data()) {
                a[span].copy_from_slice(b);
            }
        }
    }
    Ok(())
}

/// Nested arrays of the elements (floats for f32, integers for i32). What it builds is bounded
/// before it is built: every array entry it makes (each nested array and each number, counted
/// as rhai's own array size limit counts them) against the sandbox's array size limit, and
/// their bytes against the memory budget while they are built. For a shape `[d0, ..., dn-1]`
/// that is `d0 + d0·d1 + ... + d0···dn-1` entries, of which the last term are numbers: a tensor
/// with no elements can still make many arrays (`[10^6, 10^6, 0]` makes 10^12).
fn to_array(ctx: &Ctx, t: &Tensor) -> ScriptResult<Dynamic> {
    let shape = t.shape();
    // Partial products are at most the nonzero product, at most 2^40 ([`checked_numel`]),
    // so with at most 32 terms no sum overflows.
    let mut arrays = 0u64; // nested arrays: d0 + d0·d1 + ... + d0···dn-2
    let mut outer = 1u64;
    for &d in shape.iter().take(shape.len().saturating_sub(1)) {
        outer *= d as u64;
        arrays += outer;
    }
    let numbers = t.numel() as u64;
    let entries = arrays + numbers;
    let limit = ctx.sandbox.max_array_size as u64;
    if limit > 0 && entries > limit {
        return Err(crate::err!(
            Limit,
            "to_array: a tensor of shape {} makes {arrays} nested arrays and {numbers} numbers, {entries} array entries in all, over the array size limit of {limit}",
            fmt_shape(shape)
        ))
        .script();
    }
    // Each entry is a script value; each nested array also a boxed vector and its buffer.
    let value = std::mem::size_of::<Dynamic>() as u64;
    let array = std::mem::size_of::<Array>() as u64 + 2 * HEAP_BLOCK;
    let bytes = entries * value + arrays * array;
    let what = format!("to_array of a tensor of shape {}", fmt_shape(shape));
    let _building = ctx.budget.charge(bytes, what).script()?;
    Ok(nested(t))
}

/// Nested arrays of the elements (floats for f32, integers for i32).
fn nested(t: &Tensor) -> Dynamic {
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

/// The most elements a tensor's text shows; the rest are `...`, so printing a tensor of a
/// billion elements makes a line, not gigabytes.
pub const PRINTED_ELEMENTS: usize = 1000;

/// An f32 element as a tensor's text shows it: the shortest text that reads back as it, except
/// that a whole number shows all its digits (the shortest text of 2^31 is 2147483600, a number
/// the tensor does not hold: 2147483648), and one from 1e16 up or below 1e-5 an exponent (1e20,
/// not 100000000000000000000; 1e-30, not thirty zeros).
fn element(v: f32) -> String {
    let a = v.abs();
    if a != 0.0 && a.is_finite() && !(1e-5..1e16).contains(&a) {
        format!("{v:e}")
    } else if v.is_finite() && v.fract() == 0.0 {
        format!("{}", f64::from(v))
    } else {
        format!("{v}")
    }
}

impl fmt::Display for ScriptTensor {
    /// `tensor f32[2, 2] [[1, 2], [3, 4]]`: axes longer than 8 show their first and last 3
    /// entries around `...`, and after [`PRINTED_ELEMENTS`] elements the rest are `...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn rows(t: &Tensor, shape: &[usize], offset: usize, out: &mut String, left: &mut usize) {
            let Some((&d, rest)) = shape.split_first() else {
                *left = left.saturating_sub(1);
                match t.data() {
                    TensorData::F32(v) => out.push_str(&element(v[offset])),
                    TensorData::I32(v) => out.push_str(&v[offset].to_string()),
                }
                return;
            };
            let row: usize = rest.iter().product();
            let shown: Vec<usize> =
                if d > 8 { (0..3).chain(d - 3..d).collect() } else { (0..d).collect() };
            out.push('[');
            for (k, &i) in shown.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                // Cut off here: one `...` for the rest, the elided middle included.
                if *left == 0 {
                    out.push_str("...");
                    break;
                }
                if d > 8 && k == 3 {
                    out.push_str("..., ");
                }
                rows(t, rest, offset + i * row, out, left);
            }
            out.push(']');
        }
        let t = self.tensor();
        let mut s = String::new();
        if t.numel() > 0 || t.shape().is_empty() {
            rows(t, t.shape(), 0, &mut s, &mut PRINTED_ELEMENTS.clone());
        } else {
            s.push_str("[]");
        }
        write!(f, "tensor {}{} {}", t.dtype(), fmt_shape(t.shape()), s)
    }
}
