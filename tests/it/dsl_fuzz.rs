//! No input makes the parser or lowering panic or hang: seeded mutations of valid models,
//! random token soup, deep nesting and huge sources all come back as `Ok` or a positioned
//! `Err`, quickly. The tests of large inputs assert what comes back, not how long it took (no
//! timed assertions in tests): each input is sized so that the quadratic work it once caused
//! would run for minutes, which a test run shows as a hang and CI as a timeout.

use rumus::dsl;
use rumus::rng::Rng;
use rumus::Source;

const SEEDS: &[&str] = &[
    "model gpt(idx: i32[B, T], vocab = 11, d = 8, heads = 2, layers = 2, ctx = 4) {\n    x = embedding(idx, vocab, d) as wte + position_embedding(T, ctx, d) as wpe\n    repeat layers as blocks {\n        x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn\n        x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp\n    }\n    return linear(layer_norm(x) as ln_f, vocab) as head\n}\n",
    "// comment\nblock lin(x: f32[..., IN], out) {\n    param w[IN, out] = normal(0, 0.02) /* inline */\n    return x @ w\n}\nmodel m(x: f32[B, 4], y: i32[B]) {\n    const k = 2 * 3\n    h = relu(lin(x, k) as a) * -1.5 / 2\n    s = sum(h, [-1], keepdim = true) + mean(h, [0, 1])\n    loss = cross_entropy(lin(h, 3), y)\n    p = softmax(h)\n    return loss, p, s\n}\n",
    "model n(x: f32[2, 3, 4]) {\n    a = transpose(x, 0, -1)\n    b = reshape(permute(x, [2, 0, 1]), [4, -1])\n    c = concat([x, x], 1)\n    d = where(x, maximum(x, 0), minimum(x, 1))\n    e = slice(c, 1, 0, 3) + broadcast_to(sum(x, [1], keepdim = true), [2, 3, 4])\n    return gelu(e) + dropout(d, 0.1, 7) + sqrt(exp(x)) + causal_mask(x)\n}\n",
];

const TOKENS: &[&str] = &[
    "model",
    "block",
    "param",
    "const",
    "repeat",
    "return",
    "as",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    "=",
    "...",
    "+",
    "-",
    "*",
    "/",
    "@",
    "x",
    "y",
    "B",
    "T",
    "f32",
    "i32",
    "0",
    "1",
    "2",
    "-1",
    "1.5",
    "1e-5",
    "relu",
    "linear",
    "layer_norm",
    "sum",
    "reshape",
    "xavier",
    "normal",
    "ops.",
    "true",
    "//",
    "/*",
    "*/",
    "\n",
    " ",
    "é",
    "\"",
    "99999999999999999999999",
];

fn pipeline(text: &str) {
    let src = Source::new("fuzz.rms", text);
    let Ok(module) = dsl::load(&src) else { return };
    let models: Vec<String> = module.models().map(|m| m.name.name.clone()).collect();
    for m in models {
        let r = dsl::lower(&module, &m, &[], Some(2));
        if let Err(e) = r {
            let _ = e.in_source(&src).to_string();
        }
    }
    // .rms splitting and rendering must not panic either.
    if let Err(e) = dsl::load_rms(&src) {
        let _ = e.to_string();
    }
}

fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut s: Vec<char> = text.chars().collect();
    let n = 1 + rng.next_u64() as usize % 4;
    for _ in 0..n {
        let pos = if s.is_empty() { 0 } else { rng.next_u64() as usize % (s.len() + 1) };
        match rng.next_u64() % 4 {
            0 if pos < s.len() => {
                s.remove(pos);
            }
            1 => {
                let t = TOKENS[rng.next_u64() as usize % TOKENS.len()];
                for (k, c) in t.chars().enumerate() {
                    s.insert(pos + k, c);
                }
            }
            2 if pos < s.len() => {
                let end = (pos + 1 + rng.next_u64() as usize % 12).min(s.len());
                s.drain(pos..end);
            }
            _ if !s.is_empty() => {
                let from = rng.next_u64() as usize % s.len();
                let c = s[from];
                s.insert(pos, c);
            }
            _ => {}
        }
    }
    s.into_iter().collect()
}

#[test]
fn ten_thousand_mutated_and_random_sources() {
    let mut rng = Rng::new(0x5eed);
    for i in 0..10_000 {
        let text = if i % 5 == 4 {
            let n = rng.next_u64() as usize % 40;
            (0..n)
                .map(|_| TOKENS[rng.next_u64() as usize % TOKENS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            let seed = SEEDS[i % SEEDS.len()];
            let mut t = mutate(&mut rng, seed);
            if i % 7 == 0 {
                t = mutate(&mut rng, &t);
            }
            t
        };
        pipeline(&text);
    }
}

#[test]
fn seeds_are_valid() {
    for s in SEEDS {
        let src = Source::new("seed.rms", *s);
        let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
        for m in module.models() {
            dsl::lower(&module, &m.name.name, &[], Some(2))
                .unwrap_or_else(|e| panic!("{}", e.in_source(&src)));
        }
    }
}

#[track_caller]
fn fails_fast(text: &str, message_starts: &str) {
    let src = Source::new("big.rms", text);
    let e = dsl::load(&src).map(|_| ()).unwrap_err();
    assert!(e.message.starts_with(message_starts), "{}", e.message);
    assert!(e.location().is_some());
}

#[test]
fn nesting_100_000_deep_is_an_error() {
    let deep =
        format!("model m(x: f32[2]) {{ return {}x{} }}", "(".repeat(100_000), ")".repeat(100_000));
    fails_fast(&deep, "brackets nested deeper than");
    let lists =
        format!("model m(x: f32[2]) {{ return {}x{} }}", "[".repeat(100_000), "]".repeat(100_000));
    fails_fast(&lists, "brackets nested deeper than");
    let negs = format!("model m(x: f32[2]) {{ return {}x }}", "-".repeat(100_000));
    fails_fast(&negs, "expression is nested deeper than");
    let chain = format!("model m(x: f32[2]) {{ return x{} }}", " + x".repeat(20_000));
    fails_fast(&chain, "expression is nested deeper than");
}

#[test]
fn nesting_at_the_limit_parses_on_a_small_stack() {
    let n = rumus::dsl::parse::MAX_NESTING - 1;
    let text = format!("model m(x: f32[2]) {{ return {}x{} }}", "relu(".repeat(n), ")".repeat(n));
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            let src = Source::new("deep.rms", text);
            let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
            dsl::lower(&module, "m", &[], None).unwrap_or_else(|e| panic!("{e}"));
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn ten_megabyte_source_is_an_error() {
    let big = format!("model m(x: f32[2]) {{ return x }}\n// {}", "a".repeat(10 << 20));
    fails_fast(&big, "source is");
}

#[test]
fn lowering_is_bounded() {
    let text = "block f(x) { return relu(x) }\nmodel m(x: f32[2]) {\n    repeat 1000000000 {\n        x = f(x)\n    }\n    return x\n}\n";
    let src = Source::new("loop.rms", text);
    let module = dsl::load(&src).unwrap();
    let e = dsl::lower(&module, "m", &[], None).unwrap_err();
    assert!(e.message.starts_with("model is too large to lower"), "{}", e.message);
}

/// Found by the hostile-input audit: a step was an expression, however much it built, so
/// `a = [a, a, ..., a]` nine times over (10^10 values) ran until memory failed; an empty
/// `repeat` body took no step, so `repeat 2^63-1 { }` never ended; `repeat 66000 { a = [a] }`
/// took minutes copying ever deeper lists. A copied list costs its size, a pass of `repeat`
/// one step.
#[test]
fn lowering_counts_the_values_it_copies_and_every_pass_of_a_repeat() {
    for (body, at) in [
        ("    a = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n    repeat 9 { a = [a, a, a, a, a, a, a, a, a, a] }\n", (3, 21)),
        ("    repeat 9223372036854775807 { }\n", (2, 5)),
        ("    a = 1\n    repeat 66000 { a = [a] }\n", (3, 25)),
    ] {
        let text = format!("model m(x: f32[B, 4]) {{\n{body}    return x\n}}\n");
        let src = Source::new("big.rms", text);
        let module = dsl::load(&src).unwrap();
        let e = dsl::lower(&module, "m", &[], Some(2)).unwrap_err().in_source(&src);
        assert_eq!(e.message, "model is too large to lower: more than 200000 steps", "{body}");
        assert_eq!(e.location().map(|(_, l, c)| (l, c)), Some(at), "{body}");
    }
}

/// Found by the fuzz driver (a GPT with `layers = 65535`): each new parameter name was checked
/// against every node, so lowering was quadratic and this ran for minutes before reaching the
/// step limit; names are indexed now.
#[test]
fn a_gpt_with_65535_layers_stops_at_the_step_limit() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz_corpus/dsl/gpt-with-65535-layers.rms"
    ))
    .unwrap();
    let src = Source::new("deep.rms", text);
    let module = dsl::load(&src).unwrap();
    let e = dsl::lower(&module, "char_gpt", &[], Some(2)).unwrap_err().in_source(&src);
    assert_eq!(e.message, "model is too large to lower: more than 200000 steps");
    assert_eq!(e.location(), Some(("deep.rms".to_string(), 5, 13)));
}

/// A signature of 120,000 hyperparameters (under the 1 MiB source limit) is checked in linear
/// time: each hyperparameter was looked up in, and removed from, a list of all of them, which
/// took about 30 s here.
#[test]
fn a_signature_of_120_000_hyperparameters_is_checked_quickly() {
    let n = 120_000;
    let names: Vec<String> = (0..n - 1).map(|i| format!("h{i}")).collect();
    let text = format!("model m(x: f32[2], {}, last = h0) {{\n    return x\n}}\n", names.join(","));
    assert!(text.len() < 1 << 20);
    let src = Source::new("wide.rms", text);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let e = dsl::lower(&module, "m", &[], None).unwrap_err().in_source(&src);
    assert_eq!(e.message, "hyperparameter `h0` has no default and was not set");
    assert_eq!(e.location().map(|(_, line, _)| line), Some(1));
}

/// A model of 25,000 parameters declared inside expressions is checked in linear time: each
/// inline `param` copied every name in scope, which took about 13 s here.
#[test]
fn a_model_of_25_000_inline_params_is_checked_quickly() {
    let n = 25_000;
    let body: String = (0..n).map(|i| format!("    x = x + (param p{i}[2] = zeros)\n")).collect();
    let text = format!("model m(x: f32[2]) {{\n{body}    return x + p{n}\n}}\n");
    assert!(text.len() < 1 << 20);
    let src = Source::new("wide.rms", text);
    let e = dsl::load(&src).map(|_| ()).unwrap_err().in_source(&src);
    assert_eq!(e.message, format!("unknown name `p{n}`"));
    assert_eq!(e.location().map(|(_, line, col)| (line, col)), Some((n + 2, 16)));
}

/// Found by the hostile-input audit (round 7): a call's named arguments are bound in linear
/// time. Each one searched the block's parameter list for its name, so a call of 40,000 named
/// arguments took 3 s at every binding (resolve once, lowering at every iteration of a
/// `repeat`): this model took about 15 s to reach its mistake.
#[test]
fn a_call_of_40_000_named_arguments_is_bound_quickly() {
    let n = 40_000;
    let params: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
    let args: Vec<String> = (0..n).rev().map(|i| format!("a{i} = 1")).collect();
    let text = format!(
        "block f(x: f32[2, 3], {}) {{\n    return x\n}}\nmodel m(x: f32[2, 3]) {{\n    repeat 4 {{\n        x = f(x, {})\n    }}\n    return x @ x\n}}\n",
        params.join(", "),
        args.join(", ")
    );
    assert!(text.len() < 1 << 20);
    let src = Source::new("wide.rms", text);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let e = dsl::lower(&module, "m", &[], None).unwrap_err().in_source(&src);
    assert_eq!(e.message, "matmul: inner dimensions differ: [2, 3] @ [2, 3] (3 vs 2)");
    assert_eq!(e.location().map(|(_, line, _)| line), Some(8));
}

/// Found by the hostile-input audit (round 7): the values a model is lowered with (a script's
/// `m(#{ .. })`, `--set`) are matched to its signature by name in linear time. Each one
/// searched the signature, so 100,000 of them took about 12 s, at every lowering (the call,
/// `compile`, each new batch size of `predict`).
#[test]
fn a_model_lowered_with_100_000_values_matches_them_quickly() {
    let n = 100_000;
    let names: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    let text = format!("model m(x: f32[2], {}) {{\n    return x\n}}\n", names.join(","));
    assert!(text.len() < 1 << 20);
    let src = Source::new("wide.rms", text);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let mut bindings: Vec<(&str, dsl::Value)> =
        names.iter().map(|n| (n.as_str(), dsl::Value::Int(1))).collect();
    bindings.push(("typo", dsl::Value::Int(1)));
    let e = dsl::lower(&module, "m", &bindings, None).unwrap_err();
    assert_eq!(
        e.message,
        "model `m` has no hyperparameter or dimension `typo` (it has hyperparameters `h0`, `h1`, \
         `h2`, `h3`, `h4`, `h5`, `h6`, `h7`, and 99992 more; no dimensions)"
    );
}
