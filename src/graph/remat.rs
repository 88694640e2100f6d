//! Rematerialization: forward values that the backward pass reads, and that are cheap to
//! recompute from values it keeps alive anyway, are recomputed in the backward pass right
//! before their first use there instead of being kept alive across the step.
//!
//! A training step's memory peaks where the backward pass starts: every forward value the
//! backward reads is alive at once. Some of them are cheap functions of others that are alive
//! there anyway: a LayerNorm output of its input and its stats (both read by the LayerNorm
//! gradient), a GELU output of its input (read by the GELU gradient), a permuted copy of an
//! attention output (read by the attention gradient). The backward reads a copy of such a
//! node instead (and copies of the cheap nodes between it and the kept values), appended to
//! the arena right before the first backward node that reads it. Plans run kernels in arena
//! order, so the copy is computed there and freed after its last use, and the forward value
//! dies with its last forward use. The CPU interpreter runs the same graph, so the reference
//! backend checks the rematerialized step too.
//!
//! The rule, for a forward value `v` that a backward node reads:
//! - `v` is cheap ([`is_cheap`]): an elementwise op (a fused chain of them costs one pass),
//!   a view, or `layer_norm` (its stats are an input, so one pass over a row);
//! - the host does not read it: an output, the loss or an update's new value is kept anyway;
//! - no backward `equal` compares it (a max's input against the max): a copy must compare
//!   equal where the forward value did, and recomputed bits need not be the same bits;
//! - recomputing it reads only sources, kept values that the backward still reads at or after
//!   `v`'s first backward use, and cheap forward values recomputed the same way (at most
//!   [`MAX_CHAIN`] nodes).
//!
//! On request (`matmuls`), a matmul that widens ([`widens`]: a result with more elements than
//! the operands it reads besides sources, a GPT's fc and qkv projections) counts as cheap too:
//! one more product in the backward pass for the memory its result holds until then.
//!
//! So no kept value lives longer than it did without rematerialization, a copy lives only
//! within the backward pass, and each forward node is recomputed at most once (its copy
//! serves every later backward use).

use super::ir::{BinaryOp, Graph, Node, NodeId, Op, OpClass};
use std::collections::HashSet;

/// The most forward nodes one recomputation reads through (cheap nodes recomputed with it and
/// the values it reads): a longer chain is kept instead.
pub const MAX_CHAIN: usize = 64;

/// Whether an op is cheap enough to compute twice: one read of its inputs per output element
/// (elementwise ops and views) or per row (`layer_norm`, given its stats).
pub fn is_cheap(op: &Op) -> bool {
    match op.class() {
        OpClass::Elementwise => true,
        OpClass::Layout => op.is_view(),
        OpClass::Special => matches!(op, Op::LayerNorm),
        OpClass::Source | OpClass::Reduce | OpClass::MatMul => false,
    }
}

/// Rematerialize the forward values (arena indices below `backward_start`) that the backward
/// nodes of `g` read, as the module documentation says. `wanted` are the values the step
/// produces besides `g`'s outputs and updates (the loss and the gradients): backward nodes
/// they do not need (autodiff's gradients of constants) read nothing. Records the recomputed
/// values in [`Graph::recomputed`] and returns, for each node index of the graph before the
/// pass, the node that holds its value after it (the backward nodes move to make room for the
/// copies).
pub fn rematerialize(
    g: &mut Graph,
    backward_start: usize,
    wanted: &[NodeId],
    matmuls: Matmuls,
) -> Vec<NodeId> {
    let n = g.n_nodes();
    let bs = backward_start.min(n);
    let mut map: Vec<NodeId> = (0..n).map(|i| NodeId(i as u32)).collect();
    let mut needed = vec![false; n];
    let roots = wanted.iter().chain(g.outputs.iter().map(|(_, id)| id));
    for r in roots.chain(g.updates.iter().map(|u| &u.value)).filter(|r| r.index() < n) {
        needed[r.index()] = true;
    }
    let root: Vec<bool> = needed[..bs].to_vec();
    for i in (bs..n).rev() {
        if needed[i] {
            for x in &g.nodes[i].inputs {
                needed[x.index()] = true;
            }
        }
    }
    // The first and last needed backward node that reads each forward value.
    let mut first = vec![usize::MAX; bs];
    let mut last = vec![0; bs];
    for (i, node) in g.nodes.iter().enumerate().skip(bs).filter(|&(i, _)| needed[i]) {
        for x in node.inputs.iter().filter(|x| x.index() < bs) {
            first[x.index()] = first[x.index()].min(i);
            last[x.index()] = i;
        }
    }
    // Forward values a backward `equal` compares (a max's input against the max, ties of
    // `maximum`): recomputed, their bits may differ from those the forward pass compared (a
    // GPU's compiler rounds a fused chain and a split one differently), and a max's input then
    // equals the max nowhere in a row: its gradient was 0/0, NaN on every parameter.
    let mut compared = vec![false; bs];
    for node in g.nodes.iter().skip(bs).zip(&needed[bs..]).filter(|(_, &n)| n).map(|(n, _)| n) {
        if matches!(node.op, Op::Binary(BinaryOp::Equal)) {
            for x in node.inputs.iter().filter(|x| x.index() < bs) {
                compared[x.index()] = true;
            }
        }
    }
    // The FLOPs left for recomputed products: the earliest layers' are the longest kept.
    let mut budget = match matmuls {
        Matmuls::None => 0,
        Matmuls::All => u64::MAX,
        Matmuls::Share(permille) => {
            // The forward's products and the backward's that the step needs.
            let step: u64 = (0..n)
                .filter(|&i| i < bs || needed[i])
                .map(|i| flops(g, NodeId(i as u32)))
                .fold(0, u64::saturating_add);
            step / 1000 * u64::from(permille)
        }
    };
    let mut charged = vec![false; bs];
    // Decided in arena order, so every input's fate is known when a node is considered.
    let mut remat = vec![false; bs];
    for v in 0..bs {
        let node = &g.nodes[v];
        if first[v] != usize::MAX && !root[v] && !compared[v] && is_cheap(&node.op) {
            let (id, at) = (NodeId(v as u32), first[v]);
            let Some(products) = recomputable(g, id, at, &first, &last, &root, &remat, budget > 0)
            else {
                continue;
            };
            let cost: u64 = (products.iter())
                .filter(|m| !charged[m.index()])
                .map(|&m| flops(g, m))
                .fold(0, u64::saturating_add);
            if cost <= budget {
                budget -= cost;
                products.iter().for_each(|m| charged[m.index()] = true);
                remat[v] = true;
            }
        }
    }
    if !remat.contains(&true) {
        return map;
    }
    // A forward value the backward reads as it is: a source, one the host reads, or one the
    // backward reads and does not recompute.
    let kept = |x: NodeId| {
        g.nodes[x.index()].op.class() == OpClass::Source
            || root[x.index()]
            || (first[x.index()] != usize::MAX && !remat[x.index()])
    };
    let kept: Vec<bool> = (0..bs).map(|i| kept(NodeId(i as u32))).collect();
    let mut copy: Vec<Option<NodeId>> = vec![None; bs];
    for (k, node) in g.split_off(bs).into_iter().enumerate() {
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &x in &node.inputs {
            inputs.push(match x.index() {
                i if i >= bs => map[i],
                i if remat[i] && needed[bs + k] => copy_of(g, x, &kept, &mut copy),
                _ => x,
            });
        }
        map[bs + k] = g.push_node(Node { inputs, ..node });
    }
    let moved = |id: &mut NodeId| *id = map[id.index()];
    g.outputs.iter_mut().for_each(|(_, id)| moved(id));
    for u in &mut g.updates {
        moved(&mut u.target);
        moved(&mut u.value);
    }
    for (v, c) in copy.iter().enumerate() {
        if let (true, Some(c)) = (remat[v], c) {
            g.recomputed.push((NodeId(v as u32), *c));
        }
    }
    map
}

/// Whether forward value `v` can be recomputed before backward node `at`: every forward node
/// it is computed from is a source, a value the host reads, a kept value the backward still
/// reads at or after `at`, or a cheap node recomputed with it (at most [`MAX_CHAIN`] nodes;
/// with `matmuls`, a matmul that [`widens`] counts as cheap). If so, the matmuls recomputed
/// with it.
#[allow(clippy::too_many_arguments)]
fn recomputable(
    g: &Graph,
    v: NodeId,
    at: usize,
    first: &[usize],
    last: &[usize],
    root: &[bool],
    remat: &[bool],
    matmuls: bool,
) -> Option<Vec<NodeId>> {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    let mut products = Vec::new();
    while let Some(u) = stack.pop() {
        for &x in &g.nodes[u.index()].inputs {
            let i = x.index();
            if !seen.insert(x) {
                continue;
            }
            if seen.len() > MAX_CHAIN {
                return None;
            }
            let op = &g.nodes[i].op;
            if op.class() == OpClass::Source || root[i] {
                continue;
            }
            let saved = first[i] != usize::MAX;
            if saved && !remat[i] {
                if last[i] < at {
                    return None; // kept, but dead by then: recomputing would extend it
                }
            } else if is_cheap(op) {
                stack.push(x);
            } else if matmuls && widens(g, x) {
                products.push(x);
                stack.push(x);
            } else {
                return None; // neither kept nor cheap
            }
        }
    }
    Some(products)
}

/// Which widening matmuls ([`widens`]) the backward pass recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matmuls {
    /// None: each is kept.
    None,
    /// Every one that can be.
    All,
    /// The earliest ones (those kept longest), as long as their FLOPs add up to at most this
    /// many thousandths of the step's matmul FLOPs.
    Share(u32),
}

/// FLOPs of node `x` when it is a matmul (`2·m·n·k`), else 0.
fn flops(g: &Graph, x: NodeId) -> u64 {
    let node = &g.nodes[x.index()];
    if !matches!(node.op, Op::MatMul) {
        return 0;
    }
    let k = g.nodes[node.inputs[0].index()].shape.last().copied().unwrap_or(1);
    let out: usize = node.shape.iter().product();
    (2 * out as u64).saturating_mul(k as u64)
}

/// Whether `x` is a matmul whose result has more elements than the operands it reads that are
/// not sources (parameters, inputs): recomputing it costs a product but frees more bytes than
/// it keeps alive.
pub fn widens(g: &Graph, x: NodeId) -> bool {
    let node = &g.nodes[x.index()];
    let elements = |id: NodeId| g.nodes[id.index()].shape.iter().product::<usize>();
    let read: usize = (node.inputs.iter())
        .filter(|&&i| g.nodes[i.index()].op.class() != OpClass::Source)
        .map(|&i| elements(i))
        .sum();
    matches!(node.op, Op::MatMul) && elements(x) > read
}

/// The backward copy of forward node `x`, appended (after copies of the inputs it needs) the
/// first time it is asked for.
fn copy_of(g: &mut Graph, x: NodeId, kept: &[bool], copy: &mut [Option<NodeId>]) -> NodeId {
    if let Some(c) = copy[x.index()] {
        return c;
    }
    let node = g.nodes[x.index()].clone();
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for &y in &node.inputs {
        inputs.push(if kept[y.index()] { y } else { copy_of(g, y, kept, copy) });
    }
    let c = g.push_node(Node { inputs, ..node });
    copy[x.index()] = Some(c);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::graph::{training_graph, Init, OptimConfig, Optimizer, UnaryOp};
    use crate::tensor::DType;

    /// A forward graph `x [4, 3] -> body -> @ w2 [3, 2] -> sum`, as a training step: the ops of
    /// the forward values the backward recomputes, in arena order.
    fn recomputed(body: &dyn Fn(&mut Graph, NodeId) -> Result<NodeId>) -> Vec<&'static str> {
        let mut g = Graph::new();
        let x = g.input("x", &[4, 3], DType::F32).unwrap();
        let w1 = g.parameter("w1", &[3, 3], Init::Xavier).unwrap();
        let h = g.matmul(x, w1).unwrap();
        let y = body(&mut g, h).unwrap();
        let w2 = g.parameter("w2", &[3, 2], Init::Xavier).unwrap();
        let z = g.matmul(y, w2).unwrap();
        let loss = g.sum_all(z).unwrap();
        let t = training_graph(g, loss, &OptimConfig::new(Optimizer::sgd())).unwrap();
        t.graph.recomputed.iter().map(|&(v, _)| t.graph.node(v).op.name()).collect()
    }

    #[test]
    fn cheap_values_computed_from_kept_ones_are_recomputed() {
        type Body = fn(&mut Graph, NodeId) -> Result<NodeId>;
        let cases: [(&str, Body, &[&str]); 8] = [
            // gelu's gradient reads its input, which is kept: the output is recomputed.
            ("gelu", |g, h| g.gelu_tanh(h), &["gelu_tanh"]),
            // relu's and tanh's gradients read the output: it is kept, nothing to recompute.
            ("relu", |g, h| g.relu(h), &[]),
            ("tanh", |g, h| g.unary(UnaryOp::Tanh, h), &[]),
            // A chain over a kept value: the backward reads only its last node, recomputed with
            // the rest of the chain (which the backward does not read).
            (
                "chain",
                |g, h| {
                    let a = g.gelu_tanh(h)?;
                    let b = g.scale(a, 3.0)?;
                    g.add(b, h)
                },
                &["add"],
            ),
            // LayerNorm from its kept input and stats.
            (
                "layer_norm",
                |g, h| {
                    let w = g.parameter("ln.weight", &[3], Init::Ones)?;
                    let b = g.parameter("ln.bias", &[3], Init::Zeros)?;
                    g.layer_norm(h, w, b, 1e-5)
                },
                &["layer_norm"],
            ),
            // Nothing the backward keeps computes a scaled matmul output: kept.
            ("scale", |g, h| g.scale(h, 2.0), &[]),
            // A reduction is not cheap, but a product of kept values is: the row sum and the
            // gelu input are read by the product's and gelu's gradients.
            (
                "sum",
                |g, h| {
                    let s = g.sum(h, &[1], true)?;
                    let r = g.gelu_tanh(h)?;
                    g.mul(r, s)
                },
                &["gelu_tanh", "mul"],
            ),
            // `h + 1` is read by its matmul's weight gradient, after gelu's gradient has read
            // `h` for the last time: recomputing it would keep `h` alive longer, so it is kept.
            (
                "dead_input",
                |g, h| {
                    let one = g.constant(1.0);
                    let v = g.add(h, one)?;
                    let w = g.parameter("w3", &[3, 3], Init::Xavier)?;
                    let m = g.matmul(v, w)?;
                    let q = g.gelu_tanh(h)?;
                    g.add(m, q)
                },
                &[],
            ),
        ];
        for (name, body, expected) in cases {
            assert_eq!(recomputed(&body), expected, "{name}");
        }
    }

    #[test]
    fn an_output_the_host_reads_is_kept() {
        let got = recomputed(&|g, h| {
            let y = g.gelu_tanh(h)?;
            g.set_output("y", y);
            Ok(y)
        });
        assert_eq!(got, Vec::<&str>::new());
    }

    #[test]
    fn a_copy_that_is_not_its_originals_op_fails_verification() {
        let mut g = Graph::new();
        let x = g.input("x", &[2], DType::F32).unwrap();
        let a = g.relu(x).unwrap();
        let b = g.gelu_tanh(x).unwrap();
        g.recomputed.push((a, b));
        let e = crate::graph::verify(&g).unwrap_err();
        assert_eq!(e.message, "node 2 is not a recomputation of node 1");
        g.recomputed = vec![(b, a)];
        let e = crate::graph::verify(&g).unwrap_err();
        assert_eq!(e.message, "node 1 is not a recomputation of node 2");
    }
}
