//! Code generation: every kernel of a plan becomes [`Program`]s, complete WGSL modules with
//! their bindings, grid and compile options, which the runtime compiles and dispatches without
//! knowing what they compute.
//!
//! - [`wgsl`]: the generated kernels (elementwise, update copies; row kernels in `rows.rs`,
//!   gathers in `gather.rs`, embedding backward's sort in `embedding_grad.rs`) and the matmul
//!   epilogue, written with [`writer`];
//! - [`expr`]: the inlined elementwise expressions those kernels evaluate, each op's WGSL traced
//!   from its row of the op table by [`trace`], which also writes the math functions they call;
//! - [`matmul`], [`layer_norm`]: the templates of `shaders/` ([`templates`]) filled for a kernel;
//! - [`precision`]: the matmul precision modes (`highest`, `high`, `medium`);
//! - [`attention`]: the FlashAttention-2 forward and backward kernels, generated;
//! - [`loops`]: the loop iterations each program runs an invocation, which every generator
//!   states beside its code, and the software adapters that cut longer loops short;
//! - [`program`]: the program type and the programs of a whole plan.
//!
//! Adding a kernel kind is a change here: a function returning its programs and their
//! [`Loops`], called from [`compile`].

pub mod attention;
pub mod coop_convert;
mod embedding_grad;
pub mod expr;
mod gather;
pub mod layer_norm;
pub mod loops;
pub mod matmul;
pub mod matmul_coop;
pub mod matmul_cost;
pub mod matmul_dot;
pub mod matmul_simt;
pub mod merge;
pub mod precision;
pub mod prologue;
pub mod program;
mod rows;
pub mod templates;
pub mod trace;
pub mod wgsl;
pub mod writer;

pub use precision::MatmulPrecision;
pub use program::{
    CoopAttention,
    Binding, Grid, MatmulOptions, PlanPrograms, Program, Resource, ShaderChecks, Target,
    REDUCE_CHUNK,
};

use crate::err;
use crate::error::Result;
use crate::graph::{Graph, Op};
use crate::plan::limits::checks_data;
use crate::plan::{Kernel, KernelKind, Plan};
use loops::Loops;
use program::KernelPrograms;

/// The programs of every kernel of `plan`, and of its updates, for a device described by
/// `target`.
pub fn compile(g: &Graph, plan: &Plan, target: &Target) -> Result<PlanPrograms> {
    matmul::check_forced_coop_tile(target)?;
    crate::plan::limits::check_addressable(g, plan)?;
    let mut out = PlanPrograms::default();
    if plan.kernels.iter().any(|k| checks_data(&k.kind)) {
        out.status_words = wgsl::status_words(plan);
    }
    for k in &plan.kernels {
        let ops = k
            .fused
            .iter()
            .filter(|&&id| !matches!(g.node(id).op, Op::Constant { .. }))
            .map(|&id| g.node(id).op.name())
            .collect();
        // An error a kernel's code meets (a size no kernel takes) points at its op.
        let span = k.fused.iter().map(|&id| g.node(id).span).find(|s| !s.is_none());
        let at = |e: crate::error::Error| match span {
            Some(s) => e.at(s),
            None => e,
        };
        let (programs, matmul) = kernel(g, plan, k, target).map_err(at)?;
        if let Some(limit) = target.max_loop_trips {
            loops::check(g, k, &programs, limit)?;
        }
        let (programs, loops) = programs.into_iter().unzip();
        out.kernels.push(KernelPrograms { kind: k.kind.name(), ops, programs, matmul, loops });
    }
    for (u, &(dst, value)) in plan.updates.iter().enumerate() {
        let (Some(t), Some(v)) = (plan.value_of(dst), plan.value_of(value)) else {
            return Err(err!(Invariant, "update of node {} has no buffer", dst.index()));
        };
        if t.buffer == v.buffer {
            continue; // written in place
        }
        out.applies.push(u);
        if out.status_words > 0 {
            out.commits.push(wgsl::commit_copy(v.buffer, t.buffer, (t.bytes / 4) as usize));
        } else {
            out.copies.push((v.buffer, t.buffer, t.bytes));
        }
    }
    if target.merge_dispatches {
        merge::merge(plan, &mut out, target)?;
    }
    out.scratch_words = program::scratch_words(out.all());
    Ok(out)
}

/// Programs in dispatch order, each with its loops.
type ProgramsWithLoops = Vec<(Program, Loops)>;

/// The programs of one kernel, in dispatch order, with their loops, and for a matmul kernel the
/// name of the matmul kernel its product runs on (`generated`: the generated elementwise
/// kernel).
fn kernel(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
) -> Result<(ProgramsWithLoops, Option<&'static str>)> {
    let mut matmul_kernel = None;
    match &k.kind {
        KernelKind::MatMul { matmul, register, .. } => {
            if let Some((programs, tile)) = matmul::lower(g, plan, k, (*matmul, *register), target)?
            {
                return Ok((matmul_loops(g, plan, k, target, programs, tile), Some(tile)));
            }
            // The generated kernel reads a LayerNorm's stats; it cannot compute them.
            if let Some((s, _)) = k.norm_stats(g) {
                return Err(crate::err!(
                    Limit,
                    "matmul #{}: a product that computes the stats of the LayerNorm it reads (#{}) needs its operands as strides and a grid the device takes; plan this model without operand prologues (--matmul-precision highest)",
                    matmul.index(),
                    s.index()
                ));
            }
            matmul_kernel = Some("generated");
        }
        KernelKind::LayerNorm { .. }
        | KernelKind::LayerNormStats
        | KernelKind::LayerNormGradInput { .. }
        | KernelKind::LayerNormGradWeight => return Ok((layer_norm::lower(g, plan, k)?, None)),
        KernelKind::Attention { .. }
        | KernelKind::AttentionStats
        | KernelKind::AttentionGradKv
        | KernelKind::AttentionGradQ => return Ok((attention::lower(g, plan, k, target)?, None)),
        _ => {}
    }
    Ok((wgsl::generate_counted(g, plan, k, target), matmul_kernel))
}

/// The programs of matmul kernel `k` that `matmul::lower` made on `tile`, each with its loops:
/// a generated program among them (the sum of an operand the kernel computes) has those its
/// generator states; a product or its conversion, which read the sizes of their (partial)
/// product from the `Params` uniform of `shaders/matmul.wgsl` at binding 0, the most of any
/// of the product's programs at those sizes ([`loops::matmul_kernel`]); the split-K sum those
/// of [`loops::split_k_sum`].
fn matmul_loops(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
    programs: Vec<Program>,
    tile: &str,
) -> Vec<(Program, Loops)> {
    let generated = k.without_sum(g).1.map(|r| wgsl::generate_counted(g, plan, &r, target));
    let generated = generated.unwrap_or_default();
    let KernelKind::MatMul { matmul: mm, register, .. } = k.kind else {
        return programs.into_iter().map(|p| (p, Loops::NONE)).collect();
    };
    let so = g.shape(mm);
    let (m, n) = (so[so.len() - 2] as u64, so[so.len() - 1] as u64);
    let epilogue = wgsl::matmul_epilogue_loops(g, plan, k, register);
    // Every kernel the product may run on under `tile`'s name.
    let tiles = loops::tiles_named(tile, target);
    let of_product = |dims: [u64; 4]| {
        let each = tiles.iter().map(|&t| loops::matmul_kernel(t, dims, epilogue));
        each.fold(Loops::NONE, Loops::max)
    };
    programs
        .into_iter()
        .map(|p| {
            let own = generated.iter().find(|(q, _)| q.wgsl == p.wgsl && q.entry == p.entry);
            // An fp32 product's LayerNorm of A (with its stats), over rows of K.
            if p.label.ends_with(" layer_norm A") {
                let k = g.shape(g.node(mm).inputs[0]).last().copied().unwrap_or(1);
                return (p, layer_norm::forward_loops(k));
            }
            let loops = match (own, params_dims(&p)) {
                (Some((_, l)), _) => *l,
                (None, Some([m, n, k, batch])) => of_product([batch, m, n, k]),
                (None, None) => loops::split_k_sum((m, n), true, epilogue),
            };
            (p, loops)
        })
        .collect()
}

/// `[m, n, k, batch]` of the `Params` uniform a matmul program binds at binding 0
/// (`shaders/matmul.wgsl`: four u32s first), if it binds one.
fn params_dims(p: &Program) -> Option<[u64; 4]> {
    let b = p.bindings.iter().find(|b| b.at == 0)?;
    let program::Resource::Uniform(bytes) = &b.resource else { return None };
    let word = |i: usize| {
        let w: [u8; 4] = bytes.get(4 * i..4 * i + 4)?.try_into().ok()?;
        Some(u64::from(u32::from_le_bytes(w)))
    };
    Some([word(0)?, word(1)?, word(2)?, word(3)?])
}
