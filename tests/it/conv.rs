//! Convolutions, pooling and batch norm on the CPU reference against independent oracles:
//! direct convolution and pooling loops (the ops themselves go through im2col and the
//! matmul), batch norm's statistics and running-statistics updates computed by hand, and the
//! errors of shapes that do not fit.

use crate::common::conv::{CONVS, POOLS};
use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::{BatchNorm, Conv2d, Graph, NodeId, Window};
use rumus::rng::Rng;
use rumus::DType;

fn random(n: usize, rng: &mut Rng) -> Vec<f64> {
    (0..n).map(|_| rng.normal()).collect()
}

/// Runs `out` of `g` on the feeds in f64.
fn run(g: &Graph, feeds: &[(NodeId, Vec<f64>)], out: NodeId, training: bool) -> Vec<f64> {
    let mut exec = Executor::<f64>::new(g, 0).unwrap();
    let feeds: Vec<(NodeId, Buf<f64>)> =
        feeds.iter().map(|(id, v)| (*id, Buf::F(v.clone()))).collect();
    match exec.run(g, &feeds, &[out], RunOptions { training, step: 0 }).unwrap().remove(0) {
        Buf::F(v) => v,
        Buf::I(_) => panic!("f32 output"),
    }
}

/// The input coordinate window element `i` of output position `o` reads, if inside.
fn at(o: usize, i: usize, s: usize, p: usize, d: usize, size: usize) -> Option<usize> {
    (o * s + i * d).checked_sub(p).filter(|&v| v < size)
}

#[test]
fn conv2d_matches_direct_convolution() {
    let mut rng = Rng::new(5);
    for &(name, xs, ws, o) in CONVS {
        let mut g = Graph::new();
        let x = g.input("x", &xs, DType::F32).unwrap();
        let w = g.input("w", &ws, DType::F32).unwrap();
        let b = g.input("b", &[ws[0]], DType::F32).unwrap();
        let y = g.conv2d(x, w, Some(b), o).unwrap();
        let (xv, wv, bv) = (
            random(xs.iter().product(), &mut rng),
            random(ws.iter().product(), &mut rng),
            random(ws[0], &mut rng),
        );
        let got = run(&g, &[(x, xv.clone()), (w, wv.clone()), (b, bv.clone())], y, true);
        let [n, c, h, wd] = xs;
        let [oc, cg, kh, kw] = ws;
        let ys = g.shape(y).to_vec();
        let (ho, wo) = (ys[2], ys[3]);
        let Conv2d { stride: s, padding: p, dilation: d, groups } = o;
        assert_eq!(ys, [n, oc, ho, wo], "{name}");
        let og = oc / groups;
        for bi in 0..n {
            for oci in 0..oc {
                let gi = oci / og;
                for oh in 0..ho {
                    for ow in 0..wo {
                        let mut want = bv[oci];
                        for ci in 0..cg {
                            let cin = gi * cg + ci;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let (Some(yy), Some(xx)) = (
                                        at(oh, i, s[0], p[0], d[0], h),
                                        at(ow, j, s[1], p[1], d[1], wd),
                                    ) else {
                                        continue;
                                    };
                                    want += xv[((bi * c + cin) * h + yy) * wd + xx]
                                        * wv[((oci * cg + ci) * kh + i) * kw + j];
                                }
                            }
                        }
                        let e = ((bi * oc + oci) * ho + oh) * wo + ow;
                        assert!(
                            (got[e] - want).abs() < 1e-9,
                            "{name} at {e}: {} vs {want}",
                            got[e]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn pooling_matches_direct_loops() {
    let mut rng = Rng::new(6);
    for &(name, max, xs, k, s, p) in POOLS {
        let mut g = Graph::new();
        let x = g.input("x", &xs, DType::F32).unwrap();
        let y = if max { g.max_pool2d(x, k, s, p) } else { g.avg_pool2d(x, k, s, p) }.unwrap();
        let xv = random(xs.iter().product(), &mut rng);
        let got = run(&g, &[(x, xv.clone())], y, true);
        let [n, c, h, w] = xs;
        let ys = g.shape(y).to_vec();
        let (ho, wo) = (ys[2], ys[3]);
        assert_eq!(ys, [n, c, ho, wo], "{name}");
        for bc in 0..n * c {
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut vals = Vec::new();
                    for i in 0..k[0] {
                        for j in 0..k[1] {
                            match (at(oh, i, s[0], p[0], 1, h), at(ow, j, s[1], p[1], 1, w)) {
                                (Some(yy), Some(xx)) => vals.push(xv[(bc * h + yy) * w + xx]),
                                _ if max => {}
                                _ => vals.push(0.0), // counted in the average
                            }
                        }
                    }
                    let want = if max {
                        vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        vals.iter().sum::<f64>() / vals.len() as f64
                    };
                    let e = (bc * ho + oh) * wo + ow;
                    assert!((got[e] - want).abs() < 1e-12, "{name} at {e}: {} vs {want}", got[e]);
                }
            }
        }
    }
}

/// Ties in a max-pool window share its gradient equally, on every backend the same.
#[test]
fn max_pool_ties_share_the_gradient() {
    let mut g = Graph::new();
    let x = g.input("x", &[1, 1, 2, 2], DType::F32).unwrap();
    let y = g.max_pool2d(x, [2, 2], [2, 2], [0, 0]).unwrap();
    let loss = g.sum_all(y).unwrap();
    let dx = rumus::graph::autodiff::grad(&mut g, loss, &[x]).unwrap()[0];
    assert_eq!(
        run(&g, &[(x, vec![3.0, 1.0, 3.0, 3.0])], dx, true),
        [1.0 / 3.0, 0.0, 1.0 / 3.0, 1.0 / 3.0]
    );
}

/// Training normalizes with the batch's statistics and moves the running ones towards them
/// (the variance unbiased); evaluation normalizes with the running statistics.
#[test]
fn batch_norm_trains_on_batch_statistics_and_evaluates_on_running_ones() {
    let mut g = Graph::new();
    let x = g.input("x", &[4, 2], DType::F32).unwrap();
    let w = g.input("w", &[2], DType::F32).unwrap();
    let b = g.input("b", &[2], DType::F32).unwrap();
    let running = g.batch_norm_state("bn.", 2).unwrap();
    let y = g.batch_norm(x, w, b, running, BatchNorm { momentum: 0.25, eps: 1e-5 }).unwrap();
    let xv = vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 6.0, 60.0];
    let feeds = [(x, xv.clone()), (w, vec![2.0, 1.0]), (b, vec![0.5, -1.0])];
    let mut exec = Executor::<f64>::new(&g, 0).unwrap();
    let fb: Vec<(NodeId, Buf<f64>)> =
        feeds.iter().map(|(id, v)| (*id, Buf::F(v.clone()))).collect();
    let train = RunOptions { training: true, step: 0 };
    let Buf::F(got) = exec.run(&g, &fb, &[y], train).unwrap().remove(0) else { panic!() };
    // Channel 0: mean 3, biased variance 3.5, unbiased 14/3.
    let want0 = |v: f64| (v - 3.0) / (3.5f64 + 1e-5).sqrt() * 2.0 + 0.5;
    for (r, v) in [1.0, 2.0, 3.0, 6.0].iter().enumerate() {
        assert!((got[2 * r] - want0(*v)).abs() < 1e-9, "row {r}: {}", got[2 * r]);
    }
    let mean = exec.persistent(running[0]).unwrap().to_vec();
    let var = exec.persistent(running[1]).unwrap().to_vec();
    assert!(
        (mean[0] - 0.25 * 3.0).abs() < 1e-12 && (mean[1] - 0.25 * 30.0).abs() < 1e-12,
        "{mean:?}"
    );
    assert!((var[0] - (0.75 + 0.25 * 14.0 / 3.0)).abs() < 1e-6, "{var:?}");
    // Evaluation: the running statistics, nothing updated.
    let mut eval = g.clone();
    eval.updates.clear();
    let off = RunOptions { training: false, step: 1 };
    let Buf::F(got) = exec.run(&eval, &fb, &[y], off).unwrap().remove(0) else { panic!() };
    let want = (1.0 - mean[0]) / (var[0] + 1e-5).sqrt() * 2.0 + 0.5;
    assert!((got[0] - want).abs() < 1e-9, "{} vs {want}", got[0]);
    assert_eq!(exec.persistent(running[0]).unwrap(), &mean[..]);
}

/// Shapes that do not fit are errors naming the argument, never panics.
#[test]
fn shapes_that_do_not_fit_are_errors() {
    type Build = fn(&mut Graph, NodeId, NodeId) -> rumus::Result<NodeId>;
    let table: &[(&[usize], &[usize], Build, &str)] = &[
        (&[1, 3, 4], &[2, 3, 1, 1], |g, x, w| g.conv2d(x, w, None, Conv2d::default()),
            "conv2d: input `x` must be f32 [N, C, H, W], got f32[1, 3, 4]"),
        (&[1, 3, 4, 4], &[2, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d::default()),
            "conv2d: `weight` must be [out, in / groups, kh, kw], got [2, 3, 3]"),
        (&[1, 3, 4, 4], &[4, 1, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { groups: 2, ..Conv2d::default() }),
            "conv2d: `groups` 2 must divide the input channels (3) and the output channels (4)"),
        (&[1, 4, 4, 4], &[4, 4, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { groups: 2, ..Conv2d::default() }),
            "conv2d: `weight` [4, 4, 3, 3] takes 4 input channels per group, the input has 4 channels in 2 groups of 2"),
        (&[1, 1, 4, 4], &[1, 1, 5, 5], |g, x, w| g.conv2d(x, w, None, Conv2d::default()),
            "conv2d: `kernel` 5 with `dilation` 1 is larger than the padded input 4x4 (input 4x4, `padding` 0)"),
        (&[1, 1, 4, 4], &[1, 1, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { dilation: [2, 2], ..Conv2d::default() }),
            "conv2d: `kernel` 3 with `dilation` 2 is larger than the padded input 4x4 (input 4x4, `padding` 0)"),
        (&[1, 1, 4, 4], &[1, 1, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { stride: [0, 1], ..Conv2d::default() }),
            "conv2d: `stride` must be at least 1, got 0x1"),
        (&[1, 1, 4, 4], &[1, 1, 3, 3], |g, x, w| g.conv2d(x, w, Some(w), Conv2d::default()),
            "conv2d: `bias` must be [1] (one per output channel), got [1, 1, 3, 3]"),
        // One axis fails while the other's padding is near usize::MAX: the message saturates.
        (&[1, 1, 4, 4], &[1, 1, 5, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { padding: [0, 1 << 63], ..Conv2d::default() }),
            "conv2d: `kernel` 5x3 with `dilation` 1 is larger than the padded input 4x18446744073709551615 (input 4x4, `padding` 0x9223372036854775808)"),
        (&[1, 1, 4, 4], &[1, 1, 3, 3], |g, x, w| g.conv2d(x, w, None, Conv2d { padding: [1 << 63, 0], ..Conv2d::default() }),
            "conv2d: `padding` 9223372036854775808x0 or `kernel` 3 with `dilation` 1 is too large"),
        (&[1, 1, 4, 4], &[1], |g, x, _| g.max_pool2d(x, [2, 2], [2, 2], [2, 0]),
            "max_pool2d: `padding` 2x0 must be at most half of `kernel` 2"),
        // Found by the hostile-input audit (round 7): a host's window whose element count
        // overflows (kernel 2^32 x 2^32; a stride past the input gives one output) panicked in
        // a build with overflow checks and wrapped to an empty window without them, as did a
        // padding of 2^63 (twice it overflowed).
        (&[1, 1, 1, 1], &[1], |g, x, _| g.max_pool2d(x, [1 << 32, 1 << 32], [1 << 40, 1 << 40], [1 << 31, 1 << 31]),
            "max_pool2d: `kernel` 4294967296 is too large"),
        (&[1, 1, 1, 1], &[1], |g, x, _| g.avg_pool2d(x, [usize::MAX, 2], [1, 1], [usize::MAX / 2, 1]),
            "avg_pool2d: `kernel` 18446744073709551615x2 is too large"),
        (&[1, 1, 4, 4], &[1], |g, x, _| g.avg_pool2d(x, [2, 2], [1, 1], [1 << 63, 0]),
            "avg_pool2d: `padding` 9223372036854775808x0 must be at most half of `kernel` 2"),
        (&[1, 1, 1, 1], &[1], |g, x, _| {
            let window = Window { kernel: [1 << 32, 1 << 32], stride: [1 << 40, 1 << 40], padding: [1 << 31, 1 << 31], dilation: [1, 1] };
            g.unfold(x, window, 0.0)
        }, "unfold: `kernel` 4294967296 is too large"),
        (&[1, 1, 2, 2], &[1], |g, x, _| g.avg_pool2d(x, [3, 3], [1, 1], [0, 0]),
            "avg_pool2d: `kernel` 3 with `dilation` 1 is larger than the padded input 2x2 (input 2x2, `padding` 0)"),
        (&[4, 4], &[1], |g, x, _| g.max_pool2d(x, [2, 2], [2, 2], [0, 0]),
            "max_pool2d: input `x` must be f32 [N, C, H, W], got f32[4, 4]"),
        (&[4], &[1], |g, x, _| g.flatten(x, 1),
            "flatten: `start` 1 must be an axis of the input [4]"),
        (&[4], &[4], |g, x, w| {
            let r = g.batch_norm_state("bn.", 4)?;
            g.batch_norm(x, w, w, r, BatchNorm::default())
        }, "batch_norm: input `x` must be f32 [N, C] or [N, C, ...], got f32[4]"),
        (&[2, 3], &[4], |g, x, w| {
            let r = g.batch_norm_state("bn.", 3)?;
            g.batch_norm(x, w, w, r, BatchNorm::default())
        }, "batch_norm: `weight` must be [3] (one per channel of [2, 3]), got [4]"),
    ];
    for (xs, ws, build, want) in table {
        let mut g = Graph::new();
        let x = g.input("x", xs, DType::F32).unwrap();
        let w = g.input("w", ws, DType::F32).unwrap();
        match build(&mut g, x, w) {
            Ok(_) => panic!("expected an error: {want}"),
            Err(e) => assert_eq!(e.message, *want),
        }
    }
}
