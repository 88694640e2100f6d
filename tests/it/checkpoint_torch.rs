//! PyTorch state dicts through `load(path, #{ from: "pytorch", ... })`: files laid out as
//! `safetensors.torch.save_file(model.state_dict(), path)` writes them (the same crate writes
//! both), loaded with renames, `[out, in]` weights transposed, tied weights, f16 and f32.

use half::f16;
use rumus::checkpoint;
use rumus::{Engine, Tensor};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// A fresh file path for one test.
fn path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("checkpoint_torch");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::f32(shape, v.to_vec()).unwrap()
}

/// Write `tensors` as PyTorch's `save_file` does, in `dtype` (`F32` or `F16`), with
/// `{"format": "pt"}`.
fn save_torch(path: &std::path::Path, tensors: &[(&str, Tensor)], dtype: Dtype) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let v = t.as_f32().unwrap();
            let raw = match dtype {
                Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                _ => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            };
            (n.to_string(), t.shape().to_vec(), raw)
        })
        .collect();
    let views: Vec<(&str, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.as_str(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    std::fs::write(path, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
}

const MLP: &str = r#"
model mlp(x: f32[B, 3]) {
    h = relu(linear(x, 4) as fc1)
    return linear(h, 2) as fc2
}
let x = tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]]);
fn make() { mlp().compile(#{ batch: 2, loss: "mse" }) }
"#;

/// `nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))`'s state dict, PyTorch's layout.
fn sequential() -> Vec<(&'static str, Tensor)> {
    vec![
        ("0.weight", t(&[4, 3], &[1.0, 0.0, -1.0, 0.5, 2.0, 0.0, -1.0, 1.0, 1.0, 0.0, 0.0, 0.25])),
        ("0.bias", t(&[4], &[0.0, -1.0, 0.5, 1.0])),
        ("2.weight", t(&[2, 4], &[1.0, -1.0, 0.5, 2.0, 0.0, 1.0, 1.0, -0.5])),
        ("2.bias", t(&[2], &[0.25, -0.5])),
    ]
}

/// What PyTorch computes: `y = W2 relu(W1 x + b1) + b2`, weights `[out, in]`.
fn by_hand(sd: &[(&str, Tensor)], x: &[[f32; 3]]) -> Vec<f32> {
    let get = |n: &str| sd.iter().find(|(k, _)| *k == n).unwrap().1.as_f32().unwrap().to_vec();
    let (w1, b1, w2, b2) = (get("0.weight"), get("0.bias"), get("2.weight"), get("2.bias"));
    let mut y = Vec::new();
    for row in x {
        let h: Vec<f32> = (0..4)
            .map(|o| (b1[o] + (0..3).map(|i| w1[o * 3 + i] * row[i]).sum::<f32>()).max(0.0))
            .collect();
        y.extend((0..2).map(|o| b2[o] + (0..4).map(|i| w2[o * 4 + i] * h[i]).sum::<f32>()));
    }
    y
}

fn floats(v: rumus::script::rhai::Dynamic) -> Vec<f32> {
    v.into_array()
        .unwrap()
        .into_iter()
        .flat_map(|r| r.into_array().unwrap())
        .map(|x| x.as_float().unwrap() as f32)
        .collect()
}

#[test]
fn a_pytorch_mlp_predicts_what_pytorch_computes_in_f32_and_f16() {
    let sd = sequential();
    let expected = by_hand(&sd, &[[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]]);
    assert_eq!(expected, [2.5, 6.625, 3.5, 0.9375], "the hand computation");
    for (dtype, file) in [(Dtype::F32, "mlp_f32.safetensors"), (Dtype::F16, "mlp_f16.safetensors")]
    {
        let p = path(file);
        save_torch(&p, &sd, dtype); // every value is exact in f16
        let mut e = Engine::new();
        e.run(MLP).unwrap();
        let y = e
            .eval(&format!(
                "let m = make(); m.load(\"{}\", #{{ from: \"pytorch\", rename: #{{ \"0\": \"fc1\", \"2\": \"fc2\" }} }}); \
                 m.predict(x).to_array()",
                p.display()
            ))
            .unwrap();
        assert_eq!(floats(y), expected, "{dtype}");
    }
}

#[test]
fn tensors_that_do_not_fit_are_each_named_with_both_shapes() {
    let mut sd = sequential();
    sd[0].1 = Tensor::zeros(&[5, 3], rumus::DType::F32).unwrap(); // 0.weight: out 5, not 4
    sd[2].1 = t(&[4, 2], &[0.0; 8]); // 2.weight written [in, out]
    let p = path("misfit.safetensors");
    save_torch(&p, &sd, Dtype::F32);
    let mut e = Engine::new();
    e.run(MLP).unwrap();
    let err = e
        .eval(&format!(
            "make().load(\"{}\", #{{ from: \"pytorch\", rename: #{{ \"0\": \"fc1\", \"2\": \"fc2\" }} }})",
            p.display()
        ))
        .unwrap_err();
    assert_eq!(err.kind, rumus::ErrorKind::Checkpoint, "{err}");
    assert_eq!(
        err.message,
        format!(
            "{}: the state dict does not fit the model: `0.weight` for `fc1.weight`: expected \
             [4, 3], found [5, 3]; `2.weight` for `fc2.weight`: expected [2, 4], found [4, 2] \
             (its transpose fits: see the `transpose` option)",
            p.display()
        )
    );
    // Without a rename, the names themselves do not fit.
    let err = e.eval(&format!("make().load(\"{}\", #{{ from: \"pytorch\" }})", p.display()));
    assert!(err.unwrap_err().message.ends_with(
        "checkpoint does not match the model: missing `fc1.weight`, `fc1.bias`, `fc2.weight`, \
             `fc2.bias`; unexpected `0.bias`, `0.weight`, `2.bias`, `2.weight`; a non-strict \
             load takes the tensors that match"
    ));
}

#[test]
fn tied_weights_load_one_to_two_and_two_to_one() {
    let wte = t(&[5, 4], &(0..20).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>());
    let bias = t(&[5], &[0.5, -0.5, 1.0, 0.0, 2.0]);
    let mut e = Engine::new();
    e.run(
        r#"
model untied(idx: i32[B, T]) {
    x = embedding(idx, 5, 4) as wte
    return linear(x, 5) as head
}
model tied(idx: i32[B, T]) {
    x = embedding(idx, 5, 4) as wte
    return x @ transpose(wte.weight, 0, 1)
}
let idx = tensor([[0, 3], [4, 1]], "i32");
let one = untied().compile(#{ batch: 2, dims: #{ T: 2 } });
let two = tied().compile(#{ batch: 2, dims: #{ T: 2 } });
"#,
    )
    .unwrap();

    // One tensor for two of our names: the embedding as it is, the head transposed.
    let p = path("one_to_two.safetensors");
    save_torch(&p, &[("transformer.wte.weight", wte.clone()), ("lm_head.bias", bias)], Dtype::F32);
    e.run(&format!(
        "one.load(\"{}\", #{{ from: \"pytorch\", rename: #{{ \"transformer.wte\": [\"wte\", \"head\"], \"lm_head\": \"head\" }} }})",
        p.display()
    ))
    .unwrap();
    let one = e.compiled("one").unwrap();
    let tr = one.trainer().unwrap();
    assert_eq!(tr.parameter("wte.weight").unwrap(), wte);
    let head = tr.parameter("head.weight").unwrap();
    assert_eq!(head.shape(), [4, 5]);
    let (h, w) = (head.as_f32().unwrap(), wte.as_f32().unwrap());
    assert!((0..4).all(|i| (0..5).all(|j| h[i * 5 + j] == w[j * 4 + i])));
    drop(tr);

    // Two equal tensors for one of our names (PyTorch's `torch.save` keeps both).
    let rename = "rename: #{ \"transformer.wte\": \"wte\", \"lm_head\": \"wte\" }";
    let p = path("two_to_one.safetensors");
    save_torch(
        &p,
        &[("transformer.wte.weight", wte.clone()), ("lm_head.weight", wte.clone())],
        Dtype::F32,
    );
    e.run(&format!("two.load(\"{}\", #{{ from: \"pytorch\", {rename} }})", p.display())).unwrap();
    assert_eq!(e.compiled("two").unwrap().trainer().unwrap().parameter("wte.weight").unwrap(), wte);

    // ... and an error when they differ.
    let mut other = wte.clone();
    other.as_f32_mut().unwrap()[7] = 100.0;
    save_torch(&p, &[("transformer.wte.weight", wte), ("lm_head.weight", other)], Dtype::F32);
    let err = e.eval(&format!("two.load(\"{}\", #{{ from: \"pytorch\", {rename} }})", p.display()));
    assert_eq!(
        err.unwrap_err().message,
        format!(
            "{}: the state dict does not fit the model: `lm_head.weight` and \
             `transformer.wte.weight` both land on `wte.weight` but hold different values",
            p.display()
        )
    );
}

const GPT: &str = r#"
model gpt(idx: i32[B, T], vocab = 5, d = 4, heads = 2, layers = 2, ctx = 3) {
    x = embedding(idx, vocab, d) as wte + position_embedding(T, ctx, d) as wpe
    repeat layers as blocks {
        x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn
        x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp
    }
    return linear(layer_norm(x) as ln_f, vocab) as head
}
let idx = tensor([[1, 2, 3], [4, 0, 1]], "i32");
fn make(seed) { gpt().compile(#{ batch: 2, dims: #{ T: 3 }, seed: seed }) }
let a = make(1);
"#;

/// nanoGPT's names for ours (`nn.Linear` layers, so `[out, in]` weights).
const NANOGPT: &[(&str, &str)] = &[
    ("transformer.wte", "wte"),
    ("transformer.wpe", "wpe"),
    ("transformer.h.*.ln_1", "blocks.*.ln1"),
    ("transformer.h.*.attn.c_attn", "blocks.*.attn.qkv"),
    ("transformer.h.*.attn.c_proj", "blocks.*.attn.proj"),
    ("transformer.h.*.ln_2", "blocks.*.ln2"),
    ("transformer.h.*.mlp.c_fc", "blocks.*.mlp.fc"),
    ("transformer.h.*.mlp.c_proj", "blocks.*.mlp.proj"),
    ("transformer.ln_f", "ln_f"),
    ("lm_head", "head"),
];

/// Our name in nanoGPT's spelling.
fn nanogpt_name(ours: &str) -> String {
    let segs: Vec<&str> = ours.split('.').collect();
    for (theirs, pattern) in NANOGPT {
        let p: Vec<&str> = pattern.split('.').collect();
        if p.len() < segs.len() && p.iter().zip(&segs).all(|(a, b)| a == b || *a == "*") {
            let star = p.iter().zip(&segs).find(|(a, _)| **a == "*").map(|(_, b)| *b);
            let head = theirs.replace('*', star.unwrap_or("*"));
            return format!("{head}.{}", segs[p.len()..].join("."));
        }
    }
    panic!("no nanoGPT name for {ours}")
}

#[test]
fn a_nanogpt_state_dict_gives_the_logits_of_the_same_weights_loaded_natively() {
    let mut e = Engine::new();
    e.run(GPT).unwrap();
    let a = e.compiled("a").unwrap();
    let names: Vec<String> =
        a.trainer().unwrap().graph().parameters().into_iter().map(|(_, n)| n.to_string()).collect();
    let linear = |n: &str| {
        n.ends_with(".weight") && ["qkv", "proj", "fc", "head"].iter().any(|l| n.contains(l))
    };
    let round_f16 = |t: &Tensor| {
        let v = t.as_f32().unwrap().iter().map(|x| f16::from_f32(*x).to_f32()).collect();
        Tensor::f32(t.shape(), v).unwrap()
    };
    let rename: Vec<String> = NANOGPT.iter().map(|(t, o)| format!("\"{t}\": \"{o}\"")).collect();
    let rename = format!("#{{ {} }}", rename.join(", "));
    for (dtype, tag) in [(Dtype::F32, "f32"), (Dtype::F16, "f16")] {
        let mut native: Vec<(String, Tensor)> = Vec::new();
        let mut torch: Vec<(String, Tensor)> = Vec::new();
        for n in &names {
            let mut v = a.trainer().unwrap().parameter(n).unwrap();
            if dtype == Dtype::F16 {
                v = round_f16(&v);
            }
            let theirs = if linear(n) {
                let &[r, c] = v.shape() else { panic!("{n} is not 2-D") };
                let x = v.as_f32().unwrap();
                let flipped = (0..c).flat_map(|j| (0..r).map(move |i| x[i * c + j])).collect();
                Tensor::f32(&[c, r], flipped).unwrap()
            } else {
                v.clone()
            };
            torch.push((nanogpt_name(n), theirs));
            native.push((n.clone(), v));
        }
        let pn = path(&format!("native_{tag}.safetensors"));
        let refs: Vec<(&str, &Tensor)> = native.iter().map(|(n, t)| (n.as_str(), t)).collect();
        checkpoint::save(&pn, &refs, &BTreeMap::new()).unwrap();
        let pt = path(&format!("nanogpt_{tag}.safetensors"));
        let refs: Vec<(&str, Tensor)> =
            torch.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        save_torch(&pt, &refs, dtype);
        let same = e
            .eval(&format!(
                "let n = make(2); n.load(\"{}\"); let p = make(3); \
                 p.load(\"{}\", #{{ from: \"pytorch\", rename: {rename} }}); \
                 n.predict(idx) == p.predict(idx) && !(n.predict(idx) == make(4).predict(idx))",
                pn.display(),
                pt.display()
            ))
            .unwrap();
        assert!(same.as_bool().unwrap(), "{tag}");
    }
}

#[test]
fn load_options_are_checked() {
    let mut e = Engine::new();
    e.run(MLP).unwrap();
    let p = path("options.safetensors");
    save_torch(&p, &sequential(), Dtype::F32);
    let cases: &[(&str, &str)] = &[
        (
            r#"#{ from: "tensorflow" }"#,
            "load: unknown `from` \"tensorflow\": expected \"rumus\" or \"pytorch\"",
        ),
        (
            r#"#{ rename: #{ "0": "fc1" } }"#,
            "load: `rename` applies to PyTorch state dicts: add `from: \"pytorch\"`",
        ),
        (
            r#"#{ from: "pytorch", rename: #{ "h.*": "blocks" } }"#,
            "load: rename: `h.*` has 1 `*` but its target `blocks` has 0: give each the same",
        ),
        // Found by the hostile-input audit: `fc*` was a literal name, so this loaded nothing
        // into `fc1` and failed later on an unexpected `fc*.bias`.
        (
            r#"#{ from: "pytorch", rename: #{ "0": "fc*" } }"#,
            "load: name pattern `fc*`: `*` stands for a whole segment (`h.*.ln_1`), not part of one (`fc*`)",
        ),
        (
            r#"#{ from: "pytorch", transpose: ["h*"] }"#,
            "load: name pattern `h*`: `*` stands for a whole segment (`h.*.ln_1`), not part of one (`h*`)",
        ),
        (
            r#"#{ from: "pytorch", rename: #{ "h..x": "y" } }"#,
            "load: name pattern `h..x` has an empty segment: write dotted names like `h.*.ln_1`",
        ),
        (
            r#"#{ from: "pytorch", rename: #{ "0": 1 } }"#,
            "load: rename `0` must map to a name or a list of names, got i64",
        ),
        (r#"#{ from: "pytorch", rename: #{ "0": [] } }"#, "load: rename: `0` has no target"),
        (
            r#"#{ from: "pytorch", rename: #{ "*": "a.*", "0": "b" } }"#,
            "rename: `*` and `0` both match `0.bias`: make one of them longer",
        ),
        (
            r#"#{ from: "pytorch", rename: #{ "0.bias": "" } }"#,
            "rename: `0.bias` → `` leaves `0.bias` with no name",
        ),
        (
            r#"#{ from: "pytorch", transpose: "yes" }"#,
            "load: `transpose` must be true, false or a list of name patterns, got string",
        ),
        (r#"#{ from: "pytorch", strict: 1 }"#, "load: `strict` must be true or false, got i64"),
        // Found by the hostile-input audit: a rule or pattern that matches nothing (a typo)
        // loaded the state dict unrenamed or untransposed without a word.
        (
            r#"#{ from: "pytorch", rename: #{ "0": "fc1", "2": "fc2", "9": "x" } }"#,
            "rename: `9` matches no tensor of the state dict (its names begin `0.bias`, `0.weight`, `2.bias`)",
        ),
        (
            r#"#{ from: "pytorch", rename: #{ "0": "fc1", "2": "fc2" }, transpose: ["fc1", "fc9"] }"#,
            "transpose: `fc9` matches no tensor name (after renaming; the state dict's begin `0.bias`, `0.weight`, `2.bias`)",
        ),
        // A mistake in the options is the script's, not the file's: checked before the file
        // is read, and not printed after its path.
        (r#"#{ from: "pytorch", transpose: [""] }"#, "load: transpose: an empty pattern matches nothing"),
    ];
    let mut wrong = Vec::new();
    for (opts, expected) in cases {
        match e.eval(&format!("make().load(\"{}\", {opts})", p.display())) {
            Ok(_) => wrong.push(format!("{opts}: accepted")),
            Err(err) if !err.message.ends_with(expected) => {
                wrong.push(format!("{opts}: {:?}\n    expected {expected:?}", err.message))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn transpose_can_be_turned_off_or_limited_to_names() {
    // Hugging Face's GPT-2 `Conv1D` layers store `[in, out]`, as rumus does.
    let mut e = Engine::new();
    e.run(MLP).unwrap();
    let sd = sequential();
    let flip = |t: &Tensor| {
        let &[r, c] = t.shape() else { unreachable!() };
        let x = t.as_f32().unwrap();
        Tensor::f32(&[c, r], (0..c).flat_map(|j| (0..r).map(move |i| x[i * c + j])).collect())
            .unwrap()
    };
    let conv1d: Vec<(&str, Tensor)> = sd
        .iter()
        .map(|(n, t)| (*n, if n.ends_with("weight") { flip(t) } else { t.clone() }))
        .collect();
    let mixed: Vec<(&str, Tensor)> =
        sd.iter().map(|(n, t)| (*n, if *n == "2.weight" { flip(t) } else { t.clone() })).collect();
    let expected = by_hand(&sd, &[[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]]);
    for (file, dict, transpose) in
        [("conv1d.safetensors", &conv1d, "false"), ("mixed.safetensors", &mixed, "[\"fc1\"]")]
    {
        let p = path(file);
        save_torch(&p, dict, Dtype::F32);
        let y = e
            .eval(&format!(
                "let m = make(); m.load(\"{}\", #{{ from: \"pytorch\", transpose: {transpose}, \
                 rename: #{{ \"0\": \"fc1\", \"2\": \"fc2\" }} }}); m.predict(x).to_array()",
                p.display()
            ))
            .unwrap();
        assert_eq!(floats(y), expected, "{file}");
    }
}

/// Found by the hostile-input audit: a rename rule with many targets copied a tensor once per
/// target without charging the copies (a 4 MB tensor and 10,000 targets asked for 40 GB
/// outside the memory budget), and every rule and `transpose` pattern is tried on every tensor
/// of a file that may hold a million. The copies are charged, and rules are bounded.
#[test]
fn renames_are_bounded_and_their_copies_charged() {
    use rumus::script::{HostOptions, Sandbox};
    let sandbox = Sandbox { memory_budget: 64 << 20, ..Sandbox::bounded() };
    let mut e = Engine::with_options(HostOptions {
        sandbox,
        device: "cpu".into(),
        ..HostOptions::default()
    });
    e.run(MLP).unwrap();
    let p = path("copies.safetensors");
    save_torch(&p, &[("big", t(&[1 << 20], &vec![0.5; 1 << 20]))], Dtype::F32);
    let many = |n: usize, f: &dyn Fn(usize) -> String| -> String {
        (0..n).map(f).collect::<Vec<_>>().join(", ")
    };
    let copies = many(100, &|i| format!("\"c{i}\""));
    let err = e
        .eval(&format!(
            "make().load(\"{}\", #{{ from: \"pytorch\", rename: #{{ big: [{copies}] }} }})",
            p.display()
        ))
        .unwrap_err();
    assert_eq!(err.kind, rumus::ErrorKind::Limit, "{err}");
    assert!(err.message.contains("`big` copied to `c"), "{err}");
    assert!(err.message.contains("64.0 MiB memory budget"), "{err}");
    let targets = many(257, &|i| format!("\"c{i}\""));
    let transpose = many(257, &|i| format!("\"c{i}\""));
    for (opts, expected) in [
        (format!("rename: #{{ big: [{targets}] }}"), "257 rename targets and 0 transpose patterns"),
        (format!("transpose: [{transpose}]"), "0 rename targets and 257 transpose patterns"),
    ] {
        let err = e
            .eval(&format!("make().load(\"{}\", #{{ from: \"pytorch\", {opts} }})", p.display()))
            .unwrap_err();
        let expected =
            format!("load: {expected}: at most 256 of each (use `*` for the segments that vary)");
        assert_eq!(err.message, expected);
    }
}

/// Found by the hostile-input audit: `save_file(model.state_dict())` of a model with BatchNorm
/// writes each layer's `num_batches_tracked` (I64), which rumus's `batch_norm` has no value
/// for, so a strict load refused the file as it comes from PyTorch. The counter is dropped
/// (and only it: another stray tensor is still unexpected).
#[test]
fn batch_norm_counters_of_a_pytorch_state_dict_are_not_unexpected() {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let write = |p: &std::path::Path, extra: bool| {
        let mut raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![
            ("bn.weight".into(), Dtype::F32, vec![3], f32s(&[1.0, 2.0, 3.0])),
            ("bn.bias".into(), Dtype::F32, vec![3], f32s(&[0.5, 0.0, -0.5])),
            ("bn.running_mean".into(), Dtype::F32, vec![3], f32s(&[0.25, -1.0, 2.0])),
            ("bn.running_var".into(), Dtype::F32, vec![3], f32s(&[1.0, 4.0, 0.5])),
            ("bn.num_batches_tracked".into(), Dtype::I64, vec![], 7i64.to_le_bytes().to_vec()),
        ];
        if extra {
            raw.push(("head.num_steps".into(), Dtype::I64, vec![], 7i64.to_le_bytes().to_vec()));
        }
        let views: Vec<(&str, TensorView)> = raw
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        std::fs::write(p, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    };
    let (p, q) = (path("bn.safetensors"), path("bn_extra.safetensors"));
    write(&p, false);
    write(&q, true);
    let mut e = Engine::new();
    e.run("model m(x: f32[B, 3]) {\n    return batch_norm(x) as bn\n}\n").unwrap();
    // `predict` normalizes by the running statistics: the loaded ones.
    let y = e
        .eval(&format!(
            "let n = m().compile(#{{ batch: 2, loss: \"mse\" }}); n.load(\"{}\", #{{ from: \"pytorch\" }}); n.predict(zeros([2, 3])).to_array()",
            p.display()
        ))
        .unwrap();
    let expected = [(0.25, 1.0, 1.0, 0.5), (-1.0, 4.0, 2.0, 0.0), (2.0, 0.5, 3.0, -0.5)]
        .map(|(m, v, w, b): (f64, f64, f64, f64)| -m / (v + 1e-5).sqrt() * w + b);
    for (got, want) in floats(y).into_iter().zip(expected.iter().cycle()) {
        assert!((f64::from(got) - want).abs() < 1e-5 * want.abs().max(1.0), "{got} against {want}");
    }
    let err =
        e.eval(&format!("n.load(\"{}\", #{{ from: \"pytorch\" }})", q.display())).unwrap_err();
    assert!(err.message.ends_with("checkpoint does not match the model: unexpected `head.num_steps`; a non-strict load takes the tensors that match"), "{err}");
}
