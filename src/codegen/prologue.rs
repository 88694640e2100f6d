//! Operand prologues: an elementwise chain that only a product reads, computed as the product
//! reads its operand instead of by a kernel of its own (fusion decides which,
//! [`crate::plan::fuse::prologue_base`]: unary ops that map zero to zero, and layout ops, over
//! one materialized f32 value; first a LayerNorm of that value, [`crate::plan::fuse`]'s
//! `norm_prologue`, whose stats are stored or, where the conversion's strips hold whole rows,
//! computed by the conversion, [`Norm::eps`]). Each
//! element read goes through it with its index in the value's buffer (a LayerNorm's row and
//! column); padding a kernel adds does not.
//!
//! A cooperative product (`high`, `medium`) reads each operand once in its conversion pass
//! ([`super::coop_convert`]), which applies the chain to every element it reads: the chain's
//! value is never written. A product on an fp32 kernel (a small product the cost model gives
//! one, in a cooperative mode) first evaluates the chain into a scratch slot
//! ([`PROLOGUE_SLOTS`]) with [`program`]: one dispatch, as the chain's own kernel was.

use super::matmul::Operand;
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::trace::{math_wgsl, Operand as TraceOperand, Trace};
use super::wgsl::WG;
use super::writer::Wgsl;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId, UnaryOp};
use crate::plan::view::{chain_below, View};
use crate::plan::Plan;

/// Scratch slots of the A and B operands a product reads through a prologue on a kernel
/// without a conversion pass: the chain's value, row-major.
pub const PROLOGUE_SLOTS: [usize; 2] = [5, 6];

/// The first of the three bindings of a prologue's LayerNorm buffers in [`program`].
const NORM_BINDING: u32 = 2;

/// A LayerNorm over the last axis (`d`) of the value a prologue reads, applied first: element
/// `e` of its buffer is row `e / d`, column `e % d`, normalized by the stored stats (`[rows,
/// 2]`: mean, rstd) and scaled by the weight and bias (`[d]`), as the LayerNorm kernel
/// computes it (`shaders/layer_norm.wgsl`).
#[derive(Clone, Debug, PartialEq)]
pub struct Norm {
    /// Elements of a row (the last axis normalized over).
    pub d: u32,
    /// Rows of the value normalized (of the stats).
    pub rows: u64,
    /// The stats, `[rows, 2]`: mean and rstd a row.
    pub stats: Resource,
    /// The weight, `[d]`.
    pub weight: Resource,
    /// The bias, `[d]`.
    pub bias: Resource,
    /// The node of the stats.
    pub stats_node: NodeId,
    /// The LayerNorm's epsilon where the kernel computes the stats (writes them) rather than
    /// reads them: a conversion whose strips hold whole rows ([`super::coop_convert`]).
    pub eps: Option<f32>,
}

impl Norm {
    /// The bindings of the stats, weight and bias from `at` on, named `{x}_stats`, `{x}_w`,
    /// `{x}_b`.
    pub fn bindings(&self, at: u32, x: &str) -> [Binding; 3] {
        let bind = |i: u32, name: &str, resource: &Resource, words: u64| Binding {
            at: at + i,
            name: format!("{x}_{name}"),
            resource: resource.clone(),
            words,
        };
        let d = u64::from(self.d);
        [bind(0, "stats", &self.stats, 2 * self.rows), bind(1, "w", &self.weight, d), bind(2, "b", &self.bias, d)]
    }
}

/// What a product applies to each element of an operand it reads: a LayerNorm, then unary
/// ops in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prologue {
    pub norm: Option<Norm>,
    pub ops: Vec<UnaryOp>,
}

impl Prologue {
    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.norm.is_none() && self.ops.is_empty()
    }

    /// Whether the kernel computes (writes) the LayerNorm's stats rather than reading them.
    pub fn computes_stats(&self) -> bool {
        self.norm.as_ref().is_some_and(|n| n.eps.is_some())
    }

    /// WGSL of `fn {name}(e: u32, x: f32) -> f32`: the chain's value at element `e` of the
    /// buffer read, whose value is `x` (it calls the functions of [`math_wgsl`], and reads the
    /// LayerNorm's buffers bound by [`Norm::bindings`] as `{buf}_stats`, `{buf}_w`,
    /// `{buf}_b`). The unary ops are traced from the op table as every kernel's expressions
    /// are.
    pub fn wgsl_fn(&self, name: &str, buf: &str) -> String {
        let t = Trace::default();
        let mut v = t.operand(&TraceOperand::Wgsl("x".to_string()));
        for op in &self.ops {
            v = op.eval(v);
        }
        let mut w = Wgsl::new();
        w.lines(&t.function(&format!("{name}_ops"), v));
        w.open(&format!("fn {name}(e: u32, x: f32) -> f32"));
        match &self.norm {
            Some(n) => {
                let d = n.d;
                w.line(&format!("let r = 2u * (e / {d}u);"));
                w.line(&format!("let c = e % {d}u;"));
                w.line(&format!(
                    "return {name}_ops((x - {buf}_stats[r]) * {buf}_stats[r + 1u] * {buf}_w[c] + {buf}_b[c]);"
                ));
            }
            None => {
                w.line(&format!("return {name}_ops(x);"));
            }
        }
        w.close();
        w.finish()
    }

    /// WGSL declarations of the LayerNorm's buffers from binding `at` on (see [`Norm::bindings`]);
    /// the stats written where the kernel computes them.
    pub fn decls(&self, at: u32, buf: &str) -> String {
        if self.norm.is_none() {
            return String::new();
        }
        ["stats", "w", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let access = if i == 0 && self.computes_stats() { "read_write" } else { "read" };
                format!("@group(0) @binding({}) var<storage, {access}> {buf}_{name}: array<f32>;\n", at + i as u32)
            })
            .collect()
    }
}

/// The value operand `id` of a product reads, where in its buffer (`None`: row-major from
/// its start), and the prologue applied on the way: `id` itself when it has a buffer (a view
/// of one included), else the value under the chain fusion inlined into the product. `None`
/// when `id` is neither (a chain with an op a prologue cannot apply).
pub fn operand_source(g: &Graph, plan: &Plan, id: NodeId) -> Option<(NodeId, Option<View>, Prologue)> {
    let view_of = |x: NodeId| plan.view.get(x.index()).cloned().flatten();
    if plan.value_of(id).is_some() {
        return Some((id, view_of(id), Prologue::default()));
    }
    let c = chain_below(g, id, &|x| plan.value_of(x).is_some(), &view_of)?;
    let buffer = |x: NodeId| plan.value_of(x).map(|v| Resource::Buffer(v.buffer));
    let norm = match c.norm {
        None => None,
        Some([stats, weight, bias]) => Some(Norm {
            d: u32::try_from(*g.shape(c.base).last()?).ok()?,
            rows: (g.shape(c.base).iter().product::<usize>() / g.shape(c.base).last()?.max(&1)) as u64,
            stats: buffer(stats)?,
            weight: buffer(weight)?,
            bias: buffer(bias)?,
            stats_node: stats,
            eps: None,
        }),
    };
    Some((c.base, Some(c.view), Prologue { norm, ops: c.ops }))
}

/// The program that writes `prologue` of operand `op` (`batch x rows x cols` elements of
/// `from`, one batch when it is broadcast) row-major into `to`, labelled `label`: one thread
/// an element, the grid split over two axes when it is long. An empty operand (K = 0: nothing
/// to read) is an `Invariant` error (the caller gives none), one past 2^32 - 1 elements a
/// `Limit` error.
pub fn program(
    prologue: &Prologue,
    (batch, rows, cols): (u32, u32, u32),
    op: Operand,
    [from, to]: [Resource; 2],
    label: &str,
) -> Result<Program> {
    let batches = if op.batch_stride == 0 { 1 } else { batch };
    let n = u64::from(batches) * u64::from(rows) * u64::from(cols);
    if n == 0 {
        return Err(err!(Invariant, "{label}: an empty operand has no prologue to write"));
    }
    if n > u64::from(u32::MAX) {
        return Err(err!(
            Limit,
            "{label}: an operand of {batches}x{rows}x{cols} elements, more than a program indexes (2^32 - 1): make the model's values smaller"
        ));
    }
    let groups = n.div_ceil(u64::from(WG)).max(1);
    // At most 65,535 workgroups an axis (WebGPU's default).
    let x = groups.min(32768);
    let y = groups.div_ceil(x);
    let mut w = Wgsl::new();
    w.line("alias scalar = f32;");
    w.line("// an elementwise chain computed for a product's operand (codegen/prologue.rs)");
    w.line("@group(0) @binding(0) var<storage, read> x: array<f32>;");
    w.line("@group(0) @binding(1) var<storage, read_write> y: array<f32>;");
    w.lines(&prologue.decls(NORM_BINDING, "x"));
    w.lines(math_wgsl());
    w.lines(&prologue.wgsl_fn("prologue", "x"));
    w.line(&format!("@compute @workgroup_size({WG})"));
    w.open("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32)");
    w.line(&format!("let i = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
    w.block(&format!("if (i >= {n}u)"), &["return;"]);
    w.line(&format!("let c = i % {cols}u;"));
    w.line(&format!("let r = i / {cols}u % {rows}u;"));
    w.line(&format!("let b = i / {}u;", u64::from(rows) * u64::from(cols)));
    w.line(&format!(
        "let e = {}u + b * {}u + r * {}u + c * {}u;",
        op.offset, op.batch_stride, op.row_stride, op.col_stride
    ));
    w.line("y[i] = prologue(e, x[e]);");
    w.close();
    let reach = u64::from(op.offset)
        + u64::from(batches.saturating_sub(1)) * u64::from(op.batch_stride)
        + u64::from(rows.saturating_sub(1)) * u64::from(op.row_stride)
        + u64::from(cols.saturating_sub(1)) * u64::from(op.col_stride)
        + 1;
    let bind = |at: u32, name: &str, resource: Resource, words: u64| Binding {
        at,
        name: name.to_string(),
        resource,
        words,
    };
    Ok(Program {
        label: label.to_string(),
        wgsl: w.finish(),
        entry: "main",
        workgroup_size: WG,
        bindings: [bind(0, "x", from, reach), bind(1, "y", to, n)]
            .into_iter()
            .chain(prologue.norm.iter().flat_map(|m| m.bindings(NORM_BINDING, "x")))
            .collect(),
        grid: Grid::Fixed([x as u32, y as u32, 1]),
        checks: ShaderChecks::ALL,
    })
}
