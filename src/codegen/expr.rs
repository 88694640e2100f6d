//! Inlined elementwise expressions: the WGSL for a node evaluated at given coordinates.
//!
//! A kernel evaluates its output's expression tree: materialized nodes are loads from their
//! buffers, inlined nodes are `let` bindings computed from their inputs at coordinates mapped
//! through broadcasting and the index-remapping views (`broadcast_to`, `permute`, `slice`).
//! Shapes are static, so every size and stride is a literal.

use super::loops::Loops;
use super::trace::{Operand, Trace, Wgsl};
use crate::graph::scalar::Scalar;
use crate::graph::{Graph, NodeId, Op, Window};
use crate::plan::view::View;
use crate::plan::Plan;
use crate::tensor::DType;
use std::fmt::Write;

/// Emits `let` statements into `body` and returns the WGSL expression of each node.
pub struct ExprEmitter<'a> {
    pub g: &'a Graph,
    pub plan: &'a Plan,
    /// WGSL name of the binding that holds each buffer, by buffer index.
    pub binding_name: &'a dyn Fn(usize) -> String,
    /// A node whose value is already in a register (the matmul accumulator in an epilogue).
    pub register: Option<(NodeId, String)>,
    /// Nodes already computed into named `let`s here (the earlier outputs of a kernel with
    /// several): later expressions use the name instead of loading or recomputing them.
    pub computed: Vec<(NodeId, String)>,
    /// The node the kernel computes (materialized, but evaluated here rather than loaded).
    pub root: Option<NodeId>,
    /// Clamp every load's index into its binding (`arrayLength`), for kernels compiled
    /// without the runtime's bounds checks whose loads come from here (a matmul epilogue):
    /// one `min` a load instead of checks on every access of the kernel.
    pub clamp_loads: bool,
    /// Collect every load here and read it from `pre[k]` instead (a matmul epilogue whose
    /// loads are issued ahead of its values: `MatmulEpilogue::loads`).
    pub hoisted: Option<std::cell::RefCell<Vec<String>>>,
    pub body: String,
    /// The loops `body` holds (a product's sum over K, [`ExprEmitter::emit_matmul`]).
    pub loops: Loops,
    next: usize,
}

/// `hash32` of the dropout mask, the WGSL twin of `rng::hash32` (see `rng::dropout_keep`).
pub const HASH32_WGSL: &str = "fn hash32(v: u32) -> u32 {
    var x = v;
    x = x ^ (x >> 16u);
    x = x * 0x7feb352du;
    x = x ^ (x >> 15u);
    x = x * 0x846ca68bu;
    x = x ^ (x >> 16u);
    return x;
}
";

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// WGSL for the linear index of `coords` in a contiguous tensor of `shape`.
pub fn linear_index(shape: &[usize], coords: &[String]) -> String {
    let st = strides(shape);
    let terms: Vec<String> = coords
        .iter()
        .zip(&st)
        .zip(shape)
        .filter(|((_, _), &d)| d != 1)
        .map(|((c, &s), _)| if s == 1 { c.clone() } else { format!("{c} * {s}u") })
        .collect();
    if terms.is_empty() {
        "0u".to_string()
    } else {
        terms.join(" + ")
    }
}

/// WGSL for the index of `coords` in a strided view of a `shape`-shaped value.
fn strided_index(shape: &[usize], view: &View, coords: &[String]) -> String {
    let mut terms: Vec<String> = coords
        .iter()
        .zip(&view.strides)
        .zip(shape)
        .filter(|((_, &s), &d)| d != 1 && s != 0)
        .map(|((c, &s), _)| if s == 1 { c.clone() } else { format!("{c} * {s}u") })
        .collect();
    if view.offset != 0 || terms.is_empty() {
        terms.insert(0, format!("{}u", view.offset));
    }
    terms.join(" + ")
}

/// `let` statements decomposing linear index `idx` into coordinates `{prefix}0..` of `shape`.
/// A shape without elements has no coordinates to compute (the code is never reached), so
/// they are all 0 rather than divisions by a zero stride.
pub fn decompose(shape: &[usize], idx: &str, prefix: &str) -> (String, Vec<String>) {
    let st = strides(shape);
    let empty = shape.contains(&0);
    let mut code = String::new();
    let mut names = Vec::new();
    for (d, (&s, &n)) in st.iter().zip(shape).enumerate() {
        let name = format!("{prefix}{d}");
        let e = match (d, n) {
            _ if empty => "0u".to_string(),
            (_, 1) => "0u".to_string(),
            (0, _) if s == 1 => idx.to_string(),
            (0, _) => format!("{idx} / {s}u"),
            (_, _) if s == 1 => format!("{idx} % {n}u"),
            _ => format!("({idx} / {s}u) % {n}u"),
        };
        let _ = writeln!(code, "    let {name} = {e};");
        names.push(name);
    }
    (code, names)
}

/// A WGSL f32 literal that round-trips exactly (infinities and NaN as bit casts).
pub fn f32_lit(v: f32) -> String {
    if v.is_finite() {
        let s = format!("{v:?}");
        if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        format!("bitcast<f32>({}u)", v.to_bits())
    }
}

/// Map consumer coordinates to the coordinates of an operand of `shape` broadcast into them.
fn broadcast_coords(shape: &[usize], coords: &[String]) -> Vec<String> {
    let lead = coords.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if n == 1 { "0u".to_string() } else { coords[lead + d].clone() })
        .collect()
}

impl<'a> ExprEmitter<'a> {
    pub fn new(g: &'a Graph, plan: &'a Plan, binding_name: &'a dyn Fn(usize) -> String) -> Self {
        ExprEmitter {
            g,
            plan,
            binding_name,
            register: None,
            computed: Vec::new(),
            root: None,
            clamp_loads: false,
            hoisted: None,
            body: String::new(),
            loops: Loops::NONE,
            next: 0,
        }
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("v{}", self.next)
    }

    /// A load of materialized node `id` at `coords` (of its own shape): row-major in its
    /// buffer, or through the offset and strides of a strided view (`plan::view`).
    pub fn load(&self, id: NodeId, coords: &[String]) -> String {
        let v = self
            .plan
            .value_of(id)
            .expect("materialized node has a buffer (checked by plan verify)");
        let idx = match self.plan.view.get(id.index()).and_then(Option::as_ref) {
            Some(view) => strided_index(self.g.shape(id), view, coords),
            None => linear_index(self.g.shape(id), coords),
        };
        let name = (self.binding_name)(v.buffer);
        let load = if self.clamp_loads {
            format!("{name}[min({idx}, arrayLength(&{name}) - 1u)]")
        } else {
            format!("{name}[{idx}]")
        };
        match &self.hoisted {
            Some(loads) => {
                let mut loads = loads.borrow_mut();
                let k = loads.iter().position(|l| *l == load).unwrap_or_else(|| {
                    loads.push(load);
                    loads.len() - 1
                });
                format!("pre[{k}]")
            }
            None => load,
        }
    }

    /// A straightforward dot product for matmul `id` at `coords` (batch dims broadcast): the
    /// reference path used by unfused plans and by small matmuls.
    pub fn emit_matmul(&mut self, id: NodeId, coords: &[String]) -> String {
        let node = self.g.node(id);
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let (sa, sb) = (self.g.shape(a).to_vec(), self.g.shape(b).to_vec());
        let r = coords.len();
        let k = sa[sa.len() - 1];
        let kk = format!("kk{}", self.next + 1);
        let mut ca = broadcast_coords(&sa[..sa.len() - 2], &coords[..r - 2]);
        ca.extend([coords[r - 2].clone(), kk.clone()]);
        let mut cb = broadcast_coords(&sb[..sb.len() - 2], &coords[..r - 2]);
        cb.extend([kk.clone(), coords[r - 1].clone()]);
        // Operands are buffers, views of buffers or an elementwise chain over one (a prologue,
        // `codegen::prologue`): expressions of `kk`, so any `let` they bind is in the loop.
        let v = self.fresh();
        let _ = writeln!(self.body, "var {v} = 0.0;");
        let _ = writeln!(self.body, "for (var {kk} = 0u; {kk} < {k}u; {kk}++) {{");
        let (la, lb) = (self.emit(a, &ca), self.emit(b, &cb));
        let _ = writeln!(self.body, "{v} += {la} * {lb};");
        let _ = writeln!(self.body, "}}");
        self.loops = self.loops.then(Loops::flat(k as u64));
        v
    }

    /// Coordinates in the input of view `id` (broadcast_to, permute, slice, reshape) that hold
    /// the element at `coords` of the view; `None` if `id` is not a view.
    fn view_coords(&mut self, id: NodeId, coords: &[String]) -> Option<Vec<String>> {
        let node = self.g.node(id);
        if !node.op.is_view() {
            return None;
        }
        let src = self.g.shape(node.inputs[0]).to_vec();
        Some(match &node.op {
            Op::BroadcastTo => broadcast_coords(&src, coords),
            Op::Permute { perm } => {
                let mut c = vec![String::new(); perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    c[p] = coords[i].clone();
                }
                c
            }
            Op::Slice { axis, start, .. } => {
                let mut c = coords.to_vec();
                if *start > 0 {
                    c[*axis] = format!("({} + {start}u)", coords[*axis]);
                }
                c
            }
            Op::Reshape => {
                let lin = linear_index(&node.shape, coords);
                self.next += 1;
                let (code, names) =
                    decompose(&src, &format!("({lin})"), &format!("r{}_", self.next));
                self.body.push_str(&code);
                names
            }
            _ => return None,
        })
    }

    /// `let` statements decomposing `idx` over `shape`, with fresh names.
    fn coords_of(&mut self, shape: &[usize], idx: &str) -> Vec<String> {
        self.next += 1;
        let (code, names) = decompose(shape, &format!("({idx})"), &format!("r{}_", self.next));
        self.body.push_str(&code);
        names
    }

    /// The value of `id` if it is a constant inlined here, directly or through views.
    fn constant(&self, mut id: NodeId) -> Option<f32> {
        loop {
            if self.register.as_ref().is_some_and(|(r, _)| *r == id) || self.computed.iter().any(|(c, _)| *c == id) {
                return None;
            }
            let node = self.g.node(id);
            match node.op {
                Op::Constant { value } => return Some(value),
                _ if node.op.is_view()
                    && (self.plan.value_of(id).is_none() || self.root == Some(id)) =>
                {
                    id = node.inputs[0]
                }
                _ => return None,
            }
        }
    }

    /// The WGSL of the value `f` traces (`super::trace`), its shared parts bound to `let`s.
    fn traced(&mut self, f: impl for<'t> FnOnce(&'t Trace) -> Wgsl<'t>) -> String {
        let t = Trace::default();
        let v = f(&t);
        t.render(v, &mut |e| self.bind(e))
    }

    /// A `let` binding of `e`; its name.
    fn bind(&mut self, e: &str) -> String {
        let v = self.fresh();
        let _ = writeln!(self.body, "    let {v} = {e};");
        v
    }

    /// `unfold` at `coords` (row, column): the input element the window position reads, or
    /// `fill` in the padding (the read clamped inside the input and not used).
    fn emit_unfold(
        &mut self,
        id: NodeId,
        x: NodeId,
        w: &Window,
        fill: f32,
        coords: &[String],
    ) -> String {
        let xs = self.g.shape(x).to_vec();
        let [n, c, h, wd] = xs[..] else { return self.load(id, coords) };
        let [ho, wo] = w.output("unfold", [h, wd]).unwrap_or([0, 0]);
        let rc = self.coords_of(&[c, w.kernel[0], w.kernel[1]], &coords[0]);
        let lc = self.coords_of(&[n, ho, wo], &coords[1]);
        let mut at = Vec::new();
        let mut inside = Vec::new();
        for (axis, size) in [(0, h), (1, wd)] {
            let p = self.bind(&format!(
                "i32({} * {}u + {} * {}u) - {}",
                lc[1 + axis],
                w.stride[axis],
                rc[1 + axis],
                w.dilation[axis],
                w.padding[axis]
            ));
            inside.push(format!("{p} >= 0 && {p} < {size}"));
            at.push(format!("min(u32(max({p}, 0)), {}u)", size.max(1) - 1));
        }
        let xc = vec![lc[0].clone(), rc[0].clone(), at[0].clone(), at[1].clone()];
        let v = self.emit(x, &xc);
        self.bind(&format!("select({}, {v}, {} && {})", f32_lit(fill), inside[0], inside[1]))
    }

    /// `fold` at `coords` (n, c, y, x): the sum, in window order, of the column entries that
    /// `unfold` copied this element to.
    fn emit_fold(&mut self, id: NodeId, cols: NodeId, w: &Window, coords: &[String]) -> String {
        let shape = self.g.shape(id).to_vec();
        let [_, _, h, wd] = shape[..] else { return self.load(id, coords) };
        let [ho, wo] = w.output("fold", [h, wd]).unwrap_or([0, 0]);
        // Per window row i (column j): whether an output row (column) reads this element there,
        // and which.
        let mut hits: [Vec<(String, String)>; 2] = [Vec::new(), Vec::new()];
        for (axis, size) in [(0, ho), (1, wo)] {
            for i in 0..w.kernel[axis] {
                let off = w.padding[axis] as i64 - (i * w.dilation[axis]) as i64;
                let t = self.bind(&format!("i32({}) + {off}", coords[2 + axis]));
                let s = w.stride[axis];
                let ok = self.bind(&format!("{t} >= 0 && {t} % {s} == 0 && {t} / {s} < {size}"));
                let o = self.bind(&format!("min(u32(max({t}, 0)) / {s}u, {}u)", size.max(1) - 1));
                hits[axis].push((ok, o));
            }
        }
        let k = w.size();
        let acc = self.fresh();
        let _ = writeln!(self.body, "    var {acc} = 0.0;");
        for (i, (oki, oh)) in hits[0].clone().into_iter().enumerate() {
            for (j, (okj, ow)) in hits[1].clone().into_iter().enumerate() {
                let row = format!("({} * {k}u + {}u)", coords[1], i * w.kernel[1] + j);
                let col = format!("({} * {}u + {oh} * {wo}u + {ow})", coords[0], ho * wo);
                let v = self.emit(cols, &[row, col]);
                let _ = writeln!(self.body, "    {acc} += select(0.0, {v}, {oki} && {okj});");
            }
        }
        acc
    }

    /// The raw i32 WGSL expression of an i32 node at `coords` (i32 values are only ever
    /// materialized or viewed, never computed elementwise).
    pub fn emit_i32(&mut self, id: NodeId, coords: &[String]) -> String {
        if self.plan.value_of(id).is_some() && self.root != Some(id) {
            return self.load(id, coords);
        }
        match self.view_coords(id, coords) {
            Some(c) => self.emit_i32(self.g.node(id).inputs[0], &c),
            None => self.load(id, coords),
        }
    }

    /// The f32 WGSL expression of node `id` at `coords`.
    pub fn emit(&mut self, id: NodeId, coords: &[String]) -> String {
        if let Some((r, name)) = &self.register {
            if *r == id {
                return name.clone();
            }
        }
        if let Some((_, name)) = self.computed.iter().find(|(c, _)| *c == id) {
            return name.clone();
        }
        let node = self.g.node(id);
        if let Op::Constant { value } = node.op {
            return f32_lit(value);
        }
        if self.plan.value_of(id).is_some() && self.root != Some(id) {
            let load = self.load(id, coords);
            return if node.dtype == DType::I32 { format!("f32({load})") } else { load };
        }
        let ins = node.inputs.clone();
        let operand = |s: &mut Self, k: usize| {
            let c = broadcast_coords(s.g.shape(ins[k]), coords);
            s.emit(ins[k], &c)
        };
        // A constant operand stays a number, so the trace folds constant subexpressions rather
        // than writing WGSL const-expressions (`log(-0.5)` fails shader creation).
        let traced_operand = |s: &mut Self, k: usize| match s.constant(ins[k]) {
            Some(v) => Operand::Constant(v),
            None => Operand::Wgsl(operand(s, k)),
        };
        let e = match &node.op {
            Op::Unary(u) => {
                let x = traced_operand(self, 0);
                self.traced(|t| u.eval(t.operand(&x)))
            }
            Op::Binary(b) => {
                let (x, y) = (traced_operand(self, 0), traced_operand(self, 1));
                self.traced(|t| b.eval(t.operand(&x), t.operand(&y)))
            }
            Op::Where => {
                let c = traced_operand(self, 0);
                let (x, y) = (traced_operand(self, 1), traced_operand(self, 2));
                self.traced(|t| t.operand(&c).select(t.operand(&x), t.operand(&y)))
            }
            // A LayerNorm inlined as a product's operand prologue (`plan::fuse::norm_prologue`)
            // reads stored stats: elementwise over x, the row's stats, the column's weight and
            // bias, as the LayerNorm kernel computes it.
            Op::LayerNorm if !coords.is_empty() => {
                let r = coords.len() - 1;
                let x = self.emit(ins[0], coords);
                let mut at = coords[..r].to_vec();
                at.push("0u".to_string());
                let mean = self.emit(ins[1], &at);
                at[r] = "1u".to_string();
                let rstd = self.emit(ins[1], &at);
                let col = [coords[r].clone()];
                let (w, b) = (self.emit(ins[2], &col), self.emit(ins[3], &col));
                format!("({x} - {mean}) * {rstd} * {w} + {b}")
            }
            Op::BroadcastTo | Op::Permute { .. } | Op::Slice { .. } | Op::Reshape => {
                return match self.view_coords(id, coords) {
                    Some(c) => self.emit(ins[0], &c),
                    None => self.load(id, coords),
                };
            }
            Op::MatMul => return self.emit_matmul(id, coords),
            Op::CausalMask { fill } => {
                let x = self.emit(ins[0], coords);
                let r = coords.len();
                let s = node.shape[r - 1];
                let t = node.shape[r - 2];
                format!(
                    "select({x}, {}, {} > {} + {}u)",
                    f32_lit(*fill),
                    coords[r - 1],
                    coords[r - 2],
                    s - t
                )
            }
            Op::Dropout { p, seed } => {
                let x = self.emit(ins[0], coords);
                let lin = linear_index(&node.shape, coords);
                let s = crate::rng::dropout_seed(*seed);
                let keep = format!(
                    "(f32(hash32(({lin}) ^ hash32(rumus_meta.step ^ {s}u)) >> 8u) * {} >= {})",
                    f32_lit(1.0 / 16_777_216.0),
                    f32_lit(*p)
                );
                // The identity in an evaluation, as on the CPU.
                let dropped = format!("select(0.0, {x} * {}, {keep})", f32_lit(1.0 / (1.0 - p)));
                format!("select({x}, {dropped}, rumus_meta.training != 0u)")
            }
            Op::TrainingSelect => {
                let a = operand(self, 0);
                let b = operand(self, 1);
                format!("select({b}, {a}, rumus_meta.training != 0u)")
            }
            Op::Unfold { window, fill } => {
                let (x, w) = (ins[0], *window);
                return self.emit_unfold(id, x, &w, *fill, coords);
            }
            Op::Fold { window } => {
                let (cols, w) = (ins[0], *window);
                return self.emit_fold(id, cols, &w, coords);
            }
            Op::Constant { value } => f32_lit(*value),
            // Fusion inlines elementwise ops, constants and views only
            // (`plan::fuse::is_inlinable`): every other value is in a buffer.
            Op::Input { .. }
            | Op::Parameter { .. }
            | Op::State { .. }
            | Op::Reduce { .. }
            | Op::Concat { .. }
            | Op::Softmax
            | Op::LogSoftmax
            | Op::LayerNormStats { .. }
            | Op::LayerNorm
            | Op::LayerNormGradInput
            | Op::LayerNormGradWeight
            | Op::AttentionStats
            | Op::Attention
            | Op::AttentionGradKv
            | Op::AttentionGradQ
            | Op::Embedding
            | Op::EmbeddingGrad { .. }
            | Op::CrossEntropy { .. }
            | Op::CrossEntropyGrad { .. } => return self.load(id, coords),
        };
        let v = self.fresh();
        let _ = writeln!(self.body, "    let {v} = {e};");
        v
    }
}
