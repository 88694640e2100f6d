//! Attention programs: a FlashAttention-2 forward and backward for the plan's four attention
//! kernel kinds, generated in WGSL (nothing of size `T x T` exists in any pass).
//!
//! - `attention` (with or without its stats) and `attention_stats`: the forward kernel, per
//!   block of query rows an online softmax over the key blocks at or left of the diagonal,
//!   writing the output and each row's log-sum-exp (the one not wanted goes to scratch);
//! - `attention_bw_kv`: dK and dV per block of key rows, looping over the query blocks that see
//!   it, recomputing the probabilities from the saved log-sum-exp;
//! - `attention_bw_q`: dQ per block of query rows, looping over its key blocks. Each output
//!   element is written by one workgroup: no float atomics.
//!
//! `delta = Σ_d dy·y` (FlashAttention-2's `D`) is computed by each backward kernel for its
//! query rows from the output and its gradient, so the backward is two dispatches.
//!
//! This module owns the problem ([`Shape`], the [`Strided`] layout of each tensor in its
//! buffer), the choice of blocks that fit the device ([`configure`]) and the programs; the
//! fp32 kernels are written by `simt.rs`. Precision modes with cooperative matrices plug in at
//! [`Precision`]: `configure` is where a mode picks its kernels.

mod coop;
mod simt;

use super::loops::Loops;
use super::writer::Wgsl;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks, Target};
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::plan::view::View;
use crate::codegen::matmul_coop::CoopMode;
use crate::codegen::CoopAttention;
use crate::codegen::MatmulPrecision;
use crate::plan::{Kernel, KernelKind, Plan};

/// The largest head dimension the kernels take.
pub const MAX_DH: usize = 128;

/// One attention problem: q, k, v `[b, h, t, dh]`, causal, scale `1/sqrt(dh)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub b: u32,
    pub h: u32,
    pub t: u32,
    pub dh: u32,
}

impl Shape {
    /// The shape of `[b, h, t, dh]`, or why the kernels cannot take it.
    pub fn of(dims: &[usize]) -> Result<Shape> {
        let &[b, h, t, dh] = dims else {
            return Err(err!(Invariant, "attention operand of rank {}", dims.len()));
        };
        if dh > MAX_DH {
            return Err(err!(
                Shape,
                "attention: head dimension {dh} is above {MAX_DH}, the largest the GPU kernels take; use more heads"
            ));
        }
        let numel = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        // Two per element: dK and dV share one buffer.
        if numel.is_none_or(|n| n > (i32::MAX as u64) / 2) {
            return Err(err!(
                Shape,
                "attention: q of shape [{b}, {h}, {t}, {dh}] has more than 2^30 elements, too many for the GPU kernels; use a smaller batch"
            ));
        }
        Ok(Shape { b: b as u32, h: h as u32, t: t as u32, dh: dh as u32 })
    }

    /// Elements of one of q, k, v, the output.
    pub fn numel(&self) -> u64 {
        self.heads() as u64 * self.t as u64 * self.dh as u64
    }

    /// Heads over the batch, `b·h`.
    pub fn heads(&self) -> u32 {
        self.b * self.h
    }

    /// Query rows over every head, `b·h·t` (the stats' length).
    pub fn rows(&self) -> u64 {
        self.heads() as u64 * self.t as u64
    }
}

/// Where the elements of one `[b, h, t, dh]` tensor are in its buffer: element `(b, h, i, d)`
/// at `offset + b·sb + h·sh + i·st + d` (the head dimension is contiguous). dK and dV are two
/// layouts in one buffer; a permuted or sliced operand is a layout, not a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Strided {
    pub offset: u32,
    pub sb: u32,
    pub sh: u32,
    pub st: u32,
}

impl Strided {
    /// `[b, h, t, dh]` row-major from element `offset`.
    pub fn contiguous(s: &Shape, offset: u32) -> Strided {
        Strided { offset, sb: s.h * s.t * s.dh, sh: s.t * s.dh, st: s.dh }
    }

    /// The layout of a strided view of a `[b, h, t, dh]` value (innermost axis contiguous),
    /// or why the kernels cannot address it (an element past `i32::MAX`).
    pub fn of_view(v: &View) -> Result<Strided> {
        let &[sb, sh, st, 1] = v.strides.as_slice() else {
            return Err(err!(Invariant, "attention operand viewed with strides {:?}", v.strides));
        };
        let word = |n: usize| u32::try_from(n).ok().filter(|&n| n <= i32::MAX as u32);
        match (word(v.offset), word(sb), word(sh), word(st)) {
            (Some(offset), Some(sb), Some(sh), Some(st)) => Ok(Strided { offset, sb, sh, st }),
            _ => Err(err!(
                Shape,
                "attention: an operand viewed at offset {} with strides {:?} lies past 2^31 elements, too far for the GPU kernels; use a smaller batch",
                v.offset,
                v.strides
            )),
        }
    }

    /// Elements of the buffer the kernels may touch: one past the last element of `s`.
    pub fn words(&self, s: &Shape) -> u64 {
        if s.numel() == 0 {
            return 0;
        }
        let last = |n: u32, stride: u32| (n as u64 - 1) * stride as u64;
        self.offset as u64 + last(s.b, self.sb) + last(s.h, self.sh) + last(s.t, self.st) + s.dh as u64
    }
}

/// How the block products are computed: PyTorch's matmul precision names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// IEEE fp32 on the SIMT cores (`simt.rs`).
    Highest,
    /// On 16x16x16 f16 cooperative matrices in `mode` (`coop.rs`), their operations emulated
    /// in plain WGSL when `emulate`.
    Coop { mode: CoopMode, emulate: bool },
}

impl Precision {
    /// The precision of attention of shape `shape` in `target`'s matmul mode: cooperative
    /// where the mode is, its options ask for it in attention (`MatmulOptions::coop_attention`)
    /// and the target has cooperative matrices on subgroups of 32 (or emulates them). By
    /// default only `medium` with heads of 64 or more: on the H200 its cooperative kernels
    /// took gpt-medium's attention (Dh 64, T 256) from 7.4 to 6.3 ms a step and gpt-small's
    /// (Dh 32, T 128) from 0.71 to 0.79 (BENCHMARKS.md, "Attention on cooperative matrices").
    pub fn of(target: &Target, shape: &Shape) -> Precision {
        let mode = match (target.matmul.precision, target.matmul.coop_attention) {
            (MatmulPrecision::Medium, CoopAttention::Medium) if shape.dh >= 64 => CoopMode::Medium,
            (MatmulPrecision::Medium, CoopAttention::All) => CoopMode::Medium,
            (MatmulPrecision::High, CoopAttention::All) => CoopMode::High,
            _ => return Precision::Highest,
        };
        match (target.cooperative, target.matmul.emulate_coop) {
            (_, true) => Precision::Coop { mode, emulate: true },
            (Some(coop::SUBGROUP), false) => Precision::Coop { mode, emulate: false },
            _ => Precision::Highest,
        }
    }
}

/// The blocks of one kernel: `br` query rows and `bc` key rows per step, `threads` invocations
/// per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Blocks {
    pub br: u32,
    pub bc: u32,
    pub threads: u32,
}

/// The three kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    BackwardKv,
    BackwardQ,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Forward => "attention",
            Pass::BackwardKv => "attention_bw_kv",
            Pass::BackwardQ => "attention_bw_q",
        }
    }
}

/// The tensors the kernels bind, with their WGSL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    Q,
    K,
    V,
    O,
    DO,
    DQ,
    /// dK and dV: one buffer, two layouts.
    DKV,
    /// Per-row log-sum-exp `[b, h, t]`.
    Lse,
}

impl Tensor {
    fn name(self) -> &'static str {
        match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::O => "o",
            Tensor::DO => "d_o",
            Tensor::DQ => "dq",
            Tensor::DKV => "dkv",
            Tensor::Lse => "lse",
        }
    }
}

/// The layouts of the `[b, h, t, dh]` tensors (the stats are contiguous `[b, h, t]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layouts {
    pub q: Strided,
    pub k: Strided,
    pub v: Strided,
    pub o: Strided,
    pub d_o: Strided,
    pub dq: Strided,
    pub dk: Strided,
    pub dv: Strided,
}

impl Layouts {
    /// Every tensor contiguous; dV after dK in their buffer.
    pub fn contiguous(s: &Shape) -> Layouts {
        let c = Strided::contiguous(s, 0);
        let dv = Strided::contiguous(s, s.numel() as u32);
        Layouts { q: c, k: c, v: c, o: c, d_o: c, dq: c, dk: c, dv }
    }
}

/// `fn at_{name}(bh, i, d) -> u32` (the element index) for each bound `[b, h, t, dh]` tensor
/// of `bindings` (two for dK/dV), and `fn row_at(bh, i)` for the stats: the addressing both
/// kernel families share (they declare the constants `H` and `T`).
fn index_fns(w: &mut Wgsl, l: &Layouts, bindings: &[(Tensor, bool)]) {
    for (t, _) in bindings {
        let layouts: &[(&str, Strided)] = match t {
            Tensor::Q => &[("q", l.q)],
            Tensor::K => &[("k", l.k)],
            Tensor::V => &[("v", l.v)],
            Tensor::O => &[("o", l.o)],
            Tensor::DO => &[("d_o", l.d_o)],
            Tensor::DQ => &[("dq", l.dq)],
            Tensor::DKV => &[("dk", l.dk), ("dv", l.dv)],
            Tensor::Lse => &[],
        };
        for (name, l) in layouts {
            w.open(&format!("fn at_{name}(bh: u32, i: u32, d: u32) -> u32"));
            w.line(&format!(
                "return {}u + (bh / H) * {}u + (bh % H) * {}u + i * {}u + d;",
                l.offset, l.sb, l.sh, l.st
            ));
            w.close();
        }
    }
    w.open("fn row_at(bh: u32, i: u32) -> u32");
    w.line("return bh * T + i;");
    w.close();
}

/// Everything the kernels of one attention problem are generated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    pub shape: Shape,
    pub layouts: Layouts,
    pub precision: Precision,
    pub forward: Blocks,
    pub backward_kv: Blocks,
    pub backward_q: Blocks,
}

impl Config {
    fn blocks(&self, pass: Pass) -> Blocks {
        match pass {
            Pass::Forward => self.forward,
            Pass::BackwardKv => self.backward_kv,
            Pass::BackwardQ => self.backward_q,
        }
    }
}

/// A generated kernel before it meets the plan's buffers.
#[derive(Clone, Debug)]
pub struct Generated {
    pub wgsl: String,
    pub threads: u32,
    pub workgroup_bytes: u32,
    /// Workgroups: blocks per head times heads (a linear grid).
    pub workgroups: u32,
    /// Storage bindings in binding order, and whether each is written.
    pub bindings: Vec<(Tensor, bool)>,
    /// Its loops, for one invocation.
    pub loops: Loops,
}

/// For each kernel, the first blocks of its preference list (`simt::candidates`: the fastest
/// measured first; none much larger than T) whose kernel fits `target`'s invocations and
/// workgroup memory. The cooperative kernels take the first of `coop::candidates` that fits;
/// where none does (a large head dimension in `high` on a small device), the fp32 kernels.
pub fn configure(shape: Shape, layouts: Layouts, precision: Precision, target: &Target) -> Result<Config> {
    if let Precision::Coop { mode, emulate } = precision {
        let cap = shape.t.next_power_of_two().max(16);
        let pick = |pass: Pass| {
            coop::candidates(pass).into_iter().find(|b| {
                let (own, other) = if pass == Pass::BackwardKv { (b.bc, b.br) } else { (b.br, b.bc) };
                own <= cap
                    && other <= cap
                    && b.threads <= target.max_invocations
                    && coop::workgroup_bytes(&shape, b, pass, mode, emulate) <= target.max_workgroup_bytes
            })
        };
        if let (Some(forward), Some(backward_kv), Some(backward_q)) =
            (pick(Pass::Forward), pick(Pass::BackwardKv), pick(Pass::BackwardQ))
        {
            return Ok(Config { shape, layouts, precision, forward, backward_kv, backward_q });
        }
    }
    let precision = Precision::Highest;
    let cap = shape.t.next_power_of_two().max(4);
    let first = simt::candidates(Pass::Forward, shape.dh)[0];
    let mut cfg = Config { shape, layouts, precision, forward: first, backward_kv: first, backward_q: first };
    for pass in [Pass::Forward, Pass::BackwardKv, Pass::BackwardQ] {
        let fits = simt::candidates(pass, shape.dh).iter().filter(|b| b.br <= cap && b.bc <= cap).find(|&&b| {
            b.threads <= target.max_invocations
                && simt::workgroup_bytes(&shape, &b, pass).is_some_and(|n| n <= target.max_workgroup_bytes)
        });
        let Some(&b) = fits else {
            return Err(err!(
                Device,
                "attention: no block size of the {} kernel fits this device ({} bytes of workgroup memory, {} invocations); head dimension {} needs more",
                pass.name(),
                target.max_workgroup_bytes,
                target.max_invocations,
                shape.dh
            ));
        };
        match pass {
            Pass::Forward => cfg.forward = b,
            Pass::BackwardKv => cfg.backward_kv = b,
            Pass::BackwardQ => cfg.backward_q = b,
        }
    }
    Ok(cfg)
}

/// The kernel of `pass` for `cfg`, by its precision.
pub fn generate(cfg: &Config, pass: Pass) -> Generated {
    match cfg.precision {
        Precision::Highest => simt::generate(cfg, pass),
        Precision::Coop { mode, emulate } => coop::generate(cfg, pass, mode, emulate),
    }
}

/// The program of one kernel of `cfg` over `resources` (one per binding of the kernel), and
/// its loops.
fn program(cfg: &Config, pass: Pass, buffer: &dyn Fn(Tensor) -> Resource) -> (Program, Loops) {
    let gen = generate(cfg, pass);
    let s = &cfg.shape;
    let b = cfg.blocks(pass);
    let l = &cfg.layouts;
    let words = |t: Tensor| match t {
        Tensor::Lse => s.rows(),
        Tensor::Q => l.q.words(s),
        Tensor::K => l.k.words(s),
        Tensor::V => l.v.words(s),
        Tensor::O => l.o.words(s),
        Tensor::DO => l.d_o.words(s),
        Tensor::DQ => l.dq.words(s),
        Tensor::DKV => l.dk.words(s).max(l.dv.words(s)),
    };
    let bindings = gen
        .bindings
        .iter()
        .enumerate()
        .map(|(at, &(t, _))| Binding {
            at: at as u32,
            name: t.name().to_string(),
            resource: buffer(t),
            words: words(t),
        })
        .collect();
    let program = Program {
        label: format!(
            "{}{} [{}, {}, {}, {}] {}x{}/{}",
            pass.name(),
            match cfg.precision {
                Precision::Highest => "",
                Precision::Coop { mode: CoopMode::High, .. } => " coop-high",
                Precision::Coop { mode: CoopMode::Medium, .. } => " coop-medium",
            },
            s.b,
            s.h,
            s.t,
            s.dh,
            b.br,
            b.bc,
            b.threads
        ),
        wgsl: gen.wgsl,
        entry: "main",
        workgroup_size: gen.threads,
        bindings,
        grid: Grid::Linear(gen.workgroups),
        // Every global index is guarded (rows below T, columns below Dh) and every loop has a
        // bound fixed at codegen or by the workgroup id: naga's loop guard only costs time.
        checks: ShaderChecks { bounds: true, loop_bounding: false },
    };
    (program, gen.loops)
}

/// The programs of an attention kernel of `plan` (any of its four kinds), with their loops.
pub fn lower(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
) -> Result<Vec<(Program, Loops)>> {
    let buffer = |id: NodeId| {
        plan.value_of(id)
            .map(|v| Resource::Buffer(v.buffer))
            .ok_or_else(|| err!(Invariant, "node {} has no buffer in this plan", id.index()))
    };
    let out = *k.outputs.last().ok_or_else(|| err!(Invariant, "a kernel writes no value"))?;
    let node = g.node(out);
    let input = |i: usize| {
        let id = node.inputs.get(i).copied();
        id.ok_or_else(|| err!(Invariant, "{} has no input {i}", node.op.name())).and_then(buffer)
    };
    let q = node.inputs.first().ok_or_else(|| err!(Invariant, "attention without operands"))?;
    let shape = Shape::of(g.shape(*q))?;
    if shape.rows() == 0 {
        return Ok(Vec::new()); // no query row: nothing to compute
    }
    // q, k, v, the output's gradient and (read by the backward) the output may be strided
    // views of a larger value (the heads of one projection, a gradient split into heads) or
    // stored in another order.
    let mut layouts = Layouts::contiguous(&shape);
    let viewed = [&mut layouts.q, &mut layouts.k, &mut layouts.v, &mut layouts.d_o, &mut layouts.o];
    for (at, layout) in [0, 1, 2, 4, 5].into_iter().zip(viewed) {
        if let Some(v) = node.inputs.get(at).and_then(|x| plan.view[x.index()].as_ref()) {
            *layout = Strided::of_view(v)?;
        }
    }
    // The output, dq, and dK with dV may be written in another order (`plan::fuse`: the heads'
    // order of the permute that merges them), or inside a concat's buffer at its place in it
    // (the q, k and v gradients of one projection).
    if let Some(v) = plan.view[out.index()].as_ref() {
        match node.op {
            crate::graph::Op::Attention => layouts.o = Strided::of_view(v)?,
            crate::graph::Op::AttentionGradQ => layouts.dq = Strided::of_view(v)?,
            crate::graph::Op::AttentionGradKv => {
                // `[2, b, h, t, dh]`: dK at the view's offset, dV one step of its first axis on.
                let Some((&step, strides)) = v.strides.split_first() else {
                    return Err(err!(Invariant, "dK and dV viewed with strides {:?}", v.strides));
                };
                let part = |offset: usize| View { offset, strides: strides.to_vec() };
                layouts.dk = Strided::of_view(&part(v.offset))?;
                layouts.dv = Strided::of_view(&part(v.offset + step))?;
            }
            _ => return Err(err!(Invariant, "attention kernel writing {} through strides", node.op.name())),
        }
    }
    let cfg = configure(shape, layouts, Precision::of(target, &shape), target)?;
    let (q, kk) = (input(0)?, input(1)?);
    // The stats alone need no values: k stands in for v, whose output goes to scratch.
    let v = if k.kind == KernelKind::AttentionStats { kk.clone() } else { input(2)? };
    let (o, lse) = match k.kind {
        KernelKind::Attention { with_stats: true } => (buffer(out)?, input(3)?),
        KernelKind::Attention { with_stats: false } => (buffer(out)?, Resource::Scratch { slot: 0 }),
        KernelKind::AttentionStats => (Resource::Scratch { slot: 0 }, buffer(out)?),
        KernelKind::AttentionGradKv | KernelKind::AttentionGradQ => {
            let (lse, d_o, o, grad) = (input(3)?, input(4)?, input(5)?, buffer(out)?);
            let pass = if k.kind == KernelKind::AttentionGradKv {
                Pass::BackwardKv
            } else {
                Pass::BackwardQ
            };
            let resource = |t: Tensor| match t {
                Tensor::Q => q.clone(),
                Tensor::K => kk.clone(),
                Tensor::V => v.clone(),
                Tensor::Lse => lse.clone(),
                Tensor::DO => d_o.clone(),
                Tensor::O => o.clone(),
                _ => grad.clone(),
            };
            return Ok(vec![program(&cfg, pass, &resource)]);
        }
        _ => return Err(err!(Invariant, "kernel `{}` is not an attention kernel", k.kind.name())),
    };
    let resource = |t: Tensor| match t {
        Tensor::Q => q.clone(),
        Tensor::K => kk.clone(),
        Tensor::V => v.clone(),
        Tensor::Lse => lse.clone(),
        _ => o.clone(),
    };
    Ok(vec![program(&cfg, Pass::Forward, &resource)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(src: &str) -> std::result::Result<(), String> {
        use naga::valid::Capabilities;
        let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
        let caps = if src.starts_with("enable f16;") {
            Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16
        } else if src.contains(", emulated (codegen/") {
            Capabilities::SHADER_FLOAT16_IN_FLOAT32
        } else {
            Capabilities::default()
        };
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    }

    /// An adapter with the H200's limits gets the blocks measured fastest there (BENCHMARKS.md,
    /// "Faster fp32 attention kernels"): (Dh, T, forward, dK/dV, dQ).
    #[test]
    fn the_h200_gets_the_blocks_measured_fastest() {
        let b = |br, bc| Blocks { br, bc, threads: 128 };
        let table = [
            (64, 256, b(64, 32), b(32, 32), b(32, 32)),
            (32, 128, b(32, 32), b(32, 32), b(32, 32)),
        ];
        for (dh, t, forward, kv, q) in table {
            let s = Shape { b: 2, h: 3, t, dh };
            let c = configure(s, Layouts::contiguous(&s), Precision::Highest, &Target::COOPERATIVE).unwrap();
            assert_eq!((c.forward, c.backward_kv, c.backward_q), (forward, kv, q), "Dh {dh}");
        }
    }

    /// Every head dimension and sequence length gets blocks within WebGPU's default limits
    /// (ragged Dh padded, short T on small blocks), and each kernel is valid WGSL.
    #[test]
    fn every_head_dimension_fits_webgpu_defaults_and_validates() {
        let target = Target::WEBGPU_DEFAULT;
        for dh in [1, 2, 3, 4, 5, 7, 8, 12, 31, 32, 33, 48, 64, 65, 96, 127, 128] {
            for t in [1, 2, 7, 64, 300] {
                let s = Shape { b: 1, h: 2, t, dh };
                let c = configure(s, Layouts::contiguous(&s), Precision::Highest, &target).unwrap();
                for pass in [Pass::Forward, Pass::BackwardKv, Pass::BackwardQ] {
                    let g = simt::generate(&c, pass);
                    assert!(g.workgroup_bytes <= target.max_workgroup_bytes, "Dh {dh}, T {t}, {pass:?}");
                    assert!(g.threads <= target.max_invocations, "Dh {dh}, T {t}, {pass:?}");
                    if let Err(e) = validate(&g.wgsl) {
                        panic!("Dh {dh}, T {t}, {pass:?}: {e}\n{}", g.wgsl);
                    }
                }
            }
        }
    }

    /// The cooperative kernels of both modes, real and emulated, are valid WGSL at every head
    /// dimension and sequence length, fit the H200's workgroup memory (and lavapipe's when
    /// emulated), and take the cooperative path there.
    #[test]
    fn cooperative_kernels_validate_and_fit() {
        for (mode, emulate) in
            [(CoopMode::High, false), (CoopMode::Medium, false), (CoopMode::High, true), (CoopMode::Medium, true)]
        {
            let precision = Precision::Coop { mode, emulate };
            for dh in [1, 4, 16, 31, 32, 64, 65, 128] {
                for t in [1, 7, 64, 300] {
                    let s = Shape { b: 1, h: 2, t, dh };
                    let c = configure(s, Layouts::contiguous(&s), precision, &Target::COOPERATIVE).unwrap();
                    let big = dh <= 64;
                    assert!(!big || c.precision == precision, "{mode:?} Dh {dh} T {t}: fell back to fp32");
                    for pass in [Pass::Forward, Pass::BackwardKv, Pass::BackwardQ] {
                        let g = generate(&c, pass);
                        assert!(g.workgroup_bytes <= Target::COOPERATIVE.max_workgroup_bytes);
                        if let Err(e) = validate(&g.wgsl) {
                            panic!("{mode:?} emulate {emulate} Dh {dh}, T {t}, {pass:?}: {e}\n{}", g.wgsl);
                        }
                    }
                }
            }
        }
    }

    /// By default attention runs on cooperative matrices in `medium` with heads of 64 or more
    /// (measured faster there on the H200), on the fp32 kernels otherwise; `All` takes them in
    /// both cooperative modes at every head dimension; never without cooperative matrices.
    #[test]
    fn the_default_takes_cooperative_attention_where_it_was_measured_faster() {
        use crate::codegen::MatmulOptions;
        let coop = |mode, emulate| Precision::Coop { mode, emulate };
        let cases = [
            (MatmulPrecision::Medium, CoopAttention::Medium, 64, true, coop(CoopMode::Medium, false)),
            (MatmulPrecision::Medium, CoopAttention::Medium, 32, true, Precision::Highest),
            (MatmulPrecision::High, CoopAttention::Medium, 64, true, Precision::Highest),
            (MatmulPrecision::Highest, CoopAttention::All, 64, true, Precision::Highest),
            (MatmulPrecision::High, CoopAttention::All, 32, true, coop(CoopMode::High, false)),
            (MatmulPrecision::Medium, CoopAttention::None, 64, true, Precision::Highest),
            (MatmulPrecision::Medium, CoopAttention::Medium, 64, false, Precision::Highest),
        ];
        for (precision, coop_attention, dh, adapter, want) in cases {
            let matmul = MatmulOptions { precision, coop_attention, ..MatmulOptions::DEFAULT };
            let base = if adapter { Target::COOPERATIVE } else { Target::WEBGPU_DEFAULT };
            let target = Target { matmul, ..base };
            let s = Shape { b: 1, h: 1, t: 8, dh };
            assert_eq!(Precision::of(&target, &s), want, "{precision} {coop_attention:?} Dh {dh}");
        }
    }
}
