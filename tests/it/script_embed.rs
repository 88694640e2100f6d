//! `examples/embed.rs` builds, trains and answers XOR correctly.

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
