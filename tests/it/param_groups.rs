//! Parameter groups: glob patterns over dotted parameter names pick each parameter's weight
//! decay and learning-rate scale (the first matching group wins), on the CPU backend and the
//! GPU, checked against a hand computation; the GPT recipe; and the errors scripts get.

use crate::common::gpu::or_skip;
use crate::common::script::printed;
use rumus::backend::Backend;
use rumus::cpu::{CpuBackend, RunOptions};
use rumus::error::Source;
use rumus::graph::param_groups::{assign, glob_match};
use rumus::graph::{training_graph, Graph, Init, OptimConfig, Optimizer, ParamGroup, TrainGraph};
use rumus::nn::{self, GptConfig};
use rumus::plan::PlanOptions;
use rumus::runtime::backend::GpuBackend;
use rumus::script::{Host, HostOptions};
use rumus::{DType, Tensor};

#[test]
fn glob_patterns_match_whole_dotted_names() {
    let check = |pattern: &str, name: &str, expected: bool| {
        assert_eq!(glob_match(pattern, name), expected, "`{pattern}` against `{name}`");
    };
    check("*.bias", "blocks.0.attn.qkv.bias", true);
    check("*.bias", "bias", false);
    check("*.bias", "fc.bias_scale", false);
    check("*ln*", "blocks.1.ln2.weight", true);
    check("*ln*", "ln_f.bias", true);
    check("*ln*", "head.weight", false);
    check("wte.*", "wte.weight", true);
    check("wte.*", "xwte.weight", false);
    check("wte.*", "wte", false);
    check("fc?.weight", "fc1.weight", true);
    check("fc?.weight", "fc12.weight", false);
    check("*", "", true);
    check("", "a", false);
    check("a*b*c", "a.x.b.y.c", true);
    check("a*b*c", "a.x.c.y.b", false);
    check("**.w", "x.w", true);
    check("é*", "é.w", true);
}

/// `loss = Σ w·x + Σ b·x` over two parameters `fc.weight` and `fc.bias` set to known values,
/// so each gradient is the input `x`.
fn two_parameters(cfg: &OptimConfig) -> TrainGraph {
    let mut g = Graph::new();
    let w = g.parameter("fc.weight", &[3], Init::Zeros).unwrap();
    let b = g.parameter("fc.bias", &[3], Init::Zeros).unwrap();
    let x = g.input("x", &[3], DType::F32).unwrap();
    let wx = g.mul(w, x).unwrap();
    let bx = g.mul(b, x).unwrap();
    let sw = g.sum_all(wx).unwrap();
    let sb = g.sum_all(bx).unwrap();
    let loss = g.add(sw, sb).unwrap();
    training_graph(g, loss, cfg).unwrap()
}

const W: [f32; 3] = [0.5, -1.0, 2.0];
const B: [f32; 3] = [1.5, 0.25, -3.0];
const X: [f32; 3] = [0.2, -0.4, 0.8];
const LR: f32 = 0.1;

/// One step at learning rate [`LR`] from `fc.weight` = [`W`] and `fc.bias` = [`B`]; the new
/// weight and bias.
fn one_step(backend: &mut dyn Backend, t: &TrainGraph) -> (Vec<f32>, Vec<f32>) {
    let g = &t.graph;
    let (w, b) = (g.persistent_named("fc.weight").unwrap(), g.persistent_named("fc.bias").unwrap());
    backend.write(w, &Tensor::f32(&[3], W.to_vec()).unwrap()).unwrap();
    backend.write(b, &Tensor::f32(&[3], B.to_vec()).unwrap()).unwrap();
    let x = Tensor::f32(&[3], X.to_vec()).unwrap();
    let mut feeds = vec![(g.input_named("x").unwrap(), x)];
    feeds.extend(t.optim.host_feeds(LR, 0));
    let refs: Vec<_> = feeds.iter().map(|(id, t)| (*id, t)).collect();
    backend.run(&refs, &[t.loss], RunOptions { training: true, step: 0 }).unwrap();
    (backend.read(w).unwrap().to_f32_vec(), backend.read(b).unwrap().to_f32_vec())
}

fn close(got: &[f32], want: &[f32], what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{what}: got {got:?}, want {want:?}");
    }
}

/// AdamW (weight decay 0.5) with a group for the bias: no decay, twice the learning rate; and
/// SGD with L2 decay 0.5 and the same group. The first AdamW step is lr·(g/(|g| + eps) + wd·p).
#[test]
fn decay_and_lr_scale_apply_only_to_their_group_on_cpu_and_gpu() {
    let group =
        ParamGroup { weight_decay: Some(0.0), lr_scale: 2.0, ..ParamGroup::new(&["*.bias"]) };
    let adamw = OptimConfig {
        groups: vec![group.clone()],
        ..OptimConfig::new(Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.5,
        })
    };
    let sgd = OptimConfig {
        groups: vec![group],
        ..OptimConfig::new(Optimizer::Sgd { momentum: 0.0, weight_decay: 0.5 })
    };
    let adam_dir = |x: f32| x / (x.abs() + 1e-8);
    let want_adamw = (
        (0..3).map(|i| W[i] - LR * (adam_dir(X[i]) + 0.5 * W[i])).collect::<Vec<_>>(),
        (0..3).map(|i| B[i] - 2.0 * LR * adam_dir(X[i])).collect::<Vec<_>>(),
    );
    let want_sgd = (
        (0..3).map(|i| W[i] - LR * (X[i] + 0.5 * W[i])).collect::<Vec<_>>(),
        (0..3).map(|i| B[i] - 2.0 * LR * X[i]).collect::<Vec<_>>(),
    );
    let gpu = or_skip("decay_and_lr_scale_apply_only_to_their_group_on_cpu_and_gpu");
    for (name, cfg, want) in [("adamw", adamw, want_adamw), ("sgd", sgd, want_sgd)] {
        let t = two_parameters(&cfg);
        let (w, b) = one_step(&mut CpuBackend::new(t.graph.clone(), 1).unwrap(), &t);
        close(&w, &want.0, &format!("{name} weight on cpu"));
        close(&b, &want.1, &format!("{name} bias on cpu"));
        if let Some((gpu, _)) = &gpu {
            let mut backend =
                GpuBackend::new(gpu, t.graph.clone(), 1, PlanOptions::default()).unwrap();
            let (w, b) = one_step(&mut backend, &t);
            close(&w, &want.0, &format!("{name} weight on gpu"));
            close(&b, &want.1, &format!("{name} bias on gpu"));
        }
    }
}

/// The usual GPT recipe: no weight decay on biases, LayerNorm weights and embeddings, so only
/// the matrices of the linear layers decay; each group's parameters share one arena, so the
/// update takes one elementwise kernel per group, not one per parameter.
#[test]
fn the_gpt_recipe_decays_only_the_linear_weights() {
    let mut g = Graph::new();
    let c = GptConfig { vocab: 11, d: 8, heads: 2, layers: 2, ctx: 4 };
    nn::gpt(&mut g, c, 1).unwrap();
    let names: Vec<String> = g.parameters().into_iter().map(|(_, n)| n.to_string()).collect();
    let recipe = ParamGroup {
        weight_decay: Some(0.0),
        ..ParamGroup::new(&["*.bias", "*ln*", "wte.*", "wpe.*"])
    };
    let groups = assign("adamw", &[recipe], &names).unwrap();
    let decayed: Vec<&str> =
        names.iter().zip(&groups).filter(|(_, g)| g.is_none()).map(|(n, _)| n.as_str()).collect();
    assert!(!decayed.is_empty());
    for n in &names {
        let linear = n.ends_with(".weight")
            && !n.contains("ln")
            && !n.starts_with("wte")
            && !n.starts_with("wpe");
        assert_eq!(decayed.contains(&n.as_str()), linear, "{n} (decayed: {decayed:?})");
    }
}

fn check(code: &str, expected: &str) {
    let m = "model m(x: f32[B, 2]) { return linear(relu(linear(x, 4) as fc1), 3) as fc2 }\n";
    assert_eq!(printed(HostOptions::default(), &format!("{m}{code}")), expected, "script:\n{code}");
}

#[test]
fn groups_from_scripts_and_their_errors() {
    let ok = "let n = m().compile(#{ optimizer: adamw(#{ lr: 0.1, weight_decay: 0.1, groups: [
    #{ params: [\"*.bias\"], weight_decay: 0.0 }, #{ params: [\"fc1.*\"], lr_scale: 0.5 }] }) });
print(n.step);\n";
    check(ok, "0\n");
    // Patterns of one group may overlap; a later group may take what an earlier one leaves.
    let overlapping = "let n = m().compile(#{ optimizer: sgd(#{ groups: [
    #{ params: [\"*.bias\", \"fc2.bias\"] }, #{ params: [\"*\"], lr_scale: 0.5 }] }) });
print(n.step);\n";
    check(overlapping, "0\n");
    let cases = [
        (
            "adamw(#{ groups: [#{ params: [\"*.bais\"], weight_decay: 0.0 }] })",
            "adamw: groups[0]: pattern `*.bais` matches no parameter (parameters: fc1.weight, fc1.bias, fc2.weight, fc2.bias)",
        ),
        (
            "sgd(#{ groups: [#{ params: [\"*.bias\"] }, #{ params: [\"fc3.*\"] }] })",
            "sgd: groups[1]: pattern `fc3.*` matches no parameter (parameters: fc1.weight, fc1.bias, fc2.weight, fc2.bias)",
        ),
        // Found by the hostile-input audit: a group whose every parameter an earlier group
        // takes was silently not applied (here the biases were decayed).
        (
            "adamw(#{ groups: [#{ params: [\"*\"], lr_scale: 0.5 }, #{ params: [\"*.bias\"], weight_decay: 0.0 }] })",
            "adamw: groups[1]: pattern `*.bias` matches only parameters that an earlier group takes (`fc1.bias` is in groups[0]): a parameter takes the first group that matches it, so put this group before groups[0] or narrow that group's patterns",
        ),
        (
            "sgd(#{ groups: [#{ params: [\"fc1.*\"] }, #{ params: [\"fc2.*\", \"fc1.bias\"] }] })",
            "sgd: groups[1]: pattern `fc1.bias` matches only parameters that an earlier group takes (`fc1.bias` is in groups[0]): a parameter takes the first group that matches it, so put this group before groups[0] or narrow that group's patterns",
        ),
        (
            "adam(#{ groups: [#{ params: [\"*.bias\"], decay: 0.0 }] })",
            "adam: groups[0]: unknown setting `decay` (settings: params, weight_decay, lr_scale)",
        ),
        ("adamw(#{ groups: [#{ weight_decay: 0.0 }] })", "adamw: groups[0]: `params` is missing"),
        (
            "adamw(#{ groups: [#{ params: [] }] })",
            "adamw: groups[0]: `params` is empty; give at least one pattern",
        ),
        (
            "adamw(#{ groups: [#{ params: \"*.bias\" }] })",
            "adamw: groups[0]: `params` must be an array of name patterns like [\"*.bias\"], got string",
        ),
        (
            "adamw(#{ groups: [#{ params: [\"*.bias\", 3] }] })",
            "adamw: groups[0]: `params` must be an array of name patterns like [\"*.bias\"], got array",
        ),
        (
            "adamw(#{ groups: [#{ params: [\"*.bias\"], weight_decay: -0.1 }] })",
            "adamw: groups[0]: `weight_decay` must be a finite number >= 0, got -0.1",
        ),
        (
            "adamw(#{ groups: [#{ params: [\"*.bias\"], lr_scale: \"2\" }] })",
            "adamw: groups[0]: `lr_scale` must be a number, got string",
        ),
        (
            "adamw(#{ groups: [#{ params: [\"*.bias\"], lr_scale: 1e300 }] })",
            "adamw: groups[0]: `lr_scale` must be a finite number >= 0, got 1e300",
        ),
        (
            "adamw(#{ groups: #{ params: [\"*.bias\"] } })",
            "adamw: `groups` must be an array of maps, got map",
        ),
        (
            "adamw(#{ groups: [\"*.bias\"] })",
            "adamw: groups[0] must be a map like #{ params: [\"*.bias\"], weight_decay: 0.0 }, got string",
        ),
    ];
    for (optimizer, error) in cases {
        check(
            &format!("m().compile(#{{ optimizer: {optimizer} }});\n"),
            &format!("error: {error}\n"),
        );
    }
}

#[test]
fn a_pattern_that_matches_nothing_points_at_the_compile_call() {
    let code = "model m(x: f32[B, 2]) { return linear(x, 3) as fc }
let opt = adamw(#{ groups: [#{ params: [\"fc.b*\"] }, #{ params: [\"head.*\"] }] });
let n = m().compile(#{ optimizer: opt });
";
    let e = Host::new(HostOptions::default()).eval(&Source::new("t.rms", code)).unwrap_err();
    let rendered = e.to_string();
    assert!(rendered.contains("t.rms:3:"), "{rendered}");
    assert!(
        rendered.contains("adamw: groups[1]: pattern `head.*` matches no parameter"),
        "{rendered}"
    );
}
