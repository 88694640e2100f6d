//! What `rumus plan` prints: the kernels with the ops each fused, dispatches against ops, and
//! planned bytes against one buffer per value.

use super::{Plan, Value};
use crate::graph::{Graph, NodeId, Op};
use serde_json::json;

/// Figures of a plan.
#[derive(Clone, Debug)]
pub struct PlanReport {
    pub ops: usize,
    pub kernels: usize,
    pub dispatches: usize,
    pub buffers: usize,
    pub planned_bytes: u64,
    pub naive_bytes: u64,
    pub pinned_bytes: u64,
    pub scratch_bytes: u64,
    /// Forward values the backward pass recomputes instead of keeping them alive
    /// ([`crate::graph::remat`]): the graph's recomputed values whose copy the plan evaluates
    /// (in a kernel, or as a view of a buffer).
    pub recomputed: usize,
    /// One line per kernel: its kind and the ops it computes (and `update only` when a
    /// micro-batch run of gradient accumulation skips it).
    pub kernel_lines: Vec<String>,
    /// With gradient accumulation: the dispatches of a micro-batch run (set by the executor,
    /// which knows how many dispatches each kernel takes).
    pub micro_dispatches: Option<usize>,
    /// Where the shared buffers hold the most live bytes.
    pub peak: Peak,
}

/// The kernel at which the most bytes of shared (not pinned) values are live, what the heaps
/// must hold at least, and the largest of those values: where to look to plan less memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peak {
    /// The kernel (the first of several with as many live bytes).
    pub kernel: usize,
    /// Bytes of the shared values live during it (a flat concat counted whole, its members
    /// not again).
    pub live_bytes: u64,
    /// The largest of them, largest first: at most [`PEAK_VALUES`].
    pub values: Vec<PeakValue>,
}

/// How many values [`Peak`] lists.
pub const PEAK_VALUES: usize = 12;

/// A value live at the peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeakValue {
    pub node: NodeId,
    /// The op that computes it.
    pub op: &'static str,
    pub shape: Vec<usize>,
    pub bytes: u64,
    /// The first and last kernel it is live in.
    pub first: i64,
    pub last: i64,
}

/// The [`Peak`] of plan `p` of graph `g`.
pub fn peak(g: &Graph, p: &Plan) -> Peak {
    // A member of a flat concat is a range of its concat's buffer: the concat counts it.
    let mut holds_value = vec![false; p.buffers.len()];
    for v in &p.values {
        holds_value[v.buffer] = true;
    }
    let shared: Vec<&Value> = (p.values.iter())
        .filter(|v| !v.pinned && p.buffers[v.buffer].within.is_none_or(|(b, _)| !holds_value[b]))
        .collect();
    // Live bytes per kernel, as differences at each value's first and one past its last kernel.
    let n = p.kernels.len();
    let mut delta = vec![0i128; n + 1];
    for v in &shared {
        let first = v.lifetime.first.clamp(0, n as i64) as usize;
        let end = (v.lifetime.last.saturating_add(1)).clamp(0, n as i64) as usize;
        if first < end {
            delta[first] += i128::from(v.bytes);
            delta[end] -= i128::from(v.bytes);
        }
    }
    let (mut live, mut best) = (0i128, (0usize, 0i128));
    for (k, d) in delta.iter().take(n).enumerate() {
        live += d;
        if live > best.1 {
            best = (k, live);
        }
    }
    let k = best.0 as i64;
    let mut values: Vec<PeakValue> = (shared.iter())
        .filter(|v| v.lifetime.first <= k && k <= v.lifetime.last)
        .map(|v| PeakValue {
            node: v.node,
            op: g.node(v.node).op.name(),
            shape: g.shape(v.node).to_vec(),
            bytes: v.bytes,
            first: v.lifetime.first,
            last: v.lifetime.last,
        })
        .collect();
    values.sort_by_key(|v| (std::cmp::Reverse(v.bytes), v.node));
    values.truncate(PEAK_VALUES);
    Peak { kernel: best.0, live_bytes: best.1 as u64, values }
}

impl PlanReport {
    /// `dispatches` and `scratch_bytes` come from the executor (a kernel may need two
    /// dispatches; dedicated kernels may use scratch); pass `plan.kernels.len()` and 0 without one.
    pub fn new(g: &Graph, plan: &Plan, dispatches: usize, scratch_bytes: u64) -> PlanReport {
        let skipped = |i: usize| plan.micro.as_ref().is_some_and(|m| !m.kernels.contains(&i));
        let mut evaluated = vec![false; g.n_nodes()];
        for id in plan.kernels.iter().flat_map(|k| &k.fused) {
            evaluated[id.index()] = true;
        }
        let recomputed = (g.recomputed.iter())
            .filter(|&&(_, c)| evaluated[c.index()] || plan.value_of(c).is_some())
            .count();
        let kernel_lines = plan
            .kernels
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let ops: Vec<&str> = k
                    .fused
                    .iter()
                    .filter(|&&id| !matches!(g.node(id).op, Op::Constant { .. }))
                    .map(|&id| g.node(id).op.name())
                    .collect();
                let only = if skipped(i) { "  (update only)" } else { "" };
                format!("{:<18} {}{only}", k.kind.name(), ops.join(" "))
            })
            .collect();
        PlanReport {
            ops: plan.n_ops,
            kernels: plan.kernels.len(),
            dispatches,
            buffers: plan.buffers.len(),
            planned_bytes: plan.planned_bytes(),
            naive_bytes: plan.naive_bytes,
            pinned_bytes: plan.pinned_bytes(),
            scratch_bytes,
            recomputed,
            kernel_lines,
            micro_dispatches: None,
            peak: peak(g, plan),
        }
    }

    /// Summary lines (no per-kernel detail).
    pub fn summary(&self) -> String {
        let figures = format!(
            "ops {}  kernels {}  dispatches {} ({:.2} per op)  recomputed {}\nbuffers {}  planned {} bytes vs {} bytes one-buffer-per-value ({:.1}%)  pinned {} bytes  scratch {} bytes\n",
            self.ops,
            self.kernels,
            self.dispatches,
            self.dispatches as f64 / self.ops.max(1) as f64,
            self.recomputed,
            self.buffers,
            self.planned_bytes,
            self.naive_bytes,
            100.0 * self.planned_bytes as f64 / self.naive_bytes.max(1) as f64,
            self.pinned_bytes,
            self.scratch_bytes
        );
        format!(
            "{figures}peak {} bytes of shared values live at kernel {}\n",
            self.peak.live_bytes, self.peak.kernel
        )
    }

    /// Summary followed by one line per kernel.
    pub fn text(&self) -> String {
        let mut s = self.summary();
        if let Some(n) = self.micro_dispatches {
            s.push_str(&format!(
                "gradient accumulation: a micro-batch that only accumulates runs {n} of the {} dispatches (kernels marked update only are skipped)\n",
                self.dispatches
            ));
        }
        for (i, line) in self.kernel_lines.iter().enumerate() {
            s.push_str(&format!("{i:>5}  {line}\n"));
        }
        s
    }

    pub fn json(&self) -> serde_json::Value {
        let mut v = json!({
            "ops": self.ops,
            "kernels": self.kernels,
            "dispatches": self.dispatches,
            "buffers": self.buffers,
            "planned_bytes": self.planned_bytes,
            "naive_bytes": self.naive_bytes,
            "pinned_bytes": self.pinned_bytes,
            "scratch_bytes": self.scratch_bytes,
            "recomputed": self.recomputed,
            "peak": {
                "kernel": self.peak.kernel,
                "live_bytes": self.peak.live_bytes,
                "values": self.peak.values.iter().map(|v| json!({
                    "node": v.node.index(),
                    "op": v.op,
                    "shape": v.shape,
                    "bytes": v.bytes,
                    "first_kernel": v.first,
                    "last_kernel": v.last,
                })).collect::<Vec<_>>(),
            },
        });
        if let Some(n) = self.micro_dispatches {
            v["micro_batch_dispatches"] = json!(n);
        }
        v
    }
}

/// The graph in Graphviz DOT; with a plan, the nodes each kernel computes are grouped in a
/// cluster labelled with the kernel's index and kind.
pub fn dot(g: &Graph, name: &str, plan: Option<&Plan>) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out =
        format!("digraph \"{}\" {{\n    node [shape=box, fontname=monospace];\n", esc(name));
    let label = |id: crate::graph::NodeId| {
        let n = g.node(id);
        let what = match &n.op {
            Op::Input { name } => format!("input {name}"),
            Op::Parameter { name, .. } => format!("param {name}"),
            Op::State { name, .. } => format!("state {name}"),
            Op::Constant { value } => format!("constant {value}"),
            op => op.name().to_string(),
        };
        format!("{}\\n{} {}", esc(&what), crate::tensor::fmt_shape(&n.shape), n.dtype)
    };
    let mut clustered = vec![false; g.n_nodes()];
    if let Some(p) = plan {
        for (k, kernel) in p.kernels.iter().enumerate() {
            out.push_str(&format!(
                "    subgraph cluster_{k} {{\n        label=\"kernel {k}: {}\";\n",
                kernel.kind.name()
            ));
            for &id in &kernel.fused {
                if !std::mem::replace(&mut clustered[id.index()], true) {
                    out.push_str(&format!("        n{} [label=\"{}\"];\n", id.index(), label(id)));
                }
            }
            out.push_str("    }\n");
        }
    }
    for (id, n) in g.nodes() {
        if !clustered[id.index()] {
            out.push_str(&format!("    n{} [label=\"{}\"];\n", id.index(), label(id)));
        }
        for i in &n.inputs {
            out.push_str(&format!("    n{} -> n{};\n", i.index(), id.index()));
        }
    }
    for (oname, id) in &g.outputs {
        out.push_str(&format!(
            "    out_{0} [label=\"output {0}\", shape=ellipse];\n    n{1} -> out_{0};\n",
            esc(oname),
            id.index()
        ));
    }
    out.push_str("}\n");
    out
}
