//! Generated row kernels, reduced across threads in workgroup memory: reductions (with their
//! prologue expression; a workgroup reduces several output elements, see `reduce`), softmax
//! and log-softmax and cross-entropy forward and backward (a workgroup per row; cross-entropy
//! checks its labels).
//!
//! Sums over the whole GPU take two dispatches: a reduction whose first-stage workgroup would
//! take more than [`Target::reduce_chunk`](super::Target::reduce_chunk) elements has many
//! workgroups write partials into scratch and a second dispatch combine them; cross-entropy
//! writes each row's loss and count from a workgroup per row and one workgroup sums them. Every
//! sum is in a fixed order (no atomics), so a step gives the same bits every run.

use super::expr::{decompose, f32_lit, ExprEmitter};
use super::gather::in_range;
use super::loops::{halvings, strided as trips, Loops};
use super::wgsl::{open_main, thread_index, Binder, Ctx, ROW_WG, SUM_WG, WG};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId, Op, ReduceOp};

/// A workgroup-wide reduction of `acc` into `red[0]` (sum or max) by `wg` threads (a power of
/// two); its loop.
fn tree(w: &mut Wgsl, op: &str, wg: u32) -> Loops {
    let combine =
        if op == "max" { "max_(red[lid], red[lid + s])" } else { "red[lid] + red[lid + s]" };
    w.line("red[lid] = acc;");
    w.line("workgroupBarrier();");
    w.open(&format!("for (var s = {}u; s > 0u; s = s >> 1u)", wg / 2));
    w.block("if (lid < s)", &[&format!("red[lid] = {combine};")]);
    w.line("workgroupBarrier();");
    w.close();
    Loops::flat(halvings(u64::from(wg / 2)))
}

/// `var<workgroup> red: array<f32, wg>;` and the opening of `fn main`.
fn open_row_main(w: &mut Wgsl, wg: u32) {
    w.line(&format!("var<workgroup> red: array<f32, {wg}>;"));
    w.blank();
    open_main(w, wg);
}

/// `for (var j = lid; j < {n}u; j += ROW_WG) { body }`: a thread's share of a row; its loop.
fn strided(w: &mut Wgsl, n: usize, body: &[&str]) -> Loops {
    w.block(&format!("for (var j = lid; j < {n}u; j += {ROW_WG}u)"), body);
    Loops::flat(trips(n as u64, u64::from(ROW_WG)))
}

/// A row's maximum `m` and `total` = Σ exp(x - m) over `{x}[base + j]`, `j < n`, with `acc`
/// already set to -inf: the two reductions softmax and cross-entropy share. Two passes over
/// the row, a 64th of it a thread each: their loops.
fn row_max_and_total(w: &mut Wgsl, x: &str, n: usize) -> Loops {
    let max = strided(w, n, &[&format!("acc = max_(acc, {x}[base + j]);")]);
    let max = max.then(tree(w, "max", ROW_WG));
    w.line("let m = red[0];");
    w.line("workgroupBarrier();");
    w.line("acc = 0.0;");
    let total = strided(w, n, &[&format!("acc += exp({x}[base + j] - m);")]);
    let total = total.then(tree(w, "sum", ROW_WG));
    w.line("let total = red[0];");
    max.then(total)
}

/// Most partials per output element of a two-stage reduction (a larger reduction takes more
/// than `reduce_chunk` elements a workgroup).
const MAX_PARTS: usize = 256;

/// The reduction's (output elements, elements reduced into each, whether the input's last axis
/// is among those reduced).
fn reduce_sizes(g: &Graph, out: NodeId) -> (usize, usize, bool) {
    let node = g.node(out);
    let Op::Reduce { axes, .. } = &node.op else { unreachable!("reduce kernel") };
    let xs = g.shape(node.inputs[0]);
    let n_red: usize = axes.iter().map(|&d| xs[d]).product();
    let inner = !xs.is_empty() && axes.contains(&(xs.len() - 1));
    (g.shape(out).iter().product(), n_red, inner)
}

/// How a reduction's workgroups are laid out: each reduces `outs` output elements with `lanes`
/// threads apiece (`outs * lanes <= SUM_WG`, both powers of two). Over the input's last axis
/// (`inner`) a row's lanes are adjacent threads, so each load instruction reads a few whole
/// runs of a row; otherwise adjacent threads own adjacent output elements (columns) and the
/// lanes split the rows, so every load is coalesced across the columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    outs: usize,
    lanes: usize,
    inner: bool,
}

impl Layout {
    fn new(n_out: usize, n_red: usize, inner: bool) -> Layout {
        let wg = SUM_WG as usize;
        let (outs, lanes) = if inner {
            // About 4 elements a lane; rows of many outputs get at most 64 lanes, so that a
            // workgroup holds several short rows.
            let want = n_red.div_ceil(4).next_power_of_two().clamp(1, wg);
            let outs = n_out.next_power_of_two().min(wg / want.min(64)).max(1);
            (outs, want.min(wg / outs))
        } else {
            let outs = n_out.next_power_of_two().clamp(1, 64);
            (outs, (wg / outs).min(n_red.next_power_of_two()).max(1))
        };
        Layout { outs, lanes, inner }
    }

    /// Workgroups that cover `n_out` output elements.
    fn blocks(&self, n_out: usize) -> usize {
        n_out.div_ceil(self.outs)
    }

    /// Thread index of output slot `k`, lane `l` is `k * lanes + l` (inner) or `l * outs + k`.
    fn lane_stride(&self) -> usize {
        if self.inner {
            1
        } else {
            self.outs
        }
    }
}

/// (partials per output element, elements each partial sums) of a two-stage reduction over
/// `n_red` elements per output element, or `None` for one stage: a first-stage workgroup takes
/// about `chunk` elements.
fn parts(layout: Layout, n_red: usize, chunk: usize) -> Option<(usize, usize)> {
    let len = (chunk / layout.outs).max(1);
    if n_red <= len {
        return None;
    }
    let len = len.max(n_red.div_ceil(MAX_PARTS));
    Some((n_red.div_ceil(len), len))
}

/// Dispatches of reduce kernel `out`: two when each output element sums more than a first-stage
/// workgroup takes.
pub(super) fn reduce_stages(g: &Graph, out: NodeId, chunk: usize) -> usize {
    let (n_out, n_red, inner) = reduce_sizes(g, out);
    match parts(Layout::new(n_out, n_red, inner), n_red, chunk) {
        Some(_) => 2,
        None => 1,
    }
}

/// A reduction, in one stage or two ([`parts`]). A workgroup reduces [`Layout::outs`] output
/// elements over part `part` of their reduced elements (all of them in one stage): each lane
/// combines its share in order, then the lanes combine in a fixed tree. In two stages the first
/// writes partials into scratch (`[o, part]` over the last axis, `[part, o]` otherwise, so the
/// second reads them with the same layout) and the second combines each output's partials.
pub(super) fn reduce(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    ctx: &mut Ctx,
    out: NodeId,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let Op::Reduce { op, axes, .. } = &node.op else { unreachable!("reduce kernel") };
    let x = node.inputs[0];
    let xs = g.shape(x).to_vec();
    let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| xs[d]).collect();
    let red_shape: Vec<usize> = axes.iter().map(|&d| xs[d]).collect();
    let (n_out, n_red, inner) = reduce_sizes(g, out);
    let on = binder.name(out);
    if n_red == 0 {
        // Over nothing: the sum is 0 and the mean 0 / 0 (max of nothing is refused by shape
        // inference), as on the CPU.
        let fill = if *op == ReduceOp::Mean { f32_lit(f32::NAN) } else { "0.0".to_string() };
        open_main(w, WG);
        thread_index(w, "i", n_out);
        w.line(&format!("{on}[i] = {fill};"));
        w.close();
        return ((n_out as u32).div_ceil(WG), WG, Loops::NONE);
    }
    let (init, combine) = match op {
        ReduceOp::Max => (f32_lit(f32::NEG_INFINITY), "max_"),
        _ => ("0.0".to_string(), ""),
    };
    let finish = match op {
        ReduceOp::Mean => format!(" / {}", f32_lit(n_red as f32)),
        _ => String::new(),
    };
    let first = Layout::new(n_out, n_red, inner);
    let split = parts(first, n_red, ctx.chunk);
    // Scratch index of partial `part` of output element `o`.
    let at = |p: usize, o: &str, part: &str| {
        if inner {
            format!("{o} * {p}u + {part}")
        } else {
            format!("{part} * {n_out}u + {o}")
        }
    };
    if let (Some((p, _)), 1) = (split, ctx.stage) {
        // The second stage: each output element combines its partials in order.
        let s = ctx.scratch(0, n_out * p);
        let layout = Layout::new(n_out, p, inner);
        let load = format!("let v = {s}[{}];", at(p, "o", "j"));
        let write = format!("{on}[o] = acc{finish};");
        let load = (&[load.as_str()][..], Loops::NONE);
        return lanes_reduce(w, layout, n_out, (p, p), (&init, combine), load, &write);
    }
    let (out_code, out_coords) = decompose(&kept_shape, "o", "k");
    let (red_code, red_coords) = decompose(&red_shape, "j", "q");
    let mut coords = vec![String::new(); xs.len()];
    for (c, &d) in out_coords.iter().zip(&kept) {
        coords[d] = c.clone();
    }
    for (c, &d) in red_coords.iter().zip(axes) {
        coords[d] = c.clone();
    }
    let value = em.emit(x, &coords);
    let mut load: Vec<String> = vec![out_code, red_code];
    load.push(em.body.clone());
    load.push(format!("let v = {value};"));
    let (len, write) = match split {
        None => (n_red, format!("{on}[o] = acc{finish};")),
        Some((p, len)) => {
            let s = ctx.scratch(0, n_out * p);
            (len, format!("{s}[{}] = acc;", at(p, "o", "part")))
        }
    };
    let load: Vec<&str> = load.iter().map(String::as_str).collect();
    // The element's expression may loop too (a product's sum over K), once an element.
    lanes_reduce(w, first, n_out, (n_red, len), (&init, combine), (&load, em.loops), &write)
}

/// Elements a lane loads before it combines them.
const UNROLL: usize = 4;

/// The body of a reduction laid out as `layout` over `n_out` output elements of `n_red`
/// elements each, in parts of `len` (one part when `len == n_red`): `load` defines `v`, the
/// element `j` of output `o` (with the loops beside it, once an element); `write` stores `acc`
/// of output `o`, part `part`. Returns the workgroups, their size and the loops.
fn lanes_reduce(
    w: &mut Wgsl,
    layout: Layout,
    n_out: usize,
    (n_red, len): (usize, usize),
    (init, combine): (&str, &str),
    (load, load_loops): (&[&str], Loops),
    write: &str,
) -> (u32, u32, Loops) {
    let Layout { outs, lanes, inner } = layout;
    let wg = (outs * lanes) as u32;
    let blocks = layout.blocks(n_out);
    let groups = blocks * n_red.div_ceil(len);
    let fold = |a: &str, b: &str| {
        if combine.is_empty() {
            format!("{a} + {b}")
        } else {
            format!("{combine}({a}, {b})")
        }
    };
    if lanes > 1 {
        w.line(&format!("var<workgroup> red: array<f32, {wg}>;"));
        w.blank();
    }
    open_main(w, wg);
    w.line("let t = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (t >= {groups}u)"), &["return;"]);
    if inner {
        w.line(&format!("let slot = lid / {lanes}u;")).line(&format!("let lane = lid % {lanes}u;"));
    } else {
        w.line(&format!("let slot = lid % {outs}u;")).line(&format!("let lane = lid / {outs}u;"));
    }
    w.line(&format!("let part = t / {blocks}u;"));
    w.line(&format!("let o = (t % {blocks}u) * {outs}u + slot;"));
    w.line(&format!("var acc = {init};"));
    w.open(&format!("if (o < {n_out}u)"));
    let end = if len == n_red { format!("{n_red}u") } else { format!("min(part * {len}u + {len}u, {n_red}u)") };
    // UNROLL elements a lane at a time: their loads are independent, so they are in flight
    // together; they are combined in order after.
    w.line(&format!("let end = {end};"));
    w.open(&format!(
        "for (var j0 = part * {len}u + lane; j0 < end; j0 += {}u)",
        lanes * UNROLL
    ));
    w.line(&format!("var vs = array<f32, {UNROLL}>({});", [init; UNROLL].join(", ")));
    w.open(&format!("for (var u = 0u; u < {UNROLL}u; u++)"));
    w.line(&format!("let j = j0 + u * {lanes}u;"));
    w.open("if (j < end)");
    for l in load {
        w.lines(l);
    }
    w.line("vs[u] = v;");
    w.close();
    w.close();
    w.block(&format!("for (var u = 0u; u < {UNROLL}u; u++)"), &[&format!("acc = {};", fold("acc", "vs[u]"))]);
    w.close();
    w.close();
    if lanes > 1 {
        let stride = layout.lane_stride();
        w.line("red[lid] = acc;");
        w.line("workgroupBarrier();");
        w.open(&format!("for (var s = {}u; s > 0u; s = s >> 1u)", lanes / 2));
        w.block("if (lane < s)", &[&format!("red[lid] = {};", fold("red[lid]", &format!("red[lid + s * {stride}u]")))]);
        w.line("workgroupBarrier();");
        w.close();
        w.line("acc = red[lid];");
    }
    w.block(&format!("if (lane == 0u && o < {n_out}u)"), &[write]);
    w.close();
    // A lane's share of its part (`len` elements, UNROLL a step over `lanes`), each step a
    // loop of loads and one of combines; then the lanes' tree.
    let unroll = UNROLL as u64;
    let step = Loops::of(unroll, load_loops).then(Loops::flat(unroll));
    let share = Loops::of(trips(len as u64, (lanes * UNROLL) as u64), step);
    let tree = if lanes > 1 { Loops::flat(halvings(lanes as u64 / 2)) } else { Loops::NONE };
    (groups as u32, wg, share.then(tree))
}

pub(super) fn softmax(
    g: &Graph,
    w: &mut Wgsl,
    binder: &Binder,
    out: NodeId,
    log: bool,
) -> (u32, u32, Loops) {
    let x = g.node(out).inputs[0];
    let shape = g.shape(out);
    let d = *shape.last().expect("softmax has a last axis");
    let rows: usize = shape.iter().product::<usize>() / d.max(1);
    let (xn, yn) = (binder.name(x), binder.name(out));
    let write = if log { "v - m - log_(total)" } else { "exp(v - m) / total" };
    open_row_main(w, ROW_WG);
    w.line("let row = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (row >= {rows}u)"), &["return;"]);
    w.line(&format!("let base = row * {d}u;"));
    w.line(&format!("var acc = {};", f32_lit(f32::NEG_INFINITY)));
    let loops = row_max_and_total(w, &xn, d);
    let store = [&format!("let v = {xn}[base + j];"), &format!("{yn}[base + j] = {write};")];
    let loops = loops.then(strided(w, d, &store.map(String::as_str)));
    w.close();
    (rows as u32, ROW_WG, loops)
}

/// Cross-entropy in two dispatches: a workgroup per row writes the row's loss and its count
/// (0 or 1) into scratch (`[loss of each row, count of each row]`), checking its label; then
/// one workgroup sums both in order and writes their quotient, NaN when nothing was counted
/// (every label ignored: a mean of nothing, as on the CPU).
pub(super) fn cross_entropy(
    g: &Graph,
    w: &mut Wgsl,
    binder: &Binder,
    ctx: &mut Ctx,
    out: NodeId,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let Op::CrossEntropy { ignore_index } = node.op else { unreachable!("cross_entropy kernel") };
    let (logits, labels) = (node.inputs[0], node.inputs[1]);
    let c = *g.shape(logits).last().expect("class axis");
    let rows: usize = g.shape(labels).iter().product();
    let (ln, lab) = (binder.name(logits), binder.name(labels));
    let ignore = ignore_index.map_or("false".to_string(), |v| format!("label == {v}"));
    let ok = in_range("label", c);
    let s = ctx.scratch(0, 2 * rows);
    if ctx.stage == 1 {
        open_row_main(w, SUM_WG);
        w.line("var acc = 0.0;");
        w.block(&format!("for (var r = lid; r < {rows}u; r += {SUM_WG}u)"), &[&format!("acc += {s}[r];")]);
        let losses = tree(w, "sum", SUM_WG);
        w.line("let total = red[0];");
        w.line("workgroupBarrier();");
        w.line("acc = 0.0;");
        w.block(
            &format!("for (var r = lid; r < {rows}u; r += {SUM_WG}u)"),
            &[&format!("acc += {s}[{rows}u + r];")],
        );
        let counts = tree(w, "sum", SUM_WG);
        let (on, nan) = (binder.name(out), f32_lit(f32::NAN));
        let mean = format!("{on}[0] = select(total / red[0], {nan}, red[0] == 0.0);");
        w.block("if (lid == 0u)", &[&mean]);
        w.close();
        // Both sums a 256th of the rows a thread, then a tree.
        let each = Loops::flat(trips(rows as u64, u64::from(SUM_WG)));
        return (1, SUM_WG, each.then(losses).then(each).then(counts));
    }
    open_row_main(w, ROW_WG);
    w.line("let row = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (row >= {rows}u)"), &["return;"]);
    w.line(&format!("let base = row * {c}u;"));
    w.line(&format!("var acc = {};", f32_lit(f32::NEG_INFINITY)));
    let loops = row_max_and_total(w, &ln, c);
    w.open("if (lid == 0u)");
    w.line(&format!("let label = {lab}[row];"));
    w.line("var loss = 0.0;");
    w.line("var count = 0.0;");
    w.open(&format!("if (!({ignore}))"));
    w.open(&format!("if ({ok})"));
    w.line(&format!("loss = m + log_(total) - {ln}[base + u32(label)];"));
    w.line("count = 1.0;");
    w.close();
    w.block(&format!("if (!{ok})"), &["report(row);"]);
    w.close();
    w.line(&format!("{s}[row] = loss;"));
    w.line(&format!("{s}[{rows}u + row] = count;"));
    w.close();
    w.close();
    (rows as u32, ROW_WG, loops)
}

/// Dispatches of cross-entropy gradient `out`: with an ignored label, a first one counts the
/// rows that are not ignored.
pub(super) fn cross_entropy_grad_stages(g: &Graph, out: NodeId) -> usize {
    match g.node(out).op {
        Op::CrossEntropyGrad { ignore_index: Some(_) } => 2,
        _ => 1,
    }
}

/// The logits' gradient: a workgroup per row (after a dispatch counting the rows not ignored,
/// into scratch, when a label is ignored).
pub(super) fn cross_entropy_grad(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    ctx: &mut Ctx,
    out: NodeId,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let Op::CrossEntropyGrad { ignore_index } = node.op else {
        unreachable!("cross_entropy_grad kernel")
    };
    let (logits, labels, dloss) = (node.inputs[0], node.inputs[1], node.inputs[2]);
    let c = *g.shape(logits).last().expect("class axis");
    let rows: usize = g.shape(labels).iter().product();
    let (ln, lab, dn) = (binder.name(logits), binder.name(labels), binder.name(out));
    let ok = in_range("label", c);
    let ignore = ignore_index.map_or("false".to_string(), |v| format!("label == {v}"));
    if let (Some(v), 0) = (ignore_index, ctx.stage) {
        let s = ctx.scratch(0, 1);
        open_row_main(w, SUM_WG);
        w.line("var acc = 0.0;");
        w.open(&format!("for (var r = lid; r < {rows}u; r += {SUM_WG}u)"));
        w.block(&format!("if ({lab}[r] != {v})"), &["acc += 1.0;"]);
        w.close();
        let tree = tree(w, "sum", SUM_WG);
        w.block("if (lid == 0u)", &[&format!("{s}[0] = red[0];")]);
        w.close();
        return (1, SUM_WG, Loops::flat(trips(rows as u64, u64::from(SUM_WG))).then(tree));
    }
    let count = match ignore_index {
        None => f32_lit(rows as f32),
        Some(_) => format!("max({}[0], 1.0)", ctx.scratch(0, 1)),
    };
    let dl = em.emit(dloss, &[]);
    open_row_main(w, ROW_WG);
    w.line("let row = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (row >= {rows}u)"), &["return;"]);
    w.line(&format!("let count = {count};"));
    w.line(&format!("let base = row * {c}u;"));
    w.line(&format!("let label = {lab}[row];"));
    w.block(&format!("if (lid == 0u && !({ignore}) && !{ok})"), &["report(row);"]);
    w.line(&format!("var acc = {};", f32_lit(f32::NEG_INFINITY)));
    let loops = row_max_and_total(w, &ln, c);
    w.lines(&em.body);
    w.line(&format!("let scale = {dl} / count;"));
    w.open(&format!("for (var j = lid; j < {c}u; j += {ROW_WG}u)"));
    w.line(&format!("var v = exp({ln}[base + j] - m) / total;"));
    w.block("if (i32(j) == label)", &["v -= 1.0;"]);
    w.line(&format!("{dn}[base + j] = select(v * scale, 0.0, {ignore});"));
    w.close();
    w.close();
    // The row's two reductions, the gradient's expression, a third pass over the row.
    let pass = Loops::flat(trips(c as u64, u64::from(ROW_WG)));
    (rows as u32, ROW_WG, loops.then(em.loops).then(pass))
}
