//! Writes stay inside the sandbox and never fail silently: files are written atomically through
//! an unpredictable, exclusively created temporary file in the target's own folder; folders and
//! paths that resolve outside the write roots are refused; a full disk is an error; `exit(n)`
//! reaches the host.

use crate::common::script::{capture, Printed};
use rumus::error::Source;
use rumus::script::runner::{self, RunOptions};
use rumus::script::{ExitRequest, Host, HostOptions};
use rumus::ErrorKind;
use std::path::{Path, PathBuf};

/// A fresh folder under `target/` (inside the working directory, so scripts may write it),
/// and its path relative to the working directory.
fn scratch(name: &str) -> (PathBuf, String) {
    let rel = format!("target/script_writes/{name}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (dir, rel)
}

fn host() -> (Host, Printed) {
    let mut h = Host::new(HostOptions { device: "cpu".into(), ..HostOptions::default() });
    let out = capture(&mut h);
    (h, out)
}

fn eval(h: &mut Host, code: &str) -> rumus::Result<()> {
    h.eval(&Source::new("t.rms", code)).map(drop)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[cfg(unix)]
#[test]
fn planted_symlinks_at_temporary_names_are_not_followed() {
    let (dir, rel) = scratch("planted");
    let outside = std::env::temp_dir().join(format!("rumus-planted-{}", std::process::id()));
    let _ = std::fs::remove_file(&outside);
    // Where the old helpers put their temporary files: `<name>.tmp<pid>`, `.<name>.<pid>.<n>.tmp`.
    let pid = std::process::id();
    for name in ["out.txt", "ck.safetensors"] {
        for tmp in [format!("{name}.tmp{pid}"), format!(".{name}.{pid}.0.tmp")] {
            std::os::unix::fs::symlink(&outside, dir.join(tmp)).unwrap();
        }
    }
    let (mut h, _) = host();
    eval(
        &mut h,
        &format!(
            "write_text(\"{rel}/out.txt\", \"hello\");
             model m(x: f32[B, 2]) {{ return linear(x, 2) }}
             m().compile(#{{ loss: \"mse\" }}).save(\"{rel}/ck.safetensors\");"
        ),
    )
    .unwrap();
    assert!(!outside.exists(), "a write followed a planted link to {}", outside.display());
    assert_eq!(std::fs::read_to_string(dir.join("out.txt")).unwrap(), "hello");
    assert!(dir.join("ck.safetensors").is_file());
}

#[test]
fn folders_and_paths_resolving_outside_are_refused() {
    let (dir, rel) = scratch("folders");
    let (mut h, _) = host();
    let parent = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let before = names(&parent);
    for (path, kind, message) in [
        (".", ErrorKind::Io, "writing `.`: it is a folder; give a file name"),
        ("target", ErrorKind::Io, "writing `target`: it is a folder; give a file name"),
        ("target/..", ErrorKind::Io, "writing `target/..`: it is a folder; give a file name"),
        (
            "..",
            ErrorKind::Limit,
            "writing `..` is not allowed: scripts write only below the working directory",
        ),
    ] {
        let e = eval(&mut h, &format!("write_text(\"{path}\", \"x\")")).unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), (kind, message), "{path}");
    }
    assert_eq!(names(&parent), before, "nothing was written beside the working directory");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(std::env::temp_dir(), dir.join("out")).unwrap();
        let e = eval(&mut h, &format!("write_text(\"{rel}/out/x.txt\", \"x\")")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit, "{e}");
        assert!(!std::env::temp_dir().join("x.txt").exists());
    }
}

#[test]
fn temporary_files_of_a_killed_save_are_cleaned_by_the_next() {
    let (dir, rel) = scratch("stale");
    // pid 2^31 - 1 is above any pid_max: that process is gone.
    let stale = format!(".ck.safetensors.{}.00000000deadbeef.tmp", i32::MAX);
    std::fs::write(dir.join(&stale), "half a checkpoint").unwrap();
    let (mut h, _) = host();
    eval(
        &mut h,
        &format!(
            "model m(x: f32[B, 2]) {{ return linear(x, 2) }}
             m().compile(#{{ loss: \"mse\" }}).save(\"{rel}/ck.safetensors\");"
        ),
    )
    .unwrap();
    assert_eq!(names(&dir), ["ck.safetensors"]);
}

#[cfg(unix)]
#[test]
fn a_full_disk_stops_the_script_with_an_error() {
    let (_, rel) = scratch("full");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel).join("log.rms");
    std::fs::write(&file, "log_metric(\"a\", 1.0);\nprint(\"after\");\n").unwrap();
    let opts = RunOptions {
        file,
        host: HostOptions { device: "cpu".into(), ..HostOptions::default() },
        metrics: Some("/dev/full".into()),
        log_every: 0,
        plot: None,
    };
    let e = runner::run(opts).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    assert_eq!(e.message, "/dev/full: No space left on device (os error 28)");

    // Standard output on a full disk, through the command: the script stops at the first print.
    std::fs::write(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel).join("print.rms"),
        "for i in 0..3 { print(i); }\nwrite_text(\"target/script_writes/full/ran_on.txt\", \"x\");\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["run", &format!("{rel}/print.rms")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("standard output: No space left on device"), "{err}");
    assert!(!Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel).join("ran_on.txt").exists());
}

#[test]
fn exit_ends_the_script_and_its_status_reaches_the_host() {
    let (mut h, out) = host();
    eval(&mut h, "fn stop(n) { exit(n); }\nprint(1); stop(3); print(2);").unwrap();
    assert_eq!(
        (h.exit_request(), out.lock().unwrap().as_str()),
        (Some(ExitRequest::Code(3)), "1\n")
    );
    eval(&mut h, "exit();").unwrap();
    assert_eq!(h.exit_request(), Some(ExitRequest::Code(0)));
    eval(&mut h, "40 + 2").unwrap();
    assert_eq!(h.exit_request(), None, "a later evaluation that does not exit has no status");
    for (code, message) in [
        ("exit(256)", "exit code must be between 0 and 255, got 256"),
        ("exit(-1)", "exit code must be between 0 and 255, got -1"),
        ("exit(1.5)", "exit takes an integer code (0 to 255) or a message, got f64"),
    ] {
        assert_eq!(eval(&mut h, code).unwrap_err().message, message);
    }
    let (_, rel) = scratch("exit");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel).join("exit.rms");
    std::fs::write(&file, "exit(3);\n").unwrap();
    let opts =
        RunOptions { file, host: HostOptions::default(), metrics: None, log_every: 0, plot: None };
    assert_eq!(runner::run(opts).unwrap(), 3);
}

/// Every file the library writes goes through `src/files.rs`: `write_atomic`, or `create_log`
/// for the metrics log, which is written line by line as a run goes (so `tail -f` follows it and
/// a killed run keeps its lines). No other code under `src/` creates, overwrites or renames a
/// file.
#[test]
fn write_atomic_is_the_only_writer() {
    const WRITERS: [&str; 5] =
        ["File::create(", "fs::write(", "OpenOptions::new(", "fs::rename(", "fs::copy("];
    const ALLOWED: [(&str, &str); 0] = [];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut folders = vec![root.join("src")];
    while let Some(dir) = folders.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            if rel == "src/files.rs" || !rel.ends_with(".rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for w in WRITERS {
                for _ in text.matches(w) {
                    found.push((rel.clone(), w));
                }
            }
        }
    }
    found.sort();
    let allowed: Vec<(String, &str)> = ALLOWED.iter().map(|&(f, w)| (f.to_string(), w)).collect();
    assert_eq!(found, allowed, "write files through rumus::files::write_atomic");
}
