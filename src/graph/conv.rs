//! Convolutions and pooling over `[N, C, H, W]` values, built from two primitive ops and the
//! matmul: `unfold` (im2col: every window of the input as a column) and its adjoint `fold`
//! (col2im: each column entry summed back into the element it came from).
//!
//! - `conv2d(x, w)` is `w` (as `[groups, out / groups, in / groups · kh · kw]`) times the
//!   unfolded input (as `[groups, in / groups · kh · kw, N · Ho · Wo]`): one product whose K is
//!   the window and whose N is every output position of the batch, so the backward products
//!   (weight: K = N · Ho · Wo; input: then `fold`) are single matmuls too, on the GPU's matmul
//!   kernels with their precision modes.
//! - `max_pool2d` and `avg_pool2d` reduce the unfolded windows (`max`, `mean`); the GPU reads
//!   the windows inside the reduction's kernel. A max-pool window's gradient is shared equally
//!   by the elements that attain its maximum (as `max` shares it), the same on every backend.
//!   `avg_pool2d` divides by the whole window, padding included (PyTorch's
//!   `count_include_pad=True`).
//! - `batch_norm` normalizes per channel (axis 1) with the batch's statistics while training
//!   and with running statistics (state values, updated by each training step) in evaluation.

use super::ir::{Graph, Init, NodeId, Op, Update};
use crate::err;
use crate::error::{Error, Result};
use crate::tensor::{fmt_shape, DType};

/// The last segment of a batch norm's running variance state (never negative), PyTorch's name.
pub const RUNNING_VAR: &str = "running_var";

/// The geometry of a 2-D sliding window over the last two axes of an `[N, C, H, W]` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Step between windows, vertically and horizontally.
    pub stride: [usize; 2],
    /// Rows and columns added on each side (zeros for convolutions and average pooling, -inf
    /// for max pooling).
    pub padding: [usize; 2],
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
}

impl Window {
    /// A 1x1 window (the op table's sample).
    pub const SAMPLE: Window =
        Window { kernel: [1, 1], stride: [1, 1], padding: [0, 0], dilation: [1, 1] };

    /// The output height and width over an input of height and width `hw`, or why the window
    /// does not fit (`op` names the op in the message).
    pub fn output(&self, op: &str, hw: [usize; 2]) -> Result<[usize; 2]> {
        for (what, v) in
            [("kernel", self.kernel), ("stride", self.stride), ("dilation", self.dilation)]
        {
            if v.contains(&0) {
                return Err(Error::shape(format!(
                    "{op}: `{what}` must be at least 1, got {}",
                    pair(v)
                )));
            }
        }
        // So that `size` cannot overflow (a host's kernel of [2^32, 2^32] wrapped to an empty
        // window): every window `output` accepts has a size.
        if self.kernel[0].checked_mul(self.kernel[1]).is_none() {
            return Err(Error::shape(format!("{op}: `kernel` {} is too large", pair(self.kernel))));
        }
        let mut out = [0; 2];
        for a in 0..2 {
            let padded = self.padding[a].checked_mul(2).and_then(|p| p.checked_add(hw[a]));
            let span =
                self.dilation[a].checked_mul(self.kernel[a] - 1).and_then(|s| s.checked_add(1));
            let (Some(padded), Some(span)) = (padded, span) else {
                return Err(Error::shape(format!(
                    "{op}: `padding` {} or `kernel` {} with `dilation` {} is too large",
                    pair(self.padding),
                    pair(self.kernel),
                    pair(self.dilation)
                )));
            };
            if span > padded {
                return Err(Error::shape(format!(
                    "{op}: `kernel` {} with `dilation` {} is larger than the padded input {}x{} (input {}x{}, `padding` {})",
                    pair(self.kernel),
                    pair(self.dilation),
                    hw[0].saturating_add(self.padding[0].saturating_mul(2)),
                    hw[1].saturating_add(self.padding[1].saturating_mul(2)),
                    hw[0],
                    hw[1],
                    pair(self.padding)
                )));
            }
            out[a] = (padded - span) / self.stride[a] + 1;
        }
        Ok(out)
    }

    /// Elements in one window (of a window [`Window::output`] accepts: larger ones overflow).
    pub fn size(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }
}

/// `3x3`, or `3` when both are equal.
fn pair(v: [usize; 2]) -> String {
    if v[0] == v[1] {
        v[0].to_string()
    } else {
        format!("{}x{}", v[0], v[1])
    }
}

/// The shape of `unfold` over `x` ([N, C, H, W]): `[C · kh · kw, N · Ho · Wo]`.
pub(crate) fn unfold_shape(op: &str, window: &Window, x: &[usize]) -> Result<Vec<usize>> {
    let [n, c, h, w] = *x else {
        return Err(Error::shape(format!(
            "{op}: input `x` must be [N, C, H, W], got {}",
            fmt_shape(x)
        )));
    };
    let [ho, wo] = window.output(op, [h, w])?;
    let rows = c.checked_mul(window.size());
    let cols = n.checked_mul(ho).and_then(|v| v.checked_mul(wo));
    match (rows, cols) {
        (Some(r), Some(l)) => Ok(vec![r, l]),
        _ => {
            Err(Error::shape(format!("{op}: the unfolded input of {} is too large", fmt_shape(x))))
        }
    }
}

/// Options of [`Graph::conv2d`] besides the kernel (the weight's last two axes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// Step between windows (height, width).
    pub stride: [usize; 2],
    /// Zero rows and columns added on each side.
    pub padding: [usize; 2],
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
    /// Channel groups: input and output channels split into `groups` independent convolutions.
    pub groups: usize,
}

impl Default for Conv2d {
    fn default() -> Conv2d {
        Conv2d { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 }
    }
}

/// Options of [`Graph::batch_norm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNorm {
    /// Weight of the batch's statistics in each update of the running ones.
    pub momentum: f32,
    /// Added to the variance before the square root.
    pub eps: f32,
}

impl Default for BatchNorm {
    fn default() -> BatchNorm {
        BatchNorm { momentum: 0.1, eps: 1e-5 }
    }
}

impl Graph {
    /// im2col: `[N, C, H, W] -> [C · kh · kw, N · Ho · Wo]`, row `(c, i, j)` and column
    /// `(n, oh, ow)` holding `x[n, c, oh · sh − ph + i · dh, ow · sw − pw + j · dw]`, or `fill`
    /// where that falls in the padding.
    pub fn unfold(&mut self, x: NodeId, window: Window, fill: f32) -> Result<NodeId> {
        self.add_node(Op::Unfold { window, fill }, &[x], &[])
    }

    /// 2-D convolution (cross-correlation, as PyTorch's `conv2d`): `x` `[N, C, H, W]`, `weight`
    /// `[out, C / groups, kh, kw]`, `bias` `[out]` (or none) → `[N, out, Ho, Wo]`.
    pub fn conv2d(
        &mut self,
        x: NodeId,
        weight: NodeId,
        bias: Option<NodeId>,
        opts: Conv2d,
    ) -> Result<NodeId> {
        let ids: Vec<NodeId> = [x, weight].into_iter().chain(bias).collect();
        self.check_ids("conv2d", &ids)?;
        let (xs, ws) = (self.shape(x).to_vec(), self.shape(weight).to_vec());
        let fail = |g: &Graph, m: String| Err(err!(Shape, "conv2d: {m}").at(g.span));
        if xs.len() != 4 || self.dtype(x) != DType::F32 {
            return fail(
                self,
                format!(
                    "input `x` must be f32 [N, C, H, W], got {}{}",
                    self.dtype(x),
                    fmt_shape(&xs)
                ),
            );
        }
        let [o, cg, kh, kw] = ws[..] else {
            return fail(
                self,
                format!("`weight` must be [out, in / groups, kh, kw], got {}", fmt_shape(&ws)),
            );
        };
        let (n, c, groups) = (xs[0], xs[1], opts.groups);
        if groups == 0 || c % groups != 0 || o % groups != 0 {
            return fail(self, format!(
                "`groups` {groups} must divide the input channels ({c}) and the output channels ({o})"
            ));
        }
        if cg != c / groups {
            return fail(self, format!(
                "`weight` {} takes {cg} input channels per group, the input has {c} channels in {groups} groups of {}",
                fmt_shape(&ws),
                c / groups
            ));
        }
        if let Some(b) = bias {
            if self.shape(b) != [o] && !self.shape(b).is_empty() {
                return fail(
                    self,
                    format!(
                        "`bias` must be [{o}] (one per output channel), got {}",
                        fmt_shape(self.shape(b))
                    ),
                );
            }
        }
        let window = Window {
            kernel: [kh, kw],
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
        };
        let [ho, wo] = window.output("conv2d", [xs[2], xs[3]]).map_err(|e| e.at(self.span))?;
        let cols = self.unfold(x, window, 0.0)?; // [C · kh · kw, N · Ho · Wo]
        let k = cg * kh * kw;
        let l = n * ho * wo;
        let y = if groups == 1 {
            let w2 = self.reshape(weight, &[o, k])?;
            self.matmul(w2, cols)?
        } else {
            let w3 = self.reshape(weight, &[groups, o / groups, k])?;
            let c3 = self.reshape(cols, &[groups, k, l])?;
            self.matmul(w3, c3)?
        };
        let y = self.reshape(y, &[o, n, ho, wo])?;
        let y = self.permute(y, &[1, 0, 2, 3])?;
        match bias {
            Some(b) if self.shape(b).len() == 1 => {
                let b = self.reshape(b, &[1, o, 1, 1])?;
                self.add(y, b)
            }
            Some(b) => self.add(y, b),
            None => Ok(y),
        }
    }

    /// Max pooling over `kernel` windows of `[N, C, H, W]`, padded with -inf; `padding` at most
    /// half the kernel, so every window holds an element of `x`.
    pub fn max_pool2d(
        &mut self,
        x: NodeId,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<NodeId> {
        self.pool("max_pool2d", x, kernel, stride, padding)
    }

    /// Average pooling over `kernel` windows of `[N, C, H, W]`, zero padding counted in the
    /// average (PyTorch's default); `padding` at most half the kernel.
    pub fn avg_pool2d(
        &mut self,
        x: NodeId,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<NodeId> {
        self.pool("avg_pool2d", x, kernel, stride, padding)
    }

    fn pool(
        &mut self,
        op: &str,
        x: NodeId,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<NodeId> {
        self.check_ids(op, &[x])?;
        let xs = self.shape(x).to_vec();
        if xs.len() != 4 || self.dtype(x) != DType::F32 {
            return Err(err!(
                Shape,
                "{op}: input `x` must be f32 [N, C, H, W], got {}{}",
                self.dtype(x),
                fmt_shape(&xs)
            )
            .at(self.span));
        }
        // `padding > kernel / 2` is `2 * padding > kernel`, without the product that
        // overflowed on a host's padding of 2^63.
        if (0..2).any(|a| padding[a] > kernel[a] / 2) {
            return Err(err!(
                Shape,
                "{op}: `padding` {} must be at most half of `kernel` {}",
                pair(padding),
                pair(kernel)
            )
            .at(self.span));
        }
        let window = Window { kernel, stride, padding, dilation: [1, 1] };
        let [ho, wo] = window.output(op, [xs[2], xs[3]]).map_err(|e| e.at(self.span))?;
        let (n, c) = (xs[0], xs[1]);
        let max = op == "max_pool2d";
        let cols = self.unfold(x, window, if max { f32::NEG_INFINITY } else { 0.0 })?;
        // Unfolded, so `c · kernel` and `n · ho · wo` are dimensions of a value: no overflow.
        let cols = self.reshape(cols, &[c, window.size(), n * ho * wo])?;
        let y = if max { self.max(cols, &[1], false)? } else { self.mean(cols, &[1], false)? };
        let y = self.reshape(y, &[c, n, ho, wo])?;
        self.permute(y, &[1, 0, 2, 3])
    }

    /// The axes from `start` on joined into one: `[N, C, H, W]` → `[N, C · H · W]` at
    /// `start = 1`.
    pub fn flatten(&mut self, x: NodeId, start: usize) -> Result<NodeId> {
        self.check_ids("flatten", &[x])?;
        let xs = self.shape(x).to_vec();
        if start >= xs.len() {
            return Err(err!(
                Shape,
                "flatten: `start` {start} must be an axis of the input {}",
                fmt_shape(&xs)
            )
            .at(self.span));
        }
        let mut shape = xs[..start].to_vec();
        shape.push(xs[start..].iter().product());
        self.reshape(x, &shape)
    }

    /// Batch normalization over axis 1 of `x` (`[N, C]` or `[N, C, ...]`): while training,
    /// `(x − mean) / sqrt(var + eps) · weight + bias` with the batch's per-channel mean and
    /// (biased) variance, and the updates `running = (1 − momentum) · running + momentum ·
    /// batch` (the variance unbiased, as PyTorch keeps it); in evaluation the running
    /// statistics stand in for the batch's. `running_mean` and `running_var` are state values
    /// `[C]` (zeros and ones initially).
    pub fn batch_norm(
        &mut self,
        x: NodeId,
        weight: NodeId,
        bias: NodeId,
        running: [NodeId; 2],
        opts: BatchNorm,
    ) -> Result<NodeId> {
        self.check_ids("batch_norm", &[x, weight, bias, running[0], running[1]])?;
        let xs = self.shape(x).to_vec();
        if xs.len() < 2 || self.dtype(x) != DType::F32 {
            return Err(err!(
                Shape,
                "batch_norm: input `x` must be f32 [N, C] or [N, C, ...], got {}{}",
                self.dtype(x),
                fmt_shape(&xs)
            )
            .at(self.span));
        }
        let c = xs[1];
        for (what, id) in [
            ("weight", weight),
            ("bias", bias),
            ("running_mean", running[0]),
            (RUNNING_VAR, running[1]),
        ] {
            if self.shape(id) != [c] {
                return Err(err!(
                    Shape,
                    "batch_norm: `{what}` must be [{c}] (one per channel of {}), got {}",
                    fmt_shape(&xs),
                    fmt_shape(self.shape(id))
                )
                .at(self.span));
            }
        }
        for id in running {
            if !matches!(self.node(id).op, Op::State { .. }) {
                return Err(err!(Shape, "batch_norm: the running statistics must be state values")
                    .at(self.span));
            }
        }
        if !(0.0..=1.0).contains(&opts.momentum) {
            return Err(err!(
                InvalidArgument,
                "batch_norm: `momentum` must be in [0, 1], got {}",
                opts.momentum
            )
            .at(self.span));
        }
        crate::num::eps_f32(opts.eps)
            .map_err(|m| err!(InvalidArgument, "batch_norm: `eps` {m}").at(self.span))?;
        let axes: Vec<usize> = (0..xs.len()).filter(|&a| a != 1).collect();
        let count: usize = axes.iter().map(|&a| xs[a]).product();
        let mut kept = vec![1; xs.len()];
        kept[1] = c;
        // The batch's statistics.
        let mean = self.mean(x, &axes, false)?;
        let centered = {
            let m = self.reshape(mean, &kept)?;
            self.sub(x, m)?
        };
        let sq = self.square(centered)?;
        let var = self.mean(sq, &axes, false)?;
        // Training reads the batch's, evaluation the running ones.
        let m = self.add_node(Op::TrainingSelect, &[mean, running[0]], &[])?;
        let v = self.add_node(Op::TrainingSelect, &[var, running[1]], &[])?;
        let m = self.reshape(m, &kept)?;
        let v = self.reshape(v, &kept)?;
        let v = self.add_scalar(v, opts.eps)?;
        let rstd = self.unary(super::UnaryOp::Rsqrt, v)?;
        let xhat = {
            let d = self.sub(x, m)?;
            self.mul(d, rstd)?
        };
        let (w, b) = (self.reshape(weight, &kept)?, self.reshape(bias, &kept)?);
        let y = self.mul(xhat, w)?;
        let y = self.add(y, b)?;
        // The running statistics' updates, applied after each training step, and with gradient
        // accumulation after each micro-batch, as a PyTorch accumulation loop's forward passes
        // do (applied at updates only, every micro-batch but the last was dropped).
        let unbias = count as f32 / (count.max(2) - 1) as f32;
        for (stat, target, scale) in [(mean, running[0], 1.0), (var, running[1], unbias)] {
            let old = self.scale(target, 1.0 - opts.momentum)?;
            let new = self.scale(stat, opts.momentum * scale)?;
            let value = self.add(old, new)?;
            self.updates.push(Update { target, value, every_micro_batch: true });
        }
        Ok(y)
    }

    /// The running statistics of a batch norm: state values `{prefix}running_mean` (zeros) and
    /// `{prefix}`[`RUNNING_VAR`] (ones), `[C]`, PyTorch's names.
    pub fn batch_norm_state(&mut self, prefix: &str, c: usize) -> Result<[NodeId; 2]> {
        let mean = self.state(&format!("{prefix}running_mean"), &[c], Init::Zeros)?;
        let var = self.state(&format!("{prefix}{RUNNING_VAR}"), &[c], Init::Ones)?;
        Ok([mean, var])
    }

    fn add_scalar(&mut self, x: NodeId, v: f32) -> Result<NodeId> {
        let c = self.constant(v);
        self.add(x, c)
    }
}
