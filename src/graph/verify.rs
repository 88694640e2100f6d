//! `verify`: the graph's invariants, checked at every stage boundary (after building, after
//! autodiff, after the optimizer is appended). A failure here is a bug in rumus or in a caller
//! that edited the arena by hand; it is reported as an `Invariant` error, never a panic.

use super::ir::{Graph, NodeId, Op};
use super::shape::infer;
use crate::err;
use crate::error::Result;
use crate::tensor::{fmt_shape, DType, Tensor};
use std::collections::HashSet;

/// Check that:
/// - every node's inputs come earlier in the arena (the arena order is a topological order);
/// - every node's stored shape and dtype are what shape inference gives;
/// - input, parameter and state names are unique;
/// - outputs name existing nodes, and output names are unique;
/// - every update writes a parameter or state exactly once, from a later node of the same shape
///   and dtype;
/// - every recomputed value's copy is a later node with the same op, shape and dtype.
pub fn verify(g: &Graph) -> Result<()> {
    let mut names = HashSet::new();
    for (id, node) in g.nodes() {
        if let Some(bad) = node.inputs.iter().find(|i| i.index() >= id.index()) {
            return Err(err!(
                Invariant,
                "node {} ({}) reads node {}, which is not earlier",
                id.0,
                node.op.name(),
                bad.0
            ));
        }
        let ins: Vec<(&[usize], DType)> =
            node.inputs.iter().map(|&i| (g.shape(i), g.dtype(i))).collect();
        let (shape, dtype) = infer(&node.op, &ins, &node.shape, node.dtype)
            .map_err(|e| err!(Invariant, "node {}: {}", id.0, e.message))?;
        if shape != node.shape || dtype != node.dtype {
            return Err(err!(
                Invariant,
                "node {} ({}) is stored as {}{} but infers to {}{}",
                id.0,
                node.op.name(),
                node.dtype,
                fmt_shape(&node.shape),
                dtype,
                fmt_shape(&shape)
            ));
        }
        if let Op::Input { name } | Op::Parameter { name, .. } | Op::State { name, .. } = &node.op {
            if !names.insert(name.as_str()) {
                return Err(err!(Invariant, "duplicate value name `{name}`"));
            }
        }
    }
    let mut out_names = HashSet::new();
    for (name, id) in &g.outputs {
        if id.index() >= g.n_nodes() {
            return Err(err!(Invariant, "output `{name}` names a missing node"));
        }
        if !out_names.insert(name) {
            return Err(err!(Invariant, "duplicate output name `{name}`"));
        }
    }
    let mut written = HashSet::new();
    for u in &g.updates {
        if u.target.index() >= g.n_nodes() || u.value.index() >= g.n_nodes() {
            return Err(err!(Invariant, "update names a missing node"));
        }
        let (t, v) = (g.node(u.target), g.node(u.value));
        if !t.op.is_persistent() {
            return Err(err!(
                Invariant,
                "update target node {} is a {}, not a parameter or state",
                u.target.0,
                t.op.name()
            ));
        }
        if t.shape != v.shape || t.dtype != v.dtype {
            return Err(err!(
                Invariant,
                "update of node {} from {}{} to {}{}",
                u.target.0,
                t.dtype,
                fmt_shape(&t.shape),
                v.dtype,
                fmt_shape(&v.shape)
            ));
        }
        if !written.insert(u.target) {
            return Err(err!(Invariant, "node {} is updated twice", u.target.0));
        }
    }
    for &(v, c) in &g.recomputed {
        let same = match (g.nodes.get(v.index()), g.nodes.get(c.index())) {
            (Some(a), Some(b)) => v < c && a.op == b.op && a.shape == b.shape && a.dtype == b.dtype,
            _ => false,
        };
        if !same {
            return Err(err!(Invariant, "node {} is not a recomputation of node {}", c.0, v.0));
        }
    }
    Ok(())
}

/// Check a run's feeds, each `(node, dtype, elements)`, against `g`, the same on every backend:
/// each feed names an input, at most once, with that input's dtype and element count, and every
/// input the run `needs` is fed. A feed for a parameter or a computed value is an `Invariant`
/// error (a GPU wrote it into that value's buffer), a missing one a `Shape` error naming the
/// input (the GPU ran on whatever its buffer held).
pub fn check_feeds(
    g: &Graph,
    feeds: &[(NodeId, DType, usize)],
    needs: &dyn Fn(NodeId) -> bool,
) -> Result<()> {
    let mut fed = vec![false; g.n_nodes()];
    for &(id, dtype, len) in feeds {
        let Some(node) = g.nodes.get(id.index()) else {
            return Err(err!(Invariant, "feed for node {}, which is not in the graph", id.0));
        };
        let Op::Input { name } = &node.op else {
            return Err(err!(
                Invariant,
                "feed for node {} ({}), which is not an input",
                id.0,
                node.op.name()
            ));
        };
        let numel: usize = node.shape.iter().product();
        let what = format!("{}{}", node.dtype, fmt_shape(&node.shape));
        if dtype != node.dtype {
            return Err(err!(Shape, "input `{name}` is {what}, got {dtype} data"));
        }
        if len != numel {
            return Err(err!(
                Shape,
                "input `{name}` is {what} ({numel} elements), got {len} elements"
            ));
        }
        if std::mem::replace(&mut fed[id.index()], true) {
            return Err(err!(Shape, "input `{name}` is fed twice"));
        }
    }
    for (id, node) in g.nodes() {
        if let Op::Input { name } = &node.op {
            // Asked only of the inputs nobody fed: a backend's `needs` may scan its plan.
            if !fed[id.index()] && needs(id) {
                return Err(err!(
                    Shape,
                    "missing feed for input `{name}` ({}{})",
                    node.dtype,
                    fmt_shape(&node.shape)
                ));
            }
        }
    }
    Ok(())
}

/// Check that each fed tensor has its input's exact shape, as both backends' `run` do after
/// [`check_feeds`]: the same elements in another shape (a `[3, 2]` fed for a `[2, 3]`, a
/// `[6]` for a `[2, 3]`) would run, read in the input's order, and give a wrong answer without a
/// word. Feeds [`check_feeds`] refuses (not an input, another dtype or element count) are left
/// to it, so the two checks may run in either order.
pub fn check_feed_shapes(g: &Graph, feeds: &[(NodeId, &Tensor)]) -> Result<()> {
    for (id, t) in feeds {
        let Some(node) = g.nodes.get(id.index()) else { continue };
        let Op::Input { name } = &node.op else { continue };
        let numel: usize = node.shape.iter().product();
        if t.dtype() == node.dtype && t.numel() == numel && t.shape() != node.shape.as_slice() {
            return Err(err!(
                Shape,
                "input `{name}` is {}{}, got {}{}: the same elements in another shape; reshape \
                 the tensor to the input's shape",
                node.dtype,
                fmt_shape(&node.shape),
                t.dtype(),
                fmt_shape(t.shape())
            ));
        }
    }
    Ok(())
}
