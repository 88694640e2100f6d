//! Batched matrix multiplication `[..., M, K] @ [..., K, N]` with broadcast batch dimensions.
//!
//! The one op where the CPU reference is allowed to be fast, because everything calls it. The
//! classic blocked layout: blocks of B (`KC × NC`) and of A (`MC × KC`) are packed into panels,
//! and a register-tiled micro-kernel accumulates an `MR × NR` tile of C in a local array the
//! compiler keeps in vector registers. Large products split their output rows across
//! `std::thread::scope` threads; small ones stay on the calling thread.
//!
//! Invariant: every element of C is `((0 + a0·b0) + a1·b1) + …` in increasing k, a plain
//! multiply then add (never fused), whatever the blocking and the thread count. So the result is
//! bit-identical to the naive triple loop, and to itself on any machine.

use super::interp::broadcast_strides;
use super::Float;
use std::time::Instant;

/// Rows of the micro-kernel's C tile.
const MR: usize = 4;
/// Columns of the micro-kernel's C tile.
const NR: usize = 8;
/// Depth of a packed block (K direction).
const KC: usize = 256;
/// Rows of a packed A block.
const MC: usize = 64;
/// Columns of a packed B block.
const NC: usize = 512;
/// Products with fewer multiply-adds than this run on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// `a [..., M, K] @ b [..., K, N]`, batch dimensions broadcast (NumPy rules): returns the
/// row-major `[batch..., M, N]` result. The shapes must be valid (the graph's shape rules check
/// them) and the slices must hold exactly their shapes' elements.
pub fn matmul<T: Float>(a: &[T], a_shape: &[usize], b: &[T], b_shape: &[usize]) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    matmul_on(a, a_shape, b, b_shape, threads)
}

/// [`matmul`] on at most `max_threads` threads (the result does not depend on it).
fn matmul_on<T: Float>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    max_threads: usize,
) -> Vec<T> {
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
    let (a_batch, b_batch) = (&a_shape[..ra - 2], &b_shape[..rb - 2]);
    let out_batch = crate::graph::shape::broadcast_shapes(a_batch, b_batch).unwrap_or_default();
    let n_batch: usize = out_batch.iter().product();
    // Offset (in matrices) of each output batch's A and B operands.
    let a_st = broadcast_strides(a_batch, &out_batch);
    let b_st = broadcast_strides(b_batch, &out_batch);
    let operands: Vec<(usize, usize)> = (0..n_batch)
        .map(|bi| {
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

    let mut c = vec![T::zero(); n_batch * m * n];
    let rows = n_batch * m;
    if rows == 0 || n == 0 || k == 0 {
        return c;
    }
    let threads = if rows.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_MACS {
        1
    } else {
        max_threads.min(rows.div_ceil(MR))
    };
    // Row range [lo, hi) of the flattened (batch, row) space → the products it needs.
    let work = |lo: usize, hi: usize, c: &mut [T]| {
        let mut r = lo;
        while r < hi {
            let (bi, r0) = (r / m, r % m);
            let r1 = m.min(r0 + (hi - r));
            let (ao, bo) = operands[bi];
            let out = &mut c[(r - lo) * n..(r - lo + r1 - r0) * n];
            gemm_rows(&a[ao..ao + m * k], &b[bo..bo + k * n], k, n, r0, r1, out);
            r += r1 - r0;
        }
    };
    if threads <= 1 {
        work(0, rows, &mut c);
        return c;
    }
    // Split rows evenly in multiples of MR; each thread owns a contiguous run of C.
    let per = rows.div_ceil(threads).div_ceil(MR) * MR;
    std::thread::scope(|s| {
        let mut rest = &mut c[..];
        let mut lo = 0;
        while lo < rows {
            let hi = rows.min(lo + per);
            let (mine, tail) = rest.split_at_mut((hi - lo) * n);
            rest = tail;
            let work = &work;
            s.spawn(move || work(lo, hi, mine));
            lo = hi;
        }
    });
    c
}

/// Rows `r0..r1` of `a [M, K] @ b [K, N]` into `c` (`(r1 - r0) × N`, row-major).
fn gemm_rows<T: Float>(a: &[T], b: &[T], k: usize, n: usize, r0: usize, r1: usize, c: &mut [T]) {
    let mut bp = vec![T::zero(); KC * NC.min(n.div_ceil(NR) * NR)];
    let mut ap = vec![T::zero(); MC * KC];
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b(b, n, pc, kc, jc, nc, &mut bp);
            for ic in (r0..r1).step_by(MC) {
                let mc = MC.min(r1 - ic);
                pack_a(a, k, ic, mc, pc, kc, &mut ap);
                for jr in (0..nc).step_by(NR) {
                    for ir in (0..mc).step_by(MR) {
                        let tile = Tile {
                            row: ic - r0 + ir,
                            col: jc + jr,
                            rows: MR.min(mc - ir),
                            cols: NR.min(nc - jr),
                        };
                        tile_update(
                            kc,
                            &ap[ir * kc..(ir + MR) * kc],
                            &bp[jr * kc..(jr + NR) * kc],
                            c,
                            n,
                            tile,
                        );
                    }
                }
            }
        }
    }
}

/// Pack `b[pc..pc+kc, jc..jc+nc]` into panels of NR columns: panel p holds, for each k in order,
/// NR consecutive values (zero past the edge).
fn pack_b<T: Float>(b: &[T], n: usize, pc: usize, kc: usize, jc: usize, nc: usize, bp: &mut [T]) {
    for (p, j0) in (0..nc).step_by(NR).enumerate() {
        let w = NR.min(nc - j0);
        let panel = &mut bp[p * kc * NR..(p + 1) * kc * NR];
        for kk in 0..kc {
            let src = &b[(pc + kk) * n + jc + j0..][..w];
            let dst = &mut panel[kk * NR..(kk + 1) * NR];
            dst[..w].copy_from_slice(src);
            dst[w..].fill(T::zero());
        }
    }
}

/// Pack `a[ic..ic+mc, pc..pc+kc]` into panels of MR rows: panel p holds, for each k in order, MR
/// consecutive values (zero past the edge).
fn pack_a<T: Float>(a: &[T], k: usize, ic: usize, mc: usize, pc: usize, kc: usize, ap: &mut [T]) {
    for (p, i0) in (0..mc).step_by(MR).enumerate() {
        let h = MR.min(mc - i0);
        let panel = &mut ap[p * kc * MR..(p + 1) * kc * MR];
        for kk in 0..kc {
            for r in 0..MR {
                panel[kk * MR + r] = if r < h { a[(ic + i0 + r) * k + pc + kk] } else { T::zero() };
            }
        }
    }
}

/// Where a micro-kernel tile lands in C, and how much of it is real (the rest is padding).
#[derive(Clone, Copy)]
struct Tile {
    row: usize,
    col: usize,
    rows: usize,
    cols: usize,
}

/// C tile += A panel · B panel over `kc` steps, for the (possibly partial) tile `t` of `c`.
/// C starts at zero, so the first K block's sums start from 0 exactly as the naive loop's do.
fn tile_update<T: Float>(kc: usize, ap: &[T], bp: &[T], c: &mut [T], ldc: usize, t: Tile) {
    let mut acc = [[T::zero(); NR]; MR];
    for (r, acc_row) in acc.iter_mut().enumerate().take(t.rows) {
        acc_row[..t.cols].copy_from_slice(&c[(t.row + r) * ldc + t.col..][..t.cols]);
    }
    let acc = micro_kernel(kc, ap, bp, acc);
    for (r, acc_row) in acc.iter().enumerate().take(t.rows) {
        c[(t.row + r) * ldc + t.col..][..t.cols].copy_from_slice(&acc_row[..t.cols]);
    }
}

/// The register tile: `acc += A panel · B panel`, one rank-1 update per k. `acc` is passed and
/// returned by value and only ever indexed by constants, so it lives in vector registers.
#[inline(always)]
fn micro_kernel<T: Float>(kc: usize, ap: &[T], bp: &[T], mut acc: [[T; NR]; MR]) -> [[T; NR]; MR] {
    for (av, bv) in ap.chunks_exact(MR).zip(bp.chunks_exact(NR)).take(kc) {
        for r in 0..MR {
            for j in 0..NR {
                acc[r][j] += av[r] * bv[j];
            }
        }
    }
    acc
}

/// Multiply two deterministic `n × n` f32 matrices `reps` times (after one warm-up) and return
/// the rate in GFLOP/s (2·n³ flops per product). Backs `rumus bench matmul`.
pub fn bench_matmul(n: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
    let shape = [n, n];
    std::hint::black_box(matmul(&a, &shape, &b, &shape));
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(matmul(&a, &shape, &b, &shape));
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    2.0 * (n as f64).powi(3) * reps as f64 / secs / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for kk in 0..k {
                    s += a[i * k + kk] * b[kk * n + j];
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    fn data(n: usize, salt: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 31 + salt * 17) % 97) as f64 / 13.0 - 3.5).collect()
    }

    #[test]
    fn blocked_equals_naive_bit_for_bit_across_block_edges() {
        // Sizes straddling MR, NR, KC, MC and NC, and a product large enough to use threads.
        for &(m, k, n) in &[(1, 1, 1), (5, 300, 17), (5, 3, 530), (96, 300, 40)] {
            let (a, b) = (data(m * k, 1), data(k * n, 2));
            let got = matmul(&a, &[m, k], &b, &[k, n]);
            assert_eq!(got, naive(&a, &b, m, k, n), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn result_does_not_depend_on_thread_count() {
        let (m, k, n) = (3 * 70 + 1, 150, 37);
        let (a, b) = (data(2 * m * k, 3), data(k * n, 4));
        let want = matmul_on(&a, &[2, m, k], &b, &[k, n], 1);
        for threads in [2, 3, 7] {
            assert_eq!(matmul_on(&a, &[2, m, k], &b, &[k, n], threads), want);
        }
    }

    #[test]
    fn bench_reports_a_positive_rate() {
        assert!(bench_matmul(8, 1) > 0.0);
    }
}
