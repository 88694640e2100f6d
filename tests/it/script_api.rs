//! The script API, as data: each case is a script and what it prints (or the error it gives).

use crate::common::script::printed;
use rumus::script::HostOptions;

/// Run `code` in a fresh session; return its printed lines, then `error: ...` if it failed.
fn run(code: &str) -> String {
    printed(HostOptions::default(), code)
}

fn check(code: &str, expected: &str) {
    assert_eq!(run(code), expected, "script:\n{code}");
}

#[test]
fn tensors_from_arrays_and_ranges() {
    check(
        "let t = tensor([[1, 2, 3], [4, 5, 6]]); print(t); print(t.shape); print(t.dtype);",
        "tensor f32[2, 3] [[1, 2, 3], [4, 5, 6]]\n[2, 3]\nf32\n",
    );
    check("print(tensor(0..4));", "tensor f32[4] [0, 1, 2, 3]\n");
    check("print(tensor(1..=3));", "tensor f32[3] [1, 2, 3]\n");
    check("print(tensor([1, 2], \"i32\"));", "tensor i32[2] [1, 2]\n");
    check("print(zeros([2]) + 1.5);", "tensor f32[2] [1.5, 1.5]\n");
    check("print(tensor(0..20));", "tensor f32[20] [0, 1, 2, ..., 17, 18, 19]\n");
}

#[test]
fn element_access_and_to_array() {
    check(
        "let t = tensor([[1, 2], [3, 4]]); print(t[[1, 0]]); print(t[1]); t[[0, 1]] = 9; print(t.to_array());",
        "3.0\ntensor f32[2] [3, 4]\n[[1.0, 9.0], [3.0, 4.0]]\n",
    );
    check(
        "let t = tensor([1, 2]); let u = t; u[0] = 5; print(t); print(u);",
        "tensor f32[2] [1, 2]\ntensor f32[2] [5, 2]\n",
    );
    check("let t = tensor([1, 2]); t[2]", "error: index [2] is out of range for shape [2]\n");
}

#[test]
fn arithmetic_broadcasts() {
    check(
        "let a = tensor([[1, 2], [3, 4]]); let b = tensor([10, 20]); print(a + b); print(2 * a - 1); print(a / a);",
        "tensor f32[2, 2] [[11, 22], [13, 24]]\ntensor f32[2, 2] [[1, 3], [5, 7]]\ntensor f32[2, 2] [[1, 1], [1, 1]]\n",
    );
    check("tensor([1, 2, 3]) + tensor([1, 2])", "error: cannot broadcast shapes [3] and [2]\n");
    check(
        "let a = tensor([[1, 5], [7, 2]]); print(a.sum()); print(a.mean()); print(a.argmax()); print(a.max());",
        "15.0\n3.75\ntensor i32[2] [1, 0]\n7.0\n",
    );
    check("print(tensor(0..6).reshape([2, 3]));", "tensor f32[2, 3] [[0, 1, 2], [3, 4, 5]]\n");
}

/// `==` compares shapes and values as numbers across dtypes (as `torch.equal`); it used to be
/// false for an f32 and an i32 tensor of the same values.
#[test]
fn tensors_compare_by_shape_and_value_whatever_their_dtypes() {
    check(
        "print(zeros([3]) == tensor([0, 0, 0], \"i32\")); print(tensor([1, 2], \"i32\") == tensor([1.0, 2.0]));",
        "true\ntrue\n",
    );
    // 2^24 + 1 is an i32 no f32 holds: the nearest f32 (2^24) is not equal to it.
    check(
        "print(tensor([16777217], \"i32\") == tensor([16777217], \"i32\").to_f32()); print(tensor([1.5]) != tensor([1], \"i32\"));",
        "false\ntrue\n",
    );
    check(
        "print(zeros([3]) == zeros([3, 1])); let n = zeros([1]) / 0; print(n == n); print(tensor([-0.0]) == tensor([0], \"i32\"));",
        "false\nfalse\ntrue\n",
    );
}

/// Found by the hostile-input audit: `reshape([-1, 3])` said `shape: negative dimension -1`,
/// where the model language and PyTorch infer one `-1` dimension.
#[test]
fn reshape_infers_one_minus_one_dimension() {
    check("print(zeros([2, 3]).reshape([-1, 3]).shape);", "[2, 3]\n");
    check("print(tensor(0..6).reshape([3, -1]));", "tensor f32[3, 2] [[0, 1], [2, 3], [4, 5]]\n");
    check("print(zeros([2, 3, 4]).reshape([-1]).shape);", "[24]\n");
    check("print(zeros([0, 3]).reshape([-1, 3]).shape);", "[0, 3]\n");
    check(
        "zeros([2, 3]).reshape([-1, 4])",
        "error: cannot reshape [2, 3] (6 elements) into [-1, 4]: 6 is not a multiple of 4, the product of the other dimensions\n",
    );
    check(
        "zeros([0, 3]).reshape([-1, 0])",
        "error: cannot reshape [0, 3] (0 elements) into [-1, 0]: the other dimensions hold 0 elements, so -1 could be any size\n",
    );
    check(
        "zeros([2, 3]).reshape([-1, -1])",
        "error: reshape: [-1, -1] has more than one -1; only one dimension can be inferred\n",
    );
    check(
        "zeros([2, 3]).reshape([-2, -3])",
        "error: reshape: dimension -2 of [-2, -3] is negative; only -1 (one dimension inferred from the element count) is allowed\n",
    );
    check("zeros([2, 3]).reshape([4, 2])", "error: cannot reshape [2, 3] into [4, 2]\n");
}

#[test]
fn malformed_tensors_are_script_errors() {
    check(
        "tensor([[1, 2], [3]])",
        "error: tensor: ragged array: rows of length 2 and 1 at depth 1\n",
    );
    check(
        "tensor([1, \"a\"])",
        "error: tensor elements must be numbers, got the string \"a\" (the only strings taken \
         are \"inf\" and \"-inf\", for an infinity)\n",
    );
    check("zeros([2, -1])", "error: shape: negative dimension -1\n");
    check("tensor([1], \"f64\")", "error: unknown dtype `f64`: expected \"f32\" or \"i32\"\n");
    check("tensor([1, 2]).item()", "error: item: tensor of shape [2] has 2 elements, not one\n");
}

/// A rumus function called with arguments it has no form for (a model where a trainer is
/// wanted, a property called like a method) says how it is called, from the script API
/// reference; a name rumus does not have keeps rhai's message alone.
#[test]
fn a_call_no_form_matches_shows_the_forms_of_the_function() {
    let model = "model m(a: f32[B, 2]) { return linear(a, 3) }\nlet mm = m(#{ B: 2 });\n";
    check(
        &format!("{model}mm.predict(tensor([[1.0, 2.0]]))"),
        "error: function not found: predict (Model, Tensor); `predict` is called as \
         `net.predict(x)`, `net.predict(#{ ... })` (`:help predict` in the REPL, or \
         docs/script-api.md)\n",
    );
    check(
        "tensor([1.0]).shape(2)",
        "error: function not found: shape (Tensor, i64); `shape` is called as `t.shape` \
         (`:help shape` in the REPL, or docs/script-api.md)\n",
    );
    check(
        "reshape(tensor([1.0]))",
        "error: function not found: reshape (Tensor); `reshape` is called as \
         `t.reshape(shape)` (`:help reshape` in the REPL, or docs/script-api.md)\n",
    );
    check("tensor([1.0]).foo(3)", "error: function not found: foo (Tensor, i64)\n");
}

/// Found by the fuzz driver: `throw` with no value (or an empty one) gave an error with an
/// empty message.
#[test]
fn throw_without_a_message_says_so() {
    let expected =
        "error: `throw` without a message: give one, as in `throw \"what went wrong\"`\n";
    check("throw", expected);
    check("throw ();", expected);
    check("throw \"  \";", expected);
    check("throw \"bad input\";", "error: bad input\n");
    check("throw 3;", "error: 3\n");
}

/// `catch (e)` on a failed rumus call bound a value that printed as
/// `rumus::script::convert::Carried`. Each kind of failure now shows its message (and its place,
/// where it has one) through print, `to_string`, interpolation and `e.message`; `e.line` and
/// `e.position` are as in rhai's own caught errors; re-throwing keeps the original error.
#[test]
fn caught_errors_show_their_message() {
    let model = "model m(x: f32[B, 2]) {\n    return linear(x, 1)\n}\n";
    let bad = "model bad(x: f32[3, 2]) {\n    return x @ x\n}\n";
    let show = "print(e); print(e.to_string()); print(`caught: ${e}`); print(e.message); \
                print(e.line); print(e.position); print(type_of(e));";
    let missing = std::env::current_dir().unwrap().join("missing.csv");
    let missing = format!("{}: No such file or directory (os error 2)", missing.display());
    let unknown = "compile: unknown setting `bach` (settings: batch, dims, loss, output, \
                   ignore_index, optimizer, lr, schedule, clip, accumulate, device, seed, \
                   matmul_precision, remat)";
    let shape = "matmul: inner dimensions differ: [3, 2] @ [3, 2] (2 vs 3)";
    // (model blocks, the failing call, its text, its message, line, column)
    let cases: &[(&str, &str, String, &str, &str, &str)] = &[
        // A bad option map.
        (model, "m().compile(#{ bach: 4 })", unknown.to_string(), unknown, "", ""),
        // A shape error, placed in the model block.
        (bad, "bad()", format!("t.rms:2:12: {shape}"), shape, "2", "12"),
        // A missing file.
        ("", "csv(\"missing.csv\")", missing.clone(), &missing, "", ""),
        // A bad value to a tensor function.
        (
            "",
            "zeros([2, -1])",
            "shape: negative dimension -1".into(),
            "shape: negative dimension -1",
            "",
            "",
        ),
    ];
    for (prelude, call, text, message, line, column) in cases {
        let expected =
            format!("{text}\n{text}\ncaught: {text}\n{message}\n{line}\n{column}\nError\n");
        check(&format!("{prelude}try {{ {call} }} catch (e) {{ {show} }}"), &expected);
        // Thrown again, it is the original error.
        let rethrown = run(&format!("{prelude}try {{ {call} }} catch (e) {{ throw e; }}"));
        assert_eq!(rethrown, run(&format!("{prelude}{call}")), "{call}");
    }
    // rhai's own errors keep rhai's map, with the same fields.
    check(
        "try { nope() } catch (e) { print(e.message); print(e.line); print(e.position) }",
        "Function not found: nope ()\n1\n7\n",
    );
}

#[test]
fn datasets_from_csv_and_text() {
    check(
        "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); print(d.len()); print(d.x.shape); print(d.y.dtype);
         let s = d.split(0.8, 1); print(`${s.train.len()} ${s.test.len()}`);
         let bs = s.train.batches(50, 0); print(bs.len()); print(bs[0].x.shape);
         print(s.train.batches(50, 0, true).len());",
        "150\n[150, 2]\ni32\n120 30\n2\n[50, 2]\n3\n",
    );
    check(
        "let d = text(\"scripts/data/tiny.txt\", #{ seq_len: 8, stride: 100 }); print(d.x.shape); print(d.x[0]); print(d.y[0]);",
        "[5, 8]\ntensor i32[8] [73, 116, 32, 119, 97, 115, 32, 116]\ntensor i32[8] [116, 32, 119, 97, 115, 32, 116, 104]\n",
    );
    check(
        "let d = dataset(tensor([[1], [2], [3]]), tensor([0, 1, 0], \"i32\")); print(d.shuffle(3).len());",
        "3\n",
    );
    check(
        "csv(\"/etc/passwd\")",
        "error: reading `/etc/passwd` is not allowed: scripts read only below the script's folder and the working directory\n",
    );
    check(
        "dataset(zeros([2, 1]), zeros([3]))",
        "error: dataset needs x and y with the same first dimension, got [2, 1] and [3]\n",
    );
}

#[test]
fn sample_draws_from_softmax_of_logits_over_temperature() {
    // Temperature 0 is argmax; the last axis is removed, as by argmax.
    check("print(tensor([0.0, 5.0, 1.0]).sample(0, 1));", "tensor i32[] 1\n");
    // One draw per row; a logit of -inf (here ln 0) is never drawn.
    check("print(tensor([[0, 1], [1, 0]]).ln().sample(1.0, 5));", "tensor i32[2] [1, 0]\n");
    // The same seed gives the same draw.
    check("let p = randn([4, 9], 1); print(p.sample(1.0, 3) == p.sample(1.0, 3));", "true\n");
    // Frequencies follow softmax(logits / temperature): p = 0.8 at temperature 1, and
    // 0.64 / (0.64 + 0.04) = 0.94 at temperature 0.5 (2,000 draws, bounds at about 4 sigma).
    let count = |temperature: &str| -> i64 {
        let code = format!(
            "let p = tensor([0.2, 0.8]).ln(); let n = 0;
             for s in 0..2000 {{ n += p.sample({temperature}, s).item().to_int(); }} print(n);"
        );
        run(&code).trim().parse().unwrap()
    };
    let n = count("1.0");
    assert!((1530..=1670).contains(&n), "{n} of 2000 draws at p = 0.8");
    let n = count("0.5");
    assert!((1840..=1925).contains(&n), "{n} of 2000 draws at p = 0.94");
    check(
        "tensor([1.0]).sample(-1.0, 1)",
        "error: sample: temperature must be a finite number >= 0, got -1\n",
    );
    check(
        "tensor([0.0]).ln().sample(1.0, 1)",
        "error: sample: a row of logits is NaN, infinite or all -inf\n",
    );
    check("tensor(0..0).sample(1.0, 1)", "error: sample: last axis is empty\n");
}

/// Every script number that changes type is checked: nothing wraps, saturates or becomes
/// infinite, and the message names the value and the allowed range.
#[test]
fn numbers_from_scripts_never_wrap_or_saturate() {
    const M: &str = "model m(x: f32[B, 2]) { return linear(x, 3) }\n";
    let i32_range = "must be an integer in -2147483648..=2147483647";
    let dim_range = "must be an integer in 1..=2147483648";
    let f32_range = "is outside the range of f32 (about ±3.4e38)";
    let cases = [
        ("tensor([4294967297], \"i32\")", format!("tensor element {i32_range}, got 4294967297")),
        (
            "tensor([1.5], \"i32\")",
            "tensor element 1.5 is not a whole number in i32's range (-2147483648..=2147483647)"
                .into(),
        ),
        ("tensor([1e39])", format!("tensor element: 1e39 {f32_range}")),
        (
            "let t = tensor([1], \"i32\"); t[0] = 4294967297;",
            format!("tensor element {i32_range}, got 4294967297"),
        ),
        ("let t = tensor([1.0]); t[0] = -1e300;", format!("tensor element: -1e300 {f32_range}")),
        ("zeros([1]) * 1e39", format!("`*`: 1e39 {f32_range}")),
        ("1e39 - zeros([1])", format!("`-`: 1e39 {f32_range}")),
        ("full([1], 1e39)", format!("full: 1e39 {f32_range}")),
        (
            "tensor([1e10]).to_i32()",
            "to_i32: 10000000000 is not a whole number in i32's range (-2147483648..=2147483647)"
                .into(),
        ),
        (
            "tensor([0.0]).ln().to_i32()",
            "to_i32: -inf is not a whole number in i32's range (-2147483648..=2147483647)".into(),
        ),
        ("randn([2], -1)", "seed must be an integer >= 0, got -1".into()),
        ("seed(-1)", "seed must be an integer >= 0, got -1".into()),
        (
            "tensor([1.0, 2.0]).sample(1.0, -5)",
            "sample: seed must be an integer >= 0, got -5".into(),
        ),
        (
            "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); d.batches(-1, 0)",
            "batch size must be an integer >= 1, got -1".into(),
        ),
        (
            "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); d.batches(0, 0, true)",
            "batch size must be an integer >= 1, got 0".into(),
        ),
        (
            "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); d.batches(2, -1)",
            "seed must be an integer >= 0, got -1".into(),
        ),
        (
            "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); d.split(0.5, -1)",
            "seed must be an integer >= 0, got -1".into(),
        ),
        (
            "csv(\"scripts/data/blobs.csv\", #{ label_column: 2 })",
            "csv: unknown setting `label_column` (settings: label_col, labels, scale, header)"
                .into(),
        ),
        // `labels` without a label column was ignored (found by the hostile-input audit).
        (
            "csv(\"scripts/data/blobs.csv\", #{ labels: \"targets\" })",
            "csv: `labels` says how the label column reads, and there is none: give `label_col` too, or drop `labels` (without `label_col` every column is a feature)".into(),
        ),
        (
            "csv(\"scripts/data/blobs.csv\", #{ label_col: -2 })",
            "csv: `label_col` must be an integer >= 0, got -2".into(),
        ),
        (
            "csv(\"scripts/data/blobs.csv\", #{ scale: 1e39 })",
            format!("csv: `scale`: 1e39 {f32_range}"),
        ),
        (
            "text(\"scripts/data/tiny.txt\", #{ seq_len: -1 })",
            "text: `seq_len` must be an integer >= 1, got -1".into(),
        ),
        (
            "text(\"scripts/data/tiny.txt\", #{ seq_len: 4, stride: 0 })",
            "text: `stride` must be an integer >= 1, got 0".into(),
        ),
        // A loop over no batches trained on nothing without a word.
        (
            "dataset(zeros([2, 2]), zeros([2])).batches(5, 1)",
            "batches: no batch of 5 is full in a dataset of 2 rows, so there are none: use a \
             batch of at most 2, or keep_last: true for the partial one"
                .into(),
        ),
        // rhai's own text was "indexer unavailable: Tensor [f64]" (and "Tensor [f64] = f64"
        // for a write).
        (
            "zeros([2, 3])[0.5]",
            "a Tensor is indexed by an integer (`t[0]`) or an array of integers, one per axis \
             (`t[[0, 1]]`), not by f64"
                .into(),
        ),
        (
            "let t = zeros([2, 3]); t[0.5] = 1.0",
            "a Tensor is indexed by an integer (`t[0]`) or an array of integers, one per axis \
             (`t[[0, 1]]`), not by f64"
                .into(),
        ),
        // The file is named (a loop over files could not tell which was short).
        (
            "text(\"scripts/data/tiny.txt\", #{ seq_len: 418 })",
            "scripts/data/tiny.txt: text of 418 bytes is too short for one sequence of 418 bytes \
             plus a target: use a shorter seq_len (at most 417)"
                .into(),
        ),
        (
            "m().compile(#{ ignore_index: 4294967296 })",
            format!("compile: `ignore_index` {i32_range}, got 4294967296"),
        ),
        ("m().compile(#{ batch: 0 })", format!("compile: `batch` {dim_range}, got 0")),
        // A size past the model language's bound is refused where the script gave it, not at
        // the model's `B`.
        (
            "m().compile(#{ batch: 9223372036854775807 })",
            format!("compile: `batch` {dim_range}, got 9223372036854775807"),
        ),
        ("m().compile(#{ seed: -1 })", "compile: `seed` must be an integer >= 0, got -1".into()),
        (
            "m().compile(#{ matmul_precision: \"tf32\" })",
            "compile: unknown matmul precision `tf32` (valid choices: highest, high, medium)"
                .into(),
        ),
        (
            "m().compile(#{ remat: 1 })",
            "compile: `remat` must be true, false or \"matmuls\", got i64".into(),
        ),
        (
            "m().compile(#{ remat: \"all\" })",
            "compile: unknown `remat` setting \"all\": expected true, false or \"matmuls\"".into(),
        ),
        ("m().compile(#{ lr: 1e39 })", format!("compile: `lr`: 1e39 {f32_range}")),
        ("m().compile(#{ clip: -1e40 })", format!("compile: `clip`: -1e40 {f32_range}")),
        (
            "m().compile(#{ optimizer: adam(#{ betas: 0.9 }) })",
            "adam: unknown setting `betas` (settings: type, lr, beta1, beta2, eps, weight_decay, groups)"
                .into(),
        ),
        (
            "m().compile(#{ optimizer: sgd(#{ momentum: 1e39 }) })",
            "sgd: momentum must be in [0, 1), got 1e39".into(),
        ),
        (
            "m().compile(#{ optimizer: adamw(#{ lr: 1e39 }) })",
            format!("adamw: `lr`: 1e39 {f32_range}"),
        ),
        // Found by the third hostile-input audit: "got 1e-50" read as if 1e-50 were refused for
        // not being positive.
        (
            "m().compile(#{ optimizer: adam(#{ eps: 1e-50 }) })",
            "adam: eps must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got 1e-50".into(),
        ),
        (
            "m().compile(#{ schedule: step_lr(#{ every: 0 }) })",
            "step_lr: `every` must be an integer >= 1, got 0".into(),
        ),
        (
            "m().compile(#{ schedule: cosine(#{ total: 0 }) })",
            "cosine: `total` must be an integer >= 1, got 0".into(),
        ),
        (
            "m().compile(#{ schedule: cosine(#{ warmup: -1 }) })",
            "cosine: `warmup` must be an integer >= 0, got -1".into(),
        ),
        (
            "m().compile(#{ schedule: cosine(#{ min_lr: 1e39 }) })",
            format!("cosine: `min_lr`: 1e39 {f32_range}"),
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    // The inclusive end at i64::MAX does not overflow; the element has no exact f32 value.
    check(
        "print(tensor(-9223372036854775808..=-9223372036854775808).shape);
         tensor(9223372036854775807..=9223372036854775807)",
        "[1]\nerror: tensor: 9223372036854775807 has no exact f32 value (f32 holds every \
         integer up to 16777216 = 2^24, and only some beyond): make the tensor \"i32\", or \
         write the number as a float to accept rounding\n",
    );
}

/// Found by the fourth hostile-input audit: SGD's settings message named `eps`, which SGD does
/// not have, and each optimizer's message named eps and weight_decay whichever was wrong.
#[test]
fn each_optimizers_message_names_only_settings_it_has() {
    const M: &str = "model m(x: f32[B, 2]) { return linear(x, 3) }\n";
    let wd = "weight_decay must be >= 0 and finite as an f32 (it is applied in f32)";
    let eps = "eps must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0)";
    let cases = [
        ("sgd(#{ lr: 0.1, weight_decay: -1 })", format!("sgd: {wd}, got -1")),
        ("sgd(#{ weight_decay: 1e39 })", format!("sgd: {wd}, got 1e39")),
        ("adam(#{ weight_decay: -1 })", format!("adam: {wd}, got -1")),
        ("adamw(#{ weight_decay: -0.5 })", format!("adamw: {wd}, got -0.5")),
        ("adam(#{ eps: 0 })", format!("adam: {eps}, got 0")),
        ("adamw(#{ eps: -1, weight_decay: -1 })", format!("adamw: {eps}, got -1")),
        ("adamw(#{ beta1: 1 })", "adamw: betas must be in [0, 1), got (1, 0.999)".into()),
        ("sgd(#{ momentum: -0.1 })", "sgd: momentum must be in [0, 1), got -0.1".into()),
    ];
    for (optimizer, expected) in cases {
        let code = format!("{M}m().compile(#{{ optimizer: {optimizer} }})");
        check(&code, &format!("error: {expected}\n"));
        if optimizer.starts_with("sgd") {
            assert!(!expected.contains("eps") && !expected.contains("beta"), "{expected}");
        }
    }
}

/// Found by the hostile-input hunt: an eps of 1e-40 is nonzero in f32 but subnormal, which a GPU
/// may flush to 0 (WGSL allows it): NaN on a constant row where the CPU gives a finite answer.
/// Every eps (LayerNorm's, batch norm's, Adam's and AdamW's) must be a normal f32, an error at
/// its place otherwise; the smallest normal f32 itself is accepted.
#[test]
fn every_eps_must_be_a_normal_f32() {
    let run_at = |code: &str| -> String {
        let mut h = rumus::script::Host::new(HostOptions::default());
        match h.eval(&rumus::Source::new("t.rms", code)) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    };
    let fragment = "must be a finite number of at least 1.1754944e-38 (the smallest normal f32: \
                    a GPU may flush a smaller one to 0), got 1e-40";
    let ln = "model m(x: f32[B, 4]) { return layer_norm(x, EPS) }\nm().compile(#{ batch: 2 });";
    let bn = "model m(x: f32[B, 2, 3, 3]) { return batch_norm(x, eps = EPS) }\nm().compile(#{ batch: 2 });";
    let optimizer = "model m(x: f32[B, 2]) { return linear(x, 3) }
        m().compile(#{ batch: 2, optimizer: OPT(#{ eps: EPS }) });";
    let cases = [
        (ln.replace("EPS", "1e-40"), format!("t.rms:1:32: layer_norm: `eps` {fragment}")),
        (bn.replace("EPS", "1e-40"), format!("t.rms:1:38: batch_norm: `eps` {fragment}")),
        (
            optimizer.replace("OPT", "adam").replace("EPS", "1e-40"),
            format!("t.rms:2:13: adam: eps {fragment}"),
        ),
        (
            optimizer.replace("OPT", "adamw").replace("EPS", "1e-40"),
            format!("t.rms:2:13: adamw: eps {fragment}"),
        ),
    ];
    for (code, expected) in cases {
        let got = run_at(&code);
        assert_eq!(got.lines().next(), Some(expected.as_str()), "{code}\n{got}");
    }
    for code in [ln, bn, &optimizer.replace("OPT", "adam"), &optimizer.replace("OPT", "adamw")] {
        let code = code.replace("EPS", "1.1754944e-38");
        assert_eq!(run_at(&code), "ok", "{code}");
    }
}

/// Found by the fourth hostile-input audit: an i32 output under `loss: "mse"` failed with the
/// message of the op inside the loss (`sub: operand must be f32, got i32[2, 2, 2]`), naming
/// neither the loss nor what to do.
#[test]
fn a_loss_given_an_output_it_cannot_read_says_which_loss_needs_what() {
    const M: &str = "model ints(x: i32[B, 2, 2]) { return x }
        model vec(x: f32[B, 2]) { return linear(x, 3) }\n";
    let cases = [
        (
            "ints().compile(#{ batch: 2, loss: \"mse\" })",
            "the \"mse\" loss needs f32 predictions, and the model's output `x` is i32[2, 2, 2]: return f32 values from the model (i32 values are indices: `embedding` turns them into f32 vectors)",
        ),
        (
            "ints().compile(#{ batch: 2, loss: \"cross_entropy\" })",
            "the \"cross_entropy\" loss needs f32 logits, and the model's output `x` is i32[2, 2, 2]: return f32 values from the model (i32 values are indices: `embedding` turns them into f32 vectors)",
        ),
        (
            "ints().compile(#{ batch: 2, loss: \"output\" })",
            "the \"output\" loss needs an f32 scalar, the loss itself, and the model's output `x` is i32[2, 2, 2]: return f32 values from the model (i32 values are indices: `embedding` turns them into f32 vectors)",
        ),
        (
            "vec().compile(#{ batch: 2, loss: \"output\" })",
            "the \"output\" loss needs an f32 scalar, the loss itself, and the model's output `output` is f32[2, 3]: make the model reduce it to a scalar (`mean` or `sum`), or use another loss",
        ),
    ];
    for (code, expected) in cases {
        let got = run(&format!("{M}{code}"));
        assert!(got.starts_with("error: ") && got.contains(expected), "{code}:\n{got}");
    }
    // The same output under a loss that reads it compiles.
    check(&format!("{M}vec().compile(#{{ batch: 2, loss: \"mse\" }}); print(1);"), "1\n");
}

/// Found by the hostile-input audit: with every label equal to `ignore_index`, `accuracy` said
/// 0.0 where `evaluate` said NaN; nothing was counted, so both say NaN.
#[test]
fn accuracy_with_every_label_ignored_is_nan_as_in_evaluate() {
    let m = "model m(x: f32[B, 2]) { return linear(x, 3) as fc }
             let net = m().compile(#{ batch: 2, ignore_index: -1 });
             let x = randn([2, 2], 1); let y = tensor([-1, -1], \"i32\");";
    check(
        &format!("{m}\nprint(net.accuracy(x, y)); print(net.evaluate(x, y));"),
        "NaN\n#{\"accuracy\": NaN, \"loss\": NaN}\n",
    );
    check(&format!("{m}\nprint(net.accuracy(x, tensor([-1, 2], \"i32\")) >= 0.0);"), "true\n");
}

/// Metrics on NaN or infinite values are NaN, never a score that treats the first class as the
/// prediction (NaN logits with labels 0 used to score 1.0).
#[test]
fn metrics_on_nan_and_infinite_values_are_nan() {
    let m = "model m(x: f32[B, 2]) { return linear(x, 3) as fc }
             let net = m().compile(#{ batch: 4, loss: \"cross_entropy\" });
             let x = randn([4, 2], 1); let y = tensor([0, 0, 0, 0], \"i32\");
             let nan = zeros([2, 3]) / 0;";
    let cases = [
        ("net.set_param(\"fc.weight\", nan);", "NaN"),
        ("net.set_param(\"fc.weight\", zeros([2, 3])); net.set_param(\"fc.bias\", -(zeros([3]).ln()));", "NaN"),
        ("net.set_param(\"fc.weight\", zeros([2, 3])); net.set_param(\"fc.bias\", zeros([3]).ln());", "NaN"),
        ("net.set_param(\"fc.weight\", zeros([2, 3])); net.set_param(\"fc.bias\", tensor([1, 0, 0]));", "1.0"),
    ];
    for (set, expected) in cases {
        check(&format!("{m}\n{set}\nprint(net.accuracy(x, y));"), &format!("{expected}\n"));
    }
    check(
        "let t = tensor([[1.0, 0.0, 5.0]]) / tensor([[1.0, 0.0, 1.0]]);
         print(t.max()); print(t.min()); print(t.argmax()); print(t.sum());",
        "NaN\nNaN\ntensor i32[1] [1]\nNaN\n",
    );
}

/// Arguments that used to give a silently wrong answer (an empty tensor, a NaN learning rate
/// later, an accuracy of 0) are errors.
#[test]
fn out_of_range_arguments_are_errors_not_wrong_answers() {
    const M: &str =
        "model m(x: f32[B, 2]) { return linear(x, 3) }\nlet n = m().compile(#{ loss: \"mse\" });\n";
    let cases = [
        (
            "tensor(-9223372036854775808..9223372036854775807)",
            "shape [18446744073709551615] has more than 2^40 elements, the most one value may hold",
        ),
        (
            "m().compile(#{ schedule: step_lr(#{ gamma: 0.0 / 0.0 }) })",
            "step_lr: `gamma`: NaN is not a finite number",
        ),
        (
            "m().compile(#{ schedule: cosine(#{ min_lr: -1 }) })",
            "cosine: min_lr must be a finite number >= 0, got -1",
        ),
        ("n.predict(zeros([0, 2]))", "predict needs at least one example, got [0, 2]"),
        // Found by the hostile-input audit: these were 0, -inf and inf.
        ("zeros([0]).mean()", "mean: the tensor of shape [0] has no elements"),
        ("zeros([2, 0]).max()", "max: the tensor of shape [2, 0] has no elements"),
        ("tensor(3..3).min()", "min: the tensor of shape [0] has no elements"),
        (
            "n.accuracy(zeros([2, 2]), tensor([0.5, 1.0]))",
            "accuracy: label 0.5 is not a class index in 0..3",
        ),
        (
            "n.accuracy(zeros([2, 2]), tensor([7, 1], \"i32\"))",
            "accuracy: label 7 is not a class index in 0..3",
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    check("print(tensor(5..3).shape);", "[0]\n");
}

/// Found by the hostile-input audit: `step_lr(#{ every: 1, gamma: 1e30 })` drove `net.lr` to
/// inf and the loss to NaN, and the run exited 0; `cosine` took a `min_lr` above the learning
/// rate. Every schedule's rate is checked where it is computed, as a finite f32 (what `net.lr =`
/// accepts), and inconsistent settings are refused at `compile`.
#[test]
fn schedules_give_finite_learning_rates_or_an_error_naming_the_step() {
    const M: &str = "model m(x: f32[B, 2]) { return linear(x, 3) }
        let x = zeros([1, 2]); let y = zeros([1, 3]);\n";
    let over = "step_lr: the learning rate for step 2, lr 0.001 × gamma 1e30^2, is beyond f32's \
                range (about 3.4e38): use a gamma of at most 1, or a larger `every`";
    check(
        &format!(
            "{M}let n = m().compile(#{{ loss: \"mse\", schedule: step_lr(#{{ every: 1, gamma: 1e30 }}) }});
             for i in 0..5 {{ print(n.step); n.train_step(x, y); }}"
        ),
        &format!("0\n1\n2\nerror: {over}\n"),
    );
    check(
        &format!(
            "{M}let n = m().compile(#{{ loss: \"mse\", schedule: step_lr(#{{ gamma: 1e30 }}) }});
             n.train_step(x, y); n.train_step(x, y); print(n.step); n.lr"
        ),
        &format!("2\nerror: {over}\n"),
    );
    // A rate of 0 stays 0, and a gamma below 1 decays toward 0, for as long as it runs.
    check(
        &format!(
            "{M}let n = m().compile(#{{ loss: \"mse\", lr: 0, schedule: step_lr(#{{ gamma: 1e30 }}) }});
             for i in 0..40 {{ n.train_step(x, y); }} print(n.lr);
             let n = m().compile(#{{ loss: \"mse\", lr: 1, schedule: step_lr(#{{ gamma: 1e-30 }}) }});
             for i in 0..3 {{ n.train_step(x, y); }} print(n.lr);"
        ),
        "0.0\n0.0\n",
    );
    let cases = [
        (
            "m().compile(#{ schedule: cosine(#{ total: 10, min_lr: 3e38 }) })",
            "cosine: min_lr 3e38 is above the learning rate 0.001: the schedule decays from the \
             learning rate down to min_lr; give a smaller min_lr or a larger lr",
        ),
        (
            "m().compile(#{ lr: 0.01, schedule: cosine(#{ total: 10, min_lr: 0.1 }) })",
            "cosine: min_lr 0.1 is above the learning rate 0.01: the schedule decays from the \
             learning rate down to min_lr; give a smaller min_lr or a larger lr",
        ),
        (
            "m().compile(#{ schedule: cosine(#{ warmup: 20, total: 10 }) })",
            "cosine: warmup 20 is longer than total 10: the rate warms up over the first `warmup` \
             steps and reaches min_lr at step `total`; give a total of at least 20",
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    // A cosine from the largest rate f32 holds stays within it, warm-up included.
    check(
        &format!(
            "{M}let n = m().compile(#{{ loss: \"mse\", optimizer: sgd(#{{ lr: 3e38 }}),
                schedule: cosine(#{{ warmup: 4, total: 8, min_lr: 3e38 }}) }});
             let rates = []; for i in 0..10 {{ rates.push(n.lr / 3e38); n.train_step(x, y); }}
             print(rates.map(|r| (r * 100.0).round() / 100.0));"
        ),
        "[0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]\n",
    );
    // The rate is `min_lr` from step `total` on, also when the warm-up takes all of it (it
    // was the full rate at step `total` and `min_lr` one step late).
    for (warmup, total, expected) in [
        (3, 3, "[0.33, 0.67, 1.0, 0.2, 0.2, 0.2]"),
        (1, 1, "[1.0, 0.2, 0.2, 0.2, 0.2, 0.2]"),
        (0, 2, "[1.0, 0.6, 0.2, 0.2, 0.2, 0.2]"),
        (2, 4, "[0.5, 1.0, 1.0, 0.6, 0.2, 0.2]"),
    ] {
        check(
            &format!(
                "{M}let n = m().compile(#{{ loss: \"mse\", optimizer: sgd(#{{ lr: 1.0 }}),
                    schedule: cosine(#{{ warmup: {warmup}, total: {total}, min_lr: 0.2 }}) }});
                 let rates = []; for i in 0..6 {{ rates.push(n.lr); n.train_step(x, y); }}
                 print(rates.map(|r| (r * 100.0).round() / 100.0));"
            ),
            &format!("{expected}\n"),
        );
    }
}

/// Found by the hostile-input audit: `compile(#{ dims: #{ B: 3, T: 4, hidden: 100 } })` dropped
/// `B` (the batch stayed 1, and the next call failed on a confusing shape) and ignored `hidden`
/// without a word; a top-level `lr` and the optimizer's `lr` silently gave way to one another,
/// and `ignore_index` was ignored by losses other than cross-entropy. Each is an error that says
/// what to write instead.
#[test]
fn compile_refuses_settings_it_would_ignore_or_that_conflict() {
    const M: &str = "model m(x: f32[B, T, 2], hidden = 8) { return linear(x, hidden) }
        model k(x: f32[B, 2]) { return linear(x, 3) }\n";
    let valid = "(the dimensions of model `m`'s inputs: T)";
    let cases = [
        (
            "m().compile(#{ dims: #{ B: 3, T: 4 } })".to_string(),
            "compile: `B` is the batch dimension: set it with `batch:`, as in \
             `compile(#{ batch: 32 })`, not in `dims`"
                .to_string(),
        ),
        (
            "m().compile(#{ dims: #{ T: 4, hidden: 100 } })".into(),
            format!(
                "compile: `hidden` is a hyperparameter of model `m`, not a dimension of its \
                 inputs: pass it to the model, as in `m(#{{ hidden: ... }})` {valid}"
            ),
        ),
        (
            "m().compile(#{ dims: #{ t: 4 } })".into(),
            format!(
                "compile: `dims` names `t`, which is not a dimension of model `m`'s inputs {valid}"
            ),
        ),
        (
            "k().compile(#{ dims: #{ T: 4 } })".into(),
            "compile: `dims` names `T`, which is not a dimension of model `k`'s inputs (model \
             `k` has no input dimensions to set besides the batch)"
                .into(),
        ),
        (
            "m(#{ T: 4 }).compile(#{ dims: #{ T: 4 } })".into(),
            "compile: dimension `T` is already set by the model's hyperparameters, \
             `m(#{ T: ... })`: set it in one place"
                .into(),
        ),
        (
            "m().compile(#{ dims: #{ T: -3 } })".into(),
            "compile: dimension `T` must be an integer in 1..=2147483648, got -3".into(),
        ),
        (
            "m().compile(#{ dims: #{ T: 2147483649 } })".into(),
            "compile: dimension `T` must be an integer in 1..=2147483648, got 2147483649".into(),
        ),
        (
            "k().compile(#{ lr: 0.1, optimizer: adam(#{ lr: 0.01 }) })".into(),
            "compile: the learning rate is given twice, as `lr: 0.1` and as the optimizer's \
             `lr: 0.01`: give it in one place"
                .into(),
        ),
        (
            "k().compile(#{ loss: \"mse\", ignore_index: 0 })".into(),
            "compile: `ignore_index` applies to the \"cross_entropy\" loss, not \"mse\": remove it"
                .into(),
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    check(
        &format!(
            "{M}let n = m().compile(#{{ batch: 3, dims: #{{ T: 4 }}, lr: 0.5, optimizer: sgd(#{{ lr: 0.5 }}) }});
             print(n.predict(zeros([3, 4, 2])).shape); print(n.lr);
             n.train_step(zeros([3, 4, 2]), tensor([[0, 1, 2, 3], [4, 5, 6, 7], [0, 0, 0, 0]], \"i32\"));"
        ),
        "[3, 4, 8]\n0.5\n",
    );
}

/// Found by the hostile-input audit: i32 tensors were computed through f32, so
/// `tensor([16777217, 1], "i32")` summed to 16777217.0, its `max` was 16777216.0 and `t + 0` an
/// f32 tensor `[16777216, 1]`; `tensor(16777216..16777220)` held duplicates; and `full([2],
/// 1e400)`, `t + 1e400` and `t[[1, 1]] = 1e400` stored infinity where 1e39 was refused. i32
/// tensors compute exactly, and every script number going into a tensor is checked the same way.
#[test]
fn i32_tensors_compute_exactly_and_script_numbers_convert_checked() {
    check(
        "let t = tensor([16777217, 1], \"i32\");
         print(t.sum()); print(t.max()); print(t.min()); print(t.mean());
         print(t + 0); print(t * 2 - 1); print(t[0]); let r = t.reshape([2, 1]); let r0 = r[0]; print(r0.item());
         print(tensor([2147483647, 2147483647, 2147483647], \"i32\").sum());
         print(tensor(16777216..16777220, \"i32\")); print(tensor(-2..=1, \"i32\"));
         print(tensor([16777216, 16777217], \"i32\").argmax());",
        "16777218.0\n16777217.0\n1.0\n8388609.0\n\
         tensor i32[2] [16777217, 1]\ntensor i32[2] [33554433, 1]\n16777217\n16777217.0\n\
         6442450941.0\n\
         tensor i32[4] [16777216, 16777217, 16777218, 16777219]\ntensor i32[4] [-2, -1, 0, 1]\n\
         tensor i32[] 1\n",
    );
    // i32 with i32 (or an integer) stays i32, except under `/` (true division, in f32); with
    // f32 or a float it is f32; to_f32() is the explicit conversion, and rounds.
    check(
        "let i = tensor([7, -7], \"i32\");
         print(i.div_floor(2)); print(i + tensor([[10], [20]], \"i32\")); print(-i); print(pow(i, 2));
         print(abs(i)); print(relu(i)); print(max(i, 0)); print(i + 0.5); print(i * tensor([0.5]));
         print(tensor([16777217], \"i32\").to_f32()); print(zeros([1]) + 16777216);",
        "tensor i32[2] [3, -4]\ntensor i32[2, 2] [[17, 3], [27, 13]]\ntensor i32[2] [-7, 7]\n\
         tensor i32[2] [49, 49]\ntensor i32[2] [7, 7]\ntensor i32[2] [7, 0]\n\
         tensor i32[2] [7, 0]\ntensor f32[2] [7.5, -6.5]\ntensor f32[2] [3.5, -3.5]\n\
         tensor f32[1] [16777216]\ntensor f32[1] [16777216]\n",
    );
    let inexact = "has no exact f32 value (f32 holds every integer up to 16777216 = 2^24, and \
                   only some beyond)";
    let convert = "keep the computation in i32 (integers), or convert with to_f32(), which rounds";
    let not_finite =
        "inf is not a finite number (a number beyond f64's range, such as 1e400, reads as infinity)";
    let on_purpose = "write an infinity on purpose as the string \"inf\" or \"-inf\"";
    let i32_range = "is outside i32's range (-2147483648..=2147483647)";
    let cases = [
        (
            "tensor(16777216..16777220)",
            format!("tensor: 16777217 {inexact}: make the tensor \"i32\", or write the number as a float to accept rounding"),
        ),
        ("tensor([16777217])", format!("tensor element: 16777217 {inexact}: make the tensor \"i32\", or write the number as a float to accept rounding")),
        ("full([2], -16777217)", format!("full: -16777217 {inexact}: make the tensor \"i32\", or write the number as a float to accept rounding")),
        ("zeros([2]) + 16777217", format!("`+`: 16777217 {inexact}: make the tensor \"i32\", or write the number as a float to accept rounding")),
        ("tensor([16777217], \"i32\") + 0.5", format!("`+`: the i32 element 16777217 {inexact}: {convert}")),
        ("tensor([1, -16777219], \"i32\") * zeros([2])", format!("`*`: the i32 element -16777219 {inexact}: {convert}")),
        ("tensor([16777217], \"i32\").exp()", format!("`exp`: the i32 element 16777217 {inexact}: {convert}")),
        ("tensor([2147483647], \"i32\") + 1", format!("`+` on i32 tensors: 2147483647 + 1 {i32_range}")),
        ("tensor([65536], \"i32\") * tensor([65536], \"i32\")", format!("`*` on i32 tensors: 65536 * 65536 {i32_range}")),
        ("tensor([1], \"i32\") * 4294967296", "`*`: must be an integer in -2147483648..=2147483647, got 4294967296".into()),
        ("tensor([1], \"i32\").div_floor(0)", "`div_floor` on i32 tensors: div_floor(1, 0) divides by zero".into()),
        ("-tensor([-2147483648], \"i32\")", "`-` on an i32 tensor: -(-2147483648) is outside i32's range".into()),
        ("pow(tensor([2], \"i32\"), 31)", format!("`pow` on i32 tensors: pow(2, 31) {i32_range}")),
        ("pow(tensor([2], \"i32\"), -1)", "`pow` on i32 tensors: pow(2, -1) has a negative exponent, and no i32 value: convert with to_f32() first".into()),
        ("tensor(2147483647..=2147483648, \"i32\")", "tensor: element must be an integer in -2147483648..=2147483647, got 2147483648".into()),
        ("full([2], 1e400)", format!("full: {not_finite}: {on_purpose}")),
        ("zeros([2]) + 1e400", format!("`+`: {not_finite}")),
        ("-1e400 * zeros([2])", format!("`*`: -{not_finite}")),
        (
            "let t = zeros([2, 2]); t[[1, 1]] = 1e400;",
            format!("tensor element: {not_finite}: {on_purpose}"),
        ),
        ("tensor([1.0, 1e400])", format!("tensor element: {not_finite}: {on_purpose}")),
    ];
    for (code, expected) in cases {
        check(code, &format!("error: {expected}\n"));
    }
}

/// Found while testing the i32 fix: a method called on a row (`t[1].sum()`, `t[0].item()`)
/// failed with "index of 1 numbers into a tensor of shape [2, 2]", because rhai writes the row
/// back through the index setter after a method call, and the setter took single elements only.
/// `t[i] = row` sets a row; writing back an unchanged row copies nothing.
#[test]
fn rows_can_be_used_and_set_through_an_index() {
    check(
        "let t = tensor([[1, 2], [3, 4]]); print(t[1].sum()); print(t[0].to_array());
         let i = tensor([[7], [8]], \"i32\"); print(i[1].item());
         t[0] = tensor([5, 6]); print(t); let u = t; u[-1] = zeros([2]); print(t); print(u);",
        "7.0\n[1.0, 2.0]\n8.0\ntensor f32[2, 2] [[5, 6], [3, 4]]\n\
         tensor f32[2, 2] [[5, 6], [3, 4]]\ntensor f32[2, 2] [[5, 6], [0, 0]]\n",
    );
    let cases = [
        (
            "let t = zeros([2, 2]); t[0] = tensor([1, 2, 3]);",
            "row 0 of a tensor f32[2, 2] takes a tensor f32[2], got f32[3]",
        ),
        (
            "let t = zeros([2, 2]); t[0] = tensor([1, 2], \"i32\");",
            "row 0 of a tensor f32[2, 2] takes a tensor f32[2], got i32[2]",
        ),
        (
            "let t = zeros([2, 2]); t[1] = 5;",
            "row 1 of a tensor f32[2, 2] takes a tensor f32[2], got i64",
        ),
        ("let t = zeros([2, 2]); t[2] = zeros([2]);", "row 2 is out of range for shape [2, 2]"),
    ];
    for (code, expected) in cases {
        check(code, &format!("error: {expected}\n"));
    }
}

/// A tensor's text shows at most 1000 elements: `print` of a tensor with many short axes built
/// a string of every element (gigabytes for a billion), and went through every index of a long
/// axis to skip all but six.
#[test]
fn printing_a_tensor_shows_at_most_a_thousand_elements() {
    let out = run("print(zeros([8, 8, 8, 8])); print(zeros([4, 4, 4, 4, 4, 4, 4, 4, 4, 4]));");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for line in lines {
        assert_eq!(line.matches('0').count(), 1000, "{line}");
        assert!(line.len() < 10_000 && line.ends_with(", ...]"), "{line}");
    }
    // Found by review: cut off inside the row before an elided middle, the text read
    // `..., ...`; one `...` stands for both.
    let line = run("print(zeros([9, 8, 7, 7]));");
    assert_eq!(line.matches('0').count(), 1000, "{line}");
    assert!(!line.contains("..., ...") && line.ends_with("0, ...], ...], ...], ...]\n"), "{line}");
    check(
        "print(zeros([2147483648, 0])); print(tensor(0..2000000)); print(tensor([[1, 2], [3, 4]]));",
        "tensor f32[2147483648, 0] []\ntensor f32[2000000] [0, 1, 2, ..., 1999997, 1999998, 1999999]\n\
         tensor f32[2, 2] [[1, 2], [3, 4]]\n",
    );
}

/// Found by review: after i32 tensors began computing exactly, `tensor([1, 2, 3], "i32") / 2`
/// divided toward zero (`[0, 1, 1]`), so `d.x / 255` of a text dataset's i32 bytes became 0 or 1
/// without a word, and `correct.sum() / n` was rhai's integer division, 0. `/` is true division
/// (f32, as in NumPy and PyTorch), `div_floor` divides integers on request, and reductions and
/// `item` are floats, exact for i32 tensors or an error past 2^53.
#[test]
fn i32_division_is_true_division_and_reductions_are_floats() {
    check(
        "let x = tensor([1, 2, 3, 255], \"i32\");
         print(x / 2); print(x / 255); print(1 / tensor([4], \"i32\")); print(x / tensor([2.0]));
         print(x / tensor([0, 1, 1, 1], \"i32\")); print((x / 2).dtype);
         let correct = tensor([1, 0, 1], \"i32\"); print(correct.sum() / 3);
         print(x.max() / 2); print(x.min()); print(x[3]); print(tensor([5], \"i32\").item() / 2);",
        "tensor f32[4] [0.5, 1, 1.5, 127.5]\n\
         tensor f32[4] [0.003921569, 0.007843138, 0.011764706, 1]\ntensor f32[1] [0.25]\n\
         tensor f32[4] [0.5, 1, 1.5, 127.5]\ntensor f32[4] [inf, 2, 3, 255]\nf32\n\
         0.6666666666666666\n127.5\n1.0\n255\n2.5\n",
    );
    // Integer division on request, rounding down as Python's `//` does.
    check(
        "let i = tensor([7, -7, 6, -6], \"i32\"); print(i.div_floor(2)); print(i.div_floor(-2));
         print(div_floor(7, tensor([2, -2], \"i32\")));
         print(tensor([-2147483648], \"i32\").div_floor(1));",
        "tensor i32[4] [3, -4, 3, -3]\ntensor i32[4] [-4, 3, -3, 3]\ntensor i32[2] [3, -4]\n\
         tensor i32[1] [-2147483648]\n",
    );
    let f64_exact = "is beyond 2^53 = 9007199254740992, past which a float (f64) does not hold \
                     every integer: reduce smaller parts of the tensor, or convert with to_f32() \
                     first to accept rounding";
    let cases = [
        (
            "tensor([16777217], \"i32\") / 2".to_string(),
            "`/`: the i32 element 16777217 has no exact f32 value (f32 holds every integer up to \
             16777216 = 2^24, and only some beyond): keep the computation in i32 (integers), or \
             convert with to_f32(), which rounds"
                .to_string(),
        ),
        (
            "tensor([-2147483648], \"i32\").div_floor(-1)".into(),
            "`div_floor` on i32 tensors: div_floor(-2147483648, -1) is outside i32's range \
             (-2147483648..=2147483647)"
                .into(),
        ),
        (
            "zeros([2]).div_floor(2)".into(),
            "`div_floor` divides integers: it takes i32 tensors and integers, got an f32 tensor \
             and an integer; convert an f32 tensor with to_i32() (which rounds toward zero) \
             first, or use `/` for true division"
                .into(),
        ),
        (
            "tensor([1], \"i32\").div_floor(2.0)".into(),
            "`div_floor` divides integers: it takes i32 tensors and integers, got an i32 tensor \
             and a float; convert an f32 tensor with to_i32() (which rounds toward zero) first, \
             or use `/` for true division"
                .into(),
        ),
        // 4194305 elements of 2^31 - 1: 9007201398030335, past 2^53.
        (
            "(zeros([4194305]).to_i32() + 2147483647).sum()".into(),
            format!("sum: the exact result 9007201398030335 {f64_exact}"),
        ),
        (
            "(zeros([4194305]).to_i32() - 2147483647).sum()".into(),
            format!("sum: the exact result -9007201398030335 {f64_exact}"),
        ),
    ];
    for (code, expected) in cases {
        check(&code, &format!("error: {expected}\n"));
    }
    // Exactly 2^53 is still exact: 4194304 elements of 2^31.
    check(
        "print((zeros([4194304]).to_i32() - 2147483647 - 1).sum().to_int());",
        "-9007199254740992\n",
    );
}

/// Found by review: arithmetic with a number (`x / 255.0`) went through the general
/// broadcasting iterator element by element, and ranges checked every element for f32
/// exactness. Operands of the result's element count or of one element are read in one flat
/// loop, ranges whose ends are exact are checked once; every path gives what broadcasting
/// defines, and the checks still name the first element that fails.
#[test]
fn elementwise_fast_paths_give_what_broadcasting_defines() {
    check(
        "print(tensor([[1, 2, 3]]) + tensor([10, 20, 30]));
         print(tensor([[1], [2]]) + tensor([10, 20, 30]));
         print(tensor([[1], [2]]) * tensor([3])); print(tensor([[1, 2], [3, 4]]) - 1.5);
         print(tensor([[1, 2], [3, 4]], \"i32\") * tensor([[2]], \"i32\"));
         print(tensor([[1, 2], [3, 4]], \"i32\") + tensor([10, 20], \"i32\"));
         print(2 - tensor([[1, 2], [3, 4]], \"i32\")); print(zeros([2, 0]) + zeros([1, 0]));
         print(-tensor([1, -2], \"i32\")); print(tensor([4.0, 9.0]).sqrt());",
        "tensor f32[1, 3] [[11, 22, 33]]\ntensor f32[2, 3] [[11, 21, 31], [12, 22, 32]]\n\
         tensor f32[2, 1] [[3], [6]]\ntensor f32[2, 2] [[-0.5, 0.5], [1.5, 2.5]]\n\
         tensor i32[2, 2] [[2, 4], [6, 8]]\ntensor i32[2, 2] [[11, 22], [13, 24]]\n\
         tensor i32[2, 2] [[1, 0], [-1, -2]]\ntensor f32[2, 0] []\ntensor i32[2] [-1, 2]\n\
         tensor f32[2] [2, 3]\n",
    );
    check(
        "print(tensor(-16777216..=-16777214)); print(tensor(16777214..=16777216));
         print(tensor(2147483646..=2147483647, \"i32\"));
         print(tensor(-2147483648..-2147483646, \"i32\")); print(tensor(5..2));",
        "tensor f32[3] [-16777216, -16777215, -16777214]\n\
         tensor f32[3] [16777214, 16777215, 16777216]\ntensor i32[2] [2147483646, 2147483647]\n\
         tensor i32[2] [-2147483648, -2147483647]\ntensor f32[0] []\n",
    );
    let inexact = "has no exact f32 value (f32 holds every integer up to 16777216 = 2^24, and \
                   only some beyond): make the tensor \"i32\", or write the number as a float to \
                   accept rounding";
    let cases = [
        ("tensor(16777215..16777219)", format!("tensor: 16777217 {inexact}")),
        ("tensor(-16777219..0)", format!("tensor: -16777219 {inexact}")),
        (
            "tensor(-2147483649..-2147483646, \"i32\")",
            "tensor: element must be an integer in -2147483648..=2147483647, got -2147483649"
                .into(),
        ),
        (
            "tensor([[2147483647], [1]], \"i32\") + tensor([0, 1], \"i32\")",
            "`+` on i32 tensors: 2147483647 + 1 is outside i32's range (-2147483648..=2147483647)"
                .into(),
        ),
    ];
    for (code, expected) in cases {
        check(code, &format!("error: {expected}\n"));
    }
}

/// Found by review: the options' f32 conversion (`lr`, `clip`, `gamma`, `min_lr`, `scale`,
/// `net.lr =`) let NaN and infinities through where tensor elements refused them, so
/// `compile(#{ lr: 0.0/0.0, optimizer: adam(#{ lr: 0.0/0.0 }) })` said "the learning rate is
/// given twice, as NaN and NaN"; and no script could put -inf into a tensor (an attention
/// mask). One conversion refuses NaN and infinities for both; an infinity meant is written as
/// the string "inf" or "-inf", while a float that overflowed (1e400) stays an error.
#[test]
fn options_refuse_nan_and_infinities_and_tensors_take_inf_written_as_a_string() {
    const M: &str = "model m(x: f32[B, 2]) { return linear(x, 3) }
        model s(x: f32[B, 2], s = 1.0) { return x * s }\n";
    let nan = "NaN is not a finite number";
    let inf = "inf is not a finite number (a number beyond f64's range, such as 1e400, reads as \
               infinity)";
    let cases = [
        (
            "m().compile(#{ lr: 0.0 / 0.0, optimizer: adam(#{ lr: 0.0 / 0.0 }) })".to_string(),
            format!("adam: `lr`: {nan}"),
        ),
        ("m().compile(#{ lr: 0.0 / 0.0 })".into(), format!("compile: `lr`: {nan}")),
        ("m().compile(#{ lr: 1e400 })".into(), format!("compile: `lr`: {inf}")),
        ("m().compile(#{ clip: 0.0 / 0.0 })".into(), format!("compile: `clip`: {nan}")),
        ("m().compile(#{ clip: 1e400 })".into(), format!("compile: `clip`: {inf}")),
        (
            "m().compile(#{ schedule: step_lr(#{ gamma: 1e400 }) })".into(),
            format!("step_lr: `gamma`: {inf}"),
        ),
        (
            "m().compile(#{ schedule: cosine(#{ min_lr: 0.0 / 0.0 }) })".into(),
            format!("cosine: `min_lr`: {nan}"),
        ),
        (
            "csv(\"scripts/data/blobs.csv\", #{ label_col: 2, scale: 0.0 / 0.0 })".into(),
            format!("csv: `scale`: {nan}"),
        ),
        ("let n = m().compile(); n.lr = 1e400;".into(), format!("lr: {inf}")),
        ("let n = m().compile(); n.lr = 0.0 / 0.0;".into(), format!("lr: {nan}")),
        ("zeros([2]) * (0.0 / 0.0)".into(), format!("`*`: {nan}")),
        ("tensor([0.0 / 0.0])".into(), format!("tensor element: {nan}")),
        // Found by the hostile-input audit: a hyperparameter reached the model as a NaN or an
        // infinite constant (`x * s` was NaN everywhere), where the model language and `--set`
        // refuse both; in a list too.
        ("s(#{ s: 0.0 / 0.0 })".into(), format!("hyperparameter `s`: {nan}")),
        ("s(#{ s: 1e400 })".into(), format!("hyperparameter `s`: {inf}")),
        ("s(#{ s: [1.0, -1e400] })".into(), format!("hyperparameter `s`: -{inf}")),
        (
            "full([2], \"-infinity\")".into(),
            "full: the value must be a number, or the string \"inf\" or \"-inf\" for an \
             infinity, got the string \"-infinity\""
                .into(),
        ),
        (
            "tensor([\"nan\"])".into(),
            "tensor elements must be numbers, got the string \"nan\" (the only strings taken are \
             \"inf\" and \"-inf\", for an infinity)"
                .into(),
        ),
        (
            "tensor([1, \"-inf\"], \"i32\")".into(),
            "tensor element -inf is not a whole number in i32's range (-2147483648..=2147483647)"
                .into(),
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    // An attention mask: -inf above the diagonal, and what softmax-style code does with it.
    check(
        "let mask = zeros([3, 3]);
         for i in 0..3 { for j in (i + 1)..3 { mask[[i, j]] = \"-inf\"; } }
         print(mask); print(full([2], \"inf\")); print(tensor([[0, \"-inf\"], [\"+inf\", 1]]));
         print((mask + 1.0).exp()); print(mask.max()); print(mask.min());",
        "tensor f32[3, 3] [[0, -inf, -inf], [0, 0, -inf], [0, 0, 0]]\ntensor f32[2] [inf, inf]\n\
         tensor f32[2, 2] [[0, -inf], [inf, 1]]\n\
         tensor f32[3, 3] [[2.7182817, 0, 0], [2.7182817, 2.7182817, 0], [2.7182817, 2.7182817, 2.7182817]]\n\
         0.0\n-inf\n",
    );
}

/// Found by review: `compile(#{ loss: "msee", ignore_index: 0 })` complained about
/// `ignore_index` before the misspelt loss; `batch:` on a model whose inputs have no `B` was
/// ignored; and a `B` passed to the model silently overrode `batch:` (training at the model's
/// `B`, and `predict` then worked at no other batch size), while a model's default `B` gave way
/// to `batch:`. `batch` sets `B`; a `B` passed to the model is the batch when `batch` is not
/// given, and the two may not differ; a model's default `B` is the batch when neither is given.
#[test]
fn the_batch_is_set_once_and_predict_works_at_any_batch_size() {
    const M: &str = "model m(x: f32[B, 2]) { return linear(x, 3) }
        model d(x: f32[B, 2], B = 4) { return linear(x, 3) }
        model k(x: f32[4, 2]) { return linear(x, 3) }\n";
    let cases = [
        (
            "m().compile(#{ loss: \"msee\", ignore_index: 0 })",
            "unknown loss `msee`: expected \"cross_entropy\", \"mse\" or \"output\"",
        ),
        (
            "m().compile(#{ loss: \"output\", ignore_index: 0 })",
            "compile: `ignore_index` applies to the \"cross_entropy\" loss, not \"output\": \
             remove it",
        ),
        (
            "m(#{ B: 1 }).compile(#{ batch: 2 })",
            "compile: the batch size is given twice, as `batch: 2` and as `m(#{ B: 1 })`: give \
             it once (`batch` sets `B`)",
        ),
        (
            "d(#{ B: 3 }).compile(#{ batch: 2 })",
            "compile: the batch size is given twice, as `batch: 2` and as `d(#{ B: 3 })`: give \
             it once (`batch` sets `B`)",
        ),
        (
            "k().compile(#{ batch: 4 })",
            "compile: `batch: 4` sets the batch dimension `B`, and model `k`'s inputs have none: \
             remove `batch`, or name the inputs' batch dimension `B`",
        ),
    ];
    for (code, expected) in cases {
        check(&format!("{M}{code}"), &format!("error: {expected}\n"));
    }
    // The batch each way of giving it trains at (the input a training step takes), and predict
    // at other batch sizes.
    check(
        &format!(
            "{M}fn fits(n, b) {{
                 try {{ n.train_step(zeros([b, 2]), zeros([b]).to_i32()); return true; }}
                 catch {{ return false; }}
             }}
             for n in [m(#{{ B: 2 }}).compile(), m(#{{ B: 2 }}).compile(#{{ batch: 2 }}),
                       d().compile(), d().compile(#{{ batch: 2 }}), d(#{{ B: 5 }}).compile(),
                       m().compile()] {{
                 let b = []; for x in [1, 2, 4, 5] {{ if fits(n, x) {{ b.push(x); }} }}
                 print(`${{b}} ${{n.predict(zeros([3, 2])).shape}} ${{n.predict(zeros([1, 2])).shape}}`);
             }}
             let t = k().compile(); print(t.predict(zeros([4, 2])).shape);"
        ),
        "[2] [3, 3] [1, 3]\n[2] [3, 3] [1, 3]\n[4] [3, 3] [1, 3]\n[2] [3, 3] [1, 3]\n\
         [5] [3, 3] [1, 3]\n[1] [3, 3] [1, 3]\n[4, 3]\n",
    );
}

/// Found by review: `set_param` between the micro-batches of an accumulated update was
/// accepted (the update then applied gradients taken at the old values to the new ones), while
/// `save` and `load` were refused there. It is refused the same way.
#[test]
fn set_param_between_micro_batches_is_refused_like_save_and_load() {
    check(
        "model m(x: f32[B, 2]) { return linear(x, 3) as fc }
         let n = m().compile(#{ batch: 2, accumulate: 2, loss: \"mse\" });
         let x = zeros([2, 2]); let y = zeros([2, 3]);
         n.set_param(\"fc.bias\", ones([3])); print(n.param(\"fc.bias\"));
         n.train_step(x, y);
         try { n.set_param(\"fc.bias\", zeros([3])); } catch (e) { print(e); }
         print(n.param(\"fc.bias\"));
         n.train_step(x, y); n.set_param(\"fc.bias\", zeros([3])); print(n.param(\"fc.bias\"));
         n.train_step(x, y); n.set_param(\"fc.bias\", ones([3]));",
        "tensor f32[3] [1, 1, 1]\n\
         cannot set_param with 1 of 2 micro-batches of the next update accumulated (their \
         gradients were taken at the parameters' current values, and the update would apply them \
         to the new ones); set_param after a multiple of 2 train_step calls\n\
         tensor f32[3] [1, 1, 1]\ntensor f32[3] [0, 0, 0]\n\
         error: cannot set_param with 1 of 2 micro-batches of the next update accumulated (their \
         gradients were taken at the parameters' current values, and the update would apply them \
         to the new ones); set_param after a multiple of 2 train_step calls\n",
    );
}

/// Found by the hostile-input audit: batch norm trained over one value per channel (a batch of
/// 1 on `[B, C]`), whose normalized output is 0: the model learned nothing and said nothing
/// (PyTorch refuses it). Refused when the training step is built; a batch of 2 trains.
#[test]
fn batch_norm_over_one_value_per_channel_is_refused_for_training() {
    let model = "model m(x: f32[B, 2]) { return batch_norm(linear(x, 3) as fc) as bn }";
    let mut e = rumus::Engine::new();
    e.run(model).unwrap();
    let err = e.eval("m().compile(#{ batch: 1 })").unwrap_err();
    let expected = "batch_norm in training averages 1 value per channel (shape [1, 3]): its batch statistics need at least 2; train with a larger batch";
    assert!(err.message.ends_with(expected), "{err}");
    e.run("let n = m().compile(#{ batch: 2 });").unwrap();
}

/// `max(a, b)`, `min(a, b)` and `relu` of a NaN were the other operand (`f32::max` drops a
/// NaN), where the reductions, the model language's `maximum`, NumPy and PyTorch give NaN.
#[test]
fn elementwise_max_min_and_relu_keep_nan() {
    let nan = "let nan = tensor([1.0, -1.0]).ln();";
    check(
        &format!("{nan} print(max(nan, 0.0)); print(max(0, nan));"),
        "tensor f32[2] [0, NaN]\ntensor f32[2] [0, NaN]\n",
    );
    check(
        &format!("{nan} print(min(nan, zeros([2]))); print(min(1.0, nan));"),
        "tensor f32[2] [0, NaN]\ntensor f32[2] [0, NaN]\n",
    );
    check(
        &format!("{nan} print(nan.relu()); print(nan.max()); print(nan.min());"),
        "tensor f32[2] [0, NaN]\nNaN\nNaN\n",
    );
    // Ties and signed zeros as the graph's `maximum` and `relu`: the first operand on a tie.
    check(
        "print(tensor([-0.0]).relu().to_array()); print(max(tensor([-2.0, 3.0]), 1));",
        "[-0.0]\ntensor f32[2] [1, 3]\n",
    );
}

/// `len` of a tensor of rank 0 was 1; it has no first dimension (NumPy and PyTorch refuse too).
#[test]
fn len_of_a_tensor_of_rank_0_is_an_error() {
    check(
        "zeros([]).len()",
        "error: len: a tensor of shape [] (rank 0) has no first dimension; numel() counts its element\n",
    );
    check(
        "print(zeros([]).numel()); print(zeros([0, 3]).len()); print(tensor([[1, 2]]).len());",
        "1\n0\n1\n",
    );
}

/// Found by audit: a model was instantiated once with its free dimensions at 1 to surface
/// mistakes early, and so refused models that need a free dimension above 1 (`x @ x` of an
/// `f32[B, 4]` at batch 4, `B / 2`), naming shapes of a batch of 1 the script never asked for.
/// Such a model is accepted, and lowered at its real sizes by `compile` and `predict`, which
/// report a mistake with them; the model's own mistakes still surface at the call.
#[test]
fn a_model_that_needs_a_free_dimension_above_1_is_accepted_and_checked_at_its_sizes() {
    const M: &str = "model sq(x: f32[B, 4]) { return x @ x }
        model half(x: f32[B, 4]) { return reshape(x, [B / 2, 8]) }
        model bad(x: f32[B, 4]) { return linear(x, 2.5) }\n";
    check(
        &format!(
            "{M}let t = sq().compile(#{{ batch: 4, loss: \"mse\" }});
             print(t.predict(ones([4, 4])));
             print(half().compile(#{{ batch: 2, loss: \"mse\" }}).predict(tensor([[1, 2, 3, 4], [5, 6, 7, 8]])));
             try {{ sq().compile(#{{ batch: 3, loss: \"mse\" }}); }} catch (e) {{ print(e.message); }}
             try {{ t.predict(ones([3, 4])); }} catch (e) {{ print(e.message); }}
             try {{ half().compile(#{{ batch: 3, loss: \"mse\" }}); }} catch (e) {{ print(e.message); }}
             bad()"
        ),
        "tensor f32[4, 4] [[4, 4, 4, 4], [4, 4, 4, 4], [4, 4, 4, 4], [4, 4, 4, 4]]\n\
         tensor f32[1, 8] [[1, 2, 3, 4, 5, 6, 7, 8]]\n\
         matmul: inner dimensions differ: [3, 4] @ [3, 4] (4 vs 3)\n\
         matmul: inner dimensions differ: [3, 4] @ [3, 4] (4 vs 3)\n\
         `B / 2` is `3 / 2`, not a whole number\n\
         error: in `linear`: a dimension must be an integer, got a number\n",
    );
}

/// A message that names the type of a value the script gave names it as scripts know it: the
/// API's types by their registered names, where messages said "got
/// rumus::script::api::tensor::ScriptTensor".
#[test]
fn messages_name_the_scripts_own_types() {
    let m = "model m(x: f32[B, 2], h = 3) { return linear(x, h) as fc }\n";
    for (code, expected) in [
        ("let x = zeros([3]); x[0] = zeros([3]);", "tensor elements must be numbers, got Tensor"),
        ("tensor([zeros([1])])", "tensor elements must be numbers, got Tensor"),
        ("exit(zeros([1]))", "exit takes an integer code (0 to 255) or a message, got Tensor"),
        (
            "csv(\"scripts/data/blobs.csv\", #{ scale: zeros([1]) })",
            "csv: `scale` must be a number, got Tensor",
        ),
        (
            "m(#{ h: \"wide\" })",
            "hyperparameter `h` must be a number, a boolean or a list, got string",
        ),
        (
            "m(#{ h: zeros([1]) })",
            "hyperparameter `h` must be a number, a boolean or a list, got Tensor",
        ),
        (
            "m().compile(#{ batch: 2 }).train_step(#{ x: zeros([2, 2]), target: m() })",
            "`target` must be a tensor, got Model",
        ),
        (
            "m().compile(#{ optimizer: adam(#{ groups: [m().compile()] }) })",
            "adam: groups[0] must be a map like #{ params: [\"*.bias\"], weight_decay: 0.0 }, got \
             Trainer",
        ),
    ] {
        check(&format!("{m}{code}"), &format!("error: {expected}\n"));
    }
}

/// Found by the hostile-input audit: `log_metric("loss", v)` was drawn into the training
/// loss's own curve (`rumus plot` and `--plot` read a metric named `loss` as steps' losses,
/// its points among theirs), and an empty name drew a panel without a title.
#[test]
fn a_metric_named_loss_or_nothing_is_refused() {
    check(
        "log_metric(\"loss\", 0.5);",
        "error: log_metric: `loss` is the training loss's curve, which every step logs; give the metric another name, such as \"val_loss\"\n",
    );
    check("log_metric(\"loss\", 1);", &run("log_metric(\"loss\", 0.5);"));
    for name in ["", "  "] {
        check(
            &format!("log_metric(\"{name}\", 0.5);"),
            "error: log_metric: the metric's name is empty; give it a name, as in log_metric(\"val_loss\", v)\n",
        );
    }
    check("log_metric(\"val_loss\", 0.5); log_metric(\"losses\", 2); print(1);", "1\n");
}

/// Found by the hostile-input audit: the positional forms feed a model's first input, so of a
/// model of two inputs `x` and `y`, `predict(x)` said "input `y` was not fed" (as if the labels
/// were missing), and of a model of none "the model has no input `` (inputs: )".
#[test]
fn positional_feeds_need_a_model_of_one_input() {
    let two = "model m(x: f32[B, 2], y: f32[B, 2]) { return linear(x + y, 2) }
let t = m().compile(#{ batch: 2 }); let x = zeros([2, 2]); let l = tensor([0, 1], \"i32\");\n";
    let scored = "it scores models of one input; score the outputs of net.predict(#{ input: x, ... }) instead";
    let has = "feeds x to a model's one input, and this model has 2, `x`, `y`";
    for (call, advice) in [
        ("train_step(x, l)", "give the inputs by name, with the labels as `target`: net.train_step(#{ input: x, ..., target: y })"),
        ("predict(x)", "give the inputs by name: net.predict(#{ input: x, ... })"),
        ("evaluate(x, l)", scored),
        ("evaluate(dataset(x, l))", scored),
        ("accuracy(x, l)", scored),
    ] {
        let name = &call[..call.find('(').unwrap()];
        check(&format!("{two}t.{call}"), &format!("error: net.{name}(x, ..) {has}: {advice}\n"));
    }
    check(&format!("{two}print(t.predict(#{{ x: x, y: x }}).len());"), "1\n");
    let none = "model m(n = 2) { param p[2] = ones\n return sum(p * p, [0]) }
let t = m().compile(#{ loss: \"output\" }); print(t.train_step(#{}));\n";
    check(
        &format!("{none}t.train_step(zeros([1]), zeros([1]))"),
        "2.0\nerror: net.train_step(x, ..) feeds x to a model's one input, and this model has none: give the inputs by name, with the labels as `target`: net.train_step(#{ input: x, ..., target: y })\n",
    );
}

/// `rand` draws in `[0, 1)`: an f64 draw rounded to f32 gave exactly 1.0 about once in 2^25
/// (element 236634 of seed 48 did); the reduction over 2^22 draws of several seeds would
/// see it.
#[test]
fn rand_stays_in_zero_to_one_and_randn_is_reproducible() {
    check("print(rand([236635], 48)[236634] < 1.0);", "true\n");
    check(
        "let ok = true; for s in 0..8 { let r = rand([1 << 22], s); ok = ok && r.max() < 1.0 && r.min() >= 0.0; } print(ok);",
        "true\n",
    );
    check(
        "print(rand([3], 5) == rand([3], 5)); print(rand([3], 5) == rand([3], 6));",
        "true\nfalse\n",
    );
}

/// A property that cannot be written refuses a write through it: rhai dropped a write made
/// through a getter without a setter, so `d.x[[0, 0]] = 99` changed a copy and the script went
/// on as if it had worked.
#[test]
fn read_only_properties_refuse_writes_to_them_and_their_elements() {
    let copy = "is read-only (writing it, or an element of it, would change a copy)";
    let data = "let d = dataset(tensor([[0, 0], [0, 1]]), tensor([0, 1], \"i32\"));";
    let new = "make a new dataset with `dataset(x, y)`";
    for (code, expected) in [
        (format!("{data} d.x[[0, 0]] = 99;"), format!("`x` of a Dataset {copy}: {new}")),
        (format!("{data} d.y = zeros([2]);"), format!("`y` of a Dataset {copy}: {new}")),
        (
            format!("{data} let b = d.batches(2, 1); b[0].x[[0, 0]] = 7;"),
            format!("`x` of a Batch {copy}: {new}"),
        ),
        (
            "let t = zeros([2, 3]); t.shape[0] = 5;".into(),
            format!("`shape` of a Tensor {copy}: use `t.reshape(shape)`"),
        ),
        (
            "let t = zeros([2]); t.dtype = \"i32\";".into(),
            format!("`dtype` of a Tensor {copy}: use `t.to_f32()` or `t.to_i32()`"),
        ),
        (
            "try { zeros([2]).reshape([3]) } catch (e) { e.line = 3 }".into(),
            format!("`line` of a Error {copy}: `throw` a new error to change it"),
        ),
    ] {
        let out = run(&code);
        assert!(out.ends_with(&format!("{expected}\n")), "script:\n{code}\ngave:\n{out}");
    }
    // Reading through them still works, and the data is unchanged by the refused write.
    check(
        &format!("{data} try {{ d.x[[0, 1]] = 9 }} catch {{}} print(d.x[1]); print(zeros([2, 3]).shape[1]);"),
        "tensor f32[2] [0, 1]\n3\n",
    );
    // A method that takes its value by reference (rhai writes the value back after it) reads
    // through every read-only property: they were refused as writes.
    check(
        &format!(
            "{data} print(zeros([2, 3]).shape.len()); print(d.y.sum()); print(d.x.numel()); \
             print(d.classes.len()); for b in d.batches(2, 1) {{ print(b.y.numel()); }} \
             try {{ zeros([2]).reshape([3]) }} catch (e) {{ print(e.message.len() > 0); print(e.line.to_string()); }}"
        ),
        "2\n1.0\n4\n0\n2\ntrue\n\n",
    );
    // A method that changes the value is still a write.
    let out = run("let t = zeros([2, 3]); t.shape.push(4);");
    assert!(
        out.ends_with(&format!("`shape` of a Tensor {copy}: use `t.reshape(shape)`\n")),
        "{out}"
    );
}

/// Found by the hostile-input audit: the reference's own `div_floor(-7, 2)` was "function not
/// found", and so was `pow` of two numbers, which it says takes numbers.
#[test]
fn div_floor_and_pow_take_two_numbers() {
    for (code, expected) in [
        ("div_floor(-7, 2)", "-4"),
        ("(-7).div_floor(2)", "-4"),
        ("div_floor(7, -2)", "-4"),
        ("div_floor(6, 3)", "2"),
        ("pow(2, 10)", "1024"),
        ("pow(2.0, 0.5) == sqrt(2.0)", "true"),
        ("pow(2, 0.5) == pow(2.0, 0.5)", "true"),
        ("pow(2.0, -1)", "0.5"),
        ("div_floor(1, 0)", "error: div_floor(1, 0) divides by zero"),
        ("div_floor(-9223372036854775807 - 1, -1)", "error: div_floor(-9223372036854775808, -1) overflows"),
        ("pow(10, 30)", "error: pow(10, 30) overflows a script integer"),
        ("pow(2, -1)", "error: pow(2, -1): a negative or huge integer exponent; write pow(2.0, -1) for a float"),
    ] {
        check(&format!("print({code});"), &format!("{expected}\n"));
    }
}

/// `tensor` reads arrays as deep as a tensor has dimensions, so `to_array` of any tensor reads
/// back; one level deeper is an error (the bound was 16, checked a level late, while tensors
/// have up to 32 dimensions).
#[test]
fn tensor_reads_back_to_array_of_every_rank() {
    let ones = |n: usize| format!("[{}]", vec!["1"; n].join(", "));
    check(&format!("let t = zeros({}); print(tensor(t.to_array()) == t);", ones(32)), "true\n");
    check(
        "let a = 0; for i in 0..33 { a = [a]; } tensor(a)",
        "error: tensor: arrays nested more than 32 deep, the most dimensions a tensor has\n",
    );
    check("let a = 0; for i in 0..32 { a = [a]; } print(tensor(a).rank());", "32\n");
}

/// Found by metamorphic testing: a dropout's mask hashed only its seed, the step and the
/// element, so `dropout(h, 0.5, 3)` inside `repeat` dropped the same elements in every layer,
/// as did a block with a dropout called twice. Each dropout draws its own mask now (the first
/// with a seed keeps it): the squared difference of two layers' masks of 1000 ones scaled by 2
/// is about 1000 · 1/2 · 4 = 2000, where it was 0; one dropout alone is as it was.
#[test]
fn each_dropout_draws_its_own_mask() {
    let code = "model rep(x: f32[B, 1000]) {
    a = x * 0.0
    b = x * 0.0
    repeat 2 as layers {
        b = a
        a = dropout(x, 0.5, 3)
    }
    d = a - b
    return sum(d * d, [0, 1])
}
block drop(x) { return dropout(x, 0.5, 3) }
model twice(x: f32[B, 1000]) {
    d = drop(x) - drop(x)
    return sum(d * d, [0, 1])
}
model once(x: f32[B, 1000]) { return sum(dropout(x, 0.5, 3), [0, 1]) }
for m in [rep(), twice()] {
    let n = m.compile(#{ batch: 1, loss: \"output\", optimizer: sgd(#{ lr: 0.0 }), device: \"cpu\" });
    print(n.train_step(#{ x: ones([1, 1000]) }));
}
let n = once().compile(#{ batch: 1, loss: \"output\", optimizer: sgd(#{ lr: 0.0 }), device: \"cpu\" });
print(n.train_step(#{ x: ones([1, 1000]) }));
";
    let out = run(code);
    let v: Vec<f64> = out.lines().map(|l| l.parse().unwrap_or(f64::NAN)).collect();
    assert_eq!(v.len(), 3, "{out}");
    for d in &v[..2] {
        assert!((1700.0..2300.0).contains(d), "{out}");
    }
    // The mask of seed 3 at the first step, 0 (rumus::cpu::dropout_keep), as before: kept
    // elements times 2.
    let kept = (0..1000).filter(|&i| rumus::cpu::dropout_keep(3, 0, i, 0.5)).count();
    assert_eq!(v[2], 2.0 * kept as f64, "{out}");
}

/// Found by the hostile-input audit: `print` showed the shortest text that reads back as each
/// f32, which for a whole number can be one the tensor does not hold (2^31 as 2147483600).
/// Whole numbers show their digits, very large and very small magnitudes an exponent.
#[test]
fn printed_tensors_show_the_numbers_they_hold() {
    check(
        "print(tensor([2147483648.0, 123456789.0, 1e20, -1e-30, 0.5, 3.0, 1.5e-5, 16777217.0]));",
        "tensor f32[8] [2147483648, 123456792, 1e20, -1e-30, 0.5, 3, 0.000015, 16777216]\n",
    );
}

/// A parameter shaped by the batch dimension fits only the compiled batch: `predict` at another
/// said "`s` is f32[3, 2] (6 elements), got 8 elements", now which parameter and why.
#[test]
fn predict_names_a_parameter_shaped_by_the_batch() {
    let out = run("model m(x: f32[B, 2]) {
    param s[B, 2] = ones
    return linear(x * s, 2) as fc
}
let net = m().compile(#{ batch: 4, device: \"cpu\" });
print(net.predict(zeros([4, 2])).shape);
try { net.predict(zeros([3, 2])) } catch (e) { print(e.message) }
");
    assert_eq!(
        out,
        "[4, 2]\npredict at a batch of 3: `s` is [4, 2] in the trained model and would be [3, 2] \
         here: its shape follows the batch dimension `B`, so the model predicts only at the batch \
         it was compiled with; predict at that batch, or give `s` a shape without `B`\n"
    );
}

/// Found by differential testing at numeric extremes (each where the exact answer is plain):
/// - batch norm's gradient took rsqrt's derivative as y³, which underflows for a variance of
///   1e28: `batch_norm(x * p)` does not depend on p, yet dL/dp was 1.25 at a scale of 1e16;
/// - the CPU's attention took its probabilities from the stored log-sum-exp, whose `ln n`
///   rounds away beside tied scores of 1e8: the output summed the values instead of averaging;
/// - the CPU's LayerNorm rounded a row's f64 sum to f32 before dividing: rows of 3e38 (mean
///   3e38, within f32) normalized to NaN instead of 0.
#[test]
fn gradients_and_statistics_hold_at_extreme_scales() {
    let out = run("model bnscale(x: f32[B, 1], c: f32[B, 1]) {
    param p[1] = ones
    y = batch_norm(x * p) as bn
    return sum(y * c, [0, 1])
}
let net = bnscale().compile(#{ batch: 4, loss: \"output\", optimizer: sgd(#{ lr: 1.0 }), device: \"cpu\" });
net.train_step(#{ x: tensor([[1.0], [2.0], [3.0], [5.0]]) * 1e16, c: tensor([[0.3], [-0.9], [0.5], [0.7]]) });
print((1.0 - net.param(\"p\")[0]).abs() < 1e-5);
model attm(q: f32[B, 1, 5, 1], k: f32[B, 1, 5, 1], v: f32[B, 1, 5, 1]) { return attention(q, k, v) }
let a = attm().compile(#{ batch: 1, loss: \"mse\", device: \"cpu\" });
let q = full([1, 1, 5, 1], 1e4);
let o = a.predict(#{ q: q, k: q, v: tensor([1.0, 2.0, 3.0, 4.0, 5.0]).reshape([1, 1, 5, 1]) });
print(o[o.keys()[0]].reshape([5]));
model lnm(x: f32[B, 4]) { return layer_norm(x) as ln }
let l = lnm().compile(#{ batch: 2, loss: \"mse\", device: \"cpu\" });
print(l.predict(tensor([[3e38, 3e38, 3e38, 3e38], [-2e38, -2e38, -2e38, -2e38]])));
");
    assert_eq!(
        out,
        "true\ntensor f32[5] [1, 1.5, 2, 2.5, 3]\ntensor f32[2, 4] [[0, 0, 0, 0], [0, 0, 0, 0]]\n"
    );
}
