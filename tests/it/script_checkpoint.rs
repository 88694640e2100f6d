//! Checkpoints from scripts: save → load is bit-exact, and a run stopped after step k and
//! resumed from its checkpoint produces the same losses as an unbroken run.

use rumus::Engine;

const MODEL: &str = r#"
model net(x: f32[B, 3], hidden = 8) {
    h = relu(linear(x, hidden) as fc1)
    return linear(h, 3) as fc2
}
let data = dataset(randn([24, 3], 5), tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2], "i32"));
fn make() {
    net(#{ hidden: 8 }).compile(#{
        batch: 6, optimizer: adamw(#{ lr: 0.01, weight_decay: 0.1 }),
        schedule: cosine(#{ warmup: 3, total: 20 }), clip: 1.0, seed: 7,
    })
}
// Steps from `from` to `to` (exclusive): batches in an order set by the epoch, 4 per epoch.
fn train(m, data, from, to) {
    let losses = [];
    for s in from..to {
        let epoch = s / 4;
        let b = data.batches(6, epoch)[s % 4];
        losses.push(m.train_step(b.x, b.y));
    }
    losses
}
"#;

fn dir() -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_checkpoint");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bits(v: rumus::script::rhai::Dynamic) -> Vec<u64> {
    v.into_array().unwrap().into_iter().map(|x| x.as_float().unwrap().to_bits()).collect()
}

#[test]
fn save_then_load_is_bit_exact() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let path = dir().join("exact.safetensors");
    let p = path.to_string_lossy();
    let _ = e
        .eval(&format!(
        "let a = make(); train(a, data, 0, 5); a.save(\"{p}\"); let b = make(); b.load(\"{p}\");"
    ))
        .unwrap();
    let a = e.compiled("a").unwrap();
    let b = e.compiled("b").unwrap();
    assert_eq!(b.trainer().unwrap().step(), 5);
    let (sa, sb) = (
        a.trainer().unwrap().state_tensors().unwrap(),
        b.trainer().unwrap().state_tensors().unwrap(),
    );
    assert_eq!(sa, sb);
    let out = e.eval("a.param(\"fc1.weight\") == b.param(\"fc1.weight\")").unwrap();
    assert!(out.as_bool().unwrap());
}

#[test]
fn resumed_run_matches_an_unbroken_run() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let path = dir().join("resume.safetensors");
    let p = path.to_string_lossy();
    let unbroken = bits(e.eval("train(make(), data, 0, 12)").unwrap());
    let first = bits(
        e.eval(&format!("let m = make(); let l = train(m, data, 0, 5); m.save(\"{p}\"); l"))
            .unwrap(),
    );
    let rest = bits(
        e.eval(&format!("let r = make(); r.load(\"{p}\"); train(r, data, r.step, 12)")).unwrap(),
    );
    assert_eq!([first, rest].concat(), unbroken);
}

/// Found by metamorphic testing: a checkpoint held no learning rate, so one saved after
/// `net.lr = 0.01` resumed at the compiled 0.1 and trained on otherwise than the saved run. It
/// holds the base rate now, loaded with the step count (not from a file of weights alone).
#[test]
fn a_resumed_run_goes_on_at_the_rate_the_script_set() {
    let mut e = Engine::new();
    let path = dir().join("lr.safetensors");
    let p = path.to_string_lossy();
    let out = e
        .eval(&format!(
            "model lin(x: f32[B, 4]) {{ param w[4] = ones; return sum(x * w, [0, 1]) }}
let x = ones([2, 4]);
let make = || lin().compile(#{{ batch: 2, loss: \"output\", optimizer: sgd(#{{ lr: 0.1 }}) }});
let a = make.call();
a.train_step(#{{ x: x }});
a.lr = 0.01;
a.train_step(#{{ x: x }});
a.save(\"{p}\");
a.train_step(#{{ x: x }});
let b = make.call();
b.load(\"{p}\");
let lr = b.lr;
b.train_step(#{{ x: x }});
[lr, a.param(\"w\") == b.param(\"w\")]"
        ))
        .unwrap()
        .into_array()
        .unwrap();
    assert_eq!(out[0].as_float().unwrap(), f64::from(0.01f32));
    assert!(out[1].as_bool().unwrap(), "the resumed run trained otherwise");
    // A model with a schedule keeps its compiled rate: the schedule is the script's.
    let lr = e
        .eval(&format!(
            "let c = lin().compile(#{{ batch: 2, loss: \"output\", optimizer: sgd(#{{ lr: 0.1 }}), schedule: step_lr(#{{ every: 100, gamma: 0.5 }}) }});
c.load(\"{p}\");
c.lr"
        ))
        .unwrap();
    assert_eq!(lr.as_float().unwrap(), f64::from(0.1f32));
}

#[test]
fn save_outside_the_working_directory_is_refused() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let err = e.eval("make().save(\"/tmp/rumus-ckpt.safetensors\")").unwrap_err();
    assert_eq!(err.kind, rumus::ErrorKind::Limit);
    assert!(!std::path::Path::new("/tmp/rumus-ckpt.safetensors").exists());
}

#[test]
fn a_step_count_that_is_not_a_whole_number_is_refused() {
    use rumus::checkpoint;
    use rumus::memory::Budget;
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let path = dir().join("step.safetensors");
    let p = path.to_string_lossy();
    e.run(&format!("let a = make(); train(a, data, 0, 2); a.save(\"{p}\"); let b = make();"))
        .unwrap();
    let saved = checkpoint::load(&path, &mut Budget::unlimited().empty()).unwrap();
    for (bad, shown) in [
        (f32::INFINITY, "inf"),
        (-1.0, "-1"),
        (2.5, "2.5"),
        (f32::NAN, "NaN"),
        (1e30, "1e30"),
        (1.8e19, "1.8e19"),
    ] {
        let step = rumus::Tensor::scalar(bad);
        let tensors: Vec<(&str, &rumus::Tensor)> = saved
            .tensors
            .iter()
            .map(|(n, t)| (n.as_str(), if n == "optim.step" { &step } else { t }))
            .collect();
        checkpoint::save(&path, &tensors, &saved.metadata).unwrap();
        let err = e.eval(&format!("b.load(\"{p}\")")).unwrap_err();
        assert_eq!(err.kind, rumus::ErrorKind::Checkpoint, "{err}");
        assert!(
            err.message.ends_with(&format!(
                "`optim.step` must be a whole number of steps from 0 to 2^53, got {shown}"
            )),
            "{err}"
        );
        assert_eq!(e.compiled("b").unwrap().trainer().unwrap().step(), 0, "nothing was loaded");
    }
}

/// Write `path` holding the tensors of the checkpoint at `from` that `keep` accepts, plus
/// `extra`.
fn rewrite(
    from: &std::path::Path,
    path: &std::path::Path,
    keep: impl Fn(&str) -> bool,
    extra: &[(&str, &rumus::Tensor)],
) {
    use rumus::memory::Budget;
    let saved = rumus::checkpoint::load(from, &mut Budget::unlimited().empty()).unwrap();
    let mut tensors: Vec<(&str, &rumus::Tensor)> =
        saved.tensors.iter().filter(|(n, _)| keep(n)).map(|(n, t)| (n.as_str(), t)).collect();
    tensors.extend_from_slice(extra);
    rumus::checkpoint::save(path, &tensors, &saved.metadata).unwrap();
}

/// Write `path` as the checkpoint at `from` after `edit` has changed its tensors and metadata.
fn edited(
    from: &std::path::Path,
    path: &std::path::Path,
    edit: impl FnOnce(
        &mut Vec<(String, rumus::Tensor)>,
        &mut std::collections::BTreeMap<String, String>,
    ),
) {
    use rumus::memory::Budget;
    let mut saved = rumus::checkpoint::load(from, &mut Budget::unlimited().empty()).unwrap();
    edit(&mut saved.tensors, &mut saved.metadata);
    let refs: Vec<(&str, &rumus::Tensor)> =
        saved.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    rumus::checkpoint::save(path, &refs, &saved.metadata).unwrap();
}

/// Element `i` of tensor `name` among `tensors`, to change.
fn element<'a>(tensors: &'a mut [(String, rumus::Tensor)], name: &str, i: usize) -> &'a mut f32 {
    let t = &mut tensors.iter_mut().find(|(n, _)| n == name).unwrap().1;
    &mut t.as_f32_mut().unwrap()[i]
}

/// What a case keeps of a full checkpoint, adds to it, and the strict error and the
/// non-strict report it gives.
type Case<'a> =
    (&'a str, Box<dyn Fn(&str) -> bool>, &'a [(&'a str, &'a rumus::Tensor)], &'a str, &'a str);

#[test]
fn load_requires_every_parameter_unless_told_otherwise() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let full = dir().join("strict_full.safetensors");
    let part = dir().join("strict_part.safetensors");
    e.run(&format!("let a = make(); train(a, data, 0, 3); a.save(\"{}\");", full.display()))
        .unwrap();
    let extra = rumus::Tensor::scalar(1.0);
    let cases: [Case; 4] = [
        (
            "no tensors at all",
            Box::new(|_| false),
            &[],
            "missing `fc1.weight`, `fc1.bias`, `fc2.weight`, `fc2.bias`",
            "#{\"missing\": [\"fc1.weight\", \"fc1.bias\", \"fc2.weight\", \"fc2.bias\"], \"unexpected\": []}",
        ),
        (
            "one parameter missing",
            Box::new(|n| n != "fc2.bias"),
            &[],
            "missing `fc2.bias`",
            "#{\"missing\": [\"fc2.bias\"], \"unexpected\": []}",
        ),
        (
            "part of the optimizer state",
            Box::new(|n| !n.starts_with("optim.v.")),
            &[],
            "missing `optim.v.fc1.weight`, `optim.v.fc1.bias`, `optim.v.fc2.weight`, `optim.v.fc2.bias`",
            // None of it is loaded (Adam's first moments and step from the file with fresh
            // second moments trained on silently), and all of it is listed.
            "#{\"missing\": [\"optim.step\", \"optim.m.fc1.weight\", \"optim.m.fc1.bias\", \"optim.m.fc2.weight\", \"optim.m.fc2.bias\", \"optim.v.fc1.weight\", \"optim.v.fc1.bias\", \"optim.v.fc2.weight\", \"optim.v.fc2.bias\"], \"unexpected\": []}",
        ),
        (
            "an unexpected tensor",
            Box::new(|_| true),
            &[("decoder.scale", &extra)],
            "unexpected `decoder.scale`",
            "#{\"missing\": [], \"unexpected\": [\"decoder.scale\"]}",
        ),
    ];
    for (what, keep, extra, strict_error, report) in cases {
        rewrite(&full, &part, keep, extra);
        let p = part.display();
        let err = e.eval(&format!("let b = make(); b.load(\"{p}\")")).unwrap_err();
        assert_eq!(err.kind, rumus::ErrorKind::Checkpoint, "{what}: {err}");
        assert_eq!(
            err.message,
            format!("{p}: checkpoint does not match the model: {strict_error}; a non-strict load takes the tensors that match"),
            "{what}"
        );
        let out =
            e.eval(&format!("let b = make(); b.load(\"{p}\", #{{ strict: false }})")).unwrap();
        assert_eq!(out.to_string(), report, "{what}");
        // The step is the file's only where its whole optimizer state was loaded.
        let step = e.eval("b.step").unwrap().as_int().unwrap();
        let whole = !matches!(what, "no tensors at all" | "part of the optimizer state");
        assert_eq!(step, if whole { 3 } else { 0 }, "{what}");
    }
    // A params-only checkpoint (from another framework, say) loads strictly.
    rewrite(&full, &part, |n| !n.starts_with("optim."), &[]);
    e.run(&format!("let c = make(); c.load(\"{}\");", part.display())).unwrap();
    let same = e.eval("c.param(\"fc1.weight\") == a.param(\"fc1.weight\")").unwrap();
    assert!(same.as_bool().unwrap());
}

#[test]
fn predict_sees_weights_written_by_load_and_set_param_at_the_same_step() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let path = dir().join("fresh.safetensors");
    let p = path.display();
    let out = e
        .eval(&format!(
            "let x = randn([5, 3], 9);
             let a = make(); train(a, data, 0, 3); a.save(\"{p}\");
             let b = make(); train(b, data, 8, 11);
             let before = b.predict(x);
             let step = b.step;
             b.load(\"{p}\");
             let loaded = b.predict(x);
             b.set_param(\"fc2.bias\", ones([3]) * 100);
             let set = b.predict(x);
             [step, b.step, before == loaded, loaded == a.predict(x), set == loaded]"
        ))
        .unwrap();
    // Both at step 3: the evaluation copy is re-synced because the weights changed, not the step.
    assert_eq!(out.to_string(), "[3, 3, false, true, false]");
}

#[test]
fn a_checkpoint_saved_before_the_safetensors_crate_loads_into_its_model() {
    // The fixture is `m.save(..)` of this model, by rumus 16fb9e2, after one step.
    let mut e = Engine::new();
    e.run(
        "model tiny(x: f32[B, 2]) {\n return linear(x, 1) as out\n}\n\
         let m = tiny().compile(#{ batch: 2, loss: \"mse\", optimizer: adam(#{ lr: 0.1 }) });\n\
         m.load(\"tests/fixtures/rumus_before_safetensors_crate.safetensors\");",
    )
    .unwrap();
    assert_eq!(e.compiled("m").unwrap().trainer().unwrap().step(), 1);
    // The fixture's last 8 bytes, as f32 printed in full.
    let same =
        e.eval("m.param(\"out.weight\") == tensor([[0.12241476029157639], [0.27652624249458313]])");
    assert!(same.unwrap().as_bool().unwrap());
}

/// A safetensors file of `n` one-element f32 tensors `t0.weight`, `t1.weight`, ... written
/// directly (the header by hand: quicker than building `n` tensors).
fn many_tensors(path: &std::path::Path, n: usize) {
    let entries: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#""t{i}.weight":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}"#,
                4 * i,
                4 * i + 4
            )
        })
        .collect();
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.resize(file.len() + 4 * n, 0);
    std::fs::write(path, file).unwrap();
}

/// Found by the hostile-input audit: `load` looked every parameter up in the file's list of
/// tensors one by one, so a 40 MB file of 500,000 tensors loaded into a model of 20,000
/// parameters took over a minute in one native call, beyond the sandbox's time limit. The
/// answer now comes in about a second, well within a 20-second limit.
#[test]
fn a_checkpoint_of_many_tensors_loads_in_time_linear_in_its_size() {
    use rumus::script::{HostOptions, Sandbox};
    let sandbox =
        Sandbox { timeout: Some(std::time::Duration::from_secs(20)), ..Sandbox::bounded() };
    let mut e = Engine::with_options(HostOptions {
        sandbox,
        device: "cpu".into(),
        ..HostOptions::default()
    });
    let path = dir().join("many_tensors.safetensors");
    many_tensors(&path, 500_000);
    let model = "model wide(x: f32[B, 1]) {\n    repeat 20000 as blocks {\n        param w[1] = zeros\n        x = x + w\n    }\n    return x\n}";
    for from in ["rumus", "pytorch"] {
        let err = e
            .eval(&format!(
                "{model}\nwide().compile(#{{ loss: \"mse\" }}).load(\"{}\", #{{ from: \"{from}\" }})",
                path.display()
            ))
            .unwrap_err();
        let expected = "checkpoint does not match the model: missing `blocks.0.w`";
        assert!(err.message.contains(expected), "{from}: {err}");
    }
}

/// Found by the hostile-input audit: `optim.step` is f32 (as PyTorch's is), which counts exactly
/// only to 2^24 (2^24 + 1 rounds back to 2^24), so a model saved after more steps came back with
/// fewer, and its schedule restarted from the wrong step. The metadata `save` writes holds the
/// count; it wins where the tensor cannot hold it, and must agree with it where it can.
#[test]
fn a_step_count_past_f32s_whole_numbers_comes_back_exactly() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let dir = dir();
    let (first, path) = (dir.join("step_exact0.safetensors"), dir.join("step_exact.safetensors"));
    let (f, p) = (first.to_string_lossy(), path.to_string_lossy());
    e.run(&format!("let a = make(); train(a, data, 0, 2); a.save(\"{f}\"); let b = make();"))
        .unwrap();
    let write = |tensor: f32, meta: &str| {
        edited(&first, &path, |tensors, metadata| {
            *element(tensors, "optim.step", 0) = tensor;
            metadata.insert("step".into(), meta.into());
        })
    };
    let step = |e: &mut Engine| e.compiled("b").unwrap().trainer().unwrap().step();
    write(16_777_216.0, "16777219");
    e.run(&format!("b.load(\"{p}\");")).unwrap();
    assert_eq!(step(&mut e), 16_777_219);
    // Three more steps, saved and loaded again: the count goes on exactly.
    e.run(&format!("train(b, data, 0, 3); b.save(\"{p}\"); let c = make(); c.load(\"{p}\");"))
        .unwrap();
    assert_eq!(e.compiled("c").unwrap().trainer().unwrap().step(), 16_777_222);
    // At 2^53 (found by the hostile-input hunt) a step would count past what a checkpoint
    // holds exactly, and `save` wrote a count its own `load` refused: the step is refused.
    write(16_777_216.0, "9007199254740992");
    e.run(&format!("b.load(\"{p}\");")).unwrap();
    let err = e.eval("train(b, data, 0, 1)").unwrap_err();
    let expected = "has taken 2^53 steps, the most a step count (and a checkpoint) holds exactly: start a new run";
    assert!(err.message.contains(expected), "{err}");
    assert_eq!(step(&mut e), 1 << 53);
    // Below 2^24 the tensor is exact, and a metadata count that differs is an error; past
    // 2^53 (the tensor's own bound) the metadata is refused too. Either way nothing is loaded.
    e.run("let d = make();").unwrap();
    for (tensor, meta, expected) in [
        (5.0, "16777219", "the metadata's step 16777219 does not match `optim.step`, which holds 5"),
        (5.0, "+5", "the metadata's step `+5` is not a whole number of steps from 0 to 2^53"),
        // Found by metamorphic testing: a count above 2^24 in the tensor (no run makes one)
        // loaded, stayed there while the step went on, and the next save did not load.
        (
            1e8,
            "100000000",
            "`optim.step` holds 100000000, more than 2^24, where an f32 step counter stops: a \
             count beyond it is the metadata's `step`, with `optim.step` at 2^24 (16777216)",
        ),
        (
            16_777_216.0,
            "18446744073709551615",
            "the metadata's step `18446744073709551615` is not a whole number of steps from 0 to 2^53",
        ),
    ] {
        write(tensor, meta);
        let err = e.eval(&format!("d.load(\"{p}\")")).unwrap_err();
        assert!(err.message.ends_with(expected), "{err}");
        assert_eq!(e.compiled("d").unwrap().trainer().unwrap().step(), 0, "nothing was loaded");
    }
    // Without the metadata (Python's `save_file(tensors)` drops it) as with it.
    edited(&first, &path, |tensors, metadata| {
        *element(tensors, "optim.step", 0) = 1e8;
        metadata.clear();
    });
    let err = e.eval(&format!("d.load(\"{p}\")")).unwrap_err();
    assert!(err.message.ends_with("`optim.step` holds 100000000, more than 2^24, where an f32 step counter stops: a count beyond it is the metadata's `step`, with `optim.step` at 2^24 (16777216)"), "{err}");
}

/// Found by the hostile-input audit: a checkpoint whose parameters hold NaN, or whose Adam second
/// moments are negative (which no run makes), loaded without a word and the next loss was NaN.
#[test]
fn values_no_model_can_hold_are_refused_when_loaded() {
    let mut e = Engine::new();
    e.run(MODEL).unwrap();
    let dir = dir();
    let (first, path) = (dir.join("values0.safetensors"), dir.join("values.safetensors"));
    let (f, p) = (first.to_string_lossy(), path.to_string_lossy());
    e.run(&format!("let a = make(); train(a, data, 0, 2); a.save(\"{f}\"); let b = make();"))
        .unwrap();
    let cases = [
        ("fc1.weight", f32::NAN, "tensor `fc1.weight` holds NaN at element 4: a model takes finite values only (was it saved after a step whose loss was NaN?)"),
        ("fc1.bias", f32::NEG_INFINITY, "tensor `fc1.bias` holds -inf at element 4"),
        ("optim.v.fc1.weight", -1e-3, "tensor `optim.v.fc1.weight` is an Adam second moment, which is never negative, but element 4 is -0.001"),
    ];
    for (name, bad, expected) in cases {
        edited(&first, &path, |tensors, _| *element(tensors, name, 4) = bad);
        let err = e.eval(&format!("b.load(\"{p}\")")).unwrap_err();
        assert_eq!(err.kind, rumus::ErrorKind::Checkpoint, "{err}");
        assert!(err.message.contains(expected), "{err}");
        assert_eq!(e.compiled("b").unwrap().trainer().unwrap().step(), 0, "nothing was loaded");
    }
}

/// Found by the hostile-input audit: a negative batch norm running variance loaded and every
/// prediction was NaN.
#[test]
fn a_negative_running_variance_is_refused_when_loaded() {
    let mut e = Engine::new();
    let dir = dir();
    let (first, path) = (dir.join("bn0.safetensors"), dir.join("bn.safetensors"));
    let (f, p) = (first.to_string_lossy(), path.to_string_lossy());
    e.run(&format!(
        "model m(x: f32[B, 2]) {{ return batch_norm(linear(x, 3) as fc) as bn }}
         let a = m().compile(#{{ batch: 2 }}); a.save(\"{f}\"); let b = m().compile(#{{ batch: 2 }});"
    ))
    .unwrap();
    edited(&first, &path, |tensors, _| *element(tensors, "bn.running_var", 1) = -2.0);
    let err = e.eval(&format!("b.load(\"{p}\")")).unwrap_err();
    let expected = "tensor `bn.running_var` is a batch norm running variance, which is never negative, but element 1 is -2";
    assert!(err.message.ends_with(expected), "{err}");
}
