//! Causal attention on the CPU: the oracle of the fused GPU kernels, forward and backward side
//! by side, deliberately boring (each score recomputed from q and k, every sum in a fixed order).
//!
//! q, k, v, the output and the gradients are `[B, H, T, Dh]` row-major; the per-row stats are
//! `[B, H, T]`. Scores are `s_ij = q_i·k_j / sqrt(Dh)`, and row `i` sees the keys
//! `j <= i`. The stats are each row's log-sum-exp `L_i = ln Σ_{j<=i} e^(s_ij)`, so the
//! probabilities are `p_ij = e^(s_ij − L_i)`, which is how the backward ops use them
//! (FlashAttention-2: nothing of size `T x T` is kept); the forward divides by each row's sum
//! instead, as the GPU's forward does (see [`attention`]). The backward, given `dy` and the output
//! `y`, with `delta_i = Σ_d dy_id·y_id` (computed per head): `dp_ij = dy_i·v_j`, `ds_ij = p_ij (dp_ij − delta_i)`,
//! `dq_i = Σ_j ds_ij k_j / sqrt(Dh)`, `dk_j = Σ_i ds_ij q_i / sqrt(Dh)`, `dv_j = Σ_i p_ij dy_i`.
//!
//! Heads are independent: large problems split them over threads, which changes no result.

use super::Float;

/// `[B, H, T, Dh]` of an attention operand (the graph checked the rank).
#[derive(Clone, Copy, Debug)]
struct Dims {
    heads: usize,
    t: usize,
    dh: usize,
}

impl Dims {
    fn of(shape: &[usize]) -> Dims {
        Dims { heads: shape[0] * shape[1], t: shape[2], dh: shape[3] }
    }

    fn scale<T: Float>(&self) -> T {
        T::from_f64(1.0 / (self.dh as f64).sqrt())
    }
}

/// The operands of one head.
struct Head<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    /// `[T]`: each row's log-sum-exp (empty while computing it).
    stats: &'a [T],
    dy: &'a [T],
    /// The output `y` (the backward's `delta` is computed from it and `dy`).
    y: &'a [T],
}

/// Per query row of q, k `[B, H, T, Dh]`: the log-sum-exp of its causal scores, `[B, H, T]`.
pub fn attention_stats<T: Float>(q: &[T], k: &[T], shape: &[usize]) -> Vec<T> {
    let d = Dims::of(shape);
    per_head(d, d.t, &[q, k], &[], |h, out| {
        for (i, l) in out.iter_mut().enumerate() {
            let (m, e) = row_exps(&h, d, i);
            *l = m + total(&e).ln();
        }
    })
}

/// Row `i`'s largest causal score `m_i` and each key's `e^(s_ij − m_i)`.
fn row_exps<T: Float>(h: &Head<T>, d: Dims, i: usize) -> (T, Vec<T>) {
    let s: Vec<T> = (0..=i).map(|j| score(h, d, i, j)).collect();
    let m = s[1..].iter().fold(s[0], |m, &x| m.max_nan(x));
    (m, s.iter().map(|&x| (x - m).exp()).collect())
}

/// `Σ x`, in order.
fn total<T: Float>(x: &[T]) -> T {
    let mut sum = T::zero();
    for &v in x {
        sum += v;
    }
    sum
}

/// `y_i = Σ_{j<=i} p_ij v_j`, `[B, H, T, Dh]`, each row's probabilities `e^(s_ij − m_i)`
/// divided by their sum (`m_i` the row's largest score), as the GPU's forward kernel takes
/// them: through the stored `L_i` (`e^(s_ij − L_i)`), a row of tied scores of 1e8 lost `L_i`'s
/// `ln n` to f32 rounding, each tied key weighed 1, and the output was the sum of the values
/// rather than their mean. (The backward passes take `p_ij` from `L_i`, as FlashAttention-2's
/// do, on both backends.)
pub fn attention<T: Float>(q: &[T], k: &[T], v: &[T], stats: &[T], shape: &[usize]) -> Vec<T> {
    let d = Dims::of(shape);
    per_head(d, d.t * d.dh, &[q, k, v], &[stats], |h, out| {
        for i in 0..d.t {
            let (_, e) = row_exps(&h, d, i);
            let sum = total(&e);
            for (j, &ej) in e.iter().enumerate() {
                let p = ej / sum;
                for c in 0..d.dh {
                    out[i * d.dh + c] += p * h.v[j * d.dh + c];
                }
            }
        }
    })
}

/// dk then dv of [`attention`], `[2, B, H, T, Dh]`.
pub fn attention_grad_kv<T: Float>(ins: [&[T]; 6], shape: &[usize]) -> Vec<T> {
    let d = Dims::of(shape);
    let per = d.t * d.dh;
    let dkv = per_head_backward(d, 2 * per, ins, |h, out| {
        let (dk, dv) = out.split_at_mut(per);
        let scale: T = d.scale();
        let delta = deltas(&h, d);
        for j in 0..d.t {
            for (i, &delta_i) in delta.iter().enumerate().skip(j) {
                let p = prob(&h, d, i, j);
                let ds = p * (dot(&h.dy[i * d.dh..], &h.v[j * d.dh..], d.dh) - delta_i);
                for e in 0..d.dh {
                    dk[j * d.dh + e] += ds * scale * h.q[i * d.dh + e];
                    dv[j * d.dh + e] += p * h.dy[i * d.dh + e];
                }
            }
        }
    });
    // Per head [dk | dv] -> [dk of every head | dv of every head].
    let mut out = Vec::with_capacity(dkv.len());
    for half in 0..2 {
        for head in dkv.chunks(2 * per.max(1)) {
            out.extend_from_slice(&head[half * per..(half + 1) * per]);
        }
    }
    out
}

/// dq of [`attention`], `[B, H, T, Dh]`.
pub fn attention_grad_q<T: Float>(ins: [&[T]; 6], shape: &[usize]) -> Vec<T> {
    let d = Dims::of(shape);
    per_head_backward(d, d.t * d.dh, ins, |h, dq| {
        let scale: T = d.scale();
        let delta = deltas(&h, d);
        for i in 0..d.t {
            for j in 0..=i {
                let p = prob(&h, d, i, j);
                let ds = p * (dot(&h.dy[i * d.dh..], &h.v[j * d.dh..], d.dh) - delta[i]);
                for e in 0..d.dh {
                    dq[i * d.dh + e] += ds * scale * h.k[j * d.dh + e];
                }
            }
        }
    })
}

/// `s_ij` of one head.
fn score<T: Float>(h: &Head<T>, d: Dims, i: usize, j: usize) -> T {
    d.scale::<T>() * dot(&h.q[i * d.dh..], &h.k[j * d.dh..], d.dh)
}

/// `p_ij = e^(s_ij − L_i)` of one head.
fn prob<T: Float>(h: &Head<T>, d: Dims, i: usize, j: usize) -> T {
    (score(h, d, i, j) - h.stats[i]).exp()
}

/// FlashAttention-2's `delta_i = Σ_d dy_id·y_id` of each query row of one head.
fn deltas<T: Float>(h: &Head<T>, d: Dims) -> Vec<T> {
    (0..d.t).map(|i| dot(&h.dy[i * d.dh..], &h.y[i * d.dh..], d.dh)).collect()
}

/// `Σ_e a[e]·b[e]` over the first `n` elements, in order.
fn dot<T: Float>(a: &[T], b: &[T], n: usize) -> T {
    let mut acc = T::zero();
    for e in 0..n {
        acc += a[e] * b[e];
    }
    acc
}

/// The backward ops' inputs (q, k, v, stats, dy, y) split per head.
fn per_head_backward<T: Float>(
    d: Dims,
    out_per_head: usize,
    [q, k, v, stats, dy, y]: [&[T]; 6],
    f: impl Fn(Head<T>, &mut [T]) + Sync,
) -> Vec<T> {
    per_head(d, out_per_head, &[q, k, v, dy, y], &[stats], f)
}

/// Runs `f` on each head's operands and its `out_per_head` zeroed outputs: `dense` are
/// `[B, H, T, Dh]` (q, k, v, then dy and y), `rows` `[B, H, T]` (the stats); missing ones are
/// empty. Heads are split over threads when the problem is large.
fn per_head<'a, T: Float>(
    d: Dims,
    out_per_head: usize,
    dense: &[&'a [T]],
    rows: &[&'a [T]],
    f: impl Fn(Head<'a, T>, &mut [T]) + Sync,
) -> Vec<T> {
    let mut out = vec![T::zero(); d.heads * out_per_head];
    if out.is_empty() {
        return out;
    }
    let per = d.t * d.dh;
    let head = |n: usize| {
        let part = |x: Option<&&'a [T]>, len: usize| -> &'a [T] {
            x.map_or(&[], |x| &x[n * len..(n + 1) * len])
        };
        Head {
            q: part(dense.first(), per),
            k: part(dense.get(1), per),
            v: part(dense.get(2), per),
            dy: part(dense.get(3), per),
            y: part(dense.get(4), per),
            stats: part(rows.first(), d.t),
        }
    };
    let work = d.heads * d.t * d.t * d.dh;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(d.heads);
    if threads <= 1 || work < 1 << 18 {
        for (n, o) in out.chunks_mut(out_per_head).enumerate() {
            f(head(n), o);
        }
        return out;
    }
    let per_thread = d.heads.div_ceil(threads);
    std::thread::scope(|s| {
        for (c, chunk) in out.chunks_mut(per_thread * out_per_head).enumerate() {
            let (f, head) = (&f, &head);
            s.spawn(move || {
                for (n, o) in chunk.chunks_mut(out_per_head).enumerate() {
                    f(head(c * per_thread + n), o);
                }
            });
        }
    });
    out
}
