//! Arithmetic on script tensors, for data preparation: elementwise operators and functions with
//! NumPy broadcasting, reductions (`sum`, `mean`, `max`, `min`), `argmax`, and `sample` (seeded,
//! for generating text). NaN is never hidden: it propagates through `max` and `min` and counts
//! as the largest element for `argmax`. Numbers never silently lose precision, wrap or
//! saturate: i32 tensors with i32 tensors or integers compute in i32 under `+ - *`, `pow`,
//! `max`, `min` and `div_floor` (an overflow, or a division by zero, is an error); `/` is true
//! division, in f32, as in NumPy and PyTorch; reductions are floats, of i32 tensors exact (an
//! error past 2^53); and where an i32 tensor meets f32 (or a float) each element must have an
//! exact f32 value; `to_f32()` is the explicit, rounding conversion.

use super::super::convert::{script_err, to_u64, ScriptResult};
use super::super::Ctx;
use super::tensor::{alloc, exact_in_f32, reader, Number, ScriptTensor};
use crate::graph::scalar::Scalar;
use crate::rng::Rng;
use crate::tensor::{fmt_shape, Tensor, TensorData};
use rhai::{Engine, FLOAT, INT};
use std::sync::Arc;

/// An elementwise operator on two operands: its f32 form, for operands of which either is f32
/// (an f32 tensor, or a float), and its i32 form, for two i32 operands (an i32 tensor, or an
/// integer), which is exact or an error (a message fragment: an overflow, a division by zero),
/// never a wrapped or saturated result. An operator without an i32 form computes i32 operands
/// in f32 (`/` is true division, as in NumPy and PyTorch); one without an f32 form takes i32
/// operands only (`div_floor`).
#[derive(Clone, Copy)]
struct BinOp {
    name: &'static str,
    f: Option<fn(f32, f32) -> f32>,
    i: Option<IntOp>,
}

/// The exact i32 form of an operator: its result, or what stops it (a message fragment).
type IntOp = fn(i32, i32) -> Result<i32, String>;

/// `a op b` is outside i32's range.
fn overflow(a: i32, op: &str, b: i32) -> String {
    format!("{a} {op} {b} is outside i32's range ({}..={})", i32::MIN, i32::MAX)
}

const OPS: [BinOp; 8] = [
    BinOp {
        name: "+",
        f: Some(|a, b| a + b),
        i: Some(|a, b| a.checked_add(b).ok_or_else(|| overflow(a, "+", b))),
    },
    BinOp {
        name: "-",
        f: Some(|a, b| a - b),
        i: Some(|a, b| a.checked_sub(b).ok_or_else(|| overflow(a, "-", b))),
    },
    BinOp {
        name: "*",
        f: Some(|a, b| a * b),
        i: Some(|a, b| a.checked_mul(b).ok_or_else(|| overflow(a, "*", b))),
    },
    // True division, of i32 operands too (each must have an exact f32 value): `x / 255` of an
    // i32 tensor is a fraction, never silently 0 or 1.
    BinOp { name: "/", f: Some(|a, b| a / b), i: None },
    // Integer division, rounding toward negative infinity (Python's and NumPy's `//`).
    BinOp {
        name: "div_floor",
        f: None,
        i: Some(|a, b| {
            let q = div_floor(a.into(), b.into())?;
            i32::try_from(q).map_err(|_| {
                format!("div_floor({a}, {b}) is outside i32's range ({}..={})", i32::MIN, i32::MAX)
            })
        }),
    },
    BinOp {
        name: "pow",
        f: Some(f32::powf),
        i: Some(|a, b| {
            match u32::try_from(b) {
            Err(_) => Err(format!(
                "pow({a}, {b}) has a negative exponent, and no i32 value: convert with to_f32() first"
            )),
            Ok(e) => a.checked_pow(e).ok_or_else(|| {
                format!("pow({a}, {b}) is outside i32's range ({}..={})", i32::MIN, i32::MAX)
            }),
        }
        }),
    },
    // The graph's NaN-propagating forms (`f32::max` returns the other operand of a NaN).
    BinOp { name: "max", f: Some(Scalar::max_nan), i: Some(|a, b| Ok(a.max(b))) },
    BinOp { name: "min", f: Some(Scalar::min_nan), i: Some(|a, b| Ok(a.min(b))) },
];

/// `a` divided by `b`, rounded toward negative infinity (Python's `//`); an error fragment for
/// a division by zero, or for the one quotient outside i64 (`i64::MIN / -1`).
fn div_floor(a: i64, b: i64) -> Result<i64, String> {
    if b == 0 {
        return Err(format!("div_floor({a}, 0) divides by zero"));
    }
    let q = a.checked_div(b).ok_or_else(|| format!("div_floor({a}, {b}) overflows"))?;
    // Toward zero, then one down where the exact quotient is negative and not whole.
    Ok(if a % b != 0 && (a < 0) != (b < 0) { q - 1 } else { q })
}

/// `div_floor` and `pow` of two numbers, as the reference promises (`div_floor(-7, 2)` was
/// "function not found"): integers exactly in i64, rhai's integers (an overflow, a division by
/// zero or a negative integer exponent is an error), floats or a mix in f64. (`max` and `min`
/// of numbers are rhai's own.)
fn numbers(engine: &mut Engine) {
    let fail = |m: String| -> Box<rhai::EvalAltResult> { script_err(m) };
    engine.register_fn("div_floor", move |a: INT, b: INT| div_floor(a, b).map_err(fail));
    engine.register_fn("pow", move |a: INT, b: INT| -> ScriptResult<INT> {
        let e = u32::try_from(b).map_err(|_| {
            fail(format!("pow({a}, {b}): a negative or huge integer exponent; write pow({a}.0, {b}) for a float"))
        })?;
        a.checked_pow(e).ok_or_else(|| fail(format!("pow({a}, {b}) overflows a script integer")))
    });
    engine.register_fn("pow", |a: FLOAT, b: FLOAT| a.powf(b));
    engine.register_fn("pow", |a: INT, b: FLOAT| (a as FLOAT).powf(b));
    engine.register_fn("pow", |a: FLOAT, b: INT| match i32::try_from(b) {
        Ok(e) => a.powi(e),
        Err(_) => a.powf(b as FLOAT),
    });
}

/// One side of an elementwise operation.
#[derive(Clone, Copy)]
enum Operand<'a> {
    Tensor(&'a Tensor),
    Number(Number),
}

impl Operand<'_> {
    fn shape(&self) -> &[usize] {
        match self {
            Operand::Tensor(t) => t.shape(),
            Operand::Number(_) => &[],
        }
    }

    fn is_int(&self) -> bool {
        match self {
            Operand::Tensor(t) => t.as_i32().is_some(),
            Operand::Number(n) => matches!(n, Number::Int(_)),
        }
    }

    /// What the operand is, for messages.
    fn describe(&self) -> &'static str {
        match self {
            Operand::Tensor(t) if t.as_i32().is_some() => "an i32 tensor",
            Operand::Tensor(_) => "an f32 tensor",
            Operand::Number(Number::Int(_)) => "an integer",
            Operand::Number(_) => "a float",
        }
    }
}

/// An operand's elements as f32 (i32 elements checked to be exact first); a tensor of one
/// element is read as that element.
#[derive(Clone, Copy)]
enum F32s<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    One(f32),
}

impl F32s<'_> {
    /// The element count, or `None` for one element (any index reads it).
    fn len(self) -> Option<usize> {
        match self {
            F32s::F32(v) => Some(v.len()),
            F32s::I32(v) => Some(v.len()),
            F32s::One(_) => None,
        }
    }
}

/// An operand's elements as i32; a tensor of one element is read as that element.
#[derive(Clone, Copy)]
enum I32s<'a> {
    I32(&'a [i32]),
    One(i32),
}

impl I32s<'_> {
    /// The element count, or `None` for one element (any index reads it).
    fn len(self) -> Option<usize> {
        match self {
            I32s::I32(v) => Some(v.len()),
            I32s::One(_) => None,
        }
    }
}

/// `$body` with `$get` a closure reading element `k` of `$x` (an [`F32s`] or an [`I32s`]):
/// one copy of `$body` for each kind of operand, so the loops in it index a slice (or read a
/// constant) with no decision per element.
macro_rules! reading {
    (F32s: $x:expr, $get:ident => $body:expr) => {
        match $x {
            F32s::F32(v) => {
                let $get = |k: usize| v[k];
                $body
            }
            F32s::I32(v) => {
                let $get = |k: usize| v[k] as f32;
                $body
            }
            F32s::One(x) => {
                let $get = |_: usize| x;
                $body
            }
        }
    };
    (I32s: $x:expr, $get:ident => $body:expr) => {
        match $x {
            I32s::I32(v) => {
                let $get = |k: usize| v[k];
                $body
            }
            I32s::One(x) => {
                let $get = |_: usize| x;
                $body
            }
        }
    };
}

/// `x` read as f32 for operation `name`: an integer or i32 element f32 cannot hold exactly,
/// or a number that is not a finite f32, is an error ([`Number::f32`], [`exact_in_f32`]).
fn f32s<'a>(x: Operand<'a>, name: &str) -> ScriptResult<F32s<'a>> {
    let what = format!("`{name}`");
    Ok(match x {
        Operand::Tensor(t) => match t.data() {
            TensorData::F32(v) if v.len() == 1 => F32s::One(v[0]),
            TensorData::F32(v) => F32s::F32(v),
            TensorData::I32(v) => {
                exact_in_f32(v, &what)?;
                match v[..] {
                    [x] => F32s::One(x as f32),
                    _ => F32s::I32(v),
                }
            }
        },
        Operand::Number(n) => F32s::One(n.f32(&what)?),
    })
}

/// `x` (an i32 tensor or an integer) read as i32 for operation `name`.
fn i32s<'a>(x: Operand<'a>, name: &str) -> ScriptResult<I32s<'a>> {
    Ok(match x {
        Operand::Tensor(t) => match t.as_i32().unwrap_or_default() {
            &[x] => I32s::One(x),
            v => I32s::I32(v),
        },
        Operand::Number(n) => I32s::One(n.i32(&format!("`{name}`:"))?),
    })
}

/// Register the operators and functions on `Tensor`.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    // Arithmetic: i32 with i32 (or an integer) stays i32, exactly, under every operator with an
    // i32 form (all but `/`, true division); anything with f32 (or a float) is f32.
    for op in OPS {
        let c = ctx.clone();
        engine.register_fn(op.name, move |a: ScriptTensor, b: ScriptTensor| {
            binary(&c, op, Operand::Tensor(a.tensor()), Operand::Tensor(b.tensor()))
        });
        let c = ctx.clone();
        engine.register_fn(op.name, move |a: ScriptTensor, b: FLOAT| {
            binary(&c, op, Operand::Tensor(a.tensor()), Operand::Number(Number::Float(b)))
        });
        let c = ctx.clone();
        engine.register_fn(op.name, move |a: ScriptTensor, b: INT| {
            binary(&c, op, Operand::Tensor(a.tensor()), Operand::Number(Number::Int(b)))
        });
        let c = ctx.clone();
        engine.register_fn(op.name, move |a: FLOAT, b: ScriptTensor| {
            binary(&c, op, Operand::Number(Number::Float(a)), Operand::Tensor(b.tensor()))
        });
        let c = ctx.clone();
        engine.register_fn(op.name, move |a: INT, b: ScriptTensor| {
            binary(&c, op, Operand::Number(Number::Int(a)), Operand::Tensor(b.tensor()))
        });
    }
    numbers(engine);
    let c = ctx.clone();
    engine.register_fn("-", move |a: ScriptTensor| {
        let neg = |x: i32| x.checked_neg().ok_or_else(|| format!("-({x}) is outside i32's range"));
        unary(&c, "-", a.tensor(), |x| -x, Some(neg))
    });
    for (name, f) in [("exp", f32::exp as fn(f32) -> f32), ("ln", f32::ln), ("sqrt", f32::sqrt)] {
        let c = ctx.clone();
        engine.register_fn(name, move |a: &mut ScriptTensor| unary(&c, name, a.tensor(), f, None));
    }
    let c = ctx.clone();
    engine.register_fn("abs", move |a: &mut ScriptTensor| {
        let abs =
            |x: i32| x.checked_abs().ok_or_else(|| format!("abs({x}) is outside i32's range"));
        unary(&c, "abs", a.tensor(), f32::abs, Some(abs))
    });
    let c = ctx.clone();
    engine.register_fn("relu", move |a: &mut ScriptTensor| {
        unary(&c, "relu", a.tensor(), |x| x.max_nan(0.0), Some(|x: i32| Ok(x.max(0))))
    });
    // Reductions are floats, so `correct.sum() / n` divides as floats: of an i32 tensor
    // computed exactly (an error past 2^53, where f64 stops holding every integer), of an f32
    // tensor summed in f64.
    engine.register_fn("sum", |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        match t.tensor().data() {
            TensorData::I32(v) => exact_float(int_sum(v), "sum"),
            TensorData::F32(v) => Ok(v.iter().map(|&x| f64::from(x)).sum()),
        }
    });
    engine.register_fn("mean", |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "mean")?;
        let total = match t.data() {
            TensorData::I32(v) => int_sum(v) as f64,
            TensorData::F32(v) => v.iter().map(|&x| f64::from(x)).sum(),
        };
        Ok(total / t.numel() as f64)
    });
    // NaN anywhere makes the largest and smallest element NaN (as in NumPy and PyTorch), not
    // the largest of the other elements. Every i32 is exact in f64.
    engine.register_fn("max", move |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "max")?;
        Ok(match t.data() {
            TensorData::I32(v) => v.iter().copied().max().unwrap_or(0).into(),
            TensorData::F32(v) => v.iter().copied().fold(f32::NEG_INFINITY, Scalar::max_nan).into(),
        })
    });
    engine.register_fn("min", move |t: &mut ScriptTensor| -> ScriptResult<FLOAT> {
        let t = nonempty(t.tensor(), "min")?;
        Ok(match t.data() {
            TensorData::I32(v) => v.iter().copied().min().unwrap_or(0).into(),
            TensorData::F32(v) => v.iter().copied().fold(f32::INFINITY, Scalar::min_nan).into(),
        })
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

/// The exact sum of i32 elements: in i64 over runs of 2^32 elements (which no run can
/// overflow: 2^32 · 2^31 = 2^63), the runs in i128.
fn int_sum(v: &[i32]) -> i128 {
    v.chunks(1 << 32).map(|run| i128::from(run.iter().map(|&x| i64::from(x)).sum::<i64>())).sum()
}

/// The largest integer below which f64 holds every integer exactly (2^53).
const F64_EXACT: i128 = 1 << 53;

/// An exact integer result of `what` as a script float: an error beyond ±2^53, where f64
/// holds only some integers and the value would silently round.
fn exact_float(v: i128, what: &str) -> ScriptResult<FLOAT> {
    if v.abs() > F64_EXACT {
        return Err(script_err(format!(
            "{what}: the exact result {v} is beyond 2^53 = {F64_EXACT}, past which a float (f64) does not hold every integer: reduce smaller parts of the tensor, or convert with to_f32() first to accept rounding"
        )));
    }
    Ok(v as FLOAT)
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

/// Elementwise `f` of one tensor, keeping its shape: an i32 tensor stays i32 where the function
/// has an exact i32 form `i` (an error where it has no i32 result), and is read as f32 (each
/// element checked exact) where it has none; an f32 tensor stays f32.
fn unary(
    ctx: &Ctx,
    name: &str,
    t: &Tensor,
    f: fn(f32) -> f32,
    i: Option<fn(i32) -> Result<i32, String>>,
) -> ScriptResult<ScriptTensor> {
    match (t.data(), i) {
        (TensorData::I32(v), Some(i)) => alloc(ctx, t.shape(), |n| {
            let on_i32 = |m: String| script_err(format!("`{name}` on an i32 tensor: {m}"));
            // Filled to the element count charged, never grown past it.
            let mut out = Vec::with_capacity(n);
            for &x in v {
                out.push(i(x).map_err(on_i32)?);
            }
            Ok(TensorData::I32(out))
        }),
        _ => {
            let x = f32s(Operand::Tensor(t), name)?;
            alloc(ctx, t.shape(), |n| {
                Ok(TensorData::F32(reading!(F32s: x, get => (0..n).map(|k| f(get(k))).collect())))
            })
        }
    }
}

/// Elementwise `a op b` with NumPy broadcasting (a number is a tensor of shape `[]`): i32 when
/// both operands are i32 (an i32 tensor or an integer) and the operator has an exact i32 form;
/// f32 otherwise.
fn binary(ctx: &Ctx, op: BinOp, a: Operand, b: Operand) -> ScriptResult<ScriptTensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let out_shape = crate::graph::shape::broadcast_shapes(sa, sb).ok_or_else(|| {
        script_err(format!("cannot broadcast shapes {} and {}", fmt_shape(sa), fmt_shape(sb)))
    })?;
    // Operands of the result's element count (the same shape, but for leading or inner axes
    // of 1) or of one element (a number, or a tensor like `[1]`) are read by the result's flat
    // index in one loop; the others broadcast through `Pairs`.
    let pairs = |n: usize, lens: [Option<usize>; 2]| {
        let flat = lens.iter().all(|l| l.is_none_or(|l| l == n));
        (!flat).then(|| Pairs::new(sa, sb, &out_shape))
    };
    if let (true, Some(i)) = (a.is_int() && b.is_int(), op.i) {
        let (ga, gb) = (i32s(a, op.name)?, i32s(b, op.name)?);
        let on_i32 = |m: String| script_err(format!("`{}` on i32 tensors: {m}", op.name));
        return alloc(ctx, &out_shape, |n| {
            let pairs = pairs(n, [ga.len(), gb.len()]);
            let out = reading!(I32s: ga, x => reading!(I32s: gb, y => {
                each(n, pairs, x, y, |x, y| i(x, y).map_err(on_i32))?
            }));
            Ok(TensorData::I32(out))
        });
    }
    let Some(f) = op.f else {
        return Err(script_err(format!(
            "`{}` divides integers: it takes i32 tensors and integers, got {} and {}; convert an f32 tensor with to_i32() (which rounds toward zero) first, or use `/` for true division",
            op.name,
            a.describe(),
            b.describe()
        )));
    };
    let (ga, gb) = (f32s(a, op.name)?, f32s(b, op.name)?);
    alloc(ctx, &out_shape, |n| {
        let pairs = pairs(n, [ga.len(), gb.len()]);
        let out = reading!(F32s: ga, x => reading!(F32s: gb, y => {
            each(n, pairs, x, y, |x, y| Ok(f(x, y)))?
        }));
        Ok(TensorData::F32(out))
    })
}

/// The `n` results of `f` on the elements of two operands read by `a` and `b`: at the same flat
/// index when `pairs` is `None`, else at the pairs of indices it gives. Filled to `n`, the count
/// charged, never grown past it.
fn each<A, B, R>(
    n: usize,
    pairs: Option<Pairs>,
    a: impl Fn(usize) -> A,
    b: impl Fn(usize) -> B,
    f: impl Fn(A, B) -> ScriptResult<R>,
) -> ScriptResult<Vec<R>> {
    let mut out = Vec::with_capacity(n);
    match pairs {
        None => {
            for k in 0..n {
                out.push(f(a(k), b(k))?);
            }
        }
        Some(pairs) => {
            for (ia, ib) in pairs.take(n) {
                out.push(f(a(ia), b(ib))?);
            }
        }
    }
    Ok(out)
}

/// The flat indices into two broadcast operands of each element of their result, in order.
struct Pairs {
    shape: Vec<usize>,
    strides: [Vec<usize>; 2],
    idx: Vec<usize>,
    done: bool,
}

impl Pairs {
    fn new(sa: &[usize], sb: &[usize], out: &[usize]) -> Pairs {
        let rank = out.len();
        let strides = |s: &[usize]| -> Vec<usize> {
            let mut p = vec![1; rank - s.len()];
            p.extend_from_slice(s);
            let mut st = vec![0; rank];
            let mut acc = 1;
            for i in (0..rank).rev() {
                st[i] = if p[i] == 1 { 0 } else { acc };
                acc *= p[i];
            }
            st
        };
        Pairs {
            shape: out.to_vec(),
            strides: [strides(sa), strides(sb)],
            idx: vec![0; rank],
            done: out.contains(&0),
        }
    }
}

impl Iterator for Pairs {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if self.done {
            return None;
        }
        let at = |st: &[usize]| self.idx.iter().zip(st).map(|(i, s)| i * s).sum();
        let item = (at(&self.strides[0]), at(&self.strides[1]));
        self.done = true;
        for d in (0..self.shape.len()).rev() {
            self.idx[d] += 1;
            if self.idx[d] < self.shape[d] {
                self.done = false;
                break;
            }
            self.idx[d] = 0;
        }
        Some(item)
    }
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
            let top = row.clone().fold(f64::NEG_INFINITY, |m, x| m.max(x));
            if row.clone().any(|x| x.is_nan()) || !top.is_finite() {
                return Err(script_err("sample: a row of logits is NaN, infinite or all -inf"));
            }
            let mut total = 0.0;
            for (w, x) in weights.iter_mut().zip(row) {
                *w = ((x - top) / temperature).exp();
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
