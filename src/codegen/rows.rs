//! Generated row kernels: a workgroup per output row, reduced across its threads in workgroup
//! memory: reductions (with their prologue expression), softmax and log-softmax,
//! cross-entropy forward (one workgroup) and backward (checking their labels).

use super::expr::{decompose, f32_lit, ExprEmitter};
use super::gather::in_range;
use super::wgsl::{open_main, thread_index, Binder, CE_WG, ROW_WG, WG};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId, Op, ReduceOp};

/// A workgroup-wide reduction of `acc` into `red[0]` (sum or max) by `wg` threads (a power of
/// two).
fn tree(w: &mut Wgsl, op: &str, wg: u32) {
    let combine =
        if op == "max" { "max_(red[lid], red[lid + s])" } else { "red[lid] + red[lid + s]" };
    w.line("red[lid] = acc;");
    w.line("workgroupBarrier();");
    w.open(&format!("for (var s = {}u; s > 0u; s = s >> 1u)", wg / 2));
    w.block("if (lid < s)", &[&format!("red[lid] = {combine};")]);
    w.line("workgroupBarrier();");
    w.close();
}

/// `var<workgroup> red: array<f32, wg>;` and the opening of `fn main`.
fn open_row_main(w: &mut Wgsl, wg: u32) {
    w.line(&format!("var<workgroup> red: array<f32, {wg}>;"));
    w.blank();
    open_main(w, wg);
}

/// `for (var j = lid; j < {n}u; j += ROW_WG) { body }`: a thread's share of a row.
fn strided(w: &mut Wgsl, n: usize, body: &[&str]) {
    w.block(&format!("for (var j = lid; j < {n}u; j += {ROW_WG}u)"), body);
}

/// A row's maximum `m` and `total` = Σ exp(x - m) over `{x}[base + j]`, `j < n`, with `acc`
/// already set to -inf: the two reductions softmax and cross-entropy share.
fn row_max_and_total(w: &mut Wgsl, x: &str, n: usize) {
    strided(w, n, &[&format!("acc = max_(acc, {x}[base + j]);")]);
    tree(w, "max", ROW_WG);
    w.line("let m = red[0];");
    w.line("workgroupBarrier();");
    w.line("acc = 0.0;");
    strided(w, n, &[&format!("acc += exp({x}[base + j] - m);")]);
    tree(w, "sum", ROW_WG);
    w.line("let total = red[0];");
}

pub(super) fn reduce(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    out: NodeId,
) -> (u32, u32) {
    let node = g.node(out);
    let Op::Reduce { op, axes, .. } = &node.op else { unreachable!("reduce kernel") };
    let x = node.inputs[0];
    let xs = g.shape(x).to_vec();
    let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| xs[d]).collect();
    let red_shape: Vec<usize> = axes.iter().map(|&d| xs[d]).collect();
    let n_out: usize = kept_shape.iter().product();
    let n_red: usize = red_shape.iter().product();
    let on = binder.name(out);
    if n_red == 0 {
        // Over nothing: the sum is 0 and the mean 0 / 0 (max of nothing is refused by shape
        // inference), as on the CPU.
        let fill = if *op == ReduceOp::Mean { f32_lit(f32::NAN) } else { "0.0".to_string() };
        open_main(w, WG);
        thread_index(w, "i", n_out);
        w.line(&format!("{on}[i] = {fill};"));
        w.close();
        return ((n_out as u32).div_ceil(WG), WG);
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
    let (init, combine, op_name) = match op {
        ReduceOp::Max => (f32_lit(f32::NEG_INFINITY), "acc = max_(acc, v);", "max"),
        _ => ("0.0".to_string(), "acc += v;", "sum"),
    };
    let finish = match op {
        ReduceOp::Mean => format!(" / {}", f32_lit(n_red as f32)),
        _ => String::new(),
    };
    open_row_main(w, ROW_WG);
    w.line("let o = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (o >= {n_out}u)"), &["return;"]);
    w.lines(&out_code);
    w.line(&format!("var acc = {init};"));
    w.open(&format!("for (var j = lid; j < {n_red}u; j += {ROW_WG}u)"));
    w.lines(&red_code);
    w.lines(&em.body);
    w.line(&format!("let v = {value};"));
    w.line(combine);
    w.close();
    tree(w, op_name, ROW_WG);
    w.block("if (lid == 0u)", &[&format!("{on}[o] = red[0]{finish};")]);
    w.close();
    (n_out as u32, ROW_WG)
}

pub(super) fn softmax(
    g: &Graph,
    w: &mut Wgsl,
    binder: &Binder,
    out: NodeId,
    log: bool,
) -> (u32, u32) {
    let x = g.node(out).inputs[0];
    let shape = g.shape(out);
    let d = *shape.last().expect("softmax has a last axis");
    let rows: usize = shape.iter().product::<usize>() / d.max(1);
    let (xn, yn) = (binder.name(x), binder.name(out));
    let write = if log { "v - m - log(total)" } else { "exp(v - m) / total" };
    open_row_main(w, ROW_WG);
    w.line("let row = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (row >= {rows}u)"), &["return;"]);
    w.line(&format!("let base = row * {d}u;"));
    w.line(&format!("var acc = {};", f32_lit(f32::NEG_INFINITY)));
    row_max_and_total(w, &xn, d);
    strided(w, d, &[&format!("let v = {xn}[base + j];"), &format!("{yn}[base + j] = {write};")]);
    w.close();
    (rows as u32, ROW_WG)
}

pub(super) fn cross_entropy(g: &Graph, w: &mut Wgsl, binder: &Binder, out: NodeId) -> (u32, u32) {
    let node = g.node(out);
    let Op::CrossEntropy { ignore_index } = node.op else { unreachable!("cross_entropy kernel") };
    let (logits, labels) = (node.inputs[0], node.inputs[1]);
    let c = *g.shape(logits).last().expect("class axis");
    let rows: usize = g.shape(labels).iter().product();
    let (ln, lab) = (binder.name(logits), binder.name(labels));
    let ignore = ignore_index.map_or("false".to_string(), |v| format!("label == {v}"));
    let ok = in_range("label", c);
    // One workgroup (the mean needs every row): each thread takes rows, then the workgroup
    // sums losses and counts.
    open_row_main(w, CE_WG);
    w.line("var loss = 0.0;");
    w.line("var count = 0.0;");
    w.open(&format!("for (var r = lid; r < {rows}u; r += {CE_WG}u)"));
    w.line(&format!("let label = {lab}[r];"));
    w.block(&format!("if ({ignore})"), &["continue;"]);
    w.block(&format!("if (!{ok})"), &["report(r);", "continue;"]);
    w.line(&format!("let base = r * {c}u;"));
    w.line(&format!("var m = {};", f32_lit(f32::NEG_INFINITY)));
    w.block(
        &format!("for (var j = 0u; j < {c}u; j++)"),
        &[&format!("m = max_(m, {ln}[base + j]);")],
    );
    w.line("var s = 0.0;");
    w.block(
        &format!("for (var j = 0u; j < {c}u; j++)"),
        &[&format!("s += exp({ln}[base + j] - m);")],
    );
    w.line("let t = u32(label);");
    w.line(&format!("loss += m + log(s) - {ln}[base + t];"));
    w.line("count += 1.0;");
    w.close();
    w.line("var acc = loss;");
    tree(w, "sum", CE_WG);
    w.line("let total = red[0];");
    w.line("workgroupBarrier();");
    w.line("acc = count;");
    tree(w, "sum", CE_WG);
    w.block("if (lid == 0u)", &[&format!("{}[0] = total / max(red[0], 1.0);", binder.name(out))]);
    w.close();
    (1, CE_WG)
}

pub(super) fn cross_entropy_grad(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    out: NodeId,
) -> (u32, u32) {
    let node = g.node(out);
    let Op::CrossEntropyGrad { ignore_index } = node.op else {
        unreachable!("cross_entropy_grad kernel")
    };
    let (logits, labels, dloss) = (node.inputs[0], node.inputs[1], node.inputs[2]);
    let c = *g.shape(logits).last().expect("class axis");
    let rows: usize = g.shape(labels).iter().product();
    let (ln, lab, dn) = (binder.name(logits), binder.name(labels), binder.name(out));
    let ok = in_range("label", c);
    let dl = em.emit(dloss, &[]);
    let ignore = ignore_index.map_or("false".to_string(), |v| format!("label == {v}"));
    open_row_main(w, ROW_WG);
    w.line("let row = wid.x + wid.y * nwg.x;");
    w.block(&format!("if (row >= {rows}u)"), &["return;"]);
    w.line("var acc = 0.0;");
    match ignore_index {
        None => w.line(&format!("let count = {};", f32_lit(rows as f32))),
        Some(v) => {
            w.line("acc = 0.0;");
            w.open(&format!("for (var r = lid; r < {rows}u; r += {ROW_WG}u)"));
            w.block(&format!("if ({lab}[r] != {v})"), &["acc += 1.0;"]);
            w.close();
            tree(w, "sum", ROW_WG);
            w.line("let count = max(red[0], 1.0);")
        }
    };
    w.line("workgroupBarrier();");
    w.line(&format!("let base = row * {c}u;"));
    w.line(&format!("let label = {lab}[row];"));
    w.block(&format!("if (lid == 0u && !({ignore}) && !{ok})"), &["report(row);"]);
    w.line(&format!("acc = {};", f32_lit(f32::NEG_INFINITY)));
    row_max_and_total(w, &ln, c);
    w.lines(&em.body);
    w.line(&format!("let scale = {dl} / count;"));
    w.open(&format!("for (var j = lid; j < {c}u; j += {ROW_WG}u)"));
    w.line(&format!("var v = exp({ln}[base + j] - m) / total;"));
    w.block("if (i32(j) == label)", &["v -= 1.0;"]);
    w.line(&format!("{dn}[base + j] = select(v * scale, 0.0, {ignore});"));
    w.close();
    w.close();
    (rows as u32, ROW_WG)
}
