//! `rumus graph`: parameter listing, DOT output, and exit codes.

use std::process::Command;

fn rumus(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rumus")).args(args).output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), s(out.stdout), s(out.stderr))
}

#[test]
fn gpt_params_have_the_expected_dotted_names() {
    let (code, out, _) = rumus(&["graph", "scripts/gpt.rms", "--params"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap()).collect();
    let mut expected = vec!["wte.weight".to_string(), "wpe.weight".to_string()];
    for i in 0..2 {
        for n in [
            "ln1.weight",
            "ln1.bias",
            "attn.qkv.weight",
            "attn.qkv.bias",
            "attn.proj.weight",
            "attn.proj.bias",
        ] {
            expected.push(format!("blocks.{i}.{n}"));
        }
        for n in [
            "ln2.weight",
            "ln2.bias",
            "mlp.fc.weight",
            "mlp.fc.bias",
            "mlp.proj.weight",
            "mlp.proj.bias",
        ] {
            expected.push(format!("blocks.{i}.{n}"));
        }
    }
    expected.extend(["ln_f.weight", "ln_f.bias", "head.weight", "head.bias"].map(String::from));
    assert_eq!(names, expected);
    assert!(out.contains("blocks.1.mlp.fc.weight [64, 256] xavier\n"));
    assert!(out.starts_with("wte.weight [65, 64] normal(0, 0.02)\n"));
}

#[test]
fn without_params_prints_dot() {
    let (code, out, _) = rumus(&["graph", "scripts/gpt.rms", "--model", "gpt"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("digraph \"gpt\" {"));
    assert!(out.contains("-> out_logits;"));
}

#[test]
fn a_mistake_exits_1_with_the_rendered_error() {
    let dir = crate::common::ScratchDir::new("cli");
    let path = dir.join("bad.rms");
    std::fs::write(&path, "model m(x: f32[2]) {\n    return relux(x)\n}\n").unwrap();
    let p = path.to_str().unwrap();
    let (code, _, err) = rumus(&["graph", p]);
    assert_eq!(code, 1);
    assert_eq!(err, format!("{p}:2:12: unknown op or block `relux`\n        return relux(x)\n               ^^^^^\n"));
    let (code, _, _) = rumus(&["graph", "/no/such/file.rms"]);
    assert_eq!(code, 2);
    let (code, _, _) = rumus(&["graph"]);
    assert_eq!(code, 2);
}

/// Found by the hostile-input audit (round 7): `--set` flags are checked for repeats by name.
/// Each searched the flags before it, so 70,000 of them (as many as a command line of 2 MiB
/// holds) took about 7 s before the mistake at the last was found.
#[test]
fn many_set_flags_are_checked_for_repeats_quickly() {
    let dir = crate::common::ScratchDir::new("cli_many_sets");
    let path = dir.join("m.rms");
    std::fs::write(&path, "model m(x: f32[B, 2]) {\n    return x\n}\n").unwrap();
    let p = path.to_str().unwrap();
    let sets: Vec<String> = (0..70_000).map(|i| format!("--set=a{i}=2")).collect();
    let mut args = vec!["graph", p];
    args.extend(sets.iter().map(String::as_str));
    args.extend(["--set", "a0=3"]);
    let (code, _, err) = rumus(&args);
    assert_eq!((code, err.as_str()), (2, "--set a0 is given twice (2 and 3): give it once\n"));
}

/// Found by the fourth hostile-input audit: `rumus graph` drew a model at free dimensions 1 and
/// had no `--set`, so a model valid only at a larger size (`x @ x` of `f32[B, 4]`, B = 4) could
/// not be drawn. `--set` works as for `rumus plan` (one implementation), and the error at the
/// default size says to use it.
#[test]
fn graph_sets_dimensions_and_hyperparameters_as_plan_does() {
    let dir = crate::common::ScratchDir::new("cli_set");
    let path = dir.join("sq.rms");
    std::fs::write(
        &path,
        concat!(
            "model sq(x: f32[B, 4]) {\n    return x @ x\n}\n",
            "model lin(x: f32[B, 2], hidden = 3) {\n    return linear(x, hidden)\n}\n",
            "model keep(x: f32[2, 3], k = false) {\n    return sum(x, [1], keepdim = k)\n}\n",
        ),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (code, out, err) = rumus(&["graph", p, "--model", "sq", "--set", "B=4"]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(out.starts_with("digraph \"sq\" {") && out.contains("[4, 4]"), "{out}");
    // Without the size: the error at B = 1 says how to give it.
    let (code, _, err) = rumus(&["graph", p, "--model", "sq"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with(&format!("{p}:2:12: "))
            && err.contains("(dimensions that --set does not give are 1 here: give their sizes with --set NAME=VALUE)"),
        "{err}"
    );
    // A boolean hyperparameter: `true` and `false` are values (it said "must be a finite
    // number").
    for (k, shape) in [("true", "[2, 1]"), ("false", "[2]")] {
        let (code, out, err) = rumus(&["graph", p, "--model", "keep", "--set", &format!("k={k}")]);
        assert_eq!((code, err.as_str()), (0, ""), "k={k}");
        assert!(out.contains(shape), "k={k}: {out}");
    }
    // A hyperparameter, and the same `--set` rules and messages as `rumus plan`.
    let (code, out, _) = rumus(&["graph", p, "--model", "lin", "--set", "hidden=5", "--params"]);
    assert_eq!(code, 0);
    assert!(out.contains(" [2, 5] ") && out.contains(" [5] "), "{out}");
    for command in ["graph", "plan"] {
        let twice = [command, p, "--model", "lin", "--set", "hidden=5", "--set", "hidden=6"];
        let (code, _, err) = rumus(&twice);
        assert_eq!(
            (code, err.as_str()),
            (2, "--set hidden is given twice (5 and 6): give it once\n")
        );
        let (code, _, err) = rumus(&[command, p, "--set", "B"]);
        assert_eq!((code, err.as_str()), (2, "--set: needs NAME=VALUE, got `B`\n"));
        let (code, _, err) = rumus(&[command, p, "--model", "lin", "--set", "hidden=x"]);
        assert_eq!(
            (code, err.as_str()),
            (2, "--set hidden=x: the value must be a finite number, true or false\n")
        );
        // An integer past i64 was read as a float: "must be an integer, got a number".
        let huge = [command, p, "--model", "lin", "--set", "B=99999999999999999999"];
        let (code, _, err) = rumus(&huge);
        assert_eq!(
            (code, err.as_str()),
            (
                2,
                "--set B=99999999999999999999: the integer is beyond the largest a model takes, \
                 9223372036854775807\n"
            )
        );
        // A dimension out of range names itself and where its value came from (the caret is
        // on the model's `B`, where no 0 is written).
        let (code, _, err) = rumus(&[command, p, "--model", "lin", "--set", "B=0"]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(": dimension `B` of input `x` must be between 1 and 2147483648, got 0 (the value given for `B`, as by `--set B=...`, `dims` or `batch`)\n"),
            "{err}"
        );
    }
    // Two models and no `--model`: `graph` asks for one (`plan` takes the first).
    let (code, _, err) = rumus(&["graph", p, "--set", "B=4"]);
    assert_eq!(
        (code, err.as_str()),
        (2, format!("{p} has several models (sq, lin, keep); pick one with --model\n").as_str())
    );
}

/// Found by the hostile-input audit: an error of the planner or the code generator (here a
/// LayerNorm wider than the GPU kernels take) named no place and no way out.
#[test]
fn a_plan_error_points_at_its_op_and_says_what_to_do() {
    let dir = crate::common::ScratchDir::new("cli-plan");
    let path = dir.join("wide.rms");
    std::fs::write(
        &path,
        "model m(x: f32[B, 10000], B = 2) {\n    return layer_norm(x) as ln\n}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (code, _, err) = rumus(&["plan", p]);
    assert_eq!(code, 1);
    let message = "layer_norm over a last axis of 10000: the GPU's LayerNorm kernels take 1 to 8192; run this model on the CPU (--device cpu)";
    assert_eq!(err, format!("{p}:2:12: {message}\n        return layer_norm(x) as ln\n               ^^^^^^^^^^^^^^^^^^^\n"));
}

/// Found by the hostile-input audit: a model input named `target`, or a parameter under a block
/// called `optim`, took a name rumus gives its own values and failed as "duplicate name" at the
/// script's `compile`. The error is at the model's declaration and says which name is reserved.
#[test]
fn a_model_value_with_a_name_rumus_uses_itself_is_refused_at_its_declaration() {
    let dir = crate::common::ScratchDir::new("cli-reserved");
    let cases = [
        (
            "model m(x: f32[B, 4], target: f32[B, 4], B = 2) {\n    return linear(x + target, 3)\n}\n",
            "1:23: the model's input `target` takes a name rumus gives its own input",
            "    model m(x: f32[B, 4], target: f32[B, 4], B = 2) {\n                          ^^^^^^\n",
        ),
        (
            "block optim(x) {\n    param step[1] = zeros\n    return x * step\n}\nmodel m(x: f32[B, 4], B = 2) {\n    return linear(optim(x) as optim, 3)\n}\n",
            "2:5: the model's parameter `optim.step` takes a name rumus gives its own state",
            "        param step[1] = zeros\n        ^^^^^^^^^^^^^^^^^^^^^\n",
        ),
    ];
    let why = "(`target`: the labels a loss reads; `optim.`: the optimizer's state): rename it";
    for (i, (model, at, shown)) in cases.iter().enumerate() {
        let path = dir.join(format!("reserved{i}.rms"));
        std::fs::write(&path, model).unwrap();
        let p = path.to_str().unwrap();
        let (code, _, err) = rumus(&["plan", p]);
        assert_eq!(code, 1);
        assert_eq!(err, format!("{p}:{at} {why}\n{shown}"));
    }
}

/// Found by the hostile-input audit: a value of 2^32 elements or more wrapped the kernels' u32
/// workgroup counts to 0, and `rumus plan` listed kernels that compute nothing.
#[test]
fn a_value_the_kernels_cannot_index_is_refused_by_name() {
    let dir = crate::common::ScratchDir::new("cli-u32");
    let path = dir.join("big.rms");
    let model =
        "model m(x: f32[4, 2]) {\n    param w[2, 1073741824] = zeros\n    return relu(x @ w)\n}\n";
    std::fs::write(&path, model).unwrap();
    let p = path.to_str().unwrap();
    let (code, _, err) = rumus(&["plan", p]);
    assert_eq!(code, 1);
    let message = "the result of `relu` (f32[4, 1073741824]) takes 17179869184 bytes, 4294967296 elements or more: the GPU kernels index at most 2^32 - 1 (u32); use smaller dimensions";
    assert_eq!(err.lines().next().unwrap(), format!("{p}:3:12: {message}"));
}

/// Found by the hostile-input audit: `rumus bench` drew every i32 input below the logits'
/// classes, so a model whose embedding has fewer rows than it has classes could not be benched
/// ("index 9 is out of range for 4 rows"). Each index input is drawn in the range its readers take.
#[test]
fn bench_draws_each_index_input_in_the_range_its_embedding_takes() {
    let dir = crate::common::ScratchDir::new("cli-bench-vocab");
    let path = dir.join("vocab.rms");
    let model = "model g(idx: i32[B, T]) {\n    return linear(embedding(idx, 4, 8) as wte, 10) as head\n}\n";
    std::fs::write(&path, model).unwrap();
    let p = path.to_str().unwrap();
    let args = ["bench", p, "--device", "cpu", "--set", "B=2", "--set", "T=3", "--steps", "2"];
    let (code, _, err) = rumus(&args);
    assert_eq!(code, 0, "{err}");
}

/// Found by the hostile-input audit: `--set 'B =2'` set a dimension named `B ` (its space
/// kept), which the model did not have. Spaces around a name and a value are not part of them.
#[test]
fn set_takes_a_name_and_a_value_without_their_surrounding_spaces() {
    let dir = crate::common::ScratchDir::new("cli_set_spaces");
    let path = dir.join("m.rms");
    std::fs::write(&path, "model m(x: f32[B, 2]) {\n    return x\n}\n").unwrap();
    let p = path.to_str().unwrap();
    let (code, out, err) = rumus(&["graph", p, "--params", "--set", " B = 3 "]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    let (code, _, err) = rumus(&["graph", p, "--set", "B =3", "--set", "B= 4"]);
    assert_eq!((code, err.as_str()), (2, "--set B is given twice (3 and 4): give it once\n"));
}
