//! The REPL, driven through the same code as the terminal loop: `Repl::feed` line by line, and
//! `rumus repl --batch` through the binary.

use rumus::repl::{Outcome, Repl};
use rumus::script::HostOptions;

fn feed_all(repl: &mut Repl, lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match repl.feed(l) {
            Outcome::Done(s) => s,
            Outcome::More => "<more>".to_string(),
            Outcome::Quit => "<quit>".to_string(),
        })
        .collect()
}

const SESSION: &[&str] = &[
    "model lin(x: f32[B, 2]) {",
    "    return linear(x, 2) as fc",
    "}",
    "let net = lin().compile(#{ batch: 4, optimizer: sgd(#{ lr: 0.1 }) });",
    "let x = tensor([[0, 0], [0, 1], [1, 0], [1, 1]]);",
    "let y = tensor([0, 1, 1, 0], \"i32\");",
    "net.train_step(x, y) > 0.0",
    "net.train_step(x, y); net.step",
    "no_such_thing(1)",
    ":plan net",
    ":params net",
    ":graph net",
    "net.step",
    ":quit",
];

#[test]
fn define_compile_train_plan_survive_an_error_and_quit() {
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(&mut repl, SESSION);
    assert_eq!(out[0], "<more>");
    assert_eq!(out[1], "<more>");
    assert_eq!(out[2], "");
    assert_eq!(out[3], "");
    assert_eq!(out[6], "true\n");
    assert_eq!(out[7], "2\n");
    assert!(out[8].starts_with("<repl:7>:1:1: function not found: no_such_thing"), "{}", out[8]);
    assert!(out[9].contains("cpu"), "{}", out[9]);
    assert_eq!(out[10], "fc.weight [2, 2]\nfc.bias [2]\n");
    // The training step's graph, its nodes grouped by the kernels of the compiled plan.
    assert!(out[11].starts_with("digraph \"model\" {"), "{}", out[11]);
    assert!(out[11].contains("subgraph cluster_0 {"), "{}", out[11]);
    assert_eq!(out[12], "2\n", "state survives the error");
    assert_eq!(out[13], "<quit>");
}

#[test]
fn functions_defined_earlier_stay_callable() {
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(
        &mut repl,
        &["fn sq(v) {", "  v * v", "}", "sq(7)", "let t = tensor(0..3);", "t.sum()"],
    );
    assert_eq!(out[3], "49\n");
    assert_eq!(out[5], "3.0\n");
    assert_eq!(repl.eval_line("tensor(0..2)"), "tensor f32[2] [0, 1]\n");
    assert_eq!(repl.eval_line(":nope"), "unknown command `:nope`; try :help\n");
    assert!(repl.eval_line(":help").contains(":load FILE"));
    let (start, names) = repl.complete("let a = ten", 11);
    assert_eq!((start, names), (8, vec!["tensor".to_string()]));
}

#[test]
fn batch_mode_through_the_binary() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["repl", "--batch"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(SESSION.join("\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("function not found: no_such_thing"), "{text}");
    assert!(text.contains("fc.weight [2, 2]"), "{text}");
    assert!(text.trim_end().ends_with('2'), "{text}");
}

#[test]
fn error_in_a_call_of_a_model_from_an_earlier_input_points_at_the_call() {
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(
        &mut repl,
        &[
            "model m(x: f32[B, 3], k = 2) {",
            "    return reshape(linear(x, k), [1, 4])",
            "}",
            "let a = 1;",
            "let n = m(#{ bogus: 1 });",
            "let n = m(#{ k: 3 });",
        ],
    );
    // The call's mistake, at the call (the second input), not at its offset in the first.
    assert_eq!(
        out[4],
        "<repl:3>:1:9: model `m` has no hyperparameter or dimension `bogus`\n    let n = m(#{ bogus: 1 });\n            ^\n"
    );
    // A mistake inside the model, in the input that defined it.
    assert_eq!(
        out[5],
        "<repl:1>:2:12: reshape: cannot reshape [1, 3] (3 elements) into [1, 4] (4 elements)\n        return reshape(linear(x, k), [1, 4])\n               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    );
}
