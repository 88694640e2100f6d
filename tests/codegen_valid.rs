//! Every WGSL module generated for a plan passes naga's parser and validator (CPU only).

use rumus::codegen::wgsl::generate;
use rumus::graph::{training_graph, Graph, OptimConfig, Optimizer};
use rumus::nn::{self, GptConfig};
use rumus::plan::{plan, KernelKind, PlanOptions};
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
    for fusion in [true, false] {
        let p = plan(
            &t.graph,
            &[t.loss],
            true,
            PlanOptions { fusion, reuse: true, max_storage_buffers: None },
        )
        .unwrap();
        for k in &p.kernels {
            if matches!(
                k.kind,
                KernelKind::LayerNorm { .. }
                    | KernelKind::LayerNormStats
                    | KernelKind::LayerNormGradInput { .. }
                    | KernelKind::LayerNormGradWeight
            ) {
                continue;
            }
            let src = generate(&t.graph, &p, k);
            if let Err(e) = validate(&src.label, &src.wgsl) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}
