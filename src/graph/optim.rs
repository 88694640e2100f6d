//! Optimizer updates as graph nodes.
//!
//! An optimizer appends, for every parameter, the elementwise nodes that compute its new value
//! (and new moments), and records them as graph updates; its state (moments, the step count)
//! lives in `State` nodes, so it is saved, restored and planned like any other persistent value.
//! The learning rate is an `Input` scalar fed at every step, which makes schedules free.
//!
//! The update runs over flat arenas: the parameters, their gradients and each moment are joined
//! (flattened, zero-padded so that each member starts at a multiple of [`ARENA_ALIGN`]) into
//! one 1-D value per kind (another past [`ARENA_MAX`] elements), the update rule is one
//! elementwise computation over them (the global gradient norm one sum per arena), and each
//! member takes its slice of the result. The planner keeps
//! each arena in one buffer with its members inside (`plan::arena`), so the join is free and
//! the update is one kernel however many parameters there are.
//!
//! Hyperparameters are f64 and what PyTorch computes in Python floats is computed here in f64
//! too: `1 − β` of the moment averages, and Adam's bias corrections `1 − β₁ᵗ` and `√(1 − β₂ᵗ)`,
//! which the host feeds at every step like the learning rate ([`OptimNodes::host_feeds`])
//! rather than the device raising β to the power t in f32 (which drifts by up to 3e-5 a step).

use super::ir::{Graph, Init, NodeId, Update};
use super::param_groups;
pub use super::param_groups::ParamGroup;
use crate::err;
use crate::error::Result;
use crate::num::show;
use crate::tensor::{DType, Tensor};

/// Name of the learning-rate input that a training graph feeds at every step.
pub const LR_INPUT: &str = "optim.lr";
/// Names of the bias-correction inputs of Adam and AdamW: `1 − β₁ᵗ` and `√(1 − β₂ᵗ)`.
pub const BIAS_CORRECTION_INPUTS: [&str; 2] =
    ["optim.bias_correction1", "optim.bias_correction2_sqrt"];

/// Name of gradient accumulation's input: 1 at the first micro-batch of an update, else 0.
pub const FIRST_MICRO_BATCH_INPUT: &str = "optim.first_micro_batch";

/// Whether an input of a training graph is fed by the host's optimizer driver (the learning
/// rate, the bias corrections, the start of an accumulation) rather than by the user.
pub fn is_host_input(name: &str) -> bool {
    name == LR_INPUT || name == FIRST_MICRO_BATCH_INPUT || BIAS_CORRECTION_INPUTS.contains(&name)
}
/// Adam's and AdamW's second moments are the states `optim.v.<parameter>` (never negative).
pub const SECOND_MOMENT: &str = "v";

/// Name of the step-count state (the number of updates applied so far).
pub const STEP_STATE: &str = "optim.step";

/// Which update rule, with its hyperparameters (the learning rate is fed per step).
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// SGD with optional momentum and L2 weight decay (PyTorch's `SGD`, dampening 0).
    Sgd {
        /// Momentum factor (0: plain SGD).
        momentum: f64,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
    /// Adam with L2 weight decay added to the gradient (PyTorch's `Adam`).
    Adam {
        /// Decay of the first-moment average.
        beta1: f64,
        /// Decay of the second-moment average.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
    /// Adam with decoupled weight decay (PyTorch's `AdamW`).
    AdamW {
        /// Decay of the first-moment average.
        beta1: f64,
        /// Decay of the second-moment average.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// Decoupled weight decay: each step multiplies parameters by `1 − lr · weight_decay`.
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Plain SGD: no momentum, no weight decay.
    pub fn sgd() -> Optimizer {
        Optimizer::Sgd { momentum: 0.0, weight_decay: 0.0 }
    }
    /// Adam with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, no weight decay).
    pub fn adam() -> Optimizer {
        Optimizer::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
    /// AdamW with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, weight decay 0.01).
    pub fn adamw() -> Optimizer {
        Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }

    /// `sgd`, `adam` or `adamw`, as scripts spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Adam { .. } => "adam",
            Optimizer::AdamW { .. } => "adamw",
        }
    }

    /// The weight decay the optimizer applies to parameters no group claims.
    pub fn weight_decay(&self) -> f64 {
        match *self {
            Optimizer::Sgd { weight_decay, .. }
            | Optimizer::Adam { weight_decay, .. }
            | Optimizer::AdamW { weight_decay, .. } => weight_decay,
        }
    }

    /// Each setting in its range; a message names only the settings this optimizer has.
    fn check(&self) -> Result<()> {
        let name = self.name();
        let wd = match *self {
            Optimizer::Sgd { momentum, weight_decay } => {
                if !(0.0..1.0).contains(&momentum) {
                    return Err(err!(
                        InvalidArgument,
                        "{name}: momentum must be in [0, 1), got {}",
                        show(momentum)
                    ));
                }
                weight_decay
            }
            Optimizer::Adam { beta1, beta2, eps, weight_decay }
            | Optimizer::AdamW { beta1, beta2, eps, weight_decay } => {
                if !(0.0..1.0).contains(&beta1) || !(0.0..1.0).contains(&beta2) {
                    return Err(err!(
                        InvalidArgument,
                        "{name}: betas must be in [0, 1), got ({}, {})",
                        show(beta1),
                        show(beta2)
                    ));
                }
                // eps is applied in f32, where a GPU may flush a subnormal to 0.
                crate::num::eps_f32(eps).map_err(|m| err!(InvalidArgument, "{name}: eps {m}"))?;
                weight_decay
            }
        };
        // weight_decay is applied in f32 too.
        let wd32 = wd as f32;
        if !(wd32 >= 0.0 && wd32.is_finite()) {
            return Err(err!(
                InvalidArgument,
                "{name}: weight_decay must be >= 0 and finite as an f32 (it is applied in f32), got {}",
                show(wd)
            ));
        }
        Ok(())
    }
}

/// An optimizer with optional clipping of the global gradient norm and parameter groups.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimConfig {
    /// The update rule.
    pub optimizer: Optimizer,
    /// Scale all gradients by min(1, clip / ‖g‖) where ‖g‖ is the norm over every gradient.
    pub clip_norm: Option<f32>,
    /// Weight decay and learning-rate scale by parameter name; the first group that matches a
    /// parameter gives its hyperparameters, the optimizer's apply to the rest.
    pub groups: Vec<ParamGroup>,
    /// Micro-batches per update (gradient accumulation; 1: every step updates). The update
    /// reads the mean of the micro-batches' gradients, clipped as a whole.
    pub accumulate: usize,
}

impl OptimConfig {
    /// `optimizer` alone: no clipping, no parameter groups, no accumulation.
    pub fn new(optimizer: Optimizer) -> OptimConfig {
        OptimConfig { optimizer, clip_norm: None, groups: Vec::new(), accumulate: 1 }
    }
}

/// Nodes the host needs to drive the optimizer.
#[derive(Clone, Debug)]
pub struct OptimNodes {
    /// Scalar learning-rate input, fed at every step.
    pub lr: NodeId,
    /// Scalar step count (updates applied so far).
    pub step: NodeId,
    /// Global gradient norm before clipping (present when clipping is on).
    pub grad_norm: Option<NodeId>,
    /// Adam's bias corrections, fed at every step (Adam and AdamW only).
    pub bias_corrections: Option<BiasCorrections>,
    /// Gradient accumulation's nodes (with `accumulate` above 1).
    pub accumulation: Option<Accumulation>,
}

/// Gradient accumulation inside the training graph. Each gradient arena `d` has an accumulator
/// state `a` updated at every micro-batch ([`Update::every_micro_batch`]) to
/// `s = where(first, d, a + d)`: the first micro-batch of an update restarts the sum, so the
/// accumulator never needs clearing. The optimizer reads `s / k`, so the run that ends an
/// accumulation (a full training run) updates from the mean gradient of its `k` micro-batches;
/// the others are micro-batch runs, which evaluate only what the accumulators need.
#[derive(Clone, Debug)]
pub struct Accumulation {
    /// Micro-batches per update (`k`).
    pub micro_batches: usize,
    /// The scalar input fed 1 at the first micro-batch of an update and 0 at the others.
    pub first: NodeId,
    /// The accumulator of each gradient arena: sums that mean nothing between updates, so
    /// they are not part of a checkpoint.
    pub accumulators: Vec<NodeId>,
}

/// The scalar inputs `1 − β₁ᵗ` and `√(1 − β₂ᵗ)` and the betas they are computed from.
#[derive(Clone, Copy, Debug)]
pub struct BiasCorrections {
    /// The inputs fed `1 − β₁ᵗ` and `√(1 − β₂ᵗ)`.
    pub inputs: [NodeId; 2],
    /// β₁ and β₂.
    pub betas: [f64; 2],
}

impl OptimNodes {
    /// What the host feeds for the step after `step` updates (so t = step + 1): the learning
    /// rate and, for Adam and AdamW, `1 − β₁ᵗ` and `√(1 − β₂ᵗ)` computed in f64, as PyTorch
    /// computes them, then rounded to f32.
    pub fn host_feeds(&self, lr: f32, step: u64) -> Vec<(NodeId, Tensor)> {
        let mut feeds = vec![(self.lr, Tensor::scalar(lr))];
        if let Some(bc) = self.bias_corrections {
            let t = step as f64 + 1.0;
            let [b1, b2] = bc.betas;
            let values = [1.0 - b1.powf(t), (1.0 - b2.powf(t)).sqrt()];
            feeds.extend(
                bc.inputs.iter().zip(values).map(|(&id, v)| (id, Tensor::scalar(v as f32))),
            );
        }
        feeds
    }

    /// What the host feeds gradient accumulation for micro-batch `micro` (from 0) of an update:
    /// nothing without accumulation.
    pub fn micro_batch_feed(&self, micro: usize) -> Option<(NodeId, Tensor)> {
        let a = self.accumulation.as_ref()?;
        Some((a.first, Tensor::scalar(if micro == 0 { 1.0 } else { 0.0 })))
    }
}

/// Append the update of every `(parameter, gradient)` pair and record the write-backs.
pub fn apply(g: &mut Graph, params: &[(NodeId, NodeId)], cfg: &OptimConfig) -> Result<OptimNodes> {
    cfg.optimizer.check()?;
    if let Some(c) = cfg.clip_norm {
        if !(c > 0.0 && c.is_finite()) {
            return Err(err!(InvalidArgument, "clip_norm must be positive, got {c}"));
        }
    }
    if !(1..=MAX_ACCUMULATE).contains(&cfg.accumulate) {
        return Err(err!(
            InvalidArgument,
            "accumulate must be a number of micro-batches from 1 to {MAX_ACCUMULATE}, got {}",
            cfg.accumulate
        ));
    }
    let lr = g.input(LR_INPUT, &[], DType::F32)?;
    let step = g.state(STEP_STATE, &[], Init::Zeros)?;
    let one = g.constant(1.0);
    let t = g.add(step, one)?;
    g.updates.push(Update::new(step, t));

    let names = params
        .iter()
        .map(|&(p, _)| match &g.node(p).op {
            super::ir::Op::Parameter { name, .. } => Ok(name.clone()),
            other => Err(err!(
                Invariant,
                "optimizer: node {} is a {}, not a parameter",
                p.0,
                other.name()
            )),
        })
        .collect::<Result<Vec<String>>>()?;
    let groups = param_groups::assign(cfg.optimizer.name(), &cfg.groups, &names)?;
    g.set_span(crate::error::Span::NONE);
    if params.is_empty() {
        // Nothing to accumulate, but its micro-batch runs still run (the loss, no update): the
        // input that marks the graph as accumulating, which the plan gives a micro-batch part.
        let accumulation = match cfg.accumulate {
            1 => None,
            k => Some(Accumulation {
                micro_batches: k,
                first: g.input(FIRST_MICRO_BATCH_INPUT, &[], DType::F32)?,
                accumulators: Vec::new(),
            }),
        };
        return Ok(OptimNodes { lr, step, grad_norm: None, bias_corrections: None, accumulation });
    }
    // Every parameter, gradient and moment joined into one flat arena per kind and parameter
    // group (or a few, for a large model), at the same offsets: the update is one elementwise
    // computation over each, with the group's hyperparameters as constants.
    let mut chunks: Vec<Chunk> = Vec::new();
    for (group, members) in by_group(&groups) {
        let (wd, scale) = match group.map(|i| &cfg.groups[i]) {
            Some(pg) => (pg.weight_decay.unwrap_or(cfg.optimizer.weight_decay()), pg.lr_scale),
            None => (cfg.optimizer.weight_decay(), 1.0),
        };
        let lr = if scale == 1.0 { lr } else { g.scale(lr, scale as f32)? };
        for run in Arena::chunks(g, members.iter().map(|&i| params[i].0)) {
            let members: Vec<usize> = run.into_iter().map(|j| members[j]).collect();
            let arena = Arena::new(g, members.iter().map(|&i| params[i].0));
            let p = arena.join(g, &members.iter().map(|&i| params[i].0).collect::<Vec<_>>())?;
            let d = arena.join(g, &members.iter().map(|&i| params[i].1).collect::<Vec<_>>())?;
            chunks.push(Chunk { arena, members, p, d, wd, lr });
        }
    }
    // With accumulation the chunks hold the sums of k micro-batches' gradients, and the
    // update reads their mean: the norm and the clipping factor are scalars divided by k.
    let (accumulation, count) = match cfg.accumulate {
        1 => (None, None),
        k => (Some(accumulate(g, &mut chunks, k)?), Some(g.constant(k as f32))),
    };
    let mut grad_norm = None;
    if let Some(clip) = cfg.clip_norm {
        let mut total = None;
        for chunk in &chunks {
            let sq = g.square(chunk.d)?;
            let s = g.sum_all(sq)?;
            total = Some(match total {
                Some(acc) => g.add(acc, s)?,
                None => s,
            });
        }
        let total = total.ok_or_else(|| err!(Invariant, "optimizer: no arena to clip"))?;
        let mut norm = g.sqrt(total)?;
        if let Some(k) = count {
            norm = g.div(norm, k)?;
        }
        let eps = g.constant(1e-6);
        let denom = g.add(norm, eps)?;
        let c = g.constant(clip);
        let ratio = g.div(c, denom)?;
        let mut scale = g.minimum(ratio, one)?;
        if let Some(k) = count {
            scale = g.div(scale, k)?;
        }
        for chunk in &mut chunks {
            chunk.d = g.mul(chunk.d, scale)?;
        }
        grad_norm = Some(norm);
    } else if let Some(k) = count {
        for chunk in &mut chunks {
            chunk.d = g.div(chunk.d, k)?;
        }
    }

    // Bias corrections 1 − β₁ᵗ and √(1 − β₂ᵗ), shared by every parameter, fed by the host.
    let bias_corrections = match cfg.optimizer {
        Optimizer::Adam { beta1, beta2, .. } | Optimizer::AdamW { beta1, beta2, .. } => {
            let [a, b] = BIAS_CORRECTION_INPUTS;
            let inputs = [g.input(a, &[], DType::F32)?, g.input(b, &[], DType::F32)?];
            Some(BiasCorrections { inputs, betas: [beta1, beta2] })
        }
        Optimizer::Sgd { .. } => None,
    };
    for Chunk { arena, members, p, d, wd, lr } in &chunks {
        let targets: Vec<NodeId> = members.iter().map(|&i| params[i].0).collect();
        // One state per parameter (checkpoints name them), joined into an arena of its own.
        let moment = |g: &mut Graph, prefix: &str| -> Result<(Vec<NodeId>, NodeId)> {
            let states = members
                .iter()
                .map(|&i| {
                    let shape = g.shape(params[i].0).to_vec();
                    g.state(&format!("optim.{prefix}.{}", names[i]), &shape, Init::Zeros)
                })
                .collect::<Result<Vec<NodeId>>>()?;
            let joined = arena.join(g, &states)?;
            Ok((states, joined))
        };
        let hyper = Hyper { wd: *wd, lr: *lr, one, bias_corrections };
        let new_p = update_rule(g, cfg, *p, *d, &hyper, arena, moment)?;
        arena.update(g, &targets, new_p)?;
    }
    Ok(OptimNodes { lr, step, grad_norm, bias_corrections, accumulation })
}

/// Most micro-batches one update may accumulate.
pub const MAX_ACCUMULATE: usize = 1 << 20;

/// Sum each chunk's gradients over `k` micro-batches in an accumulator (see [`Accumulation`]);
/// the chunks then read the sum.
fn accumulate(g: &mut Graph, chunks: &mut [Chunk], k: usize) -> Result<Accumulation> {
    let first = g.input(FIRST_MICRO_BATCH_INPUT, &[], DType::F32)?;
    let mut accumulators = Vec::with_capacity(chunks.len());
    for (i, chunk) in chunks.iter_mut().enumerate() {
        let len = g.shape(chunk.d).to_vec();
        let acc = g.state(&format!("optim.grad_sum.{i}"), &len, Init::Zeros)?;
        let more = g.add(acc, chunk.d)?;
        let sum = g.select(first, chunk.d, more)?;
        g.updates.push(Update { target: acc, value: sum, every_micro_batch: true });
        chunk.d = sum;
        accumulators.push(acc);
    }
    Ok(Accumulation { micro_batches: k, first, accumulators })
}

/// One flat arena of parameters of one group: the layout, the parameters' indices, the joined
/// parameters and gradients, and the group's weight decay and learning rate.
struct Chunk {
    arena: Arena,
    members: Vec<usize>,
    p: NodeId,
    d: NodeId,
    wd: f64,
    lr: NodeId,
}

/// The parameters' indices by group (`None`: no group), the groups in the order their first
/// parameter comes.
fn by_group(groups: &[Option<usize>]) -> Vec<(Option<usize>, Vec<usize>)> {
    let mut out: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
    for (i, &group) in groups.iter().enumerate() {
        match out.iter_mut().find(|(k, _)| *k == group) {
            Some((_, members)) => members.push(i),
            None => out.push((group, vec![i])),
        }
    }
    out
}

/// What an arena's update reads besides its values: the group's weight decay and learning
/// rate, the constant 1, and Adam's bias corrections.
struct Hyper {
    wd: f64,
    lr: NodeId,
    one: NodeId,
    bias_corrections: Option<BiasCorrections>,
}

/// The new flat parameters `p` given their flat gradient `d`, recording the moments' updates.
fn update_rule(
    g: &mut Graph,
    cfg: &OptimConfig,
    p: NodeId,
    d: NodeId,
    h: &Hyper,
    arena: &Arena,
    moment: impl Fn(&mut Graph, &str) -> Result<(Vec<NodeId>, NodeId)>,
) -> Result<NodeId> {
    let (lr, one, weight_decay) = (h.lr, h.one, h.wd);
    Ok(match cfg.optimizer {
        Optimizer::Sgd { momentum, .. } => {
            let d = add_l2(g, d, p, weight_decay)?;
            let dir = if momentum > 0.0 {
                let (bufs, buf) = moment(g, "momentum")?;
                let mb = g.scale(buf, momentum as f32)?;
                let nb = g.add(mb, d)?;
                arena.update(g, &bufs, nb)?;
                nb
            } else {
                d
            };
            let step_size = g.mul(dir, lr)?;
            g.sub(p, step_size)?
        }
        Optimizer::Adam { beta1, beta2, eps, .. } | Optimizer::AdamW { beta1, beta2, eps, .. } => {
            let decoupled = matches!(cfg.optimizer, Optimizer::AdamW { .. });
            let d = if decoupled { d } else { add_l2(g, d, p, weight_decay)? };
            let (ms, m) = moment(g, "m")?;
            let (vs, v) = moment(g, SECOND_MOMENT)?;
            let new_m = ema(g, m, d, beta1)?;
            let d2 = g.square(d)?;
            let new_v = ema(g, v, d2, beta2)?;
            arena.update(g, &ms, new_m)?;
            arena.update(g, &vs, new_v)?;
            let [bc1, bc2_sqrt] = h.bias_corrections.map_or([one; 2], |bc| bc.inputs);
            // PyTorch: denom = √v / √(1 − β₂ᵗ) + eps; step = m / (1 − β₁ᵗ) / denom.
            let m_hat = g.div(new_m, bc1)?;
            let root = g.sqrt(new_v)?;
            let root = g.div(root, bc2_sqrt)?;
            let e = g.constant(eps as f32);
            let denom = g.add(root, e)?;
            let mut dir = g.div(m_hat, denom)?;
            if decoupled && weight_decay > 0.0 {
                let wp = g.scale(p, weight_decay as f32)?;
                dir = g.add(dir, wp)?;
            }
            let step_size = g.mul(dir, lr)?;
            g.sub(p, step_size)?
        }
    })
}

/// Elements between the starts of two members of a flat arena: 64 f32, 256 bytes, the largest
/// storage-binding offset alignment WebGPU allows, so a device can bind each member alone.
pub const ARENA_ALIGN: usize = 64;

/// The layout of a flat arena: each member's offset and element count, and the length.
struct Arena {
    members: Vec<(usize, usize)>,
    len: usize,
}

/// Elements an arena holds before the next parameter starts another: 2^25 (128 MiB, WebGPU's
/// default limit of one storage binding), so that an arena fits a binding whenever its members
/// do, and no arena is larger than its largest member and this.
pub const ARENA_MAX: usize = 1 << 25;

impl Arena {
    /// Indices of `ids` in runs whose padded sizes add up to at most [`ARENA_MAX`] (a member
    /// larger than that alone).
    fn chunks(g: &Graph, ids: impl Iterator<Item = NodeId>) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut len = 0;
        for (i, id) in ids.enumerate() {
            let n: usize = g.shape(id).iter().product();
            let size = n.max(1).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
            match out.last_mut() {
                Some(run) if len + size <= ARENA_MAX => run.push(i),
                _ => {
                    out.push(vec![i]);
                    len = 0;
                }
            }
            len += size;
        }
        out
    }

    /// Members of the shapes of `ids`, each at a multiple of [`ARENA_ALIGN`] (an empty member
    /// takes one aligned slot too, so that no two start at the same offset).
    fn new(g: &Graph, ids: impl Iterator<Item = NodeId>) -> Arena {
        let mut members = Vec::new();
        let mut len = 0;
        for id in ids {
            let n: usize = g.shape(id).iter().product();
            members.push((len, n));
            len += n.max(1).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        }
        Arena { members, len }
    }

    /// `xs` (one per member, of the member's size) flattened and joined, zeros between them.
    fn join(&self, g: &mut Graph, xs: &[NodeId]) -> Result<NodeId> {
        let mut parts = Vec::with_capacity(2 * xs.len());
        for (i, &x) in xs.iter().enumerate() {
            let (at, n) = self.members[i];
            parts.push(g.reshape(x, &[n])?);
            let next = self.members.get(i + 1).map_or(self.len, |m| m.0);
            if next > at + n {
                parts.push(g.full(&[next - at - n], 0.0)?);
            }
        }
        g.concat(&parts, 0)
    }

    /// Record the update of every member of `targets` with its part of the flat `value`.
    fn update(&self, g: &mut Graph, targets: &[NodeId], value: NodeId) -> Result<()> {
        for (&t, &(at, n)) in targets.iter().zip(&self.members) {
            let shape = g.shape(t).to_vec();
            let part =
                if at == 0 && n == self.len { value } else { g.slice(value, 0, at, at + n)? };
            let value = g.reshape(part, &shape)?;
            g.updates.push(Update::new(t, value));
        }
        Ok(())
    }
}

/// g + wd·p (plain L2 regularization), or g itself when wd is 0.
fn add_l2(g: &mut Graph, d: NodeId, p: NodeId, wd: f64) -> Result<NodeId> {
    if wd == 0.0 {
        return Ok(d);
    }
    let wp = g.scale(p, wd as f32)?;
    g.add(d, wp)
}

/// β·state + (1 − β)·x, with 1 − β computed in f64.
fn ema(g: &mut Graph, state: NodeId, x: NodeId, beta: f64) -> Result<NodeId> {
    let a = g.scale(state, beta as f32)?;
    let b = g.scale(x, (1.0 - beta) as f32)?;
    g.add(a, b)
}
