//! Batched matrix multiplication `[..., M, K] @ [..., K, N]` with broadcast batch dimensions.
//!
//! The one op where the CPU backend is allowed to be fast, because everything calls it. Each
//! product runs on the `gemm` crate: packed operands, register-tiled micro-kernels for the
//! widest vectors the processor has (AVX-512 with the crate's `x86-v4` feature, AVX2, NEON),
//! selected at run time, and threads through rayon for large products. Batches of small
//! products are split across threads here, one whole product per thread.
//!
//! Invariant: the result is deterministic. `gemm` sums each element over k in an order fixed by
//! the product's shape and the machine's kernel (blocks of k in increasing order, fused
//! multiply-adds inside a block), never by the thread count or the scheduling: threads only
//! split independent output tiles. So the same inputs give the same bits on every run and for
//! every thread count; they are not bit-identical to a naive loop, and a row may round
//! differently in a product of another shape (another batch size) or on a processor with other
//! vector widths. [`matmul_reference`] is the plain loop, for tests that need exact sums.

use super::interp::broadcast_strides;
use super::Float;
use gemm::Parallelism;
use std::any::TypeId;
use std::time::Instant;

/// Products with fewer multiply-adds than this run on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// `a [..., M, K] @ b [..., K, N]`, batch dimensions broadcast (NumPy rules): returns the
/// row-major `[batch..., M, N]` result. The shapes must be valid (the graph's shape rules check
/// them) and the slices must hold exactly their shapes' elements.
pub fn matmul<T: Float>(a: &[T], a_shape: &[usize], b: &[T], b_shape: &[usize]) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    matmul_on(a, a_shape, b, b_shape, threads)
}

/// The same product as the plain triple loop: every element is `((0 + a0·b0) + a1·b1) + …` in
/// increasing k, a multiply then an add (never fused). Slow; for tests that compare against
/// exact sums, and for element types `gemm` does not know.
pub fn matmul_reference<T: Float>(a: &[T], a_shape: &[usize], b: &[T], b_shape: &[usize]) -> Vec<T> {
    let p = Problem::new(a_shape, b_shape);
    let mut c = vec![T::zero(); p.batches.len() * p.m * p.n];
    for (&(ao, bo), c) in p.batches.iter().zip(c.chunks_mut((p.m * p.n).max(1))) {
        for i in 0..p.m {
            for j in 0..p.n {
                let mut s = T::zero();
                for kk in 0..p.k {
                    s += a[ao + i * p.k + kk] * b[bo + kk * p.n + j];
                }
                c[i * p.n + j] = s;
            }
        }
    }
    c
}

/// The shape of a batched product: sizes, and each output batch's operand offsets (elements).
struct Problem {
    m: usize,
    k: usize,
    n: usize,
    batches: Vec<(usize, usize)>,
}

impl Problem {
    fn new(a_shape: &[usize], b_shape: &[usize]) -> Problem {
        let (ra, rb) = (a_shape.len(), b_shape.len());
        let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
        let (a_batch, b_batch) = (&a_shape[..ra - 2], &b_shape[..rb - 2]);
        let out_batch = crate::graph::shape::broadcast_shapes(a_batch, b_batch).unwrap_or_default();
        let a_st = broadcast_strides(a_batch, &out_batch);
        let b_st = broadcast_strides(b_batch, &out_batch);
        let batches = (0..out_batch.iter().product())
            .map(|bi: usize| {
                let (mut rest, mut ao, mut bo) = (bi, 0, 0);
                for ax in (0..out_batch.len()).rev() {
                    let i = rest % out_batch[ax];
                    rest /= out_batch[ax];
                    ao += i * a_st[ax];
                    bo += i * b_st[ax];
                }
                (ao * m * k, bo * k * n)
            })
            .collect();
        Problem { m, k, n, batches }
    }
}

/// [`matmul`] on at most `max_threads` threads (the result does not depend on it).
fn matmul_on<T: Float>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    max_threads: usize,
) -> Vec<T> {
    if !gemm_computes::<T>() {
        return matmul_reference(a, a_shape, b, b_shape);
    }
    let Problem { m, k, n, batches } = Problem::new(a_shape, b_shape);
    let mut c = vec![T::zero(); batches.len() * m * n];
    let size = m * n;
    if size == 0 || k == 0 {
        return c;
    }
    let macs = size.saturating_mul(k);
    let product = |(ao, bo): (usize, usize), c: &mut [T], par: Parallelism| {
        gemm_into(&a[ao..ao + m * k], &b[bo..bo + k * n], c, (m, k, n), par);
    };
    if macs >= PARALLEL_MIN_MACS || batches.len() == 1 || max_threads <= 1 {
        // One product at a time, each on gemm's threads when it is large enough.
        let par = if macs >= PARALLEL_MIN_MACS && max_threads > 1 {
            Parallelism::Rayon(max_threads)
        } else {
            Parallelism::None
        };
        for (&ops, c) in batches.iter().zip(c.chunks_mut(size)) {
            product(ops, c, par);
        }
        return c;
    }
    if macs.saturating_mul(batches.len()) < PARALLEL_MIN_MACS {
        for (&ops, c) in batches.iter().zip(c.chunks_mut(size)) {
            product(ops, c, Parallelism::None);
        }
        return c;
    }
    // Many small products: each thread takes a contiguous run of whole products.
    let per = batches.len().div_ceil(max_threads);
    std::thread::scope(|s| {
        for (ops, c) in batches.chunks(per).zip(c.chunks_mut(per * size)) {
            let product = &product;
            s.spawn(move || {
                for (&ops, c) in ops.iter().zip(c.chunks_mut(size)) {
                    product(ops, c, Parallelism::None);
                }
            });
        }
    });
    c
}

/// Whether `gemm` computes products of `T` (f32 and f64; it panics on any other type).
fn gemm_computes<T: 'static>() -> bool {
    [TypeId::of::<f32>(), TypeId::of::<f64>()].contains(&TypeId::of::<T>())
}

/// `c = a @ b` for one row-major `m × k` by `k × n` product, `T` being f32 or f64.
fn gemm_into<T: Float>(a: &[T], b: &[T], c: &mut [T], (m, k, n): (usize, usize, usize), par: Parallelism) {
    assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n, "matmul operand sizes");
    assert!(gemm_computes::<T>(), "matmul element type");
    let (k_stride, n_stride) = (k as isize, n as isize);
    // SAFETY: `a`, `b` and `c` are row-major (column stride 1, row stride k or n) and hold
    // exactly their m × k, k × n and m × n elements (checked above), so every access is in
    // bounds; `c` is a unique borrow, aliasing neither operand; `T` is f32 or f64 (checked
    // above), types `gemm` computes (it panics on any other). `read_dst` is false, so `c`'s
    // old contents are not read: c = 1 · (a @ b).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n_stride,
            false,
            a.as_ptr(),
            1,
            k_stride,
            b.as_ptr(),
            1,
            n_stride,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        );
    }
}

/// Multiply two deterministic `n × n` f32 matrices (after one warm-up) at least `min_reps`
/// times and for at least half a second, but no more once [`LONG_RUN_S`] have passed with one
/// product timed (a 20000³ product takes minutes on 2 cores: six would take half an hour), and
/// return the median product's rate in GFLOP/s (2·n³ flops per product). Backs `rumus bench
/// --cpu-matmul`; `scripts/bench/numpy_matmul.py` measures numpy the same way.
pub fn bench_matmul(n: usize, min_reps: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
    let shape = [n, n];
    std::hint::black_box(matmul(&a, &shape, &b, &shape));
    let (start, mut times) = (Instant::now(), Vec::new());
    loop {
        let (done, elapsed) = (times.len(), start.elapsed().as_secs_f64());
        let enough = done >= min_reps.max(1) || (done >= 1 && elapsed >= LONG_RUN_S);
        if enough && elapsed >= 0.5 {
            break;
        }
        let t = Instant::now();
        std::hint::black_box(matmul(&a, &shape, &b, &shape));
        times.push(t.elapsed().as_secs_f64().max(1e-9));
    }
    times.sort_by(f64::total_cmp);
    2.0 * (n as f64).powi(3) / times[times.len() / 2] / 1e9
}

/// Seconds after which [`bench_matmul`] stops once it has timed one product.
pub const LONG_RUN_S: f64 = 10.0;

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, salt: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 31 + salt * 17) % 97) as f64 / 13.0 - 3.5).collect()
    }

    /// Batched, broadcast, thin (gemm's matrix-vector paths), past gemm's blocks, and large
    /// enough for threads, with a batch of many small products.
    const CASES: &[(&[usize], &[usize])] = &[
        (&[1, 1], &[1, 1]),
        (&[1, 300], &[300, 17]),
        (&[5, 300], &[300, 1]),
        (&[5, 3], &[3, 530]),
        (&[2, 3, 96, 700], &[700, 40]),
        (&[1, 40, 9], &[300, 9, 21]),
        (&[200, 130], &[130, 70]),
    ];

    #[test]
    fn gemm_matches_the_reference_in_f64_and_f32() {
        for &(sa, sb) in CASES {
            let a = data(sa.iter().product(), 1);
            let b = data(sb.iter().product(), 2);
            let want = matmul_reference(&a, sa, &b, sb);
            let got = matmul(&a, sa, &b, sb);
            let err = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
            assert!(got.len() == want.len() && err < 1e-10, "{sa:?} @ {sb:?}: {err}");
            let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
            let got32 = matmul(&a32, sa, &b32, sb);
            let err = got32.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(err < 1e-2, "f32 {sa:?} @ {sb:?}: {err}");
        }
    }

    #[test]
    fn result_does_not_depend_on_thread_count_or_run() {
        for &(sa, sb) in CASES {
            let a = data(sa.iter().product(), 3);
            let b = data(sb.iter().product(), 4);
            let want = matmul_on(&a, sa, &b, sb, 1);
            for threads in [1, 2, 3, 7] {
                assert_eq!(matmul_on(&a, sa, &b, sb, threads), want, "{sa:?} @ {sb:?} on {threads}");
            }
        }
    }

    #[test]
    fn bench_reports_a_positive_rate() {
        assert!(bench_matmul(8, 1) > 0.0);
    }
}
