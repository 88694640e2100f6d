//! Every script in `scripts/` runs through the `rumus` binary and prints what its
//! `// expect: TEXT` comments say (each line must appear in its output, in order).

use std::path::Path;
use std::process::Command;

fn rumus(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUMUS_DEVICE", "cpu")
        .output()
        .expect("run rumus")
}

#[test]
fn every_script_prints_what_it_expects() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rms"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    // Scripts write their checkpoints below `target/` of the working directory.
    std::fs::create_dir_all(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected: Vec<&str> =
            text.lines().filter_map(|l| l.trim().strip_prefix("// expect: ")).collect();
        let rel = format!("scripts/{}", file.file_name().unwrap().to_string_lossy());
        let out = rumus(&["run", &rel, "--seed", "1"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{rel} failed:\n{stdout}\n{stderr}");
        let mut rest = &stdout[..];
        for e in expected {
            match rest.find(e) {
                Some(i) => rest = &rest[i + e.len()..],
                None => panic!("{rel}: expected `{e}` in its output:\n{stdout}"),
            }
        }
    }
}
