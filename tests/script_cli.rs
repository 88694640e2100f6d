//! The `rumus` command's contract: exit codes (0 success, 1 script or runtime error, 2 usage or
//! I/O error), errors as `file:line:col: message` with a caret, a broken pipe is success, and
//! the metrics log.

use std::io::Read;
use std::process::{Command, Stdio};

fn rumus(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run rumus");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A script file under `target/` (inside the working directory, so the sandbox lets it run).
fn script(name: &str, text: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    format!("target/script_cli/{name}")
}

#[test]
fn success_is_zero() {
    let f = script("ok.rms", "print(1 + 1);\n");
    assert_eq!(rumus(&["run", &f]), (0, "2\n".into(), String::new()));
}

#[test]
fn script_error_is_one_with_position_and_caret() {
    let f = script("bad.rms", "let a = 1;\nlet b = zeros([2, -1]);\n");
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "{f}:2:9: shape: negative dimension -1\n    let b = zeros([2, -1]);\n            ^\n"
        )
    );
}

#[test]
fn usage_and_io_errors_are_two() {
    assert_eq!(rumus(&["run"]).0, 2);
    assert_eq!(rumus(&["frobnicate"]).0, 2);
    assert_eq!(rumus(&["run", "x.rms", "--seed", "many"]).0, 2);
    assert_eq!(rumus(&["run", "x.rms", "--device", "tpu"]).0, 2);
    let (code, _, err) = rumus(&["run", "target/no/such/file.rms"]);
    assert_eq!(code, 2);
    assert!(err.contains("target/no/such/file.rms"), "{err}");
}

#[test]
fn broken_pipe_is_success() {
    let f = script("chatty.rms", "let i = 0;\nloop { print(`line ${i}`); i += 1; }\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["run", &f])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 64];
    stdout.read_exact(&mut buf).unwrap();
    drop(stdout);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn metrics_log_is_json_lines() {
    let f = script("metrics.rms", "log_metric(\"acc\", 0.5);\nlog_metric(\"n\", 3);\n");
    let log = "target/script_cli/metrics.jsonl";
    assert_eq!(rumus(&["run", &f, "--metrics", log]).0, 0);
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(log))
        .unwrap();
    assert_eq!(
        text,
        "{\"metric\":\"acc\",\"step\":0,\"value\":0.5}\n{\"metric\":\"n\",\"step\":0,\"value\":3.0}\n"
    );
}

#[test]
fn errors_in_either_language_point_into_the_file() {
    // A model-language error inside a block, on the file's line 3.
    let f = script(
        "model_err.rms",
        "let a = 1;\nmodel m(x: f32[B, 2]) {\n    h = relux(x)\n    return h\n}\n",
    );
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1);
    assert!(err.starts_with(&format!("{f}:3:9: ")), "{err}");
    // A script error after a model block keeps the file's line numbers.
    let f = script(
        "after_model.rms",
        "model m(x: f32[B, 2]) {\n    return linear(x, 2)\n}\nlet net = m();\nnet.nope();\n",
    );
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1);
    assert!(err.starts_with(&format!("{f}:5:")), "{err}");
}

/// Bytes written to `target/script_cli/NAME`; the path to pass.
fn raw_file(name: &str, bytes: &[u8]) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_cli");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
    format!("target/script_cli/{name}")
}

#[test]
fn every_command_reads_source_files_the_same_checked_way() {
    let bom = raw_file("bom.rms", b"\xEF\xBB\xBFprint(1);\nmodel m(x: f32[B, 2]) { return x }\n");
    let utf16 = raw_file("utf16.rms", b"\xFF\xFEp\x00r\x00");
    let bad = raw_file("bad_utf8.rms", b"print(1);\nlet a = \"\x9F\";\n");
    // A UTF-8 byte-order mark is skipped.
    assert_eq!(rumus(&["run", &bom]), (0, "1\n".into(), String::new()));
    for command in ["run", "graph", "plan", "bench"] {
        let (code, _, err) = rumus(&[command, &utf16]);
        assert_eq!(code, 1, "{command}: {err}");
        assert!(
            err.starts_with(&format!(
                "{utf16}:1:1: the file starts with a UTF-16 little-endian byte-order mark"
            )),
            "{command}: {err}"
        );
        let (code, _, err) = rumus(&[command, &bad]);
        assert_eq!(code, 1, "{command}: {err}");
        assert!(
            err.starts_with(&format!(
                "{bad}:2:10: invalid UTF-8 (byte 0x9F): source files must be UTF-8 text\n    let a = \"\u{FFFD}\";\n             ^\n"
            )),
            "{command}: {err}"
        );
        let (code, _, err) = rumus(&[command, "/dev/zero"]);
        assert_eq!(code, 2, "{command}: {err}");
        assert!(
            err.starts_with("/dev/zero: a source file may have at most 16777216 bytes"),
            "{command}: {err}"
        );
    }
}
