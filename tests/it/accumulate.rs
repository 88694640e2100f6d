//! Gradient accumulation (`accumulate: k`): k micro-batches per optimizer update inside the
//! plan. Four micro-batches of 8 train as one batch of 32 (losses and parameters, clipping of
//! the accumulated gradient and a schedule counting updates included) on the CPU backend and
//! the GPU; a micro-batch run skips the optimizer's kernels, and the plan says so; checkpoints
//! between the micro-batches of an update are refused.

use crate::common::gpu::devices_or_skip;
use crate::common::script::printed;
use rumus::graph::{training_graph, OptimConfig, Optimizer};
use rumus::nn::GptConfig;
use rumus::plan::report::PlanReport;
use rumus::plan::{plan, PlanOptions};
use rumus::script::HostOptions;

fn run_on(device: &str, code: &str) -> String {
    let m = "model m(x: f32[B, 3], classes = 4) {
    return linear(relu(linear(x, 8) as fc1), classes) as fc2
}
";
    printed(HostOptions { device: device.into(), ..HostOptions::default() }, &format!("{m}{code}"))
}

/// Rows `from..to` of a fixed 32-row data set, as `(x, y)` tensors.
const DATA: &str = "
fn rows(from, to) {
    let xs = [];
    let ys = [];
    for i in from..to {
        xs.push([((i * 37) % 23 - 11) / 7.0, ((i * 11) % 13 - 6) / 5.0, ((i * 7) % 5 - 2) / 3.0]);
        ys.push((i * 5) % 4);
    }
    [tensor(xs), tensor(ys, \"i32\")]
}
fn rel(a, b) { (a - b).abs().max() / b.abs().max() }
";

#[test]
fn four_micro_batches_of_8_train_as_one_batch_of_32() {
    // clip 0.05 is far below the gradient norm: clipping each micro-batch's gradient instead
    // of their mean would change every update.
    let code = format!(
        "{DATA}
let opts = |b, k| #{{ batch: b, accumulate: k, device: DEV, seed: 3, clip: 0.05,
    optimizer: adamw(#{{ lr: 0.05, eps: 1e-3 }}), schedule: cosine(#{{ warmup: 2, total: 4 }}) }};
let a = m().compile(opts.call(8, 4));
let b = m().compile(opts.call(32, 1));
let worst = 0.0;
for u in 0..4 {{
    let sum = 0.0;
    for i in 0..4 {{
        if a.step != u {{ throw `step ${{a.step}} during update ${{u}}`; }}
        let r = rows(8 * i, 8 * i + 8);
        sum += a.train_step(r[0], r[1]);
    }}
    let r = rows(0, 32);
    let lb = b.train_step(r[0], r[1]);
    let d = (sum / 4.0 - lb).abs() / lb.abs();
    if d > worst {{ worst = d; }}
    if a.lr != b.lr {{ throw `lr ${{a.lr}} vs ${{b.lr}}`; }}
}}
print(`updates ${{a.step}} and ${{b.step}}`);
print(`losses within 1e-5: ${{worst < 1e-5}}`);
for n in a.params() {{
    let d = rel(a.param(n), b.param(n));
    if d >= 1e-5 {{ print(`${{n}} differs by ${{d}}`); }}
}}
print(\"done\");
"
    );
    let (devices, _turn) = devices_or_skip("four_micro_batches_of_8_train_as_one_batch_of_32");
    for dev in devices {
        let out = run_on(dev, &code.replace("DEV", &format!("\"{dev}\"")));
        assert_eq!(out, "updates 4 and 4\nlosses within 1e-5: true\ndone\n", "on {dev}");
    }
}

#[test]
fn checkpoints_between_the_micro_batches_of_an_update_are_refused() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/accumulate");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("between.safetensors");
    let p = path.to_string_lossy();
    // Saved and loaded after a whole update; then one micro-batch, and `what` (uncaught).
    let code = |what: &str| {
        format!(
            "{DATA}
let net = m().compile(#{{ batch: 8, accumulate: 2, device: DEV }});
let r = rows(0, 8);
net.train_step(r[0], r[1]);
net.train_step(r[0], r[1]);
net.save(\"{p}\");
net.load(\"{p}\");
print(`step ${{net.step}}`);
print(net.plan().contains(\"a micro-batch that only accumulates\"));
net.train_step(r[0], r[1]);
net.{what}(\"{p}\");
"
        )
    };
    let refused = |what: &str| {
        format!(
            "cannot {what} with 1 of 2 micro-batches of the next update accumulated (a checkpoint holds no partial sums of gradients); {what} after a multiple of 2 train_step calls"
        )
    };
    let (devices, _turn) =
        devices_or_skip("checkpoints_between_the_micro_batches_of_an_update_are_refused");
    for dev in devices {
        let dev_code = |what: &str| code(what).replace("DEV", &format!("\"{dev}\""));
        let want = format!("step 1\ntrue\nerror: {}\n", refused("save"));
        assert_eq!(run_on(dev, &dev_code("save")), want, "on {dev}");
        let want = format!("step 1\ntrue\nerror: {p}: {}\n", refused("load"));
        assert_eq!(run_on(dev, &dev_code("load")), want, "on {dev}");
    }
}

#[test]
fn accumulate_must_be_a_count_of_micro_batches() {
    let check = |value: &str, error: &str| {
        let out = run_on("cpu", &format!("m().compile(#{{ accumulate: {value} }});\n"));
        assert_eq!(out, format!("error: {error}\n"), "accumulate: {value}");
    };
    check("0", "compile: `accumulate` must be an integer in 1..=1048576, got 0");
    check("2.5", "compile: `accumulate` must be an integer, got f64");
    check("\"4\"", "compile: `accumulate` must be an integer, got string");
    check("1048577", "compile: `accumulate` must be an integer in 1..=1048576, got 1048577");
}

/// A micro-batch run is the plan's forward and backward kernels and one accumulating kernel
/// per gradient arena; the optimizer's kernels are marked `update only`, and the report counts
/// the micro-batch run's dispatches apart.
#[test]
fn the_plan_shows_what_a_micro_batch_runs() {
    let step = |accumulate: usize| {
        let c = GptConfig { vocab: 11, d: 8, heads: 2, layers: 1, ctx: 4 };
        let (g, loss) = crate::common::gpt_loss(c, 2);
        let cfg = OptimConfig {
            clip_norm: Some(1.0),
            accumulate,
            ..OptimConfig::new(Optimizer::adamw())
        };
        let t = training_graph(g, loss, &cfg).unwrap();
        let p = plan(&t.graph, &[t.loss], true, PlanOptions::default()).unwrap();
        (t, p)
    };
    let (plain_step, plain) = step(1);
    let (t, acc) = step(4);
    assert!(plain.micro.is_none());
    // The CPU's report says so too, and only of a step that accumulates.
    let note = "a micro-batch that only accumulates gradients";
    let cpu = |t: &rumus::graph::TrainGraph| {
        use rumus::backend::Backend;
        rumus::cpu::CpuBackend::new(t.graph.clone(), 0).unwrap().plan_report()
    };
    assert!(!cpu(&plain_step).contains(note), "{}", cpu(&plain_step));
    assert!(cpu(&t).contains(note), "{}", cpu(&t));
    let micro = acc.micro.as_ref().unwrap();
    let arenas = t.optim.accumulation.as_ref().unwrap().accumulators.len();
    // The accumulators' kernels are all the plan adds; the update reads their sums.
    assert_eq!(acc.kernels.len(), plain.kernels.len() + arenas);
    let update_only = acc.kernels.len() - micro.kernels.len();
    assert!(update_only >= 2, "the update and clipping's norm: {update_only}");
    let mut r = PlanReport::new(&t.graph, &acc, acc.kernels.len(), 0);
    r.micro_dispatches = Some(micro.kernels.len());
    let text = r.text();
    assert_eq!(text.matches("(update only)").count(), update_only, "{text}");
    assert!(
        text.contains(&format!(
            "gradient accumulation: a micro-batch that only accumulates runs {} of the {} dispatches",
            micro.kernels.len(),
            acc.kernels.len()
        )),
        "{text}"
    );
}

/// Found by the numerical audit: with `accumulate`, batch norm's running statistics took only
/// the last micro-batch of each update (the others' were dropped), where a PyTorch
/// accumulation loop updates them at every micro-batch's forward pass. Two micro-batches of an
/// update now give what two single steps give (the learning rate is 0, so only the running
/// statistics move), on the CPU and the GPU.
#[test]
fn batch_norm_running_statistics_follow_every_micro_batch() {
    let code = "model f(x: f32[B, 2]) {
    param w[2] = zeros
    return batch_norm(x + w) as bn
}
let x1 = tensor([[1.0, 2.0], [-1.0, 0.5], [3.0, 3.0]]);
let x2 = tensor([[0.0, -2.0], [2.0, 0.5], [1.0, 1.0]]);
let opts = |k| #{ batch: 3, accumulate: k, loss: \"mse\", optimizer: sgd(#{ lr: 0.0 }), device: DEV };
let a = f().compile(opts.call(2));
let b = f().compile(opts.call(1));
for n in [a, b] { n.train_step(x1, zeros([3, 2])); n.train_step(x2, zeros([3, 2])); }
let p = tensor([[1.0, 1.0]]);
print(a.predict(p) == b.predict(p));
print(b.predict(p).to_array().map(|r| r.map(|v| (v * 1e4).round() / 1e4)));
";
    let (devices, _turn) =
        devices_or_skip("batch_norm_running_statistics_follow_every_micro_batch");
    for dev in devices {
        let out = printed(HostOptions::default(), &code.replace("DEV", &format!("\"{dev}\"")));
        // (1 - m) / sqrt(v + eps) per channel after both batches (m, v the running mean and
        // unbiased variance, momentum 0.1), as PyTorch's BatchNorm1d gives.
        assert_eq!(out, "true\n[[0.7188, 0.774]]\n", "on {dev}");
    }
}
