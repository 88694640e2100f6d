//! Target `checkpoint`: safetensors bytes through `checkpoint::from_bytes`, and the file
//! through `Compiled::load` into three small compiled models (an MLP with Adam, an embedding
//! model with AdamW, a one-layer GPT with SGD), each reset to its initial state before every
//! input. The corpus is the checkpoints these models save after two steps, and their parameters
//! alone.
//!
//! Invariants: every error passes [`check::error`]; a parsed checkpoint written back by
//! `checkpoint::to_bytes` parses to the same tensors and metadata; after a successful load the
//! model holds exactly the loaded values, saves them, and the saved file loads back to the same
//! values; a step and a prediction afterwards return `Ok` or a checked error.

use super::check::{self, Failure};
use super::mutate::{Mutator, BOUNDARY_NUMBERS, CONTROL};
use super::Fuzz;
use rumus::checkpoint::{self as ckpt, METADATA_KEY};
use rumus::engine::Compiled;
use rumus::memory::Budget;
use rumus::rng::Rng;
use rumus::script::{HostOptions, Sandbox};
use rumus::{Engine, Tensor};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The models, their compile settings and a batch: the script that makes the corpus.
const SETUP: &str = r#"
model mlp(x: f32[B, 3], hidden = 5) {
    return linear(relu(linear(x, hidden) as fc1), 2) as fc2
}
model emb(idx: i32[B, T], vocab = 7, d = 4) {
    x = embedding(idx, vocab, d) as wte
    return linear(layer_norm(x) as ln, vocab) as head
}
model gpt(idx: i32[B, T], vocab = 5, d = 4, heads = 2, ctx = 3) {
    x = embedding(idx, vocab, d) as wte + position_embedding(T, ctx, d) as wpe
    x = transformer_block(x, heads, hidden = 8) as h
    return linear(layer_norm(x) as ln_f, vocab) as head
}
let m0 = mlp().compile(#{ batch: 2, optimizer: adam(#{ lr: 0.01 }), seed: 1 });
let m1 = emb().compile(#{ batch: 2, dims: #{ T: 3 }, optimizer: adamw(), seed: 2 });
let m2 = gpt().compile(#{ batch: 2, dims: #{ T: 3 }, optimizer: sgd(#{ lr: 0.1, momentum: 0.9 }) });
let f = tensor([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]]);
let i = tensor([[1, 2, 3], [4, 0, 1]], "i32");
let y = tensor([0, 1], "i32");
for s in 0..2 {
    m0.train_step(f, y);
    m1.train_step(i, i);
    m2.train_step(i, i);
}
"#;

/// JSON fragments for header edits.
const DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"F32\"",
    "\"I32\"",
    "\"F16\"",
    "\"BF16\"",
    "\"F64\"",
    "\"I64\"",
    "\"BOOL\"",
    "\"U8\"",
    "null",
    "true",
    "\"__metadata__\"",
    "\"step\"",
    "\"format\"",
    "\"rumus\"",
    "[]",
    "{}",
    "\\u0000",
    "\\ud800",
];

pub struct Checkpoint {
    corpus: Vec<Vec<u8>>,
    dir: PathBuf,
    /// The models to load into, with their initial state.
    models: Vec<(Compiled, Vec<(String, Tensor)>)>,
    /// The engine owning the models' script variables.
    _engine: Engine,
}

impl Checkpoint {
    pub fn new(scratch: &Path) -> Checkpoint {
        let dir = scratch.to_path_buf();
        let sandbox = Sandbox {
            read_roots: vec![dir.clone()],
            write_roots: vec![dir.clone()],
            ..Sandbox::default()
        };
        let mut engine = Engine::with_options(HostOptions {
            sandbox,
            device: "cpu".into(),
            ..HostOptions::default()
        });
        engine.run(SETUP).unwrap_or_else(|e| panic!("checkpoint corpus setup: {e}"));
        let mut corpus = Vec::new();
        let mut models = Vec::new();
        for name in ["m0", "m1", "m2"] {
            let model = engine.compiled(name).expect("compiled in SETUP");
            let state = model
                .trainer()
                .expect("no guard is alive")
                .state_tensors()
                .expect("state of a CPU model");
            let params = model
                .trainer()
                .expect("no guard is alive")
                .parameters()
                .expect("parameters of a CPU model");
            let path = dir.join("seed.safetensors");
            model.save(&path).expect("save a seed checkpoint");
            corpus.push(std::fs::read(&path).expect("read a seed checkpoint"));
            let refs: Vec<(&str, &Tensor)> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
            corpus.push(ckpt::to_bytes(&refs, &BTreeMap::new()).expect("encode parameters"));
            models.push((model, state));
        }
        Checkpoint { corpus, dir, models, _engine: engine }
    }

    fn load_into(&self, k: usize, path: &Path, loaded: &ckpt::Checkpoint) -> Result<(), Failure> {
        let (model, initial) = &self.models[k];
        let initial: Vec<(&str, &Tensor)> = initial.iter().map(|(n, t)| (n.as_str(), t)).collect();
        model
            .trainer()
            .expect("no guard is alive")
            .load_state(&initial)
            .expect("reset to the initial state");
        if let Err(e) = model.load(path) {
            return check::error(&e);
        }
        super::accepted();
        let state = model
            .trainer()
            .expect("no guard is alive")
            .state_tensors()
            .expect("state of a CPU model");
        for (name, t) in &loaded.tensors {
            match state.iter().find(|(n, _)| n == name) {
                Some((_, now)) if same(now, t) => {}
                _ => return Err(Failure::new("loaded-state-differs", format!("`{name}`"))),
            }
        }
        let out = self.dir.join("out.safetensors");
        if let Err(e) = model.save(&out) {
            return check::error(&e);
        }
        match ckpt::load(&out, &mut Budget::unlimited().empty()) {
            Ok(again) if equal(&again.tensors, &state) => {}
            Ok(_) => return Err(Failure::new("saved-state-differs", "after a load")),
            Err(e) => return Err(Failure::new("saved-file-fails-to-load", e.message)),
        }
        // The loaded values in use: a step and a prediction are `Ok` or a checked error.
        let (x, y) = if k == 0 {
            let x = Tensor::f32(&[2, 3], vec![0.5, 1.0, -1.0, 0.0, 2.0, 1.0]).expect("features");
            (x, Tensor::i32(&[2], vec![1, 0]).expect("labels"))
        } else {
            let idx = Tensor::i32(&[2, 3], vec![1, 2, 3, 0, 1, 2]).expect("indices");
            (idx.clone(), idx)
        };
        let input = if k == 0 { "x" } else { "idx" };
        if let Err(e) =
            model.trainer().expect("no guard is alive").train_step(&[(input, &x), ("target", &y)])
        {
            check::error(&e)?;
        }
        if let Err(e) = model.predict_named(&[(input, &x)]) {
            check::error(&e)?;
        }
        Ok(())
    }
}

impl Fuzz for Checkpoint {
    fn corpus(&self) -> &[Vec<u8>] {
        &self.corpus
    }

    fn mutate(&self, rng: &mut Rng) -> Vec<u8> {
        let m = Mutator { corpus: &self.corpus, dict: DICT };
        match rng.below(5) {
            0 => m.bytes(rng),
            1 => {
                let base = m.pick(rng).to_vec();
                let mut out = header_edit(rng, &base);
                if rng.below(4) == 0 {
                    m.bytes_once(rng, &mut out);
                }
                out
            }
            2 => {
                let base = m.pick(rng).to_vec();
                let (mut header, data) = split(&base);
                for _ in 0..1 + rng.below(3) {
                    m.text_once(rng, &mut header);
                }
                join(rng, &header, &data)
            }
            3 => {
                let base = m.pick(rng).to_vec();
                let once = header_edit(rng, &base);
                header_edit(rng, &once)
            }
            _ => {
                let base = m.pick(rng).to_vec();
                value_edit(rng, &base)
            }
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        let loaded = match ckpt::from_bytes(input) {
            Ok(c) => c,
            Err(e) => return check::error(&e),
        };
        let refs: Vec<(&str, &Tensor)> =
            loaded.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        match ckpt::to_bytes(&refs, &loaded.metadata).map(|b| ckpt::from_bytes(&b)) {
            Ok(Ok(again))
                if again.metadata == loaded.metadata && equal(&again.tensors, &loaded.tensors) => {}
            Ok(Ok(_)) => {
                return Err(Failure::new("checkpoint-roundtrip", "written back, reads different"))
            }
            Ok(Err(e)) => return Err(Failure::new("checkpoint-roundtrip", e.message)),
            Err(e) => check::error(&e)?,
        }
        let path = self.dir.join("input.safetensors");
        std::fs::write(&path, input).expect("write the input to the scratch folder");
        for k in 0..self.models.len() {
            self.load_into(k, &path, &loaded)?;
        }
        Ok(())
    }
}

/// Same shape, dtype and bits.
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_le_bytes() == b.to_le_bytes()
}

/// The same names with the same tensors, in any order.
fn equal(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.len() == b.len() && a.iter().all(|(n, t)| b.iter().any(|(m, u)| m == n && same(t, u)))
}

/// The header (as JSON text, when the length field is sane) and the data of a file.
fn split(file: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let n = file
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .unwrap_or(0);
    match file.get(8..8usize.saturating_add(n)) {
        Some(h) => (h.to_vec(), file[8 + n..].to_vec()),
        None => (Vec::new(), file.get(8..).unwrap_or(&[]).to_vec()),
    }
}

/// A file from a header and data: usually the right length and padding, sometimes not.
fn join(rng: &mut Rng, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut header = header.to_vec();
    if rng.below(2) == 0 {
        header.resize(header.len().next_multiple_of(8), b' ');
    }
    let len = match rng.below(12) {
        0 => [0, 7, 100_000_001, 1 << 32, 1 << 63, u64::MAX][rng.below(6) as usize],
        1 => (header.len() as u64).wrapping_add([1, u64::MAX, 8][rng.below(3) as usize]),
        _ => header.len() as u64,
    };
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out
}

/// A structural edit of the JSON header: a field, a name, an entry or the metadata.
fn header_edit(rng: &mut Rng, file: &[u8]) -> Vec<u8> {
    let (header, data) = split(file);
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(&header) else {
        return file.to_vec();
    };
    let names: Vec<String> = map.keys().filter(|k| *k != METADATA_KEY).cloned().collect();
    // Numbers outside JSON's i64/u64/f64 go in as placeholders, replaced in the text below.
    let mut raw: Vec<(String, String)> = Vec::new();
    let mut number = |rng: &mut Rng| -> Value {
        let text = BOUNDARY_NUMBERS[rng.below(BOUNDARY_NUMBERS.len() as u64) as usize];
        let key = format!("@@{}@@", raw.len());
        raw.push((format!("\"{key}\""), text.to_string()));
        Value::String(key)
    };
    let pick = |rng: &mut Rng| names.get(rng.below(names.len().max(1) as u64) as usize).cloned();
    match rng.below(12) {
        0..=2 => {
            // One field of one tensor.
            if let Some(Value::Object(e)) = pick(rng).and_then(|n| map.get_mut(&n)) {
                let field = ["dtype", "shape", "data_offsets"][rng.below(3) as usize];
                let v = e.entry(field).or_insert(Value::Null);
                match (field, rng.below(4)) {
                    ("dtype", _) => {
                        let tags =
                            ["F32", "I32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "f32", ""];
                        *v = json!(tags[rng.below(tags.len() as u64) as usize]);
                    }
                    (_, 0) => *v = json!([]),
                    (_, 1) => {
                        if let Value::Array(a) = v {
                            let i = rng.below(a.len() as u64 + 1) as usize;
                            a.insert(i, number(rng));
                        }
                    }
                    (_, 2) => {
                        if let Value::Array(a) = v {
                            if !a.is_empty() {
                                let i = rng.below(a.len() as u64) as usize;
                                a[i] = match rng.below(3) {
                                    0 => number(rng),
                                    1 => json!(a[i].as_u64().unwrap_or(0).wrapping_add(4)),
                                    _ => json!(a[i].as_u64().unwrap_or(0).saturating_sub(1)),
                                };
                            }
                        }
                    }
                    _ => {
                        *v = [json!("1"), json!(null), json!({}), json!(1.5)][rng.below(4) as usize]
                            .clone()
                    }
                }
                if rng.below(8) == 0 {
                    e.insert("extra".into(), json!(1));
                }
            }
        }
        3 | 4 => {
            // Rename a tensor.
            if let Some(n) = pick(rng) {
                let v = map.remove(&n).unwrap_or(Value::Null);
                let c = CONTROL[rng.below(CONTROL.len() as u64) as usize];
                let other = pick(rng).unwrap_or_default();
                let new = match rng.below(6) {
                    0 => String::new(),
                    1 => METADATA_KEY.to_string(),
                    2 => format!("{n}{c}"),
                    3 => n.repeat(1 + rng.below(2000) as usize),
                    4 => format!("{other}.x"),
                    _ => n.to_uppercase(),
                };
                map.insert(new, v);
            }
        }
        5 => {
            if let Some(n) = pick(rng) {
                map.remove(&n);
            }
        }
        6 => {
            // A second tensor over the same bytes.
            if let Some(n) = pick(rng) {
                let v = map.get(&n).cloned().unwrap_or(Value::Null);
                map.insert(format!("{n}.copy"), v);
            }
        }
        7 => {
            if let Some(n) = pick(rng) {
                map.insert(
                    n,
                    [json!(1), json!("x"), json!([]), json!(null)][rng.below(4) as usize].clone(),
                );
            }
        }
        8 | 9 => {
            // Metadata: the step and the format, odd values and odd types.
            let meta = map.entry(METADATA_KEY).or_insert(json!({}));
            let steps = ["inf", "-1", "1e39", "nan", "18446744073709551616", "0x10", "", "1", " 2"];
            match (meta, rng.below(4)) {
                (Value::Object(m), 0 | 1) => {
                    m.insert("step".into(), json!(steps[rng.below(steps.len() as u64) as usize]));
                }
                (Value::Object(m), 2) => {
                    let odd = [json!(1), json!(null), json!({"a": "b"}), json!(["x"])];
                    m.insert("step".into(), odd[rng.below(4) as usize].clone());
                }
                (meta, _) => {
                    *meta = [json!("x"), json!([]), json!(null)][rng.below(3) as usize].clone()
                }
            }
        }
        _ => {
            // A duplicated key, which a JSON map cannot hold: spliced into the text below.
            if let Some(n) = pick(rng) {
                let entry = serde_json::to_string(&map[&n]).unwrap_or_default();
                raw.push(("{".into(), format!("{{{}:{entry},", json!(n))));
            }
        }
    }
    let mut text = serde_json::to_string(&map).unwrap_or_default();
    for (from, to) in &raw {
        text = text.replacen(from.as_str(), to, 1);
    }
    join(rng, text.as_bytes(), &data)
}

/// Element values at the edges of f32 and i32, written over tensor elements.
const VALUES: &[u32] = &[
    0x7f80_0000, // inf
    0xff80_0000, // -inf
    0x7fc0_0000, // NaN
    0x7f7f_ffff, // f32::MAX
    0x0000_0001, // the smallest subnormal
    0x4f80_0000, // 2^32
    0x5f80_0000, // 2^64
    0xbf80_0000, // -1.0
    0x8000_0000, // -0.0, i32::MIN
    0x7fff_ffff, // i32::MAX
    0xffff_ffff, // -1
];

/// One to four elements of the data set to boundary values.
fn value_edit(rng: &mut Rng, file: &[u8]) -> Vec<u8> {
    let mut out = file.to_vec();
    let (header, data) = split(file);
    let start = 8 + header.len();
    if data.len() < 4 {
        return out;
    }
    for _ in 0..1 + rng.below(4) {
        let i = start + 4 * rng.below(data.len() as u64 / 4) as usize;
        let v = VALUES[rng.below(VALUES.len() as u64) as usize];
        out[i..i + 4].copy_from_slice(&v.to_le_bytes());
    }
    out
}
