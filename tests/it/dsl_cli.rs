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
