//! The generated kernels: one WGSL module per kernel, every size a literal, written with
//! [`Wgsl`] (indented, one statement a line).
//!
//! Elementwise kernels and guarded update copies are generated here, as are the epilogues that
//! the matmul template runs ([`matmul_epilogue`]); the row kernels (reductions, softmax,
//! cross-entropy) are in `rows.rs`, the gathers (embedding, concat) in `gather.rs` and embedding
//! backward in `embedding_grad.rs`. Every generated kernel starts from [`generate`].
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

use super::expr::{decompose, ExprEmitter, HASH32_WGSL};
use super::trace::math_wgsl;
use super::embedding_grad::{embedding_grad, embedding_grad_stages};
use super::gather::{concat, embedding};
use super::loops::Loops;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks, Target};
use super::rows::{
    cross_entropy, cross_entropy_grad, cross_entropy_grad_stages, reduce, reduce_stages, softmax,
};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId, Op};
use crate::plan::limits::{checks_data, guarded};
use crate::plan::{Kernel, KernelKind, Plan};
use crate::tensor::DType;

/// Threads per workgroup of generated elementwise-style kernels.
pub const WG: u32 = 256;
/// Threads per workgroup of generated row kernels (softmax, cross-entropy).
pub const ROW_WG: u32 = 64;
/// Most threads per workgroup of a reduction, and the threads of the one workgroup that
/// finishes a cross-entropy (sums its rows' losses) or counts its labels.
pub const SUM_WG: u32 = 256;

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
pub(super) fn status_decl(w: &mut Wgsl, status: StatusUse, binding: usize) {
    w.line(&format!(
        "@group(0) @binding({binding}) var<storage, read_write> rumus_status: array<atomic<u32>>;"
    ));
    if let StatusUse::Report { slot } = status {
        w.blank();
        w.open("fn report(pos: u32)");
        w.line("atomicMax(&rumus_status[0], 1u);");
        w.line(&format!("atomicMin(&rumus_status[{slot}], pos);"));
        w.close();
    }
}

/// The first statement of a guarded kernel: nothing is written once a check failed.
pub(super) fn guard(w: &mut Wgsl) {
    w.block("if (atomicLoad(&rumus_status[0]) != 0u)", &["return;"]);
}

/// `@compute @workgroup_size(wg)` and the opening of `fn main`.
pub(super) fn open_main(w: &mut Wgsl, wg: u32) {
    w.line(&format!("@compute @workgroup_size({wg})"));
    w.open(&format!("fn main({MAIN_ARGS})"));
}

/// `let {name} = (wid.x + wid.y * nwg.x) * WG + lid;` and a return for ids from `n` on.
pub(super) fn thread_index(w: &mut Wgsl, name: &str, n: usize) {
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
pub(super) struct Binder<'a> {
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

    pub(super) fn name(&self, id: NodeId) -> String {
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

/// What a dispatch of a generated kernel binds beyond the plan's buffers, and which of the
/// kernel's dispatches it is.
pub(super) struct Ctx {
    /// Which of the kernel's dispatches is being written, from 0 ([`stages`] of them).
    pub stage: usize,
    /// The target's `reduce_chunk`: elements a workgroup of a reduction's first stage takes.
    pub chunk: usize,
    /// Scratch slots the dispatch binds, with the words it touches and their element type, in
    /// binding order.
    scratch: Vec<(usize, u64, &'static str)>,
}

impl Ctx {
    /// The WGSL name (`s{slot}`) of scratch slot `slot` as `f32`s, bound with at least `words`
    /// words.
    pub fn scratch(&mut self, slot: usize, words: usize) -> String {
        self.scratch_of(slot, words, "f32")
    }

    /// [`Ctx::scratch`] with elements of type `ty` (`u32`: sort keys, counts, positions).
    pub fn scratch_of(&mut self, slot: usize, words: usize, ty: &'static str) -> String {
        match self.scratch.iter_mut().find(|(s, _, _)| *s == slot) {
            Some(e) => e.1 = e.1.max(words as u64),
            None => self.scratch.push((slot, words as u64, ty)),
        }
        format!("s{slot}")
    }
}

/// How many dispatches generated kernel `k` takes on `target` (one, or a reduction's stages).
fn stages(g: &Graph, k: &Kernel, target: &Target) -> usize {
    let out = *k.outputs.last().expect("a kernel writes a value");
    let chunk = target.reduce_chunk as usize;
    match &k.kind {
        KernelKind::Reduce => reduce_stages(g, out, chunk),
        KernelKind::CrossEntropy => 2,
        KernelKind::CrossEntropyGrad => cross_entropy_grad_stages(g, out),
        KernelKind::EmbeddingGrad => embedding_grad_stages(g, out),
        _ => 1,
    }
}

/// The programs of generated kernel `k` (any kind but LayerNorm's, which use templates), in
/// dispatch order, leaving out dispatches with nothing to compute or check (a zero-size value).
/// Only buffers the code reads or writes are bound (an automatic pipeline layout leaves out
/// the others): a kernel over zero-size values may touch none of its inputs.
/// A matmul kernel that also sums its operand is the matmul's programs, then the reduction's.
pub fn generate(g: &Graph, plan: &Plan, k: &Kernel, target: &Target) -> Vec<Program> {
    generate_counted(g, plan, k, target).into_iter().map(|(p, _)| p).collect()
}

/// [`generate`], each program with its loops.
pub fn generate_counted(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
) -> Vec<(Program, Loops)> {
    let (k, sum) = k.without_sum(g);
    let stages = (0..stages(g, &k, target)).filter_map(|stage| generate_stage(g, plan, &k, target, stage));
    let sum = sum.map(|r| generate_counted(g, plan, &r, target)).unwrap_or_default();
    stages.chain(sum).collect()
}

fn generate_stage(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
    stage: usize,
) -> Option<(Program, Loops)> {
    let (all, loops) = generate_binding(g, plan, k, target, stage, None);
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
    let (p, loops) = if used.len() == n_buffers.count() {
        (all, loops)
    } else {
        generate_binding(g, plan, k, target, stage, Some(&used))
    };
    (p.grid != Grid::Linear(0)).then_some((p, loops))
}

fn generate_binding(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
    stage: usize,
    only: Option<&[usize]>,
) -> (Program, Loops) {
    let binder = Binder::new(plan, k, only);
    let names = |b: usize| name_of(&binder.list, b);
    let out = *k.outputs.last().expect("a kernel writes a value");
    let mut em = ExprEmitter::new(g, plan, &names);
    em.root = Some(out);
    let status = status_use(g, plan, k);
    let mut ctx = Ctx { stage, chunk: target.reduce_chunk.max(1) as usize, scratch: Vec::new() };
    // The body first: the declarations after it bind only what it uses.
    let mut w = Wgsl::new();
    // Each kind's code states its loops (`super::loops`) beside them.
    let (workgroups, wg, loops) = match &k.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } => {
            elementwise(g, &mut w, &mut em, &binder, k, status == Some(StatusUse::Guard))
        }
        KernelKind::Reduce => reduce(g, &mut w, &mut em, &binder, &mut ctx, out),
        KernelKind::Softmax | KernelKind::LogSoftmax => {
            softmax(g, &mut w, &binder, out, k.kind == KernelKind::LogSoftmax)
        }
        KernelKind::CrossEntropy => cross_entropy(g, &mut w, &binder, &mut ctx, out),
        KernelKind::CrossEntropyGrad => {
            cross_entropy_grad(g, &mut w, &mut em, &binder, &mut ctx, out)
        }
        KernelKind::Embedding => embedding(g, &mut w, &binder, out),
        KernelKind::EmbeddingGrad => embedding_grad(g, &mut w, &binder, &mut ctx, out),
        KernelKind::Concat { parts } => {
            concat(g, plan, &mut w, &binder, &names, out, parts.clone())
        }
        other => unreachable!("{other:?} kernels use the templates in shaders/"),
    };
    let body = w.finish();
    let status = status.filter(|_| body.contains("report(") || body.contains("rumus_status"));
    let uses_meta = body.contains("rumus_meta");
    let mut h = Wgsl::new();
    h.line("alias scalar = f32;");
    h.blank();
    binder.declare(&mut h, g, k);
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
    if let Some(status) = status {
        let at = bindings.len();
        status_decl(&mut h, status, at);
        bindings.push(Binding {
            at: at as u32,
            name: "rumus_status".into(),
            resource: Resource::Status,
            words: 0,
        });
    }
    if uses_meta {
        let at = bindings.len();
        h.open("struct Meta");
        h.lines("step: u32,\ntraining: u32,\npad1: u32,\npad2: u32,");
        h.close();
        h.line(&format!("@group(0) @binding({at}) var<uniform> rumus_meta: Meta;"));
        h.lines(HASH32_WGSL);
        bindings.push(Binding {
            at: at as u32,
            name: "rumus_meta".into(),
            resource: Resource::Meta,
            words: 0,
        });
    }
    // A scratch slot the code names but does not index (a term of size 1) is not bound.
    let scratch = ctx.scratch.iter().filter(|(slot, _, _)| body.contains(&format!("s{slot}[")));
    for &(slot, words, ty) in scratch {
        let at = bindings.len();
        h.line(&format!("@group(0) @binding({at}) var<storage, read_write> s{slot}: array<{ty}>;"));
        bindings.push(Binding {
            at: at as u32,
            name: format!("s{slot}"),
            resource: Resource::Scratch { slot },
            words,
        });
    }
    h.blank();
    h.lines(math_wgsl());
    h.blank();
    let stage_name = if stages(g, k, target) > 1 { format!(" stage {stage}") } else { String::new() };
    let program = Program {
        label: format!("{} #{}{stage_name}", k.kind.name(), out.index()),
        wgsl: format!("{}{body}", h.finish()),
        entry: "main",
        workgroup_size: wg,
        bindings,
        grid: Grid::Linear(workgroups),
        checks: checks_of(&k.kind),
    };
    (program, loops)
}

/// The runtime checks of a generated kernel: the row kernels' loops run to sizes fixed at
/// codegen, so they go without naga's loop guard (it costs them time and guards nothing).
fn checks_of(kind: &KernelKind) -> ShaderChecks {
    match kind {
        KernelKind::Reduce | KernelKind::Softmax | KernelKind::LogSoftmax => {
            ShaderChecks { bounds: true, loop_bounding: false }
        }
        _ => ShaderChecks::ALL,
    }
}

/// An elementwise kernel (or the generated fallback of a matmul): thread `i` computes output
/// element `i`. A kernel with several outputs (of one shape, in arena order: `plan::fuse`'s
/// merged elementwise kernels) computes each into a `let` that the later ones read, then
/// stores them all (after every load: an output may be written in place of an input).
fn elementwise(
    g: &Graph,
    w: &mut Wgsl,
    em: &mut ExprEmitter,
    binder: &Binder,
    k: &Kernel,
    guarded: bool,
) -> (u32, u32, Loops) {
    let out = *k.outputs.last().expect("a kernel writes a value");
    let out_shape = g.shape(out).to_vec();
    let n_out: usize = out_shape.iter().product();
    let (coords_code, coords) = decompose(&out_shape, "i", "c");
    let mut stores = Vec::new();
    for (n, &early) in k.outputs[..k.outputs.len() - 1].iter().enumerate() {
        em.root = Some(early);
        let value = em.emit(early, &coords);
        let name = format!("out{n}");
        em.body.push_str(&format!("    let {name} = {value};\n"));
        em.computed.push((early, name.clone()));
        stores.push(format!("{}[i] = {name};", binder.name(early)));
    }
    em.root = Some(out);
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
    for store in &stores {
        w.line(store);
    }
    w.line(&format!("{}[i] = {value};", binder.name(out)));
    w.close();
    // The expression's own loops (a product's sum over K).
    ((n_out as u32).div_ceil(WG), WG, em.loops)
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
    /// How many values the epilogue loads, when its loads are split out (all its buffers
    /// f32): `decls` then define `fn epilogue_loads(batch, i, j) -> array<f32, L>` and
    /// `fn epilogue_with(v, batch, i, j, pre: array<f32, L>) -> scalar`, and `body` calls
    /// them, so a kernel may issue the loads of many elements before it has their values
    /// (the cooperative product's epilogue, where each load waited for memory in turn);
    /// 0 when not split.
    pub loads: u32,
}

/// The coordinates in `shape` (the epilogue's output) of element (batch, i, j) of an `m x n`
/// product: where the output's last axis is the product's columns, that axis is `j` and the
/// others come from the row `batch * m + i`, without the division and remainder by `n` that
/// decomposing the linear index costs each element (measured on the H200 as a large part of
/// a cooperative product's epilogue); otherwise from the linear index.
fn epilogue_coords(shape: &[usize], m: usize, n: usize) -> (String, Vec<String>) {
    match shape.split_last() {
        Some((&last, rows)) if last == n && !shape.contains(&0) => {
            let (mut code, mut names) = decompose(rows, &format!("(batch * {m}u + i)"), "c");
            let name = format!("c{}", rows.len());
            code.push_str(&format!("    let {name} = {};\n", if n == 1 { "0u" } else { "j" }));
            names.push(name);
            (code, names)
        }
        _ => decompose(shape, &format!("((batch * {m}u + i) * {n}u + j)"), "c"),
    }
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
    epilogue_and_loops(g, plan, k, register).map(|(e, _)| e)
}

/// The loops of one call of the epilogue [`matmul_epilogue`] gives (the function `epilogue`,
/// or `epilogue_with`), [`Loops::NONE`] when there is none.
pub fn matmul_epilogue_loops(g: &Graph, plan: &Plan, k: &Kernel, register: NodeId) -> Loops {
    epilogue_and_loops(g, plan, k, register).map_or(Loops::NONE, |(_, l)| l)
}

fn epilogue_and_loops(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    register: NodeId,
) -> Option<(MatmulEpilogue, Loops)> {
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
    // The products run without the runtime's bounds checks (they would slow every load of
    // their loops): the epilogue's own loads clamp their indices instead.
    let (coords_code, coords) = epilogue_coords(g.shape(out), m, n);
    let emit = |hoist: bool| {
        let mut em = ExprEmitter::new(g, plan, &names);
        em.register = Some((register, "v".to_string()));
        em.root = Some(out);
        em.clamp_loads = true;
        em.hoisted = hoist.then(Default::default);
        let value = if out == register { "v".to_string() } else { em.emit(out, &coords) };
        let loads = em.hoisted.take().map(|l| l.into_inner()).unwrap_or_default();
        (em.body, value, loads, em.loops)
    };
    let (code, value, loads, loops) = emit(true);
    let extra = used.borrow().clone();
    // Split only loads whose indices need nothing the body computes (a gather's index, an
    // inlined product's loop counter): they must be computable from (batch, i, j) alone.
    let defined: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "let" || w[0] == "var")
        .map(|w| w[1])
        .collect();
    let independent = loads.iter().all(|l| {
        l.split(|c: char| !(c.is_alphanumeric() || c == '_')).all(|word| !defined.contains(&word))
    });
    let split = !loads.is_empty()
        && independent
        && !extra.iter().any(|&b| buffer_is_i32(g, plan, k, b));
    let mut decls = Wgsl::new();
    for (i, &b) in extra.iter().enumerate() {
        let ty = if buffer_is_i32(g, plan, k, b) { "i32" } else { "f32" };
        let at = i + 4;
        decls.line(&format!("@group(0) @binding({at}) var<storage, read> e{i}: array<{ty}>;"));
    }
    decls.lines(math_wgsl());
    let mut body = Wgsl::new();
    if split {
        let l = loads.len();
        decls.open(&format!("fn epilogue_loads(batch: u32, i: u32, j: u32) -> array<f32, {l}>"));
        decls.lines(&coords_code).line(&format!("return array<f32, {l}>({});", loads.join(", ")));
        decls.close();
        decls.open(&format!(
            "fn epilogue_with(v: scalar, batch: u32, i: u32, j: u32, pre: array<f32, {l}>) -> scalar"
        ));
        decls.lines(&coords_code).lines(&code).line(&format!("return {value};"));
        decls.close();
        body.line("return epilogue_with(v, batch, i, j, epilogue_loads(batch, i, j));");
    } else {
        let (code, value, ..) = emit(false);
        body.lines(&coords_code).lines(&code).line(&format!("return {value};"));
    }
    // The template indents the first line of the body; the others are indented here.
    let body = body.finish().trim_end().replace('\n', "\n    ");
    let extra = used.into_inner();
    let loads = if split { loads.len() as u32 } else { 0 };
    Some((MatmulEpilogue { decls: decls.finish(), body, extra, loads }, loops))
}
