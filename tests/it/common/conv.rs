//! Op-table cases for convolutions, pooling, flatten and batch norm: stride 2, padding,
//! dilation 2, groups 2, depthwise, 1x1 and non-square kernels, windows that overlap and
//! windows that skip elements.

use super::{case, Case, Dom::*};
use rumus::graph::{BatchNorm, Conv2d, Op, Window};

/// (name, x, weight, options)
pub type ConvRow = (&'static str, [usize; 4], [usize; 4], Conv2d);

const fn opts(
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Conv2d {
    Conv2d { stride, padding, dilation, groups }
}

pub const CONVS: &[ConvRow] = &[
    ("conv2d 3x3", [2, 3, 5, 5], [4, 3, 3, 3], opts([1, 1], [0, 0], [1, 1], 1)),
    ("conv2d stride 2 padding 1", [1, 2, 6, 5], [3, 2, 3, 3], opts([2, 2], [1, 1], [1, 1], 1)),
    ("conv2d dilation 2", [1, 2, 7, 6], [2, 2, 3, 3], opts([1, 1], [2, 1], [2, 2], 1)),
    ("conv2d groups 2", [2, 4, 5, 4], [6, 2, 3, 2], opts([1, 1], [1, 0], [1, 1], 2)),
    ("conv2d depthwise", [1, 3, 5, 5], [3, 1, 3, 3], opts([1, 1], [1, 1], [1, 1], 3)),
    ("conv2d 1x1", [2, 3, 4, 3], [5, 3, 1, 1], opts([1, 1], [0, 0], [1, 1], 1)),
    ("conv2d non-square", [1, 2, 5, 7], [3, 2, 2, 3], opts([2, 1], [1, 0], [1, 2], 1)),
    ("conv2d stride 3 skips", [1, 1, 7, 7], [2, 1, 2, 2], opts([3, 3], [0, 0], [1, 1], 1)),
];

/// (name, max, x, kernel, stride, padding)
pub type PoolRow = (&'static str, bool, [usize; 4], [usize; 2], [usize; 2], [usize; 2]);

pub const POOLS: &[PoolRow] = &[
    ("max_pool2d 2", true, [2, 3, 4, 4], [2, 2], [2, 2], [0, 0]),
    ("max_pool2d 3 stride 2 padding 1", true, [1, 2, 5, 6], [3, 3], [2, 2], [1, 1]),
    ("max_pool2d non-square overlapping", true, [1, 2, 5, 5], [2, 3], [1, 2], [1, 1]),
    ("avg_pool2d 2", false, [2, 3, 4, 4], [2, 2], [2, 2], [0, 0]),
    ("avg_pool2d 3 stride 2 padding 1", false, [1, 2, 5, 6], [3, 3], [2, 2], [1, 1]),
];

pub fn cases() -> Vec<Case> {
    let mut cs = Vec::new();
    for &(name, x, w, o) in CONVS {
        let o2 = o;
        cs.push(case(name, &[(&x, Any), (&w, Any), (&[w[0]], Any)], move |g, v| {
            g.conv2d(v[0], v[1], Some(v[2]), o2)
        }));
        cs.push(case(&format!("{name} no bias"), &[(&x, Any), (&w, Any)], move |g, v| {
            g.conv2d(v[0], v[1], None, o)
        }));
    }
    for &(name, max, x, k, s, p) in POOLS {
        cs.push(case(name, &[(&x, Any)], move |g, v| {
            if max {
                g.max_pool2d(v[0], k, s, p)
            } else {
                g.avg_pool2d(v[0], k, s, p)
            }
        }));
    }
    // fold on its own (elsewhere it appears only in gradients): overlapping windows summed.
    let w = Window { kernel: [2, 3], stride: [1, 2], padding: [1, 1], dilation: [2, 1] };
    cs.push(case("fold", &[(&[12, 30], Any)], move |g, v| {
        g.add_node(Op::Fold { window: w }, &[v[0]], &[2, 2, 5, 5])
    }));
    cs.push(case("unfold fill", &[(&[1, 2, 3, 4], Any)], move |g, v| g.unfold(v[0], w, -2.5)));
    cs.push(case("flatten", &[(&[2, 3, 2, 2], Any)], |g, v| g.flatten(v[0], 1)));
    for (name, x) in [("batch_norm nchw", &[3, 2, 3, 2][..]), ("batch_norm [N, C]", &[4, 3][..])] {
        let c = x[1];
        cs.push(case(name, &[(x, Any), (&[c], Any), (&[c], Any)], move |g, v| {
            let running = g.batch_norm_state("bn.", c)?;
            g.batch_norm(v[0], v[1], v[2], running, BatchNorm::default())
        }));
    }
    cs
}
