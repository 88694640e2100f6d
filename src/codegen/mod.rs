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
//! - [`program`]: the program type and the programs of a whole plan.
//!
//! Adding a kernel kind is a change here: a function returning its programs, called from
//! [`compile`].

pub mod attention;
pub mod coop_convert;
mod embedding_grad;
pub mod expr;
mod gather;
pub mod layer_norm;
pub mod matmul;
pub mod matmul_coop;
pub mod matmul_cost;
pub mod matmul_dot;
pub mod matmul_simt;
pub mod precision;
pub mod program;
mod rows;
pub mod templates;
pub mod trace;
pub mod wgsl;
pub mod writer;

pub use precision::MatmulPrecision;
pub use program::{
    Binding, Grid, MatmulOptions, PlanPrograms, Program, Resource, ShaderChecks, Target,
    REDUCE_CHUNK,
};

use crate::err;
use crate::error::Result;
use crate::graph::{Graph, Op};
use crate::plan::limits::checks_data;
use crate::plan::{Kernel, KernelKind, Plan};
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
        let (programs, matmul) = kernel(g, plan, k, target).map_err(|e| match span {
            Some(s) => e.at(s),
            None => e,
        })?;
        out.kernels.push(KernelPrograms { kind: k.kind.name(), ops, programs, matmul });
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
    out.scratch_words = program::scratch_words(out.all());
    Ok(out)
}

/// The programs of one kernel, in dispatch order, and for a matmul kernel the name of the
/// matmul kernel its product runs on (`generated`: the generated elementwise kernel).
fn kernel(
    g: &Graph,
    plan: &Plan,
    k: &Kernel,
    target: &Target,
) -> Result<(Vec<Program>, Option<&'static str>)> {
    let mut matmul_kernel = None;
    match &k.kind {
        KernelKind::MatMul { matmul, register, .. } => {
            if let Some((programs, tile)) = matmul::lower(g, plan, k, (*matmul, *register), target)?
            {
                return Ok((programs, Some(tile)));
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
    Ok((wgsl::generate(g, plan, k, target), matmul_kernel))
}
