//! Every WGSL module generated for a plan passes naga's parser and validator (CPU only): the
//! generated kernels, and the matmul template filled with every generated epilogue, for the
//! fused and unfused plans of a GPT training step and of every op-table case.

use crate::common;

use rumus::codegen::wgsl::{generate, matmul_epilogue};
use rumus::graph::{training_graph, Graph, OptimConfig, Optimizer};
use rumus::nn::{self, GptConfig};
use rumus::plan::limits::{guarded, storage_bindings};
use rumus::plan::{plan, KernelKind, Limits, PlanOptions};
use rumus::runtime::kernels::MATMUL;
use rumus::DType;

fn validate(label: &str, src: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| format!("{label}: parse: {}\n{src}", e.emit_to_string(src)))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::default(),
    )
    .validate(&module)
    .map_err(|e| format!("{label}: validate: {e:?}\n{src}"))?;
    Ok(())
}

/// Validate every generated module of the plans of `g` for `wanted` (fused and unfused); returns
/// the number of modules checked.
fn validate_plans(
    g: &Graph,
    wanted: &[rumus::graph::NodeId],
    train: bool,
    failures: &mut Vec<String>,
) -> usize {
    let mut n = 0;
    for (fusion, limits) in [(true, None), (false, None), (true, Some(Limits::WEBGPU_DEFAULT))] {
        let opts = PlanOptions { fusion, reuse: true, limits };
        let p = plan(g, wanted, train, opts).unwrap();
        for k in &p.kernels {
            let counted =
                storage_bindings(g, k, &|id| p.value_of(id).unwrap().buffer, guarded(g, &p, k));
            let result = match k.kind {
                KernelKind::LayerNorm { .. }
                | KernelKind::LayerNormStats
                | KernelKind::LayerNormGradInput { .. }
                | KernelKind::LayerNormGradWeight => continue, // templates only, see wgsl_valid
                KernelKind::MatMul { register, .. } => {
                    // The template path when there is an epilogue; the generated one otherwise.
                    let src = generate(g, &p, k);
                    let generated = validate(&src.label, &src.wgsl);
                    let template = match matmul_epilogue(g, &p, k, register) {
                        Some(e) if 3 + e.extra.len() != counted => Err(format!(
                            "{}: the template binds {}, counted {counted}",
                            src.label,
                            3 + e.extra.len()
                        )),
                        Some(e) => MATMUL
                            .fill(&[("EPILOGUE_BINDINGS", &e.decls), ("EPILOGUE", &e.body)])
                            .map_err(|err| err.to_string())
                            .and_then(|wgsl| validate(&format!("{} (template)", src.label), &wgsl)),
                        None => Ok(()),
                    };
                    n += 1;
                    generated.and(template)
                }
                _ => {
                    let src = generate(g, &p, k);
                    let declared = src.wgsl.matches("var<storage").count();
                    if declared > counted {
                        failures
                            .push(format!("{}: binds {declared}, counted {counted}", src.label));
                    }
                    validate(&src.label, &src.wgsl)
                }
            };
            n += 1;
            if let Err(e) = result {
                failures.push(e);
            }
        }
    }
    n
}

#[test]
fn generated_modules_of_a_gpt_training_step_validate() {
    let mut g = Graph::new();
    let c = GptConfig { vocab: 32, d: 16, heads: 2, layers: 1, ctx: 8 };
    let logits = nn::gpt(&mut g, c, 2).unwrap();
    let target = g.input("target", &[2, 8], DType::I32).unwrap();
    let loss = g.cross_entropy(logits, target, Some(0)).unwrap();
    let cfg = OptimConfig { optimizer: Optimizer::adamw(), clip_norm: Some(1.0) };
    let t = training_graph(g, loss, &cfg).unwrap();
    let mut failures = Vec::new();
    let n = validate_plans(&t.graph, &[t.loss], true, &mut failures);
    assert!(n > 100, "only {n} modules checked");
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}

#[test]
fn generated_modules_of_every_op_case_validate() {
    let mut failures = Vec::new();
    for c in common::cases() {
        let b = common::build(&c).unwrap();
        let mut want = vec![b.out];
        want.extend(b.grads.iter().map(|&(_, d)| d));
        validate_plans(&b.g, &want, false, &mut failures);
    }
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}
