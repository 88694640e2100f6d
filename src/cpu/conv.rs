//! The convolution primitives, forward and backward side by side: `unfold` (im2col) and its
//! adjoint `fold` (col2im). Convolutions and pooling are built from them and the matmul
//! (`graph::conv`), so these two loops are all the CPU reference adds for them.

use crate::graph::Window;

/// The padded-input coordinate of window element `i` at output position `o` along one axis,
/// or `None` where it falls in the padding.
fn source(o: usize, i: usize, w: &Window, axis: usize, size: usize) -> Option<usize> {
    let at = (o * w.stride[axis] + i * w.dilation[axis]).checked_sub(w.padding[axis])?;
    (at < size).then_some(at)
}

/// im2col: `x` `[N, C, H, W]` → `[C·kh·kw, N·Ho·Wo]`, `fill` in the padding.
pub fn unfold<T: Copy>(x: &[T], shape: &[usize], w: &Window, out: &[usize], fill: T) -> Vec<T> {
    let [n, c, h, wd] = shape[..] else { return Vec::new() };
    let l = out[1];
    let [kh, kw] = w.kernel;
    let [ho, wo] = w.output("unfold", [h, wd]).unwrap_or([0, 0]);
    let mut cols = vec![fill; out.iter().product()];
    for ci in 0..c {
        for i in 0..kh {
            for j in 0..kw {
                let row = (ci * kh + i) * kw + j;
                for b in 0..n {
                    for oh in 0..ho {
                        let Some(y) = source(oh, i, w, 0, h) else { continue };
                        for ow in 0..wo {
                            if let Some(xx) = source(ow, j, w, 1, wd) {
                                cols[row * l + (b * ho + oh) * wo + ow] =
                                    x[((b * c + ci) * h + y) * wd + xx];
                            }
                        }
                    }
                }
            }
        }
    }
    cols
}

/// col2im: `cols` `[C·kh·kw, N·Ho·Wo]` → `[N, C, H, W]` (`shape`), each element the sum of the
/// entries `unfold` copied it to, added in window order (the GPU adds in the same order).
pub fn fold<T: super::Float>(cols: &[T], w: &Window, shape: &[usize]) -> Vec<T> {
    let [n, c, h, wd] = shape[..] else { return Vec::new() };
    let [kh, kw] = w.kernel;
    let [ho, wo] = w.output("fold", [h, wd]).unwrap_or([0, 0]);
    let l = n * ho * wo;
    let mut x = vec![T::zero(); n * c * h * wd];
    for b in 0..n {
        for ci in 0..c {
            for y in 0..h {
                for xx in 0..wd {
                    let mut s = T::zero();
                    for i in 0..kh {
                        let Some(oh) = target(y, i, w, 0, ho) else { continue };
                        for j in 0..kw {
                            if let Some(ow) = target(xx, j, w, 1, wo) {
                                let row = (ci * kh + i) * kw + j;
                                s += cols[row * l + (b * ho + oh) * wo + ow];
                            }
                        }
                    }
                    x[((b * c + ci) * h + y) * wd + xx] = s;
                }
            }
        }
    }
    x
}

/// The output position whose window element `i` reads input coordinate `at` along one axis, if
/// any: `o · stride + i · dilation − padding = at`.
fn target(at: usize, i: usize, w: &Window, axis: usize, size: usize) -> Option<usize> {
    let num = (at + w.padding[axis]).checked_sub(i * w.dilation[axis])?;
    let s = w.stride[axis];
    (num % s == 0 && num / s < size).then_some(num / s)
}
