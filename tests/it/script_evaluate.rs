//! Evaluation and training controls from scripts: `net.evaluate(...)` on held-out data (the
//! mean loss over every example, batches of any size, nothing about the model changed) and a
//! learning rate set from the script, on the CPU backend and on the GPU.

use crate::common::gpu::devices_or_skip;
use crate::common::script::printed;
use rumus::script::HostOptions;

/// Run `code` on `device` in a fresh session; its printed lines, then `error: ...` if it failed.
fn run_on(device: &str, code: &str) -> String {
    printed(HostOptions { device: device.into(), ..HostOptions::default() }, code)
}

fn check(code: &str, expected: &str) {
    assert_eq!(run_on("cpu", code), expected, "script:\n{code}");
}

/// The CPU backend, and the GPU when there is one (a failure under `CI=true` when there is not).
const MLP: &str = "model m(x: f32[B, 3], classes = 4) {
    return linear(relu(linear(x, 8) as fc1), classes) as fc2
}
let x = randn([10, 3], 1);
let y = tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1], \"i32\");
let d = dataset(x, y);
let x4 = randn([4, 3], 2);
let y4 = tensor([3, 2, 1, 0], \"i32\");
";

#[test]
fn evaluate_is_the_same_mean_at_every_batch_size_and_changes_nothing() {
    let code = "
let make = |dev| m().compile(#{ batch: 4, device: dev, seed: 1, optimizer: adam(#{ lr: 0.01 }) });
let a = make.call(DEV);
let b = make.call(DEV);
let full = a.evaluate(x, y, #{ batch: 10 });
let parts = a.evaluate(d, #{ batch: 3 });
let dflt = a.evaluate(d);
print((full.loss - parts.loss).abs() < 1e-6 * full.loss && (full.loss - dflt.loss).abs() < 1e-6 * full.loss);
print(full.accuracy == parts.accuracy && full.accuracy == dflt.accuracy && full.accuracy == a.accuracy(x, y));
let w = a.param(\"fc1.weight\");
let e = a.evaluate(x4, y4);
print(a.param(\"fc1.weight\") == w && a.step == 0);
let la = a.train_step(x4, y4);
print((e.loss - la).abs() < 1e-5 * la);
let same = la == b.train_step(x4, y4);
for i in 0..3 {
    a.evaluate(d, #{ batch: 3 });
    same = same && a.train_step(x4, y4) == b.train_step(x4, y4);
}
print(same && a.step == 4);
";
    let (devices, _turn) = devices_or_skip("evaluate on the gpu");
    for dev in devices {
        let out = run_on(dev, &format!("{MLP}const DEV = \"{dev}\";\n{code}"));
        assert_eq!(out, "true\ntrue\ntrue\ntrue\ntrue\n", "{dev}");
    }
}

/// Cross-entropy over labels that are all `ignore_index` is a mean of nothing: `train_step`
/// and `evaluate` both give NaN (`train_step` gave 0.0 where `evaluate` gave NaN), as PyTorch
/// does, on either device; the step's gradients are 0, so it moves no parameter, and a batch
/// with one label counted trains.
#[test]
fn a_batch_whose_every_label_is_ignored_has_a_nan_loss_and_moves_nothing() {
    let code = "
let net = m().compile(#{ batch: 4, device: DEV, ignore_index: -1, optimizer: sgd(#{ lr: 0.5 }) });
let w = net.param(\"fc1.weight\");
let none = tensor([-1, -1, -1, -1], \"i32\");
print(net.train_step(x4, none));
print(net.evaluate(x4, none).loss);
print(net.param(\"fc1.weight\") == w && net.step == 1);
let one = tensor([-1, 2, -1, -1], \"i32\");
print(net.train_step(x4, one) > 0.0 && net.param(\"fc1.weight\") != w);
";
    let (devices, _turn) = devices_or_skip("every label ignored on the gpu");
    for dev in devices {
        let out = run_on(dev, &format!("{MLP}const DEV = \"{dev}\";\n{code}"));
        assert_eq!(out, "NaN\nNaN\ntrue\ntrue\n", "{dev}");
    }
}

#[test]
fn evaluate_reports_mean_loss_and_accuracy() {
    let zero = "model lin(x: f32[B, 2], n = 3) { return linear(x, n) as fc }
        let x = randn([3, 2], 1);";
    let cases = [
        // Zero weights: every row's logits are equal, the loss is ln 3 and class 0 is predicted.
        (
            "let n = lin().compile(#{ batch: 2, ignore_index: -1 });
             n.set_param(\"fc.weight\", zeros([2, 3]));
             let r = n.evaluate(x, tensor([0, -1, 2], \"i32\"), #{ batch: 2 });
             print(r.loss); print(r.accuracy);",
            "1.0986122886681098\n0.5\n",
        ),
        (
            "let n = lin(#{ n: 1 }).compile(#{ batch: 2, loss: \"mse\" });
             n.set_param(\"fc.weight\", zeros([2, 1]));
             let r = n.evaluate(x, tensor([[1], [2], [3]]));
             print(r.loss); print(r.keys());",
            "4.666666666666667\n[\"loss\"]\n",
        ),
        (
            "let n = lin().compile(#{ batch: 2, ignore_index: -1 });
             print(n.evaluate(x, tensor([-1, -1, -1], \"i32\")));",
            "#{\"accuracy\": NaN, \"loss\": NaN}\n",
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{zero}\n{code}"), expected);
    }
}

#[test]
fn evaluate_rejects_what_it_cannot_score() {
    let setup = "model lin(x: f32[B, 2]) { return linear(x, 3) as fc }
        let n = lin().compile(#{ batch: 2 });
        model total(x: f32[B, 2]) { return sum(linear(x, 1), [0, 1]) }
        let x = zeros([3, 2]);";
    let cases = [
        ("n.evaluate(x, tensor([0, 7, 1], \"i32\"))", "evaluate: label 7 is not a class index in 0..3"),
        (
            "n.evaluate(x, tensor([0, 1], \"i32\"))",
            "evaluate needs x and y with the same number of examples (at least one), got [3, 2] and [2]",
        ),
        (
            "n.evaluate(zeros([0, 2]), tensor([], \"i32\"))",
            "evaluate needs x and y with the same number of examples (at least one), got [0, 2] and [0]",
        ),
        // Found by review: accuracy on no data said "predict needs at least one example".
        (
            "n.accuracy(zeros([0, 2]), tensor([], \"i32\"))",
            "accuracy needs x and y with the same number of examples (at least one), got [0, 2] and [0]",
        ),
        (
            "n.accuracy(dataset(zeros([0, 2]), tensor([], \"i32\")))",
            "accuracy needs x and y with the same number of examples (at least one), got [0, 2] and [0]",
        ),
        (
            "n.accuracy(x, tensor([0, 1], \"i32\"))",
            "accuracy needs x and y with the same number of examples (at least one), got [3, 2] and [2]",
        ),
        // Found by the third hostile-input audit: labels of another shape with as many
        // elements were paired with rows in memory order.
        (
            "n.evaluate(x, tensor([[0], [1], [2]], \"i32\"))",
            "evaluate: labels of shape [3, 1] for outputs of shape [3, 3]: give one label per row of outputs, shape [3]",
        ),
        (
            "n.accuracy(x, tensor([[0], [1], [2]], \"i32\"))",
            "accuracy: labels of shape [3, 1] for outputs of shape [3, 3]: give one label per row of outputs, shape [3]",
        ),
        ("n.evaluate(x, tensor([0, 1, 2], \"i32\"), #{ batch: 0 })", "evaluate: `batch` must be"),
        (
            "n.evaluate(x, tensor([0, 1, 2], \"i32\"), #{ batch: 4294967296 })",
            "evaluate: `batch` must be an integer in 1..=2147483648, got 4294967296",
        ),
        ("n.evaluate(x, tensor([0, 1, 2], \"i32\"), #{ bach: 2 })", "evaluate: unknown setting `bach`"),
        (
            "total().compile(#{ loss: \"output\" }).evaluate(x, tensor([0, 1, 2], \"i32\"))",
            "evaluate needs a model compiled with loss \"cross_entropy\" or \"mse\"",
        ),
        (
            "lin().compile(#{ loss: \"mse\" }).evaluate(x, tensor([0, 1, 2], \"i32\"))",
            "evaluate: mse needs f32 targets, got i32",
        ),
        (
            "lin().compile(#{ loss: \"mse\" }).evaluate(x, zeros([3, 2]))",
            "evaluate: an output row is [3] but a target row is [2]",
        ),
    ];
    for (code, expected) in cases {
        let out = run_on("cpu", &format!("{setup}\n{code}"));
        assert!(out.starts_with(&format!("error: {expected}")), "{code}:\n{out}");
    }
}

#[test]
fn a_learning_rate_set_from_the_script_takes_effect_at_the_next_step() {
    let code = "
let make = |dev, lr| m().compile(#{ batch: 4, device: dev, seed: 1, optimizer: sgd(#{ lr: lr }) });
let a = make.call(DEV, 0.5);
let b = make.call(DEV, 0.05);
a.lr = 0.05;
print(a.lr == b.lr);
let same = true;
for i in 0..3 { same = same && a.train_step(x4, y4) == b.train_step(x4, y4); }
print(same && a.param(\"fc1.weight\") == b.param(\"fc1.weight\"));
a.lr = 0;
let w = a.param(\"fc1.weight\");
a.train_step(x4, y4);
print(a.param(\"fc1.weight\") == w && a.lr == 0.0);
a.lr = 0.05;
a.train_step(x4, y4);
print(a.param(\"fc1.weight\") != w);
";
    let (devices, _turn) = devices_or_skip("a learning rate set on the gpu");
    for dev in devices {
        let out = run_on(dev, &format!("{MLP}const DEV = \"{dev}\";\n{code}"));
        assert_eq!(out, "true\ntrue\ntrue\ntrue\n", "{dev}");
    }
}

/// A plateau schedule written in the script: halve the rate when the held-out loss has not
/// improved for two evaluations.
#[test]
fn a_plateau_schedule_in_a_script_halves_the_rate() {
    let code = "
let net = m().compile(#{ batch: 4, seed: 1, optimizer: sgd(#{ lr: 0.1 }) });
let best = 1e9;
let bad = 0;
let rates = [];
for epoch in 0..8 {
    // A held-out set that training never sees, so the loss stops improving at some point.
    net.train_step(x4, y4);
    let loss = net.evaluate(d).loss;
    if loss < best - 1e-4 { best = loss; bad = 0; } else { bad += 1; }
    if bad >= 2 { net.lr = net.lr * 0.5; bad = 0; }
    rates.push(net.lr);
}
print(rates[0] == 0.10000000149011612 && rates[-1] < rates[0]);
let halvings = true;
for i in 1..rates.len() {
    halvings = halvings && (rates[i] == rates[i - 1] || (rates[i] - rates[i - 1] * 0.5).abs() < 1e-9);
}
print(halvings);
";
    check(&format!("{MLP}\n{code}"), "true\ntrue\n");
}

#[test]
fn a_learning_rate_that_cannot_be_used_is_an_error() {
    let cases = [
        ("let n = m().compile(#{ optimizer: sgd() }); n.lr = -1.0;", "learning rate must be a finite number >= 0, got -1"),
        ("let n = m().compile(); n.lr = 0.0 / 0.0;", "lr: NaN is not a finite number"),
        ("let n = m().compile(); n.lr = 1e300;", "lr: "),
        (
            "let n = m().compile(#{ schedule: cosine(#{ total: 10 }) }); n.lr = 0.1;",
            "the learning rate follows the model's schedule; compile without `schedule` to set it from the script",
        ),
    ];
    for (code, expected) in cases {
        let out = run_on("cpu", &format!("{MLP}\n{code}"));
        assert!(out.starts_with(&format!("error: {expected}")), "{code}:\n{out}");
    }
}
