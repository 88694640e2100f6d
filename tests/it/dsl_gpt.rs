//! Acceptance: a GPT-style model written in the model language lowers to the same graph as the
//! one built by hand from Rust (`rumus::nn::gpt`), with the usual dotted parameter names.

use rumus::dsl::{self, Value};
use rumus::graph::{Graph, NodeId, Op};
use rumus::nn::{self, GptConfig};
use rumus::Source;
use std::collections::HashMap;

/// The whole model, in the language (well under 40 lines).
const GPT: &str = r#"
// A GPT-style language model: token + position embeddings, pre-LN blocks, final LN, head.
model gpt(idx: i32[B, T], vocab = 65, d = 64, heads = 4, layers = 2, ctx = 16) {
    x = embedding(idx, vocab, d) as wte + position_embedding(T, ctx, d) as wpe
    repeat layers as blocks {
        x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn
        x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp
    }
    logits = linear(layer_norm(x) as ln_f, vocab) as head
    return logits
}
"#;

/// Canonical structure of every node: op, shape, dtype and the canonical ids of its inputs.
/// Two nodes with the same id compute the same thing from the same parameters and inputs, so
/// equal output ids mean equal forward results on any backend.
fn canon(g: &Graph, table: &mut HashMap<String, usize>) -> Vec<usize> {
    let mut ids: Vec<usize> = Vec::new();
    for (_, n) in g.nodes() {
        let ins: Vec<usize> = n.inputs.iter().map(|i: &NodeId| ids[i.index()]).collect();
        let key = format!("{:?} {:?} {:?} {:?}", n.op, n.shape, n.dtype, ins);
        let next = table.len();
        ids.push(*table.entry(key).or_insert(next));
    }
    ids
}

fn dsl_gpt(c: GptConfig, batch: usize) -> Graph {
    let src = Source::new("gpt.rms", GPT);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let int = |v: usize| Value::Int(v as i64);
    let bindings = [
        ("B", int(batch)),
        ("T", int(c.ctx)),
        ("vocab", int(c.vocab)),
        ("d", int(c.d)),
        ("heads", int(c.heads)),
        ("layers", int(c.layers)),
        ("ctx", int(c.ctx)),
    ];
    dsl::lower(&module, "gpt", &bindings, None).unwrap_or_else(|e| panic!("{}", e.in_source(&src)))
}

#[test]
fn gpt_is_short() {
    assert!(GPT.trim().lines().count() < 40);
}

#[test]
fn gpt_lowers_to_the_hand_built_graph() {
    let c = GptConfig { vocab: 65, d: 64, heads: 4, layers: 2, ctx: 16 };
    let ours = dsl_gpt(c, 2);
    let mut theirs = Graph::new();
    nn::gpt(&mut theirs, c, 2).unwrap();
    let mut table = HashMap::new();
    let a = canon(&ours, &mut table);
    let b = canon(&theirs, &mut table);
    let out_a = a[ours.output("logits").unwrap().index()];
    let out_b = b[theirs.output("logits").unwrap().index()];
    assert_eq!(out_a, out_b, "the two graphs compute different logits");
    let params = |g: &Graph| {
        let mut v: Vec<String> = g.parameters().iter().map(|(_, n)| n.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(params(&ours), params(&theirs));
}

#[test]
fn gpt_parameter_names() {
    let c = GptConfig { vocab: 65, d: 64, heads: 4, layers: 2, ctx: 16 };
    let g = dsl_gpt(c, 1);
    let names: Vec<String> =
        g.parameters().iter().map(|&(id, n)| format!("{n} {:?}", g.shape(id))).collect();
    let mut expected = vec!["wte.weight [65, 64]".to_string(), "wpe.weight [16, 64]".to_string()];
    for i in 0..2 {
        for (n, s) in [
            ("ln1.weight", "[64]"),
            ("ln1.bias", "[64]"),
            ("attn.qkv.weight", "[64, 192]"),
            ("attn.qkv.bias", "[192]"),
            ("attn.proj.weight", "[64, 64]"),
            ("attn.proj.bias", "[64]"),
            ("ln2.weight", "[64]"),
            ("ln2.bias", "[64]"),
            ("mlp.fc.weight", "[64, 256]"),
            ("mlp.fc.bias", "[256]"),
            ("mlp.proj.weight", "[256, 64]"),
            ("mlp.proj.bias", "[64]"),
        ] {
            expected.push(format!("blocks.{i}.{n} {s}"));
        }
    }
    expected.extend(
        ["ln_f.weight [64]", "ln_f.bias [64]", "head.weight [64, 65]", "head.bias [65]"]
            .map(String::from),
    );
    assert_eq!(names, expected);
}

#[test]
fn every_node_has_a_span_in_the_source() {
    let c = GptConfig { vocab: 65, d: 64, heads: 4, layers: 2, ctx: 16 };
    let g = dsl_gpt(c, 1);
    for (id, n) in g.nodes() {
        assert!(!n.span.is_none(), "node {id:?} ({}) has no span", n.op.name());
        assert!((n.span.end as usize) <= GPT.len());
    }
    // The head's matmul points at the `linear(...) as head` call.
    let head_w = g.persistent_named("head.weight").unwrap();
    let mm = g
        .nodes()
        .find(|(_, n)| matches!(n.op, Op::MatMul) && n.inputs.contains(&head_w))
        .unwrap()
        .1;
    assert!(GPT[mm.span.start as usize..mm.span.end as usize]
        .starts_with("linear(layer_norm(x) as ln_f, vocab) as head"));
}

#[test]
fn model_inside_an_rms_script_keeps_positions() {
    let text = "let n = 3;\nprint(`hi ${n}`);\nmodel m(x: f32[2, 3]) {\n    return x @ x\n}\nlet y = #{ a: 1 };\n";
    let src = Source::new("s.rms", text);
    let module = dsl::load_rms(&src).unwrap();
    let e = dsl::lower(&module, "m", &[], None).unwrap_err().in_source(&src);
    assert_eq!(
        e.to_string(),
        "s.rms:4:12: matmul: inner dimensions differ: [2, 3] @ [2, 3] (3 vs 2)\n        return x @ x\n               ^^^^^"
    );
    let split = dsl::rms::split(text);
    assert_eq!(split.script_text.len(), text.len());
    assert!(split.script_text.contains("let y = #{ a: 1 };"));
    assert!(!split.script_text.contains("model"));
    assert!(split.model_text.trim_start().starts_with("model m"));
}

#[test]
fn std_library_parses_and_resolves() {
    let src = Source::new("empty.rms", "");
    let module = dsl::load(&src).unwrap();
    for name in
        ["linear", "layer_norm", "embedding", "mlp", "causal_self_attention", "transformer_block"]
    {
        assert!(module.item(name).is_some(), "std lacks {name}");
    }
}

#[test]
fn transformer_block_from_std() {
    let text = "model m(x: f32[B, T, 16]) {\n    return transformer_block(x, 2) as tb\n}\n";
    let src = Source::new("t.rms", text);
    let module = dsl::load(&src).unwrap();
    let g = dsl::lower(&module, "m", &[("B", Value::Int(2)), ("T", Value::Int(4))], None).unwrap();
    assert_eq!(g.shape(g.output("tb").unwrap()), &[2, 4, 16]);
    assert!(g.persistent_named("tb.attn.qkv.weight").is_some());
    assert!(g.persistent_named("tb.mlp.fc.weight").is_some());
}

#[test]
fn inline_param_binds_its_name() {
    let text = "model m(x: f32[B, T, 4], ctx = 8) {\n    y = x + slice(param wpe[ctx, 4] = normal(0, 0.02), 0, 0, T)\n    return y + slice(wpe, 0, 0, T)\n}\n";
    let src = Source::new("i.rms", text);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let g = dsl::lower(&module, "m", &[("B", Value::Int(1)), ("T", Value::Int(3))], None).unwrap();
    assert_eq!(g.shape(g.persistent_named("wpe").unwrap()), &[8, 4]);
    assert_eq!(g.shape(g.output("output").unwrap()), &[1, 3, 4]);
}

/// The CPU forward of the language's GPT equals the hand-built one bit for bit (same seed, so
/// the same initial parameters by name, and the same tokens).
#[test]
fn gpt_cpu_forward_matches_the_hand_built_graph_exactly() {
    use rumus::cpu::{Buf, Executor, RunOptions};
    let c = GptConfig { vocab: 65, d: 32, heads: 4, layers: 2, ctx: 8 };
    let ours = dsl_gpt(c, 2);
    let mut theirs = Graph::new();
    nn::gpt(&mut theirs, c, 2).unwrap();
    let tokens: Vec<i32> = (0..16).map(|i| i * 7 % 65).collect();
    let forward = |g: &Graph| {
        let idx = g.input_named("idx").unwrap();
        let logits = g.output("logits").unwrap();
        let mut exec = Executor::<f32>::new(g, 11).unwrap();
        let opts = RunOptions { training: false, step: 0 };
        match exec.run(g, &[(idx, Buf::I(tokens.clone()))], &[logits], opts).unwrap().remove(0) {
            Buf::F(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
            Buf::I(_) => panic!("logits are f32"),
        }
    };
    let (a, b) = (forward(&ours), forward(&theirs));
    assert_eq!(a.len(), 2 * 8 * 65);
    assert!(a == b, "the language's GPT and the hand-built one differ");
}

/// Regression: a user model named like a standard block (`mlp`) hid that block from the
/// standard library's own `transformer_block`, which then failed with "`mlp` is a model".
#[test]
fn a_model_named_like_a_std_block_does_not_hide_it() {
    let text = "model mlp(idx: i32[B, T]) {\n    x = embedding(idx, 16, 8) as wte\n    return transformer_block(x, 2)\n}\n";
    let src = Source::new("m.rms", text);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let g = dsl::lower(&module, "mlp", &[("B", Value::Int(2)), ("T", Value::Int(4))], None)
        .unwrap_or_else(|e| panic!("{}", e.in_source(&src)));
    assert!(g.persistent_named("transformer_block_0.mlp.fc.weight").is_some());
}

/// Anonymous `repeat`s are named by place, `repeat_<k>` for the k-th of their scope, as
/// anonymous calls are: a nested one was named by a count of every `repeat` run, so it was
/// `repeat_1` in its outer one's first pass, `repeat_2` in the second, and the next
/// top-level one `repeat_3`.
#[test]
fn anonymous_repeats_are_named_by_place() {
    let text = "model m(x: f32[B, 4]) {\n    repeat 2 { repeat 2 { x = linear(x, 4) } }\n    repeat 2 { x = linear(x, 4) }\n    return x\n}\n";
    let module = dsl::load(&Source::new("r.rms", text)).unwrap();
    let g = dsl::lower(&module, "m", &[], Some(2)).unwrap();
    let names: Vec<&str> =
        g.parameters().iter().map(|&(_, n)| n).filter(|n| n.ends_with("weight")).collect();
    assert_eq!(
        names,
        [
            "repeat_0.0.repeat_0.0.linear_0.weight",
            "repeat_0.0.repeat_0.1.linear_0.weight",
            "repeat_0.1.repeat_0.0.linear_0.weight",
            "repeat_0.1.repeat_0.1.linear_0.weight",
            "repeat_1.0.linear_0.weight",
            "repeat_1.1.linear_0.weight",
        ]
    );
}
