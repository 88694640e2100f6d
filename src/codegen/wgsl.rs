//! The generated kernels: one WGSL module per kernel, every size a literal, written with
//! [`Wgsl`] (indented, one statement a line).
//!
//! Elementwise kernels, reductions (with their prologue expression), softmax and log-softmax,
//! cross-entropy forward and backward, embedding forward and backward, concat and guarded update
//! copies are generated here, as are the epilogues that the matmul template runs
//! ([`matmul_epilogue`]).
//!
//! Bindings: every buffer a kernel touches is bound once, in the order of first use
//! (`@binding(i)`, named `b{i}`), read-only unless the kernel writes it; then the plan's status
//! buffer when the kernel uses it ([`StatusUse`]); then the plan's `meta` uniform when the
//! kernel needs the step counter (dropout).
//!
//! The status buffer is how the GPU reports bad data the way the CPU does: word 0 is nonzero
//! when any check of the step failed, word `1 + j` holds the first bad position (an index or
//! label out of range) that the `j`-th checking kernel of the plan found. A kernel that commits
//! an update in place writes nothing once a check failed, so a step that fails leaves
//! parameters and state as they were, as on the CPU.

use super::expr::{decompose, f32_lit, linear_index, ExprEmitter, HASH32_WGSL, MATH_WGSL};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId, Op, ReduceOp};
use crate::plan::limits::{checks_data, guarded};
use crate::plan::{Kernel, KernelKind, Plan};
use crate::tensor::DType;

/// Threads per workgroup of generated elementwise-style kernels.
pub const WG: u32 = 256;
/// Threads per workgroup of generated row kernels (softmax, reductions, cross-entropy).
pub const ROW_WG: u32 = 64;
/// Threads of the one workgroup of the cross-entropy forward kernel.
pub const CE_WG: u32 = 256;

/// The arguments of every generated entry point.
pub const MAIN_ARGS: &str = "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32";

/// How a kernel uses the plan's status buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusUse {
    /// It checks its data and reports the first bad position it finds into word `slot`.
    Report { slot: usize },
    /// It commits an update in place and writes nothing once any check failed.
    Guard,
}

/// Words of a plan's status buffer: one for "a check failed", then one per checking kernel.
pub fn status_words(plan: &Plan) -> usize {
    1 + plan.kernels.iter().filter(|k| checks_data(&k.kind)).count()
}

/// How kernel `k` of `plan` uses the status buffer.
pub fn status_use(g: &Graph, plan: &Plan, k: &Kernel) -> Option<StatusUse> {
    if checks_data(&k.kind) {
        let before = plan.kernels.iter().take_while(|x| *x != k).filter(|x| checks_data(&x.kind));
        return Some(StatusUse::Report { slot: 1 + before.count() });
    }
    guarded(g, plan, k).then_some(StatusUse::Guard)
}

/// The status binding at `binding`, and `report(pos)` for a checking kernel.
fn status_decl(w: &mut Wgsl, status: StatusUse, binding: usize) {
    w.line(&format!(
        "@group(0) @binding({binding}) var<storage, read_write> rumus_status: array<atomic<u32>>;"
    ));
    if let StatusUse::Report { slot } = status {
        w.open("fn report(pos: u32)");
        w.line("atomicMax(&rumus_status[0], 1u);");
        w.line(&format!("atomicMin(&rumus_status[{slot}], pos);"));
        w.close();
    }
}

/// The first statement of a guarded kernel: nothing is written once a check failed.
fn guard(w: &mut Wgsl) {
    w.block("if (atomicLoad(&rumus_status[0]) != 0u)", &["return;"]);
}

/// `@compute @workgroup_size(wg)` and the opening of `fn main`.
fn open_main(w: &mut Wgsl, wg: u32) {
    w.line(&format!("@compute @workgroup_size({wg})"));
    w.open(&format!("fn main({MAIN_ARGS})"));
}

/// `let {name} = (wid.x + wid.y * nwg.x) * WG + lid;` and a return for ids from `n` on.
fn thread_index(w: &mut Wgsl, name: &str, n: usize) {
    w.line(&format!("let {name} = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
    w.block(&format!("if ({name} >= {n}u)"), &["return;"]);
}

/// A guarded copy of `words` 4-byte words from buffer `from` to buffer `to`: an update committed
/// after the step's kernels, skipped once a check failed.
pub fn commit_copy(from: usize, to: usize, words: usize) -> Program {
    let mut w = Wgsl::new();
    w.line("@group(0) @binding(0) var<storage, read> src: array<u32>;");
    w.line("@group(0) @binding(1) var<storage, read_write> dst: array<u32>;");
    status_decl(&mut w, StatusUse::Guard, 2);
    w.blank();
    open_main(&mut w, WG);
    guard(&mut w);
    thread_index(&mut w, "i", words);
    w.line("dst[i] = src[i];");
    w.close();
    let bind = |at: u32, name: &str, resource| Binding {
        at,
        name: name.to_string(),
        resource,
        words: words as u64,
    };
    Program {
        label: format!("commit {words} words"),
        wgsl: w.finish(),
        entry: "main",
        workgroup_size: WG,
        bindings: vec![
            bind(0, "src", Resource::Buffer(from)),
            bind(1, "dst", Resource::Buffer(to)),
            Binding { at: 2, name: "rumus_status".into(), resource: Resource::Status, words: 0 },
        ],
        grid: Grid::Linear((words as u32).div_ceil(WG)),
        checks: ShaderChecks::ALL,
    }
}

/// Bindings collected while a kernel is generated.
struct Binder<'a> {
    plan: &'a Plan,
    list: Vec<(usize, bool)>,
}

impl<'a> Binder<'a> {
    /// Every buffer of `k`, or those of `only` when given.
    fn new(plan: &'a Plan, k: &Kernel, only: Option<&[usize]>) -> Binder<'a> {
        let mut b = Binder { plan, list: Vec::new() };
        for &id in &k.inputs {
            b.bind(id, false);
        }
        for &id in &k.outputs {
            b.bind(id, true);
        }
        if let Some(only) = only {
            b.list.retain(|(buffer, _)| only.contains(buffer));
        }
        b
    }

    fn bind(&mut self, id: NodeId, write: bool) {
        let buffer = self
            .plan
            .value_of(id)
            .expect("plan verify checked every kernel value has a buffer")
            .buffer;
        match self.list.iter_mut().find(|(b, _)| *b == buffer) {
            Some(slot) => slot.1 |= write,
            None => self.list.push((buffer, write)),
        }
    }

    fn name(&self, id: NodeId) -> String {
        let buffer = self.plan.value_of(id).expect("bound").buffer;
        name_of(&self.list, buffer)
    }

    fn declare(&self, w: &mut Wgsl, g: &Graph, k: &Kernel) {
        for (i, &(buffer, write)) in self.list.iter().enumerate() {
            // A buffer's element type is that of the values this kernel uses it for.
            let ty = if buffer_is_i32(g, self.plan, k, buffer) { "i32" } else { "f32" };
            let access = if write { "read_write" } else { "read" };
            w.line(&format!("@group(0) @binding({i}) var<storage, {access}> b{i}: array<{ty}>;"));
        }
    }
}

/// The WGSL name of a bound buffer (`unbound` for one the module does not use).
fn name_of(list: &[(usize, bool)], buffer: usize) -> String {
    match list.iter().position(|(b, _)| *b == buffer) {
        Some(i) => format!("b{i}"),
        None => "unbound".to_string(),
    }
}

/// Whether kernel `k` uses `buffer` for an i32 value.
fn buffer_is_i32(g: &Graph, plan: &Plan, k: &Kernel, buffer: usize) -> bool {
    k.inputs.iter().chain(&k.outputs).any(|&id| {
        plan.value_of(id).is_some_and(|v| v.buffer == buffer) && g.dtype(id) == DType::I32
    })
}

fn uses_dropout(g: &Graph, k: &Kernel) -> bool {
    k.fused.iter().any(|&id| matches!(g.node(id).op, Op::Dropout { .. }))
}

/// The program of generated kernel `k` (any kind but LayerNorm's, which use templates), or
/// `None` when it has nothing to compute or check (a zero-size value). Only buffers the code
/// reads or writes are bound (an automatic pipeline layout leaves out the others): a kernel
/// over zero-size values may touch none of its inputs.
pub fn generate(g: &Graph, plan: &Plan, k: &Kernel) -> Option<Program> {
    let all = generate_binding(g, plan, k, None);
    let used: Vec<usize> = all
        .bindings
        .iter()
        .filter(|b| all.wgsl.contains(&format!("{}[", b.name)))
        .filter_map(|b| match b.resource {
            Resource::Buffer(i) => Some(i),
            _ => None,
        })
        .collect();
    let n_buffers = all.bindings.iter().filter(|b| matches!(b.resource, Resource::Buffer(_)));
    let p = if used.len() == n_buffers.count() {
        all
    } else {
        generate_binding(g, plan, k, Some(&used))
    };
    (p.grid != Grid::Linear(0)).then_some(p)
}

fn generate_binding(g: &Graph, plan: &Plan, k: &Kernel, only: Option<&[usize]>) -> Program {
    let binder = Binder::new(plan, k, only);
    let names = |b: usize| name_of(&binder.list, b);
    let out = *k.outputs.last().expect("a kernel writes a value");
    let mut em = ExprEmitter::new(g, plan, &names);
    em.root = Some(out);
    let uses_meta = uses_dropout(g, k);
    let status = status_use(g, plan, k);
    let mut w = Wgsl::new();
    w.line("alias scalar = f32;");
    w.blank();
    binder.declare(&mut w, g, k);
    let mut at = binder.list.len();
    if let Some(status) = status {
        status_decl(&mut w, status, at);
        at += 1;
    }
    if uses_meta {
        w.open("struct Meta");
        w.lines("step: u32,\npad0: u32,\npad1: u32,\npad2: u32,");
        w.close();
        w.line(&format!("@group(0) @binding({at}) var<uniform> rumus_meta: Meta;"));
        w.lines(HASH32_WGSL);
    }
    w.blank();
    w.lines(MATH_WGSL);
    w.blank();
    let (workgroups, wg) = match &k.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } => {
            elementwise(g, &mut w, &mut em, &binder, k, status == Some(StatusUse::Guard))
        }
        KernelKind::Reduce => reduce(g, &mut w, &mut em, &binder, out),
        KernelKind::Softmax | KernelKind::LogSoftmax => {
            softmax(g, &mut w, &binder, out, k.kind == KernelKind::LogSoftmax)
        }
        KernelKind::CrossEntropy => cross_entropy(g, &mut w, &binder, out),
        KernelKind::CrossEntropyGrad => cross_entropy_grad(g, &mut w, &mut em, &binder, out),
        KernelKind::Embedding => embedding(g, &mut w, &binder, out),
        KernelKind::EmbeddingGrad => embedding_grad(g, &mut w, &binder, out),
        KernelKind::Concat { parts } => {
            concat(g, plan, &mut w, &binder, &names, out, parts.clone())
        }
        other => unreachable!("{other:?} kernels use the templates in shaders/"),
    };
    let mut bindings: Vec<Binding> = binder
        .list
        .iter()
        .enumerate()
        .map(|(i, &(b, _))| Binding {
            at: i as u32,
            name: format!("b{i}"),
            resource: Resource::Buffer(b),
            words: 0,
        })
        .collect();
    if status.is_some() {
        let at = bindings.len() as u32;
        bindings.push(Binding {
            at,
            name: "rumus_status".into(),
            resource: Resource::Status,
            words: 0,
        });
    }
    if uses_meta {
        let at = bindings.len() as u32;
        bindings.push(Binding {
            at,
            name: "rumus_meta".into(),
            resource: Resource::Meta,
            words: 0,
        });
    }
    Program {
        label: format!("{} #{}", k.kind.name(), out.index()),
        wgsl: w.finish(),
        entry: "main",
        workgroup_size: wg,
        bindings,
        grid: Grid::Linear(workgroups),
        checks: ShaderChecks::ALL,
    }
}

/// An elementwise kernel (or the generated fallback of a matmul): thread `i` computes output
/// element `i`.
fn elementwise(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    k: &Kernel,
    guarded: bool,
) -> (u32, u32) {
    let out = *k.outputs.last().expect("a kernel writes a value");
    let out_shape = g.shape(out).to_vec();
    let n_out: usize = out_shape.iter().product();
    let (coords_code, coords) = decompose(&out_shape, "i", "c");
    let value = match k.kind {
        KernelKind::MatMul { matmul, .. } if matmul == out => em.emit_matmul(out, &coords),
        _ if g.dtype(out) == DType::I32 => em.emit_i32(out, &coords),
        _ => em.emit(out, &coords),
    };
    open_main(w, WG);
    if guarded {
        guard(w);
    }
    thread_index(w, "i", n_out);
    w.lines(&coords_code);
    w.lines(&em.body);
    w.line(&format!("{}[i] = {value};", binder.name(out)));
    w.close();
    ((n_out as u32).div_ceil(WG), WG)
}

/// The generated part of a matmul kernel: the epilogue that turns the accumulator of element
/// `(batch, i, j)` into the kernel's output, for the `matmul.wgsl` template.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulEpilogue {
    /// Declarations of the epilogue's extra bindings (from `@binding(4)`) and helpers.
    pub decls: String,
    /// Body of `fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar`.
    pub body: String,
    /// Plan buffers bound at `@binding(4..)`, in order.
    pub extra: Vec<usize>,
}

/// The epilogue of matmul kernel `k` whose `[.., M, N]` result reaches the output through
/// `register` (the matmul, or a reshape of it); `None` when it needs the step uniform (dropout),
/// which the template does not bind.
pub fn matmul_epilogue(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    register: NodeId,
) -> Option<MatmulEpilogue> {
    if uses_dropout(g, k) {
        return None;
    }
    let out = *k.outputs.last()?;
    let mm_shape = match k.kind {
        KernelKind::MatMul { matmul, .. } => g.shape(matmul).to_vec(),
        _ => return None,
    };
    let (m, n) = (mm_shape[mm_shape.len() - 2], mm_shape[mm_shape.len() - 1]);
    // Buffers are named in order of first use, so only those the expression reads are bound.
    let used = std::cell::RefCell::new(Vec::<usize>::new());
    let names = |b: usize| {
        let mut u = used.borrow_mut();
        let i = u.iter().position(|&x| x == b).unwrap_or_else(|| {
            u.push(b);
            u.len() - 1
        });
        format!("e{i}")
    };
    let mut em = ExprEmitter::new(g, plan, &names);
    em.register = Some((register, "v".to_string()));
    em.root = Some(out);
    let lin = format!("((batch * {m}u + i) * {n}u + j)");
    let (coords_code, coords) = decompose(g.shape(out), &lin, "c");
    let value = if out == register { "v".to_string() } else { em.emit(out, &coords) };
    // The template indents the first line of the body; the others are indented here.
    let mut body = Wgsl::new();
    body.lines(&coords_code).lines(&em.body).line(&format!("return {value};"));
    let body = body.finish().trim_end().replace('\n', "\n    ");
    let extra = used.into_inner();
    let mut decls = Wgsl::new();
    for (i, &b) in extra.iter().enumerate() {
        let ty = if buffer_is_i32(g, plan, k, b) { "i32" } else { "f32" };
        let at = i + 4;
        decls.line(&format!("@group(0) @binding({at}) var<storage, read> e{i}: array<{ty}>;"));
    }
    decls.lines(MATH_WGSL);
    Some(MatmulEpilogue { decls: decls.finish(), body, extra })
}

/// WGSL for "`{idx}` is a row of a table of `rows`": an i32 comparison that holds for every
/// size (a table of more than `i32::MAX` rows holds every non-negative index).
fn in_range(idx: &str, rows: usize) -> String {
    match i32::try_from(rows) {
        Ok(n) => format!("({idx} >= 0 && {idx} < {n})"),
        Err(_) => format!("({idx} >= 0)"),
    }
}

/// `if (i < n_idx) { let r = x[i]; if (!ok) { report(i); } }`: thread `i` checks index `i`.
fn check_index(w: &mut Wgsl, x: &str, n_idx: usize, ok: &str) {
    w.open(&format!("if (i < {n_idx}u)"));
    w.line(&format!("let r = {x}[i];"));
    w.block(&format!("if (!{ok})"), &["report(i);"]);
    w.close();
}

/// Embedding: thread `i` gathers output element `i`, and checks index `i` (reported as the CPU
/// reports it, a bad index reads row 0).
fn embedding(g: &Graph, w: &mut Wgsl, binder: &Binder, out: NodeId) -> (u32, u32) {
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
    ((n_out.max(n_idx) as u32).div_ceil(WG), WG)
}

/// The table gradient of embedding: thread `i` sums output element `i` over the indices that
/// name its row (a gather, no atomics), and checks index `i`.
fn embedding_grad(g: &Graph, w: &mut Wgsl, binder: &Binder, out: NodeId) -> (u32, u32) {
    let node = g.node(out);
    let (idx, dy) = (node.inputs[0], node.inputs[1]);
    let n_idx: usize = g.shape(idx).iter().product();
    let (vocab, d) = (g.shape(out)[0], g.shape(out)[1]);
    let n_out = vocab * d;
    let (x, dn, yn) = (binder.name(idx), binder.name(dy), binder.name(out));
    let ok = in_range("r", vocab);
    open_main(w, WG);
    w.line(&format!("let i = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
    check_index(w, &x, n_idx, &ok);
    if n_out > 0 {
        w.open(&format!("if (i < {n_out}u)"));
        w.line(&format!("let v = i32(i / {d}u);"));
        w.line(&format!("let col = i % {d}u;"));
        w.line("var acc = 0.0;");
        w.open(&format!("for (var n = 0u; n < {n_idx}u; n++)"));
        w.block(&format!("if ({x}[n] == v)"), &[&format!("acc += {dn}[n * {d}u + col];")]);
        w.close();
        w.line(&format!("{yn}[i] = acc;"));
        w.close();
    }
    w.close();
    ((n_out.max(n_idx) as u32).div_ceil(WG), WG)
}

/// The part of a concat's output that inputs `parts` fill: one thread per element of that part.
fn concat(
    g: &Graph,
    plan: &Plan,
    w: &mut Wgsl,
    binder: &Binder,
    names: &dyn Fn(usize) -> String,
    out: NodeId,
    parts: std::ops::Range<usize>,
) -> (u32, u32) {
    let node = g.node(out);
    let Op::Concat { axis } = node.op else { unreachable!("concat kernel") };
    let len = |x: &NodeId| g.shape(*x)[axis];
    let base: usize = node.inputs[..parts.start].iter().map(len).sum();
    let mut part_shape = g.shape(out).to_vec();
    part_shape[axis] = node.inputs[parts.clone()].iter().map(len).sum();
    let n_part: usize = part_shape.iter().product();
    let (coords_code, coords) = decompose(&part_shape, "i", "c");
    let is_i32 = g.dtype(out) == DType::I32;
    open_main(w, WG);
    thread_index(w, "i", n_part);
    w.lines(&coords_code);
    w.line(&format!("var value = {};", if is_i32 { "0" } else { "0.0" }));
    let mut offset = 0;
    for &x in &node.inputs[parts] {
        let mut c = coords.clone();
        c[axis] = format!("({} - {offset}u)", coords[axis]);
        let mut sub = ExprEmitter::new(g, plan, names);
        let v = if is_i32 { sub.emit_i32(x, &c) } else { sub.emit(x, &c) };
        let (at, end) = (&coords[axis], offset + len(&x));
        w.open(&format!("if ({at} >= {offset}u && {at} < {end}u)"));
        w.lines(&sub.body);
        w.line(&format!("value = {v};"));
        w.close();
        offset = end;
    }
    let mut out_coords = coords.clone();
    out_coords[axis] = format!("({} + {base}u)", coords[axis]);
    let index = linear_index(g.shape(out), &out_coords);
    w.line(&format!("{}[{index}] = value;", binder.name(out)));
    w.close();
    ((n_part as u32).div_ceil(WG), WG)
}

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

fn reduce(
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

fn softmax(g: &Graph, w: &mut Wgsl, binder: &Binder, out: NodeId, log: bool) -> (u32, u32) {
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
    strided(w, d, &[&format!("acc = max_(acc, {xn}[base + j]);")]);
    tree(w, "max", ROW_WG);
    w.line("let m = red[0];");
    w.line("workgroupBarrier();");
    w.line("acc = 0.0;");
    strided(w, d, &[&format!("acc += exp({xn}[base + j] - m);")]);
    tree(w, "sum", ROW_WG);
    w.line("let total = red[0];");
    strided(w, d, &[&format!("let v = {xn}[base + j];"), &format!("{yn}[base + j] = {write};")]);
    w.close();
    (rows as u32, ROW_WG)
}

fn cross_entropy(g: &Graph, w: &mut Wgsl, binder: &Binder, out: NodeId) -> (u32, u32) {
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

fn cross_entropy_grad(
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
    strided(w, c, &[&format!("acc = max_(acc, {ln}[base + j]);")]);
    tree(w, "max", ROW_WG);
    w.line("let m = red[0];");
    w.line("workgroupBarrier();");
    w.line("acc = 0.0;");
    strided(w, c, &[&format!("acc += exp({ln}[base + j] - m);")]);
    tree(w, "sum", ROW_WG);
    w.line("let total = red[0];");
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
