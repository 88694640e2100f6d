//! LayerNorm programs: `shaders/layer_norm.wgsl` (forward) and `shaders/layer_norm_bw.wgsl`
//! (backward) over the last axis of a contiguous `[rows, d]` tensor, and the lowering of a
//! plan's four LayerNorm kernel kinds onto them.
//!
//! The forward writes `y` and per-row stats `[rows, 2]` = (mean, rstd), which the backward
//! reads. The backward is two dispatches: `rows` (grad-input, plus per-row-group partial sums of
//! grad-weight and grad-bias into scratch of [`scratch_len`] elements) and `params` (sums the
//! partials into grad-weight and grad-bias). It may add a buffer to the grad-input it writes
//! (`addend`) and sum the columns of what it writes (`col_sum`: the gradient of a bias added
//! before the LayerNorm's input, as a linear layer's in a residual block) in the same passes.

use super::loops::{strided, Loops};
use super::program::{Binding, Grid, Program, Resource, ShaderChecks};
use super::templates::{LAYER_NORM, LAYER_NORM_BW};
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId, Op};
use crate::plan::{Kernel, KernelKind, Plan};

/// Most threads per workgroup of both layer-norm shaders' row kernels (`WG` in the WGSL).
const MAX_WG: usize = 256;
/// Fewest threads per workgroup of the row kernels.
const MIN_WG: usize = 64;
/// Most columns a thread holds in registers; so `d` is at most `MAX_WG * MAX_CPT`.
const MAX_CPT: usize = 32;
/// Columns per workgroup of the `params` entry point (`PC` in the WGSL).
const PC: usize = 8;
/// Threads per workgroup of the `params` entry point (`PWG` in the WGSL).
const PWG: usize = 256;
/// The backward aims at this many row groups (workgroups of the `rows` entry point): on an H200
/// at 32768 x 1024, 4096 groups measured the same and 256 a fifth slower.
const TARGET_GROUPS: usize = 1024;

/// Threads per workgroup of a row kernel over rows of `d`: about 12 columns a thread, a power
/// of two from 64 to 256. Measured on an H200 at 32768 rows (forward + backward): at d = 1024,
/// 2.1 TB/s with 256 threads (4 columns each), 3.1 with 128 or 64; at d = 768, 2.0 with 256,
/// 2.8 with 128, 2.9 with 64.
fn row_threads(d: usize) -> usize {
    d.div_ceil(12).next_power_of_two().clamp(MIN_WG, MAX_WG)
}

/// Groups of the two-level workgroup reduction of `wg` threads: about its square root.
fn reduce_groups(wg: usize) -> usize {
    1 << (wg.trailing_zeros() / 2)
}

/// What the buffers of a forward pass are. `x`, `y`: `[rows, d]`; `weight`, `bias`: `[d]`;
/// `stats`: `[rows, 2]`.
#[derive(Clone, Debug)]
pub struct Forward {
    pub x: Resource,
    pub weight: Resource,
    pub bias: Resource,
    pub y: Resource,
    pub stats: Resource,
}

/// What the buffers of a backward pass are. `partial` holds [`scratch_len`] elements (any
/// contents). `dparams` is `[2, d]`: dweight in row 0, dbias in row 1. With `accumulate_dx` the
/// result is added to `dx`, with `accumulate_params` to `dparams`; otherwise they are
/// overwritten and never read. With an `addend` (`[rows, d]`) dx is the gradient plus it; with
/// a `col_sum` (`[d]`) that buffer gets the sum of dx over the rows.
#[derive(Clone, Debug)]
pub struct Backward {
    pub x: Resource,
    pub weight: Resource,
    pub stats: Resource,
    pub dy: Resource,
    pub dx: Resource,
    pub partial: Resource,
    pub dparams: Resource,
    pub accumulate_dx: bool,
    pub accumulate_params: bool,
    pub addend: Option<Resource>,
    pub col_sum: Option<Resource>,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FwdParams {
    rows: u32,
    d: u32,
    eps: f32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BwdParams {
    rows: u32,
    d: u32,
    rows_per_group: u32,
    flags: u32,
}

/// Rows each workgroup of the backward handles for `rows` rows.
pub fn rows_per_group(rows: usize) -> usize {
    rows.div_ceil(TARGET_GROUPS).max(1)
}

/// Elements of the backward's partial sums for `rows` rows of width `d`, `parts` a column and
/// row group (2: dweight and dbias; 3 with the column sums of dx).
pub fn scratch_len(rows: usize, d: usize, parts: usize) -> usize {
    rows.div_ceil(rows_per_group(rows)) * d * parts
}

/// The template text for rows of `d` elements (`1 <= d <= 8192`) and its workgroup size, with
/// the `extra` placeholders filled too.
fn fill(template: &super::templates::Template, d: usize, extra: &[(&str, &str)]) -> Result<(String, usize)> {
    if d == 0 || d > MAX_WG * MAX_CPT {
        return Err(err!(
            Device,
            "layer_norm over a last axis of {d}: the GPU's LayerNorm kernels take 1 to {}; run this model on the CPU (--device cpu)",
            MAX_WG * MAX_CPT
        ));
    }
    let wg = row_threads(d);
    let (wg_s, ng, cpt) = (wg.to_string(), reduce_groups(wg).to_string(), d.div_ceil(wg).to_string());
    let mut values = vec![("WG", wg_s.as_str()), ("NG", ng.as_str()), ("CPT", cpt.as_str())];
    values.extend_from_slice(extra);
    let text = template.fill(&values)?;
    Ok((text, wg))
}

/// The loops of the forward program over rows of `d` (`main`): three over the thread's `CPT`
/// columns, and `workgroup_merge`'s two over its groups.
pub fn forward_loops(d: usize) -> Loops {
    let wg = row_threads(d);
    let (ng, cpt) = (reduce_groups(wg) as u64, d.div_ceil(wg) as u64);
    let columns = Loops::flat(cpt);
    let merge = Loops::flat(wg as u64 / ng - 1).then(Loops::flat(ng - 1));
    columns.then(columns).then(columns).then(merge)
}

/// The loops of the backward's two programs over `rows` rows of `d`: `rows` walks the
/// columns once, then its workgroup's rows (`rows_per_group`), each twice over the columns
/// and through `workgroup_sum2`'s two loops, and the columns again; `params` sums each
/// column's partials over the row groups, 32 lanes a column, then the lanes.
pub fn backward_loops(rows: usize, d: usize) -> [Loops; 2] {
    let wg = row_threads(d);
    let (ng, cpt) = (reduce_groups(wg) as u64, d.div_ceil(wg) as u64);
    let columns = Loops::flat(cpt);
    let sum2 = Loops::flat(wg as u64 / ng).then(Loops::flat(ng));
    let row = columns.then(sum2.calls(1)).then(columns);
    let rpg = rows_per_group(rows) as u64;
    let rows_loops =
        columns.then(Loops::of(rpg, row)).then(columns).then(sum2.defines());
    let groups = rows.div_ceil(rows_per_group(rows)) as u64;
    let lanes = (PWG / PC) as u64;
    let params_loops = Loops::flat(strided(groups, lanes)).then(Loops::flat(lanes));
    [rows_loops, params_loops]
}

/// Every loop of both shaders is bounded by a constant or the uniform sizes: naga's loop guard
/// only costs time.
const CHECKS: ShaderChecks = ShaderChecks { bounds: true, loop_bounding: false };

fn to_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| err!(Device, "layer_norm: {n} rows do not fit one dispatch"))
}

fn binding(at: u32, name: &str, resource: Resource, words: usize) -> Binding {
    Binding { at, name: name.to_string(), resource, words: words as u64 }
}

fn uniform(bytes: &[u8]) -> Binding {
    binding(0, "p", Resource::Uniform(bytes.to_vec()), 0)
}

/// The forward program over `rows` rows of `d`.
pub fn forward(rows: usize, d: usize, eps: f32, buf: Forward) -> Result<Program> {
    let (wgsl, wg) = fill(&LAYER_NORM, d, &[])?;
    let rows32 = to_u32(rows)?;
    let params = FwdParams { rows: rows32, d: d as u32, eps, pad: 0 };
    Ok(Program {
        label: format!("layer_norm [{rows}, {d}]"),
        wgsl,
        entry: "main",
        workgroup_size: wg as u32,
        bindings: vec![
            uniform(bytemuck::bytes_of(&params)),
            binding(1, "x", buf.x, rows * d),
            binding(2, "weight", buf.weight, d),
            binding(3, "bias", buf.bias, d),
            binding(4, "y", buf.y, rows * d),
            binding(5, "stats", buf.stats, rows * 2),
        ],
        grid: Grid::Linear(rows32),
        checks: CHECKS,
    })
}

/// The two backward programs over `rows` rows of `d`, to be run in order.
pub fn backward(rows: usize, d: usize, buf: Backward) -> Result<[Program; 2]> {
    let mut extra: Vec<(&str, &str)> = Vec::new();
    if buf.addend.is_some() {
        extra.push(("ADD", "v += f32(addend[base + j]);"));
    }
    let parts = if buf.col_sum.is_some() { 3 } else { 2 };
    if buf.col_sum.is_some() {
        extra.extend([
            ("NP", "3"),
            ("SUM", "ds[c] += v;"),
            ("SUM_STORE", "partial[o + 2u] = ds[c];"),
            ("SUM_LOAD", "partial[o + 2u]"),
            ("SUM_WRITE", "colsum[j] = scalar(total.z);"),
        ]);
    }
    let (wgsl, wg) = fill(&LAYER_NORM_BW, d, &extra)?;
    let rpg = rows_per_group(rows);
    let groups = to_u32(rows.div_ceil(rpg))?;
    let flags = u32::from(buf.accumulate_dx) | (u32::from(buf.accumulate_params) << 1);
    let params = BwdParams { rows: to_u32(rows)?, d: d as u32, rows_per_group: rpg as u32, flags };
    let partial = binding(6, "partial", buf.partial, scratch_len(rows, d, parts));
    let mut row_bindings = vec![
        uniform(bytemuck::bytes_of(&params)),
        binding(1, "x", buf.x, rows * d),
        binding(2, "weight", buf.weight, d),
        binding(3, "stats", buf.stats, rows * 2),
        binding(4, "dy", buf.dy, rows * d),
        binding(5, "dx", buf.dx, rows * d),
        partial.clone(),
    ];
    if let Some(addend) = buf.addend {
        row_bindings.push(binding(8, "addend", addend, rows * d));
    }
    let rows_program = Program {
        label: format!("layer_norm_bw rows [{rows}, {d}]"),
        wgsl: wgsl.clone(),
        entry: "rows",
        workgroup_size: wg as u32,
        bindings: row_bindings,
        grid: Grid::Linear(groups),
        checks: CHECKS,
    };
    let mut param_bindings =
        vec![uniform(bytemuck::bytes_of(&params)), partial, binding(7, "dparams", buf.dparams, 2 * d)];
    if let Some(col_sum) = buf.col_sum {
        param_bindings.push(binding(9, "colsum", col_sum, d));
    }
    let params_program = Program {
        label: format!("layer_norm_bw params [{rows}, {d}]"),
        wgsl,
        entry: "params",
        workgroup_size: PWG as u32,
        bindings: param_bindings,
        grid: Grid::Fixed([d.div_ceil(PC) as u32, 1, 1]),
        checks: CHECKS,
    };
    Ok([rows_program, params_program])
}

/// `[rows, d]` of a value normalized over its last axis.
fn rows_d(g: &Graph, id: NodeId) -> (usize, usize) {
    let d = g.shape(id).last().copied().unwrap_or(1);
    (g.shape(id).iter().product::<usize>() / d.max(1), d)
}

/// The programs of a LayerNorm kernel of `plan` (any of its four kinds), with their loops.
pub fn lower(g: &Graph, plan: &Plan, k: &Kernel) -> Result<Vec<(Program, Loops)>> {
    let buffer = |id: NodeId| {
        plan.value_of(id)
            .map(|v| Resource::Buffer(v.buffer))
            .ok_or_else(|| err!(Invariant, "node {} has no buffer in this plan", id.index()))
    };
    let out = *k.outputs.last().ok_or_else(|| err!(Invariant, "a kernel writes no value"))?;
    let eps_of = |stats: NodeId| match g.node(stats).op {
        Op::LayerNormStats { eps } => Ok(eps),
        _ => Err(err!(Invariant, "layer_norm reads stats from a non-stats node")),
    };
    match k.kind {
        KernelKind::LayerNorm { with_stats } => {
            let ins = &g.node(out).inputs; // x, stats, weight, bias
            let eps = eps_of(ins[1])?;
            let (rows, d) = rows_d(g, out);
            if rows == 0 {
                return Ok(Vec::new()); // no rows: nothing to normalize
            }
            // Without `with_stats` the stats are already in their buffer; recomputing them
            // into scratch gives the same numbers and keeps one forward kernel.
            let stats = if with_stats { buffer(ins[1])? } else { Resource::Scratch { slot: 0 } };
            let buf = Forward {
                x: buffer(ins[0])?,
                weight: buffer(ins[2])?,
                bias: buffer(ins[3])?,
                y: buffer(out)?,
                stats,
            };
            Ok(vec![(forward(rows, d, eps, buf)?, forward_loops(d))])
        }
        KernelKind::LayerNormStats => {
            let x = g.node(out).inputs[0];
            let eps = eps_of(out)?;
            let (rows, d) = rows_d(g, x);
            if rows == 0 {
                return Ok(Vec::new());
            }
            let buf = Forward {
                x: buffer(x)?,
                weight: Resource::Filled { value: 1.0, words: d },
                bias: Resource::Filled { value: 0.0, words: d },
                y: Resource::Scratch { slot: 0 },
                stats: buffer(out)?,
            };
            Ok(vec![(forward(rows, d, eps, buf)?, forward_loops(d))])
        }
        KernelKind::LayerNormGradInput { weight_grad, add, col_sum } => {
            // With `add` the kernel writes `out` = the gradient + the add's other input.
            let (gi, addend) = match add {
                Some(a) => {
                    let &[l, r] = g.node(a).inputs.as_slice() else {
                        return Err(err!(Invariant, "layer_norm_bw adds into a node without two inputs"));
                    };
                    // The gradient is the input computed inside this kernel.
                    let (gi, other) = if k.fused.contains(&l) { (l, r) } else { (r, l) };
                    (gi, Some(buffer(other)?))
                }
                None => (out, None),
            };
            let ins = &g.node(gi).inputs; // x, stats, weight, dy
            let dwb = match weight_grad {
                Some(w) => buffer(w)?,
                None => Resource::Scratch { slot: 2 },
            };
            let col_sum = col_sum.map(&buffer).transpose()?;
            let extra = Extra { addend, col_sum };
            ln_backward(g, [ins[0], ins[1], ins[3]], buffer(ins[2])?, buffer(out)?, dwb, extra, &buffer)
        }
        KernelKind::LayerNormGradWeight => {
            let ins = &g.node(out).inputs; // x, stats, dy
            let d = rows_d(g, ins[0]).1;
            let ones = Resource::Filled { value: 1.0, words: d };
            let dx = Resource::Scratch { slot: 1 };
            ln_backward(g, [ins[0], ins[1], ins[2]], ones, dx, buffer(out)?, Extra::default(), &buffer)
        }
        _ => Err(err!(Invariant, "kernel `{}` is not a layer_norm kernel", k.kind.name())),
    }
}

/// What a LayerNorm backward does besides its gradients: a buffer to add to dx, a buffer for the
/// column sums of dx.
#[derive(Default)]
struct Extra {
    addend: Option<Resource>,
    col_sum: Option<Resource>,
}

/// The scratch slot of a LayerNorm backward's partial sums: a slot of its own rather than slot
/// 0, which a split-K product's partials take, so that the product's last dispatch (their sum)
/// and the LayerNorm backward after it touch no common memory and run as one dispatch
/// ([`super::merge`]).
pub const PARTIAL_SLOT: usize = 7;

/// LayerNorm backward over (x, stats, dy) with `weight`: dx (plus the addend, if any) into `dx`
/// and dweight/dbias into the two rows of `dwb` (and dx's column sums, if asked), the partial
/// sums in scratch slot [`PARTIAL_SLOT`].
fn ln_backward(
    g: &Graph,
    [x, stats, dy]: [NodeId; 3],
    weight: Resource,
    dx: Resource,
    dparams: Resource,
    Extra { addend, col_sum }: Extra,
    buffer: &dyn Fn(NodeId) -> Result<Resource>,
) -> Result<Vec<(Program, Loops)>> {
    let (rows, d) = rows_d(g, x);
    let buf = Backward {
        x: buffer(x)?,
        weight,
        stats: buffer(stats)?,
        dy: buffer(dy)?,
        dx,
        partial: Resource::Scratch { slot: PARTIAL_SLOT },
        dparams,
        accumulate_dx: false,
        accumulate_params: false,
        addend,
        col_sum,
    };
    Ok(backward(rows, d, buf)?.into_iter().zip(backward_loops(rows, d)).collect())
}
