//! `examples/embed.rs` builds, trains and answers XOR correctly; the engine and its handles
//! are `Send`.

use std::process::Command;

#[test]
fn embed_example_trains_and_queries() {
    // `cargo test` builds the examples next to the test binaries' folder; use that build, and
    // fall back to `cargo run` when it is not there.
    let built = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("examples/embed")))
        .filter(|p| p.exists());
    let mut cmd = match built {
        Some(exe) => Command::new(exe),
        None => {
            let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            c.args(["run", "--quiet", "--example", "embed"]);
            c
        }
    };
    let out = cmd.current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("run the embed example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in ["xor(0, 0) = 0", "xor(0, 1) = 1", "xor(1, 0) = 1", "xor(1, 1) = 0"] {
        assert!(stdout.contains(line), "missing `{line}` in:\n{stdout}");
    }
}

/// A host application can move an engine, and what it hands out, to another thread (a worker
/// pool, a server): this test stops compiling if an `Rc` or a `RefCell` shared between
/// threads comes back anywhere inside them.
#[test]
fn the_engine_and_its_handles_are_send() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<rumus::Engine>();
    send::<rumus::script::Host>();
    send::<rumus::repl::Repl>();
    send::<rumus::session::Trainer>();
    send_sync::<rumus::engine::Compiled>();
    send_sync::<rumus::script::ScriptTrainer>();
    send_sync::<rumus::script::rhai::Dynamic>();
    send_sync::<rumus::script::Interrupt>();
    send_sync::<rumus::Tensor>();
    send_sync::<rumus::Error>();
}

/// `examples/worker.rs`: an engine set up on this thread moves to a worker thread (its print
/// sink with it), which trains, evaluates and predicts XOR on request.
#[test]
fn a_worker_thread_owns_an_engine_and_answers_jobs() {
    use crate::worker::{run, xor_jobs, Reply};
    let mut replies = Vec::new();
    run(xor_jobs(), |r| replies.push(r)).unwrap();
    // Losses differ in their last digits between CPUs (AVX-512, AVX2): compared to a bound.
    let low = |loss: f64| if loss < 0.05 { "below 0.05" } else { "too high" };
    let summary: Vec<String> = replies
        .iter()
        .map(|r| match r {
            Reply::Trained { step, loss } => format!("step {step}, loss {}", low(*loss as f64)),
            Reply::Evaluated { loss, accuracy } => {
                format!("evaluated loss {}, accuracy {accuracy}", low(*loss))
            }
            other => other.to_string(),
        })
        .collect();
    let expected = [
        "script: classifier compiled on cpu",
        "step 100, loss below 0.05",
        "evaluated loss below 0.05, accuracy 1",
        "step 300, loss below 0.05",
        "evaluated loss below 0.05, accuracy 1",
        "xor(0, 0) = 0",
        "xor(0, 1) = 1",
        "xor(1, 0) = 1",
        "xor(1, 1) = 0",
    ];
    assert_eq!(summary, expected);
}
