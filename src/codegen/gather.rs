//! Generated gathers: embedding forward (checking its indices), and concat (all of its inputs,
//! or a run of them). Embedding backward is in `embedding_grad.rs`.

use super::expr::{decompose, linear_index, ExprEmitter};
use super::loops::Loops;
use super::wgsl::{open_main, thread_index, Binder, WG};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId, Op};
use crate::plan::Plan;
use crate::tensor::DType;

/// WGSL for "`{idx}` is a row of a table of `rows`": an i32 comparison that holds for every
/// size (a table of more than `i32::MAX` rows holds every non-negative index).
pub(super) fn in_range(idx: &str, rows: usize) -> String {
    match i32::try_from(rows) {
        Ok(n) => format!("({idx} >= 0 && {idx} < {n})"),
        Err(_) => format!("({idx} >= 0)"),
    }
}

/// `if (i < n_idx) { let r = x[i]; if (!ok) { report(i); } }`: thread `i` checks index `i`.
pub(super) fn check_index(w: &mut Wgsl, x: &str, n_idx: usize, ok: &str) {
    w.open(&format!("if (i < {n_idx}u)"));
    w.line(&format!("let r = {x}[i];"));
    w.block(&format!("if (!{ok})"), &["report(i);"]);
    w.close();
}

/// Embedding: thread `i` gathers output element `i`, and checks index `i` (reported as the CPU
/// reports it, a bad index reads row 0).
pub(super) fn embedding(
    g: &Graph,
    w: &mut Wgsl,
    binder: &Binder,
    out: NodeId,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let (table, idx) = (node.inputs[0], node.inputs[1]);
    let (vocab, d) = (g.shape(table)[0], g.shape(table)[1]);
    let n_out: usize = g.shape(out).iter().product();
    let n_idx: usize = g.shape(idx).iter().product();
    let (x, tn, yn) = (binder.name(idx), binder.name(table), binder.name(out));
    let ok = in_range("r", vocab);
    open_main(w, WG);
    w.line(&format!("let i = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
    check_index(w, &x, n_idx, &ok);
    if n_out > 0 {
        w.open(&format!("if (i < {n_out}u)"));
        w.line(&format!("let r = {x}[i / {d}u];"));
        w.line(&format!("let row = select(0u, u32(r), {ok});"));
        w.line(&format!("{yn}[i] = {tn}[row * {d}u + i % {d}u];"));
        w.close();
    }
    w.close();
    ((n_out.max(n_idx) as u32).div_ceil(WG), WG, Loops::NONE)
}

/// The part of a concat's output that inputs `parts` fill: one thread per element it writes.
/// An input placed at its part of the output (`plan::arena`: a gradient its own kernel wrote
/// into the arena) is there already; along axis 0 the grid leaves those parts out, so that a
/// gradient arena whose members are all placed but a few costs threads for those few and the
/// padding, not for every parameter (gpt-medium: 85 million threads that returned at once,
/// 0.8 ms of an H200 step).
pub(super) fn concat(
    g: &Graph,
    plan: &Plan,
    w: &mut Wgsl,
    binder: &Binder,
    names: &dyn Fn(usize) -> String,
    out: NodeId,
    parts: std::ops::Range<usize>,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let Op::Concat { axis } = node.op else { unreachable!("concat kernel") };
    let len = |x: &NodeId| g.shape(*x)[axis];
    let base: usize = node.inputs[..parts.start].iter().map(len).sum();
    let mut part_shape = g.shape(out).to_vec();
    part_shape[axis] = node.inputs[parts.clone()].iter().map(len).sum();
    let n_part: usize = part_shape.iter().product();
    let out_buffer = plan.value_of(out).map(|v| v.buffer);
    // Each input with its first index along the axis, and whether it is placed.
    let mut inputs = Vec::new();
    let mut offset = 0;
    for &x in &node.inputs[parts] {
        let within = plan.value_of(x).and_then(|v| plan.buffers[v.buffer].within);
        let at_its_part = (base + offset) as u64 * 4;
        let viewed = plan.view[x.index()].as_ref().map_or(0, |v| v.offset as u64 * 4);
        let there = |w: (usize, u64)| Some(w.0) == out_buffer && w.1 + viewed == at_its_part;
        inputs.push((x, offset, axis == 0 && within.is_some_and(there)));
        offset += len(&x);
    }
    // Along axis 0 each input's part is one run of elements: thread `i` writes element `o` of
    // the part, the runs of the inputs not placed laid end to end.
    let inner: usize = part_shape.iter().skip(1).product();
    let compact = inputs.iter().any(|&(_, _, placed)| placed);
    let n_threads = if compact {
        inputs.iter().filter(|i| !i.2).map(|&(x, _, _)| len(&x) * inner).sum()
    } else {
        n_part
    };
    let is_i32 = g.dtype(out) == DType::I32;
    open_main(w, WG);
    thread_index(w, "i", n_threads);
    let index = if compact {
        w.line("var o = 0u;");
        let mut from = 0;
        for &(x, at, _) in inputs.iter().filter(|i| !i.2) {
            let n = len(&x) * inner;
            w.block(
                &format!("if (i >= {from}u && i < {}u)", from + n),
                &[&format!("o = i - {from}u + {}u;", at * inner)],
            );
            from += n;
        }
        "o"
    } else {
        "i"
    };
    let (coords_code, coords) = decompose(&part_shape, index, "c");
    w.lines(&coords_code);
    w.line(&format!("var value = {};", if is_i32 { "0" } else { "0.0" }));
    // The inputs' expressions' loops (none but a product's), each in its own branch.
    let mut loops = Loops::NONE;
    for &(x, offset, placed) in &inputs {
        if placed {
            continue;
        }
        let mut c = coords.clone();
        c[axis] = format!("({} - {offset}u)", coords[axis]);
        let mut sub = ExprEmitter::new(g, plan, names);
        let v = if is_i32 { sub.emit_i32(x, &c) } else { sub.emit(x, &c) };
        let (at, end) = (&coords[axis], offset + len(&x));
        w.open(&format!("if ({at} >= {offset}u && {at} < {end}u)"));
        w.lines(&sub.body);
        w.line(&format!("value = {v};"));
        w.close();
        loops = loops.or(sub.loops);
    }
    let mut out_coords = coords.clone();
    out_coords[axis] = format!("({} + {base}u)", coords[axis]);
    let index = linear_index(g.shape(out), &out_coords);
    w.line(&format!("{}[{index}] = value;", binder.name(out)));
    w.close();
    // Nothing to write (every input placed, no padding): no dispatch.
    ((n_threads as u32).div_ceil(WG), WG, loops)
}
