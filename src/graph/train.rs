//! The training graph: forward, loss, backward and optimizer update in one arena, checked before
//! and after the passes that extend it.

use super::autodiff;
use super::ir::{Graph, NodeId, Op};
use super::optim::{self, OptimConfig, OptimNodes};
use super::remat;
use super::verify::verify;
use crate::err;
use crate::error::Result;

/// A graph whose one evaluation is a whole training step.
#[derive(Clone, Debug)]
pub struct TrainGraph {
    /// Forward, backward and update nodes in one arena.
    pub graph: Graph,
    /// The scalar loss (also output `loss`).
    pub loss: NodeId,
    /// `(parameter, gradient)` pairs, in parameter order.
    pub grads: Vec<(NodeId, NodeId)>,
    /// The nodes the host drives the optimizer through.
    pub optim: OptimNodes,
    /// The arena index of the first backward node: every node before it is forward (the loss
    /// included).
    pub backward_start: usize,
    /// The arena index of the first optimizer node: every node before it is forward, loss or
    /// backward, every node from it on reads the gradients to update (data-parallel training
    /// averages the gradients across ranks between the two).
    pub update_start: usize,
}

/// How a forward graph becomes a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainOptions {
    /// Recompute cheap forward values in the backward pass instead of keeping them alive
    /// across the step ([`super::remat`]; on by default).
    pub remat: bool,
    /// With `remat`, also recompute all the matmuls that widen (a result with more elements
    /// than the operands it reads besides parameters: a GPT's fc and qkv projections), each
    /// one more product in the backward pass, for the memory they hold (off by default: then
    /// only the earliest, up to [`REMAT_MATMUL_SHARE`] of the step's matmul FLOPs).
    pub remat_matmuls: bool,
}

/// Thousandths of a step's matmul FLOPs that a training step spends by default recomputing
/// the earliest widening matmuls (the values kept longest): 40, about 2% of gpt-medium's step
/// time for 214 MB less at its peak (its first two layers' fc and qkv products, the third's
/// qkv).
pub const REMAT_MATMUL_SHARE: u32 = 40;

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions { remat: true, remat_matmuls: false }
    }
}

/// Extend a forward graph into a training step, with the default [`TrainOptions`].
pub fn training_graph(g: Graph, loss: NodeId, cfg: &OptimConfig) -> Result<TrainGraph> {
    training_graph_with(g, loss, cfg, TrainOptions::default())
}

/// Extend a forward graph into a training step.
pub fn training_graph_with(
    mut g: Graph,
    loss: NodeId,
    cfg: &OptimConfig,
    opts: TrainOptions,
) -> Result<TrainGraph> {
    verify(&g)?; // the forward graph is well-formed before anything is appended
    batch_statistics_need_two_values(&g)?;
    let params: Vec<NodeId> = g.parameters().into_iter().map(|(id, _)| id).collect();
    let backward_start = g.n_nodes();
    let mut grads = autodiff::grad(&mut g, loss, &params)?; // backward nodes, same arena
    if opts.remat {
        // Cheap forward values recomputed where the backward reads them; backward nodes move.
        let wanted: Vec<NodeId> = grads.iter().copied().chain([loss]).collect();
        let matmuls = match opts.remat_matmuls {
            true => remat::Matmuls::All,
            false => remat::Matmuls::Share(REMAT_MATMUL_SHARE),
        };
        let moved = remat::rematerialize(&mut g, backward_start, &wanted, matmuls);
        grads.iter_mut().for_each(|d| *d = moved[d.index()]);
    }
    let pairs: Vec<(NodeId, NodeId)> = params.into_iter().zip(grads).collect();
    let update_start = g.n_nodes();
    let optim = optim::apply(&mut g, &pairs, cfg)?; // update nodes and optimizer state
    g.set_output("loss", loss);
    verify(&g)?; // and still well-formed after both passes
    Ok(TrainGraph { graph: g, loss, grads: pairs, optim, backward_start, update_start })
}

/// A batch statistic (batch norm's mean and variance in training, chosen by `TrainingSelect`)
/// over a single value per channel is that value itself: its normalized output is 0 and its
/// variance 0, so training learns nothing from it (PyTorch refuses it too). Refused at the
/// op, with the number of values it averages.
fn batch_statistics_need_two_values(g: &Graph) -> Result<()> {
    let numel = |id: NodeId| g.shape(id).iter().product::<usize>().max(1);
    for (_, n) in g.nodes() {
        let (Op::TrainingSelect, Some(&stat)) = (&n.op, n.inputs.first()) else { continue };
        let stat_node = g.node(stat);
        let (Op::Reduce { .. }, Some(&x)) = (&stat_node.op, stat_node.inputs.first()) else {
            continue;
        };
        let count = numel(x) / numel(stat);
        if count < 2 {
            return Err(err!(
                Shape,
                "batch_norm in training averages {count} value per channel (shape {}): its batch statistics need at least 2; train with a larger batch",
                crate::tensor::fmt_shape(g.shape(x))
            )
            .at(n.span));
        }
    }
    Ok(())
}
