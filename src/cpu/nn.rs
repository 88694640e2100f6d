//! The neural-network ops: softmax, causal masking, layer norm, embedding, cross-entropy and
//! dropout, each gradient-helper op right after the op it differentiates (llm.c style).
//!
//! Row-wise ops work on the last axis: a `[..., D]` tensor is a list of rows of length `D`, and
//! every sum over a row runs from its first element to its last, added in f64.

use super::interp::sum;
use super::{Float, RunOptions};
use crate::err;
use crate::error::Result;
use crate::rng::dropout_keep;

// ---- softmax ----

/// Softmax over rows of length `d`: e^(x - max) / Σ e^(x - max).
pub fn softmax<T: Float>(x: &[T], d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d.max(1)) {
        let m = row_max(row);
        let e: Vec<T> = row.iter().map(|&v| (v - m).exp()).collect();
        let s = sum(&e);
        out.extend(e.iter().map(|&v| v / s));
    }
    out
}

/// Log-softmax over rows of length `d`: x - max - ln Σ e^(x - max).
pub fn log_softmax<T: Float>(x: &[T], d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d.max(1)) {
        let lse = log_sum_exp(row);
        out.extend(row.iter().map(|&v| v - lse));
    }
    out
}

/// max + ln Σ e^(x - max) of one row (the sum added in f64, as [`sum`]).
fn log_sum_exp<T: Float>(row: &[T]) -> T {
    let m = row_max(row);
    let mut s = 0.0f64;
    for &v in row {
        s += (v - m).exp().to_f64();
    }
    m + T::from_f64(s).ln()
}

fn row_max<T: Float>(row: &[T]) -> T {
    row[1..].iter().fold(row[0], |m, &v| m.max_nan(v))
}

// ---- causal mask ----

/// On scores `[..., T, S]`, element (i, j) with j > i + (S - T) becomes `fill`; the rest is
/// copied. The same op with fill 0 is its own gradient.
pub fn causal_mask<T: Float>(x: &[T], shape: &[usize], fill: f32) -> Vec<T> {
    let (t, s) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let fill = T::from_f64(fill as f64);
    let mut out = x.to_vec();
    if t * s == 0 {
        return out;
    }
    for mat in out.chunks_mut(t * s) {
        for i in 0..t {
            for j in (i + s - t + 1)..s {
                mat[i * s + j] = fill;
            }
        }
    }
    out
}

// ---- layer norm ----

/// Per row of length `d`: `[mean, rstd]` with rstd = 1/√(var + eps), var the biased variance
/// (two passes: the mean, then Σ (x - mean)² / d).
pub fn layer_norm_stats<T: Float>(x: &[T], d: usize, eps: f32) -> Vec<T> {
    let eps = T::from_f64(eps as f64);
    let n = T::from_f64(d as f64);
    let mut out = Vec::with_capacity(x.len() / d.max(1) * 2);
    for row in x.chunks(d.max(1)) {
        let mean = super::interp::mean(row);
        let mut var = T::zero();
        for &v in row {
            var += (v - mean) * (v - mean);
        }
        var = var / n;
        out.push(mean);
        out.push(T::one() / (var + eps).sqrt());
    }
    out
}

/// `(x - mean) · rstd · weight + bias` per row, with `stats` from [`layer_norm_stats`].
pub fn layer_norm<T: Float>(x: &[T], stats: &[T], weight: &[T], bias: &[T]) -> Vec<T> {
    let d = weight.len().max(1);
    let mut out = Vec::with_capacity(x.len());
    for (row, st) in x.chunks(d).zip(stats.chunks(2)) {
        let (mean, rstd) = (st[0], st[1]);
        for ((&v, &w), &b) in row.iter().zip(weight).zip(bias) {
            out.push((v - mean) * rstd * w + b);
        }
    }
    out
}

/// The input gradient of [`layer_norm`] through the stats: with g = dy·w and
/// xhat = (x - mean)·rstd, dx = rstd·(g − mean(g) − xhat·mean(g·xhat)) per row.
pub fn layer_norm_grad_input<T: Float>(x: &[T], stats: &[T], weight: &[T], dy: &[T]) -> Vec<T> {
    let n = T::from_f64(weight.len() as f64);
    let d = weight.len().max(1);
    let mut out = Vec::with_capacity(x.len());
    for ((row, st), dy_row) in x.chunks(d).zip(stats.chunks(2)).zip(dy.chunks(d)) {
        let (mean, rstd) = (st[0], st[1]);
        let xhat: Vec<T> = row.iter().map(|&v| (v - mean) * rstd).collect();
        let g: Vec<T> = dy_row.iter().zip(weight).map(|(&a, &w)| a * w).collect();
        let mean_g = sum(&g) / n;
        let gx: Vec<T> = g.iter().zip(&xhat).map(|(&a, &b)| a * b).collect();
        let mean_gx = sum(&gx) / n;
        for (&gi, &xi) in g.iter().zip(&xhat) {
            out.push(rstd * (gi - mean_g - xi * mean_gx));
        }
    }
    out
}

/// The weight and bias gradients of [`layer_norm`] as `[2, D]`: row 0 is Σ_rows dy · xhat,
/// row 1 is Σ_rows dy, rows summed in order.
pub fn layer_norm_grad_weight<T: Float>(x: &[T], stats: &[T], dy: &[T], d: usize) -> Vec<T> {
    let mut out = vec![T::zero(); 2 * d];
    if d == 0 {
        return out;
    }
    let (dw, db) = out.split_at_mut(d);
    for ((row, st), dy_row) in x.chunks(d).zip(stats.chunks(2)).zip(dy.chunks(d)) {
        let (mean, rstd) = (st[0], st[1]);
        for (j, (&v, &g)) in row.iter().zip(dy_row).enumerate() {
            dw[j] += g * ((v - mean) * rstd);
            db[j] += g;
        }
    }
    out
}

// ---- embedding ----

/// Rows of `table [V, D]` gathered by `idx`; an index outside `0..V` is an error naming it.
pub fn embedding<T: Float>(table: &[T], table_shape: &[usize], idx: &[i32]) -> Result<Vec<T>> {
    let (vocab, d) = (table_shape[0], table_shape[1]);
    let mut out = Vec::with_capacity(idx.len() * d);
    for &i in idx {
        let r = check_index("embedding", i, vocab)?;
        out.extend_from_slice(&table[r * d..(r + 1) * d]);
    }
    Ok(out)
}

/// The table gradient of [`embedding`]: rows of `dy [..., D]` added into a `[vocab, D]` zero
/// tensor at their indices, in order (repeated indices sum).
pub fn embedding_grad<T: Float>(idx: &[i32], dy: &[T], vocab: usize, d: usize) -> Result<Vec<T>> {
    let mut out = vec![T::zero(); vocab * d];
    for (&i, g) in idx.iter().zip(dy.chunks(d.max(1))) {
        let r = check_index("embedding_grad", i, vocab)?;
        for (o, &v) in out[r * d..(r + 1) * d].iter_mut().zip(g) {
            *o += v;
        }
    }
    Ok(out)
}

/// `i` as a row of a table of `n` rows, or the error naming it (the GPU reports the same).
pub fn check_index(op: &str, i: i32, n: usize) -> Result<usize> {
    usize::try_from(i)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| err!(Shape, "{op}: index {i} is out of range for {n} rows"))
}

// ---- cross-entropy ----

/// Mean over the rows whose label is not `ignore_index` of `−log_softmax(row)[label]`; NaN when
/// every label is ignored (a mean of nothing, as PyTorch's; its gradient is 0). A label outside
/// `0..C` (and not ignored) is an error naming it.
pub fn cross_entropy<T: Float>(
    logits: &[T],
    c: usize,
    labels: &[i32],
    ignore_index: Option<i32>,
) -> Result<Vec<T>> {
    let mut total = 0.0f64;
    let mut count = 0usize;
    for (row, &label) in logits.chunks(c.max(1)).zip(labels) {
        if Some(label) == ignore_index {
            continue;
        }
        let k = check_label("cross_entropy", label, c)?;
        total += (log_sum_exp(row) - row[k]).to_f64();
        count += 1;
    }
    if count == 0 {
        return Ok(vec![T::from_f64(f64::NAN)]);
    }
    Ok(vec![T::from_f64(total) / T::from_f64(count as f64)])
}

/// The logits gradient of [`cross_entropy`]: (softmax − onehot) · dloss / count per counted row,
/// zero rows for ignored labels (every row when every label is: the loss's NaN moves nothing).
pub fn cross_entropy_grad<T: Float>(
    logits: &[T],
    c: usize,
    labels: &[i32],
    dloss: &[T],
    ignore_index: Option<i32>,
) -> Result<Vec<T>> {
    let mut count = 0usize;
    for &label in labels {
        if Some(label) != ignore_index {
            check_label("cross_entropy_grad", label, c)?;
            count += 1;
        }
    }
    let scale = dloss[0] / T::from_f64(count.max(1) as f64);
    let mut out = Vec::with_capacity(logits.len());
    for (row, &label) in logits.chunks(c.max(1)).zip(labels) {
        if Some(label) == ignore_index {
            out.extend(std::iter::repeat_n(T::zero(), c));
            continue;
        }
        let p = softmax(row, c);
        for (k, &pk) in p.iter().enumerate() {
            let onehot = if k as i32 == label { T::one() } else { T::zero() };
            out.push((pk - onehot) * scale);
        }
    }
    Ok(out)
}

/// `label` as one of `c` classes, or the error naming it (the GPU reports the same).
pub fn check_label(op: &str, label: i32, c: usize) -> Result<usize> {
    usize::try_from(label)
        .ok()
        .filter(|&k| k < c)
        .ok_or_else(|| err!(Shape, "{op}: label {label} is out of range for {c} classes"))
}

// ---- dropout ----

/// Dropout: when training, element i is kept (times 1/(1−p)) iff [`dropout_keep`], else zeroed;
/// the identity when not training. Its gradient is the same op applied to dy.
pub fn dropout<T: Float>(x: &[T], p: f32, seed: u64, opts: RunOptions) -> Vec<T> {
    if !opts.training {
        return x.to_vec();
    }
    let scale = T::one() / (T::one() - T::from_f64(p as f64));
    x.iter()
        .enumerate()
        .map(|(i, &v)| if dropout_keep(seed, opts.step, i, p) { v * scale } else { T::zero() })
        .collect()
}
