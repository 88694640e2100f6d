//! Rematerialization (`graph::remat`): a training step that recomputes cheap forward values in
//! the backward pass trains to the same losses as one that keeps them, on the CPU and on the
//! GPU; its plan frees the GELU and LayerNorm outputs with the forward pass; and the command
//! line and scripts turn it off. (The NaN-poisoned buffer-reuse test and the fused-against-
//! unfused test of `gpu_plan.rs` run rematerialized steps: it is on by default.)

use crate::common::gpu::or_skip;
use rumus::backend::Backend;
use rumus::cpu::{CpuBackend, RunOptions};
use rumus::graph::{training_graph_with, OptimConfig, Optimizer, TrainGraph, TrainOptions};
use rumus::nn::GptConfig;
use rumus::plan::report::PlanReport;
use rumus::plan::{plan, Plan, PlanOptions};
use rumus::runtime::backend::GpuBackend;
use rumus::Tensor;

/// A 2-layer GPT's training step (pre-LN blocks, tanh GELU), AdamW.
fn gpt_step(remat: bool) -> TrainGraph {
    gpt_step_with(TrainOptions { remat, ..TrainOptions::default() })
}

fn gpt_step_with(opts: TrainOptions) -> TrainGraph {
    let c = GptConfig { vocab: 13, d: 16, heads: 2, layers: 2, ctx: 6 };
    let (g, loss) = crate::common::gpt_loss(c, 2);
    let cfg = OptimConfig::new(Optimizer::adamw());
    training_graph_with(g, loss, &cfg, opts).unwrap()
}

/// The losses of `steps` training steps on fixed data, then every parameter and state value.
fn train(b: &mut dyn Backend, t: &TrainGraph, steps: u64) -> (Vec<f32>, Vec<f32>) {
    let g = &t.graph;
    let idx = g.input_named("idx").unwrap();
    let target = g.input_named("target").unwrap();
    let ids = Tensor::i32(&[2, 6], (0..12).map(|i| i * 5 % 13).collect()).unwrap();
    let labels = Tensor::i32(&[2, 6], (0..12).map(|i| i * 7 % 13).collect()).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let mut feeds = vec![(idx, ids.clone()), (target, labels.clone())];
        feeds.extend(t.optim.host_feeds(1e-2, step));
        let refs: Vec<_> = feeds.iter().map(|(id, t)| (*id, t)).collect();
        let out = b.run(&refs, &[t.loss], RunOptions { training: true, step }).unwrap();
        losses.push(out[0].to_f32_vec()[0]);
    }
    let persistent = g.nodes().filter(|(_, n)| n.op.is_persistent());
    let values = persistent.flat_map(|(id, _)| b.read(id).unwrap().to_f32_vec()).collect();
    (losses, values)
}

fn max_rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let err = |(&x, &y): (&f32, &f32)| (x as f64 - y as f64).abs() / (y.abs() as f64).max(1e-30);
    a.iter().zip(b).map(err).fold(0.0, f64::max)
}

/// Five steps of `on` and `off` give the same losses and values within 1e-6 relative on the
/// CPU, and the same losses on the GPU where there is one (`test` names the GPU part).
fn trains_alike(on: &TrainGraph, off: &TrainGraph, test: &str) {
    let (cl, cv) = train(&mut CpuBackend::new(on.graph.clone(), 3).unwrap(), on, 5);
    let (kl, kv) = train(&mut CpuBackend::new(off.graph.clone(), 3).unwrap(), off, 5);
    assert!(max_rel_err(&cl, &kl) <= 1e-6, "cpu losses {cl:?} vs {kl:?}");
    assert!(max_rel_err(&cv, &kv) <= 1e-6, "cpu values differ");
    let Some((gpu, _turn)) = or_skip(test) else { return };
    let gpu_train = |t: &TrainGraph| {
        let mut b = GpuBackend::new(gpu, t.graph.clone(), 3, PlanOptions::default()).unwrap();
        train(&mut b, t, 5)
    };
    let ((gl, _), (hl, _)) = (gpu_train(on), gpu_train(off));
    assert!(max_rel_err(&gl, &hl) <= 1e-6, "gpu losses {gl:?} vs {hl:?}");
}

#[test]
fn rematerialized_steps_train_to_the_same_losses_on_the_cpu_and_the_gpu() {
    let (on, off) = (gpt_step(true), gpt_step(false));
    assert_eq!(
        on.graph.recomputed.len(),
        9,
        "ln1, ln2, gelu and attention-output views per layer, ln_f"
    );
    assert!(off.graph.recomputed.is_empty());
    trains_alike(&on, &off, "rematerialized_steps_train_to_the_same_losses_on_the_gpu");
}

/// The plan's first kernel that computes a backward node.
fn backward_start(t: &TrainGraph, p: &Plan) -> usize {
    let backward =
        |k: &rumus::plan::Kernel| k.fused.iter().any(|id| id.index() >= t.backward_start);
    p.kernels.iter().position(backward).unwrap()
}

/// The last kernel that reads the value a forward kernel computing `op` writes (its last
/// output: a layer_norm kernel also writes the stats, which the LayerNorm gradient reads).
fn last_read_of_forward(t: &TrainGraph, p: &Plan, op: &str) -> usize {
    let g = &t.graph;
    let forward = &p.kernels[..backward_start(t, p)];
    let writes_op = |k: &&rumus::plan::Kernel| k.fused.iter().any(|&id| g.node(id).op.name() == op);
    let outputs = forward.iter().filter(writes_op).filter_map(|k| k.outputs.last());
    let last = outputs.map(|&o| p.value_of(o).unwrap().lifetime.last).max().unwrap();
    usize::try_from(last).unwrap()
}

#[test]
fn gelu_and_layer_norm_outputs_die_with_the_forward_pass() {
    for (remat, alive_in_backward) in [(true, false), (false, true)] {
        let t = gpt_step(remat);
        let p = plan(&t.graph, &[t.loss], true, PlanOptions::default()).unwrap();
        let boundary = backward_start(&t, &p);
        for op in ["gelu_tanh", "layer_norm"] {
            let last = last_read_of_forward(&t, &p, op);
            assert_eq!(last >= boundary, alive_in_backward, "remat {remat}: {op} read at {last}");
        }
        let recomputed = PlanReport::new(&t.graph, &p, p.kernels.len(), 0).recomputed;
        // Per layer ln1, ln2 and the GELU output, and ln_f; the attention output's permuted
        // copy is recomputed too, but as a view of the attention output it costs no kernel.
        assert_eq!(recomputed, if remat { 7 } else { 0 });
        // Each recomputed copy runs after the forward pass, in the kernel before its reader.
        for &(_, copy) in &t.graph.recomputed {
            assert!(copy.index() >= t.backward_start && copy.index() < t.update_start);
        }
    }
}

/// `rumus plan scripts/bench/gpt-small.rms --json` with `extra` arguments, parsed.
fn plan_json(extra: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["plan", "scripts/bench/gpt-small.rms", "--json"])
        .args(extra)
        // Each kernel's own dispatches: merging pairs neighbours of the recomputed products
        // differently.
        .env("RUMUS_MERGE_DISPATCHES", "0")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A number of a `rumus plan --json` report.
fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap()
}

#[test]
fn rumus_plan_no_remat_keeps_the_values_and_plans_more_bytes() {
    let (on, off) = (plan_json(&[]), plan_json(&["--no-remat"]));
    // Three values a layer (ln1, ln2, the GELU output; the attention output's permuted copy
    // is a view) of [32, 128, 256] floats (the GELU output 4 times as wide) and ln_f, and the
    // first layer's q, k and v (its qkv product, within `REMAT_MATMUL_SHARE` of the step's
    // matmul FLOPs): at least 20 MiB less.
    assert_eq!((n(&on, "recomputed"), n(&off, "recomputed")), (16, 0));
    assert!(n(&on, "planned_bytes") + (20 << 20) < n(&off, "planned_bytes"), "{on} {off}");
    assert!(n(&on, "dispatches") > n(&off, "dispatches"));
}

/// With `remat_matmuls`, each layer's fc and qkv products (wider than the LayerNorm output they
/// read) are recomputed in the backward pass too, and the steps train to the same losses and
/// values as the step that keeps them, on the CPU and the GPU.
#[test]
fn recomputed_matmuls_train_to_the_same_losses() {
    let on = gpt_step_with(TrainOptions { remat: true, remat_matmuls: true });
    let off = gpt_step(true);
    let matmuls = |t: &TrainGraph| t.graph.nodes().filter(|(_, n)| n.op.name() == "matmul").count();
    assert_eq!(matmuls(&on), matmuls(&off) + 4, "fc and qkv copies in each of 2 layers");
    assert!(on.graph.recomputed.len() > off.graph.recomputed.len());
    trains_alike(&on, &off, "recomputed_matmuls_train_to_the_same_losses");
}

/// `rumus plan --remat-matmuls` on gpt-small: the fc outputs and qkv projections of all but
/// the last layer no longer alive at the backward's start (28 MiB a layer), for two more
/// products a layer (seven more than the default plan, which recomputes the first layer's qkv
/// product).
#[test]
fn rumus_plan_remat_matmuls_plans_fewer_bytes_for_more_dispatches() {
    let precision = ["--matmul-precision", "highest"];
    let (on, off) =
        (plan_json(&[&precision[..], &["--remat-matmuls"]].concat()), plan_json(&precision));
    assert_eq!(n(&on, "dispatches"), n(&off, "dispatches") + 7, "{on} {off}");
    assert!(n(&on, "planned_bytes") + (60 << 20) < n(&off, "planned_bytes"), "{on} {off}");
}

/// Scripts choose with `compile(#{ remat })`: `false`, the default, and `"matmuls"` train a
/// small GPT to the same losses on the CPU backend, each recomputing more ops than the last.
#[test]
fn scripts_choose_what_is_recomputed() {
    let code = |remat: &str| {
        format!(
            "model g(idx: i32[B, T], vocab = 11, d = 8, heads = 2, layers = 2) {{
    x = embedding(idx, vocab, d) as wte + position_embedding(T, T, d) as wpe
    repeat layers as blocks {{
        x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn
        x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp
    }}
    return linear(layer_norm(x) as ln_f, vocab) as head
}}
let net = g().compile(#{{ batch: 2, dims: #{{ T: 5 }}, device: \"cpu\", seed: 3{remat} }});
let x = tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], \"i32\");
let y = tensor([[2, 3, 4, 5, 6], [7, 8, 9, 10, 0]], \"i32\");
for i in 0..6 {{ print(net.train_step(x, y)); }}
print(net.plan());
"
        )
    };
    // The six losses, and the ops of the step (the plan line: "device cpu (...): N ops, ...").
    let run = |remat: &str| -> (Vec<f64>, usize) {
        let out = crate::common::script::printed(Default::default(), &code(remat));
        let lines: Vec<&str> = out.lines().collect();
        let v: Vec<f64> = lines.iter().take(6).map(|l| l.parse().unwrap_or(f64::NAN)).collect();
        assert!(lines.len() == 7 && v.iter().all(|x| x.is_finite()), "{out}");
        let ops = lines[6].split(": ").nth(1).and_then(|s| s.split(' ').next());
        (v, ops.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{out}")))
    };
    let (kept, mut fewer) = run(", remat: false");
    assert!(kept[5] < kept[0], "{kept:?}");
    for (remat, more) in [("", true), (", remat: true", false), (", remat: \"matmuls\"", true)] {
        let (got, ops) = run(remat);
        for (a, b) in got.iter().zip(&kept) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "remat{remat}: {got:?} against {kept:?}");
        }
        assert_eq!(ops > fewer, more, "remat{remat}: {ops} ops after {fewer}");
        fewer = ops;
    }
}

/// By default the earliest widening products (kept the longest) are recomputed as long as
/// their FLOPs stay within `REMAT_MATMUL_SHARE` of the step's matmul FLOPs: on gpt-medium's
/// shape, the first two layers' fc and qkv products and the third's qkv (its fc would pass the
/// share), so its peak falls by 214 MB (`rumus plan`) for five more products.
#[test]
fn the_default_recomputes_the_earliest_products_within_its_share() {
    let step = |opts: TrainOptions| {
        let c = GptConfig { vocab: 256, d: 768, heads: 12, layers: 12, ctx: 256 };
        let (g, loss) = crate::common::gpt_loss(c, 16);
        training_graph_with(g, loss, &OptimConfig::new(Optimizer::adamw()), opts).unwrap()
    };
    let products = |t: &TrainGraph, width: usize| {
        let g = &t.graph;
        let n =
            g.nodes().filter(|(_, n)| n.op.name() == "matmul" && n.shape.last() == Some(&width));
        n.count()
    };
    let on = step(TrainOptions::default());
    let off = step(TrainOptions { remat: false, ..TrainOptions::default() });
    assert_eq!(products(&on, 3 * 768), products(&off, 3 * 768) + 3, "qkv");
    assert_eq!(products(&on, 4 * 768), products(&off, 4 * 768) + 2, "fc");
}

/// Found by differential testing: the gradient of `max` compares its input with the max
/// (`equal`), and rematerialization recomputed that input in the backward pass. On a GPU the
/// recomputed chain (split into kernels of its own) rounded otherwise than the chain the max
/// kernel inlined, so in some rows no element equalled the max: 0/0, and every parameter was
/// NaN after one step (8 of 20 inputs on lavapipe). A value a backward `equal` compares is
/// kept now: the GPU trains as the CPU does on all 20, and the plan keeps it.
#[test]
fn a_max_gradient_compares_the_values_the_max_was_taken_of() {
    let (devices, _turn) = crate::common::gpu::devices_or_skip(
        "a_max_gradient_compares_the_values_the_max_was_taken_of",
    );
    let mut code = String::from(
        "model m(x: f32[B, 9]) {
    param w[9] = ones
    return max(pow(softplus(x * w) + 0.1, 3.0), [1])
}
",
    );
    for dev in &devices {
        code += &format!(
            "for seed in 100..120 {{
    let net = m().compile(#{{ batch: 1, loss: \"mse\", optimizer: sgd(#{{ lr: 0.1 }}), device: \"{dev}\" }});
    let x = randn([1, 9], seed) * 0.01;
    net.train_step(x, zeros([1]));
    print(`${{net.train_step(x, zeros([1]))}} ${{net.param(\"w\").sum()}}`);
}}
"
        );
    }
    let out = crate::common::script::printed(Default::default(), &code);
    let rows: Vec<Vec<f64>> = (out.lines())
        .map(|l| l.split(' ').map(|v| v.parse().unwrap_or(f64::NAN)).collect())
        .collect();
    assert_eq!(rows.len(), 20 * devices.len(), "{out}");
    for (i, (cpu, dev)) in rows[..20].iter().zip(&rows[rows.len() - 20..]).enumerate() {
        for (a, b) in cpu.iter().zip(dev) {
            assert!((a - b).abs() <= 1e-4 * a.abs(), "seed {}: cpu {cpu:?} gpu {dev:?}", 100 + i);
        }
    }
    // The graph: the max's input is kept, not recomputed (the product before it still is).
    let mut g = rumus::graph::Graph::new();
    let x = g.input("x", &[1, 9], rumus::DType::F32).unwrap();
    let w = g.parameter("w", &[9], rumus::graph::Init::Ones).unwrap();
    let xw = g.mul(x, w).unwrap();
    let s = g.unary(rumus::graph::UnaryOp::Softplus, xw).unwrap();
    let (tenth, three) = (g.constant(0.1), g.constant(3.0));
    let s = g.add(s, tenth).unwrap();
    let p = g.pow(s, three).unwrap();
    let m = g.max(p, &[1], false).unwrap();
    let loss = g.sum(m, &[0], false).unwrap();
    let t =
        training_graph_with(g, loss, &OptimConfig::new(Optimizer::sgd()), TrainOptions::default())
            .unwrap();
    let recomputed: Vec<_> = t.graph.recomputed.iter().map(|&(v, _)| v).collect();
    assert!(!recomputed.contains(&p), "{recomputed:?} holds the max's input {p:?}");
    assert!(recomputed.contains(&xw), "{recomputed:?}");
}
