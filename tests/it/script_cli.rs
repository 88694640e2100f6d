//! The `rumus` command's contract: exit codes (0 success, 1 script or runtime error or a data
//! file's content, 2 usage or I/O error, 130 Ctrl-C, `exit(n)` in a script), errors as
//! `file:line:col: message` with a caret, a broken pipe is success but any other output error
//! is not, numbers range-checked, and the metrics log.

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

/// A script error after wide characters and a tab on its line: the caret under the culprit, the
/// tab shown as spaces to its stop, each wide character two columns (the caret sat one column
/// left per wide character).
#[test]
fn a_script_errors_caret_follows_wide_characters_and_tabs() {
    let f = script("wide.rms", "let s = \"日本語 😀\";\tlet b = zeros([2, -1]);\n");
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "{f}:1:26: shape: negative dimension -1\n    let s = \"日本語 😀\";    let b = \
             zeros([2, -1]);\n{}^\n",
            " ".repeat(4 + 32)
        )
    );
}

#[test]
fn usage_and_io_errors_are_two() {
    assert_eq!(rumus(&["run"]).0, 2);
    assert_eq!(rumus(&["frobnicate"]).0, 2);
    assert_eq!(rumus(&["run", "x.rms", "--seed", "many"]).0, 2);
    assert_eq!(rumus(&["run", "x.rms", "--device", "tpu"]).0, 2);
    assert_eq!(
        rumus(&["frobnicate"]).2,
        "unknown command `frobnicate`; `rumus help` lists the commands\n"
    );
    let (code, _, err) = rumus(&["run", "target/no/such/file.rms"]);
    assert_eq!(code, 2);
    assert!(err.contains("target/no/such/file.rms"), "{err}");
}

/// `rumus run FILE` started with its output and errors piped, for a test that reads or signals
/// it while it runs.
fn spawn_run(file: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["run", file])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn broken_pipe_is_success() {
    let f = script("chatty.rms", "let i = 0;\nloop { print(`line ${i}`); i += 1; }\n");
    let mut child = spawn_run(&f);
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 64];
    stdout.read_exact(&mut buf).unwrap();
    drop(stdout);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The metrics log as JSON values, each line's `time` checked (seconds since the run started,
/// in order) and removed, since it differs from run to run.
fn metrics_without_time(log: &str) -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(log);
    let mut last = 0.0;
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let t = v.as_object_mut().unwrap().remove("time").and_then(|t| t.as_f64());
            let t = t.unwrap_or_else(|| panic!("no time in {l}"));
            assert!(t >= last, "{l}");
            last = t;
            v
        })
        .collect()
}

#[test]
fn metrics_log_is_json_lines() {
    let f = script("metrics.rms", "log_metric(\"acc\", 0.5);\nlog_metric(\"n\", 3);\n");
    let log = "target/script_cli/metrics.jsonl";
    assert_eq!(rumus(&["run", &f, "--metrics", log]).0, 0);
    let expected = serde_json::json!([
        { "metric": "acc", "step": 0, "value": 0.5, "epoch": null },
        { "metric": "n", "step": 0, "value": 3.0, "epoch": null },
    ]);
    assert_eq!(serde_json::Value::Array(metrics_without_time(log)), expected);
}

const TRAIN: &str = "model m(x: f32[B, 1]) { return linear(x, 1) as fc }
let net = m().compile(#{ batch: 2, loss: \"mse\", optimizer: sgd(#{ lr: 0.5 }), device: \"cpu\" });
let x = tensor([[1], [2]]);
let y = tensor([[2], [4]]);
progress(#{ epochs: 2 });
for e in 0..2 {
    epoch(e);
    net.train_step(x, y);
    net.lr = 0.25;
    log_metric(\"held_out\", 1.0 / (e + 1));
}
";

/// Step lines carry the step's learning rate and the epoch the script declared.
#[test]
fn metrics_lines_carry_time_lr_and_epoch() {
    let f = script("train_metrics.rms", TRAIN);
    let log = "target/script_cli/train_metrics.jsonl";
    assert_eq!(rumus(&["run", &f, "--metrics", log]).0, 0);
    let lines = metrics_without_time(log);
    let steps: Vec<_> = lines.iter().filter(|v| v.get("loss").is_some()).collect();
    assert_eq!(steps.len(), 2);
    let pick = |v: &serde_json::Value| (v["step"].clone(), v["lr"].clone(), v["epoch"].clone());
    assert_eq!(pick(steps[0]), (1.into(), 0.5.into(), 0.into()));
    assert_eq!(pick(steps[1]), (2.into(), 0.25.into(), 1.into()));
    let held: Vec<_> = lines.iter().filter(|v| v.get("metric").is_some()).collect();
    assert_eq!(pick(held[1]).2, serde_json::Value::from(1));
}

/// `rumus plot` draws a metrics log; `rumus run --plot` draws the run's own curves.
/// A series of positive values spanning two decades or more (a loss) is drawn on a log-scale
/// axis and its title says so; others (an accuracy, a loss that stays within a decade, or one
/// that reaches 0) keep a linear axis.
#[test]
fn plot_draws_a_loss_over_decades_on_a_log_axis() {
    let mut c = rumus::plot::Curves::default();
    for step in 1..=50 {
        let s = f64::from(step);
        c.push("loss", s, 4.0 * 0.88f64.powf(s)); // 3.5 down to 0.007
        c.push("accuracy", s, 0.5 + 0.01 * s);
        c.push("mse", s, 2.0 - 0.03 * s); // 1.97 down to 0.5: one decade
        c.push("gap", s, 50.0 - s); // reaches 0
    }
    let svg = c.svg().unwrap();
    let title = |t: &str| svg.contains(&format!(">\n{t}\n</text>"));
    assert!(title("loss (log scale)"), "{svg}");
    for linear in ["accuracy", "mse", "gap"] {
        assert!(title(linear) && !title(&format!("{linear} (log scale)")), "{linear}");
    }
}

/// Found by the hostile-input audit: `plotters` panics on an axis of infinite span (steps of
/// ±1e308) and loops forever on values of ±1e308 or on a log axis that reaches a subnormal
/// number (a loss of 1e-310), and a log of thousands of metric names drew a panel for each
/// (2,000 names: a 55 MB SVG). Points beyond f32's range are left out like NaN, a log axis
/// starts at f32's smallest normal number, and a plot has at most 64 panels.
#[test]
fn plot_axes_stay_drawable_whatever_the_numbers() {
    let cases: [&[(f64, f64)]; 5] = [
        &[(1e308, 1.0), (-1e308, 2.0), (1.0, 3.0)],
        &[(1.0, 1e308), (2.0, -1e308), (3.0, 1.0)],
        &[(1.0, 1e-310), (2.0, 1.0)],
        &[(1.0, 1e-300), (2.0, 1e300)],
        &[(1.0, 3.4e38), (2.0, -3.4e38), (3.4e38, 1.0), (-3.4e38, 1.0)],
    ];
    for (i, points) in cases.into_iter().enumerate() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut c = rumus::plot::Curves::default();
            for &(step, value) in points {
                c.push("loss", step, value);
            }
            let _ = tx.send(c.svg().map(|svg| svg.contains(">\nloss\n</text>")));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(Ok(linear_title)) => assert!(linear_title, "case {i}: a linear axis titled `loss`"),
            Ok(Err(e)) => panic!("case {i}: {e}"),
            Err(e) => panic!("case {i}: no plot after 60 s ({e}; a panic or a hang)"),
        }
    }
    // Found by the hostile-input audit: a NUL in a metric's name went raw into the SVG, which
    // no XML reader accepts; control and invisible characters are escaped.
    let mut c = rumus::plot::Curves::default();
    c.push("<a>\0\u{202e}", 1.0, 1.0);
    let svg = c.svg().unwrap();
    assert!(svg.contains("&lt;a&gt;\\0\\u{202e}"), "{svg}");
    assert!(!svg.contains(['\0', '\u{202e}']), "{svg}");
    roxmltree::Document::parse(&svg).unwrap();
    // The first 64 series are drawn and the rest named in a note (a run that logged a 65th
    // metric name ended in an error after its work, its plot lost).
    let mut c = rumus::plot::Curves::default();
    for i in 0..1000 {
        c.push(&format!("m{i}"), 1.0, 1.0);
    }
    let svg = c.svg().unwrap();
    assert!(svg.contains(">\nm63\n</text>") && !svg.contains(">\nm64\n</text>"));
    assert_eq!(
        c.notes(),
        ["series from `m64` on are not drawn: a plot has at most 64 panels, one per series; \
          log fewer metric names"]
    );
}

/// Found by the hostile-input audit: a log of NaN losses was "no steps and no metrics"; a lone
/// point drew nothing (a line needs two); a constant 1e20 got an axis of zero span, without
/// ticks; two steps read `1 1 1 1 1 2 2 2 2 2` along the x axis.
#[test]
fn plot_says_what_it_leaves_out_and_draws_lone_and_constant_points() {
    let mut c = rumus::plot::Curves::default();
    c.push("loss", 1.0, f64::NAN);
    c.push("loss", 2.0, f64::INFINITY);
    assert_eq!(
        c.svg().unwrap_err().message,
        "nothing to plot: the 2 points logged are all NaN, infinite or beyond f32's range"
    );
    c.push("accuracy", 1.0, 0.5);
    assert!(c.svg().unwrap().contains("<circle"), "a lone point is a dot");
    assert_eq!(c.notes(), ["2 points are not drawn: NaN, infinite or beyond f32's range"]);
    let mut c = rumus::plot::Curves::default();
    c.push("loss", 1.0, 1e20);
    c.push("loss", 2.0, 1e20);
    let svg = c.svg().unwrap();
    let labels: Vec<&str> =
        svg.split("</text>").filter_map(|t| t.rsplit('>').next()).map(str::trim).collect();
    assert!(labels.contains(&"1.00e20") && labels.contains(&"9.9e19"), "{labels:?}");
    // Ticks close together get the digits that tell them apart (0.0012 twice, before).
    let mut c = rumus::plot::Curves::default();
    c.push("loss", 1.0, 0.00121);
    c.push("loss", 2.0, 0.00129);
    let svg = c.svg().unwrap();
    assert!(svg.contains(">\n0.00122\n</text>") && svg.contains(">\n0.00128\n</text>"), "{svg}");
    let steps: Vec<&&str> = labels.iter().filter(|l| ["1", "2"].contains(l)).collect();
    assert_eq!(steps, [&"1", &"2"], "{labels:?}");
    // A run that succeeded with nothing to draw keeps its exit code; the plot's absence is a note.
    let f = script("no_steps.rms", "print(\"done\");\n");
    let svg = "target/script_cli/no_steps.svg";
    assert_eq!(
        rumus(&["run", &f, "--plot", svg]),
        (
            0,
            "done\n".into(),
            format!("note: {svg} is not written: nothing to plot: no steps and no metrics\n")
        )
    );
}

#[test]
fn plot_writes_an_svg_of_every_curve() {
    let f = script("plot.rms", TRAIN);
    let (log, svg, direct) = (
        "target/script_cli/plot.jsonl",
        "target/script_cli/plot.svg",
        "target/script_cli/plot_run.svg",
    );
    assert_eq!(rumus(&["run", &f, "--metrics", log, "--plot", direct]).0, 0);
    assert_eq!(rumus(&["plot", log, "-o", svg]), (0, String::new(), String::new()));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [svg, direct] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{file}");
        // Panel titles and the axis name are `<text>` elements; each curve is a polyline.
        for label in ["loss", "held_out", "step"] {
            assert!(text.contains(&format!(">\n{label}\n</text>")), "{file} lacks {label}");
        }
        assert_eq!(text.matches("stroke=\"#0000FF\" stroke-width=\"2\"").count(), 2, "{file}");
    }
    let bad = script("bad.jsonl", "{\"step\": 1, \"loss\": 2}\nnot json\n");
    let (code, _, err) = rumus(&["plot", &bad, "-o", svg]);
    // What the log holds is wrong, as with an empty one: 1, not a usage or I/O error.
    assert_eq!(code, 1);
    assert!(err.starts_with(&format!("{bad}:2: not a JSON line: ")), "{err}");
    let empty = script("empty.jsonl", "");
    assert_eq!(
        rumus(&["plot", &empty, "-o", svg]),
        (1, String::new(), "nothing to plot: no steps and no metrics\n".into())
    );
    assert_eq!(
        rumus(&["plot", log]),
        (
            2,
            String::new(),
            "missing --output FILE.svg; `rumus plot --help` shows the usage\n".into()
        )
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
    // A mistake found while the training step is built (after the model was lowered) points
    // at its op in the model, not at the script's `compile` call.
    let f = script(
        "train_err.rms",
        "model m(x: f32[B, 2, 1, 1]) {\n    h = batch_norm(x) as bn\n    return linear(reshape(h, [B, 2]), 3)\n}\nlet net = m().compile(#{ batch: 1 });\n",
    );
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1);
    let want = format!("{f}:2:9: batch_norm in training averages 1 value per channel");
    assert!(err.starts_with(&want), "{err}");
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
    }
}

/// Found by the hostile-input audit: every command that reads a file named on its command line
/// (or by `:load` in the REPL) blocked forever opening a FIFO no process writes to. FIFOs and
/// devices are refused at once, as in scripts.
#[cfg(unix)]
#[test]
fn a_fifo_or_a_device_named_on_the_command_line_is_refused_at_once() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("fifo.rms"));
    let made = Command::new("mkfifo").arg(dir.join("fifo.rms")).status().unwrap();
    assert!(made.success());
    let fifo = "target/script_cli/fifo.rms";
    let svg = "target/script_cli/fifo.svg";
    for file in [fifo, "/dev/zero"] {
        let runs: [&[&str]; 6] = [
            &["run", file],
            &["graph", file],
            &["plan", file],
            &["bench", file],
            &["plot", file, "-o", svg],
            &["repl", "--batch"],
        ];
        for args in runs {
            let mut child = Command::new(env!("CARGO_BIN_EXE_rumus"))
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            // A command that reads no input may have exited already: a closed pipe is no error.
            let sent = std::io::Write::write_all(&mut stdin, format!(":load {file}\n").as_bytes());
            assert!(sent.is_ok() || args[0] != "repl", "{sent:?}");
            drop(stdin);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while child.try_wait().unwrap().is_none() {
                if std::time::Instant::now() > deadline {
                    child.kill().unwrap();
                    panic!("`rumus {}` with {file} still runs after 60 s", args.join(" "));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let out = child.wait_with_output().unwrap();
            // The REPL answers on stdout, commands on stderr.
            let err = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
            let expected = format!(
                "{file}: is not a regular file (a FIFO, socket or device); rumus reads files only"
            );
            assert!(err.contains(&expected), "rumus {}: {err}", args.join(" "));
            let code = if args[0] == "repl" { 0 } else { 2 };
            assert_eq!(out.status.code(), Some(code), "rumus {}: {err}", args.join(" "));
        }
    }
}

/// `rumus ARGS` with `env` set: (exit code, first line of stderr).
fn check(args: &[&str], env: &[(&str, &str)], expected: (i32, &str)) {
    let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run rumus");
    let err = String::from_utf8_lossy(&out.stderr);
    let got = (out.status.code().unwrap_or(-1), err.lines().next().unwrap_or(""));
    assert_eq!(got, expected, "rumus {args:?}");
}

/// Found by the hostile-input audit: `mpirun -np 4 rumus run` with a binary built without the
/// feature `mpi` trained four independent models, each believing it was the whole job, and
/// said nothing (`rumus launch` refuses such a binary). Each rank now stops with the reason.
#[cfg(not(feature = "mpi"))]
#[test]
fn ranks_of_a_binary_without_mpi_are_refused() {
    let ok = script("ranks.rms", "print(1 + 1);\n");
    let refused = "started as one of 4 ranks, but this rumus was built without the `mpi` feature, so each rank would train alone; build it with `cargo build --release --features mpi`";
    check(&["run", &ok], &[("OMPI_COMM_WORLD_SIZE", "4")], (2, refused));
    let bench = ["bench", "scripts/bench/mlp.rms", "--device", "cpu", "--set", "hidden=1"];
    check(&bench, &[("PMI_SIZE", "4")], (2, refused));
    // One rank (srun of a single task) or a size that is not a number is a job of one.
    check(&["run", &ok], &[("PMI_SIZE", "1")], (0, ""));
    check(&["run", &ok], &[("OMPI_COMM_WORLD_SIZE", "x")], (0, ""));
}

/// Found by the hostile-input audit: `rumus run f.rms --metrics f.rms` ran the script and then
/// truncated it to write the log there (`--plot` would have replaced it with the drawing).
#[test]
fn outputs_that_name_their_own_input_are_refused() {
    let f = script("self.rms", "print(1 + 1);\n");
    let other_spelling = format!("./{}", f.replace("script_cli/", "script_cli/../script_cli/"));
    for (flag, out) in [("--metrics", f.as_str()), ("--plot", other_spelling.as_str())] {
        let expected =
            format!("{flag} {out}: names the script {f} itself: writing there would destroy it");
        check(&["run", &f, flag, out], &[], (2, &expected));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(std::fs::read_to_string(root.join(&f)).unwrap(), "print(1 + 1);\n");
    // The same for the other commands that read one file and write another.
    let log = script("self.jsonl", "{\"step\": 1, \"loss\": 2}\n");
    let expected =
        format!("--output {log}: names the log {log} itself: writing there would destroy it");
    check(&["plot", &log, "-o", &log], &[], (2, &expected));
    let model = script("self_model.rms", "model m(x: f32[B, 2], B = 2) { return linear(x, 2) }\n");
    let expected = format!(
        "--svg {model}: names the model file {model} itself: writing there would destroy it"
    );
    check(&["plan", &model, "--svg", &model], &[], (2, &expected));
    assert!(std::fs::read_to_string(root.join(&log)).unwrap().starts_with("{\"step\""));
    assert!(std::fs::read_to_string(root.join(&model)).unwrap().starts_with("model m"));
}

/// Found by the hostile-input audit: a variable that is not UTF-8 read as unset, so
/// `RUMUS_DEVICE=$'\xff'` ran on the default device and an unreadable cooperative tile planned
/// with the default one, silently. Both are errors naming the variable.
#[cfg(unix)]
#[test]
fn environment_variables_that_are_not_text_are_errors() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"gpu\xFF");
    let ok = script("env.rms", "print(1 + 1);\n");
    for (var, args, expected) in [
        (
            "RUMUS_DEVICE",
            vec!["run", ok.as_str()],
            "RUMUS_DEVICE: \"gpu\\xFF\" is not UTF-8 text (valid choices: auto, gpu, cpu)",
        ),
        (
            "RUMUS_MATMUL_COOP_TILE",
            vec!["plan", "scripts/xor.rms", "--set", "B=2"],
            "RUMUS_MATMUL_COOP_TILE: \"gpu\\xFF\" is not UTF-8 text",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
            .args(&args)
            .env(var, bad)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), err.trim_end()), (Some(2), expected), "{var}");
    }
}

/// Found by the hostile-input audit: an argument that is not UTF-8 panicked in `std::env::args`
/// (exit 1 and a backtrace) for every command.
#[cfg(unix)]
#[test]
fn arguments_that_are_not_text_are_usage_errors() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"B=\xFF");
    for (args, expected) in [
        (
            vec!["plan".as_ref(), "scripts/xor.rms".as_ref(), "--set".as_ref(), bad],
            "argument 4 is not UTF-8 text: \"B=\\xFF\"",
        ),
        (
            vec![std::ffi::OsStr::from_bytes(b"\xFF.rms")],
            "argument 1 is not UTF-8 text: \"\\xFF.rms\"",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let expected = format!("{expected} (rumus reads its arguments as UTF-8; rename the file or give its path in UTF-8)");
        assert_eq!((out.status.code(), err.trim_end()), (Some(2), expected.as_str()));
    }
}

#[test]
fn command_line_numbers_are_range_checked() {
    let ok = script("ok.rms", "print(1 + 1);\n");
    let mlp = "scripts/bench/mlp.rms";
    let max = u64::MAX.to_string();
    for (args, expected) in [
        (vec!["run", &ok, "--seed", "-1"], "--seed: must be a whole number from 0 to 9223372036854775807, got `-1`"),
        (vec!["run", &ok, "--seed", "9223372036854775808"], "--seed: must be a whole number from 0 to 9223372036854775807, got `9223372036854775808`"),
        (vec!["run", &ok, "--log-every", "1.5"], "--log-every: must be a whole number from 0 to 18446744073709551615, got `1.5`"),
        (vec!["run", &ok, "--max-operations", "0"], "--max-operations: must be a whole number from 1 to 18446744073709551615, got `0`"),
        (vec!["run", &ok, "--timeout", "nan"], "--timeout: must be a number of seconds from 0.001 to 31536000, got `nan`"),
        (vec!["run", &ok, "--timeout", "1e300"], "--timeout: must be a number of seconds from 0.001 to 31536000, got `1e300`"),
        (vec!["run", &ok, "--timeout", "-1"], "--timeout: must be a number of seconds from 0.001 to 31536000, got `-1`"),
        (vec!["repl", "--timeout", "0"], "--timeout: must be a number of seconds from 0.001 to 31536000, got `0`"),
        (vec!["bench", mlp, "--warmup", &max], "--warmup: must be a whole number from 0 to 1000000, got `18446744073709551615`"),
        (vec!["bench", mlp, "--steps", "0"], "--steps: must be a whole number from 1 to 1000000, got `0`"),
        (vec!["bench", "--cpu-matmul", "--size", "1000000"], "--size: must be a whole number from 1 to 65536, got `1000000`"),
        (vec!["bench", "--cpu-matmul", "--size", "0"], "--size: must be a whole number from 1 to 65536, got `0`"),
        (
            vec!["bench", mlp, "--set", "hidden=1e999"],
            "--set hidden=1e999: the value must be a finite number, true or false",
        ),
        (vec!["run", &ok, "--seed"], "--seed needs a value"),
    ] {
        check(&args, &[], (2, expected));
    }
}

/// `--help` on any command prints that command's usage to stdout and exits 0, as `rumus help
/// COMMAND` does; `--version` prints the version.
#[test]
fn help_and_version_print_and_exit_zero() {
    let version = format!("rumus {}\n", env!("CARGO_PKG_VERSION"));
    assert_eq!(rumus(&["--version"]), (0, version, String::new()));
    for (args, start) in [
        (&["run", "--help"][..], "Run a script\n\nUsage: rumus run [OPTIONS] <FILE>\n"),
        (&["help", "run"], "Run a script\n\nUsage: rumus run [OPTIONS] <FILE>\n"),
        (&["plan", "x.rms", "--help"], "Print a model's compiled training step"),
        (&["bench", "-h"], "Time a model's training step"),
        (&["launch", "--help"], "`rumus run` on N ranks through mpirun"),
        (&["--help"], "rumus: a model language"),
        (&["help"], "rumus: a model language"),
    ] {
        let (code, out, err) = rumus(args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        assert!(out.starts_with(start), "{args:?}: {out}");
    }
    // Every command and every flag of `run` is listed.
    let (_, top, _) = rumus(&["help"]);
    for command in ["run", "launch", "repl", "graph", "plot", "plan", "bench"] {
        assert!(top.contains(&format!("\n  {command} ")), "{command}: {top}");
    }
    let (_, run, _) = rumus(&["run", "--help"]);
    for flag in [
        "--device <DEVICE>",
        "--seed <N>",
        "--max-operations <N>",
        "--timeout <SECS>",
        "--matmul-precision <MODE>",
        "--metrics <FILE>",
        "--plot <FILE.svg>",
        "--log-every <N>",
    ] {
        assert!(run.contains(flag), "{flag}: {run}");
    }
}

/// Found by the fourth hostile-input audit: "no model in this file" exited 1 from `rumus graph`
/// but 2 from `plan` and `bench`, and `rumus --version extra` ignored `extra`.
#[test]
fn every_command_gives_a_mistake_the_same_exit_code() {
    let none = script("no_model.rms", "print(1 + 1);\n");
    let one = script("one_model.rms", "model m(x: f32[B, 4]) { return linear(x, 2) }\n");
    for command in ["graph", "plan", "bench"] {
        // What the file holds is a model error, exit code 1, as an unknown `--model` is.
        check(&[command, &none], &[], (1, &format!("{none}: no model in this file")));
        check(&[command, &one, "--model", "n"], &[], (1, "no model named `n` (its models: `m`)"));
        // A flag the command does not know is a usage error, exit code 2.
        check(
            &[command, &one, "--frob"],
            &[],
            (
                2,
                &format!(
                    "unexpected argument `--frob`; `rumus {command} --help` lists the options"
                ),
            ),
        );
    }
    for flag in ["--version", "-V"] {
        check(
            &[flag, "extra"],
            &[],
            (2, &format!("unexpected argument `extra` after {flag}, which takes none")),
        );
        let (code, out, err) = rumus(&[flag]);
        assert_eq!((code, err.as_str()), (0, ""), "{flag}");
        assert_eq!(out, format!("rumus {}\n", env!("CARGO_PKG_VERSION")));
    }
    // Found by the hostile-input hunt: `rumus run --help extra` printed the help and exited 0
    // where `--version extra` is refused. What follows a help flag is refused the same way, on
    // any command (`launch` checks its run options as `run` does); before it, it is not.
    for args in [
        &["--help", "extra"][..],
        &["run", "--help", "extra"],
        &["run", "-h", "extra"],
        &["run", "--help", "--seed", "3"],
        &["plan", &one, "--help", "extra"],
        &["launch", "-n", "2", &one, "--seed", "1", "--help", "extra"],
    ] {
        let flag = args.iter().find(|a| a.starts_with('-') && a.contains('h')).unwrap();
        let extra = args[args.iter().position(|a| a == flag).unwrap() + 1];
        check(
            args,
            &[],
            (2, &format!("unexpected argument `{extra}` after {flag}, which takes none")),
        );
    }
    for args in [&["run", "extra", "--help"][..], &["plan", &one, "-h"], &["help", "run"]] {
        let (code, out, err) = rumus(args);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?}");
        assert!(out.contains("Usage: rumus "), "{args:?}: {out}");
    }
}

/// A data file whose content is wrong is the run's input gone wrong, exit code 1 as a script's
/// or a model's mistake is (it was 2, a usage or I/O error: a CSV's label column out of range
/// exited as a mistyped flag does); a data file that cannot be read at all is still an I/O
/// error, 2.
#[test]
fn a_data_files_content_is_exit_code_1_and_a_file_that_cannot_be_read_2() {
    let csv = |name: &str, text: &[u8]| {
        let path = script(name, "");
        std::fs::write(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&path), text).unwrap();
        path
    };
    let short = csv("data_short.csv", b"1,2,0\n");
    let word = csv("data_word.csv", b"1,2,0\n3,x,1\n");
    let bytes = csv("data_bytes.txt", b"ab\xffcd\n");
    let cases = [
        (
            format!("csv(\"{short}\", #{{ label_col: 3 }});\n"),
            1,
            format!("{short}:1: label_col 3 is out of range for 3 fields (it counts from 0)"),
        ),
        (
            format!("csv(\"{word}\", #{{ label_col: 2 }});\n"),
            1,
            format!("{word}:2: column 2: `x` is not a number"),
        ),
        (
            format!("read_text(\"{bytes}\");\n"),
            1,
            format!("{bytes}:1:3: invalid UTF-8 (byte 0xFF at byte offset 2)"),
        ),
        (
            "csv(\"target/script_cli/data_missing.csv\");\n".to_string(),
            2,
            "target/script_cli/data_missing.csv: No such file or directory".to_string(),
        ),
    ];
    for (i, (text, code, message)) in cases.into_iter().enumerate() {
        let f = script(&format!("data_{i}.rms"), &text);
        let (got, _, err) = rumus(&["run", &f]);
        let first = err.lines().next().unwrap_or("");
        assert_eq!(got, code, "{text}: {err}");
        assert!(first.contains(&message), "{text}: {first}");
    }
}

/// Usage errors are one line in our style, exit code 2: mistyped commands and flags get a
/// suggestion, a missing argument names what is missing and where the usage is.
#[test]
fn usage_errors_name_the_mistake_and_suggest_a_fix() {
    let ok = script("ok.rms", "print(1 + 1);\n");
    for (args, expected) in [
        (vec![], "no command given; `rumus help` lists the commands"),
        (vec!["runn", &ok], "unknown command `runn`; did you mean `run`?"),
        (vec!["plna"], "unknown command `plna`; did you mean `plan`?"),
        (vec!["run", &ok, "--sed", "1"], "unexpected argument `--sed`; did you mean `--seed`?"),
        (vec!["bench", "--kernel"], "unexpected argument `--kernel`; did you mean `--kernels`?"),
        (
            vec!["run", &ok, "--frob"],
            "unexpected argument `--frob`; `rumus run --help` lists the options",
        ),
        (
            vec!["run", &ok, "extra"],
            "unexpected argument `extra`; `rumus run --help` lists the options",
        ),
        (vec!["run"], "missing FILE; `rumus run --help` shows the usage"),
        (vec!["launch", &ok], "missing -n N; `rumus launch --help` shows the usage"),
        (vec!["run", &ok, "--seed", "1", "--seed", "2"], "--seed can be given only once"),
        (
            vec!["bench", "--kernels", "--cpu-matmul"],
            "--cpu-matmul and --kernels cannot be combined",
        ),
        (
            vec!["bench", "--size", "64"],
            "missing --cpu-matmul and FILE; `rumus bench --help` shows the usage",
        ),
        // Found by the hostile-input hunt: a size for a model's benchmark was ignored.
        (
            vec!["bench", "scripts/bench/mlp.rms", "--size", "64"],
            "--size sets the size of --cpu-matmul's product: add --cpu-matmul, or drop --size",
        ),
        (
            vec!["bench", "scripts/bench/mlp.rms", "--device", "cpu", "--profile"],
            "--profile times each GPU dispatch alone, and this benchmark runs on the CPU (--device cpu, or no GPU adapter): drop --profile, or run it on a GPU",
        ),
        (vec!["plan", &ok, "--set", "B"], "--set: needs NAME=VALUE, got `B`"),
        (vec!["plan", &ok, "--set", " =2"], "--set: needs NAME=VALUE, got ` =2`"),
        (vec!["plan", &ok, "--wgsl", ""], "--wgsl: needs a kernel number (`rumus plan FILE` lists them)"),
        (
            vec!["plan", "--wgsl", &ok],
            "--wgsl: `target/script_cli/ok.rms` is not a kernel number (`rumus plan FILE` lists \
             them); the model file goes before --wgsl",
        ),
        (vec!["launch", "-n", "0", &ok], "-n: must be a whole number from 1 to 4096, got `0`"),
        (
            vec!["launch", "-n", "2", &ok, "--seed", "x"],
            "--seed: must be a whole number from 0 to 9223372036854775807, got `x`",
        ),
    ] {
        check(&args, &[], (2, expected));
    }
}

/// Found by the hostile-input audit: the memory budget was half the machine's memory whatever
/// the process was allowed, so under `ulimit -v` a tensor the budget took, or a benchmark's
/// matrices, aborted the process on a failed allocation (exit 134). The budget is half of what
/// the process may use.
#[cfg(unix)]
#[test]
fn an_address_space_limit_lowers_the_memory_budget() {
    use std::os::unix::process::CommandExt;
    let big = script("rlimit.rms", "let t = zeros([1000000000]);\nprint(t.shape);\n");
    let limited = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rumus"));
        c.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            c.pre_exec(|| {
                let r = libc::rlimit { rlim_cur: 3 << 30, rlim_max: libc::RLIM_INFINITY };
                match libc::setrlimit(libc::RLIMIT_AS, &r) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            })
        };
        let out = c.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = limited(&["run", &big, "--device", "cpu"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("a tensor of shape [1000000000] needs 3.7 GiB, more than the whole 1.5 GiB memory budget"), "{err}");
    let (code, err) = limited(&["bench", "--cpu-matmul", "--size", "30000"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("a 30000 x 30000 matmul needs 10800000000 bytes of memory; "), "{err}");
}

#[test]
fn resource_sized_options_are_checked_against_memory_before_allocating() {
    // Three 65536² f32 matrices (48 GiB) or a 2^47-element parameter: refused, not aborted.
    let (code, _, err) = rumus(&["bench", "--cpu-matmul", "--size", "65536"]);
    if code != 0 {
        assert_eq!(code, 1, "{err}");
        assert!(
            err.starts_with("a 65536 x 65536 matmul needs 51539607552 bytes of memory; "),
            "{err}"
        );
    }
    let wide =
        script("wide.rms", "model m(x: f32[B, 65536]) {\n    return linear(x, 2147483648)\n}\n");
    let huge =
        script("huge.rms", "model m(x: f32[B, 65536]) {\n    return linear(x, 1048576)\n}\n");
    for device in ["cpu", "auto"] {
        let (code, _, err) = rumus(&["bench", &wide, "--set", "B=1", "--device", device]);
        assert_eq!(code, 1, "{err}");
        let expected = "in `linear`: shape [65536, 2147483648] has more than 2^40 elements, the \
                        most one value may hold";
        assert!(err.contains(expected), "{err}");
        let (code, _, err) = rumus(&["bench", &huge, "--set", "B=1", "--device", device]);
        assert_eq!(code, 1, "{err}");
        let expected = format!("benchmarking `{huge}` needs 2.3 TiB, more than the whole ");
        // (`auto` may print adapter notes first.)
        assert!(err.contains(&expected) && err.ends_with(" memory budget\n"), "{err}");
    }
}

/// Found by the hostile-input audit: a model named like a script function replaced it without a
/// word (`model exit` made `exit()` build a model, and the script ran on past it); one named
/// like a keyword could never be called.
#[test]
fn a_model_named_like_a_script_function_or_keyword_is_refused() {
    for (name, why) in [
        ("exit", "is a word of the script language, so the model could not be called: rename it"),
        ("seed", "is a function of the script API (see `:help seed`), which the model would replace: rename it"),
        ("let", "is a word of the script language, so the model could not be called: rename it"),
    ] {
        let f = script(
            &format!("named_{name}.rms"),
            &format!("print(1);\nmodel {name}(x: f32[B, 2]) {{ return linear(x, 3) as fc }}\n"),
        );
        check(&["run", &f, "--device", "cpu"], &[], (1, &format!("{f}:2:7: model `{name}`: `{name}` {why}")));
    }
}

/// Found by the hostile-input audit: a script function named like a model of the file replaced
/// the model's call without a word (`fn q() { 1 }` beside `model q` made `q()` return 1), in
/// either order in the file, and for either call (`fn q(o)` replaced `q(#{ .. })`).
#[test]
fn a_script_function_named_like_a_model_is_refused() {
    let model = "model q(x: f32[B, 2]) { return linear(x, 3) as fc }";
    let why = "fn `q`: a model `q` is defined, and a call `q(..)` would run this function \
               instead of the model: rename one";
    for (file, text, at) in [
        ("fn_after.rms", format!("{model}\nfn q() {{ 1 }}\nprint(q());\n"), "2:4"),
        ("fn_before.rms", format!("fn  q(o) {{ 1 }}\n{model}\nprint(q(#{{}}));\n"), "1:5"),
    ] {
        let f = script(file, &text);
        check(&["run", &f, "--device", "cpu"], &[], (1, &format!("{f}:{at}: {why}")));
    }
}

/// Found by the hostile-input audit: `net.save("train.rms")` in `train.rms` replaced the running
/// script with a checkpoint (the command line's own outputs were already refused there).
#[test]
fn a_script_cannot_write_over_itself() {
    let text = "model m(x: f32[B, 2]) { return linear(x, 3) as fc }\nlet n = m().compile(#{ batch: 2 });\nn.save(\"target/script_cli/self_save.rms\");\n";
    let f = script("self_save.rms", text);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let resolved = root.join(&f).canonicalize().unwrap();
    let expected = format!(
        "{f}:3:3: writing `target/script_cli/self_save.rms` would replace the running script {}: write somewhere else",
        resolved.display()
    );
    check(&["run", &f, "--device", "cpu"], &[], (2, &expected));
    assert_eq!(std::fs::read_to_string(root.join(&f)).unwrap(), text);
}

/// Found by the hostile-input audit: `--metrics m.jsonl --plot m.jsonl` ran and left the plot
/// where the log was, and a script's `write_text` or `save` over either output replaced it
/// without a word (its own writes then lost under the log's lines, or under the plot).
#[test]
fn a_run_keeps_its_metrics_log_and_plot_apart_from_everything_else() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let f = script("outputs.rms", "print(1);\n");
    let log = "target/script_cli/outputs.jsonl";
    let _ = std::fs::remove_file(root.join(log));
    let expected = format!(
        "--plot ./{log}: names the metrics log {log} itself: writing there would destroy it"
    );
    check(&["run", &f, "--metrics", log, "--plot", &format!("./{log}")], &[], (2, &expected));
    // Written by the script: refused with the script's position, the outputs kept.
    let plot = "target/script_cli/outputs.svg";
    for (target, what) in [(log, "the metrics log (--metrics)"), (plot, "the plot (--plot)")] {
        let _ = std::fs::remove_file(root.join(plot));
        let text = format!("print(1);\nwrite_text(\"{target}\", \"hello\\n\");\n");
        let f = script("writes_outputs.rms", &text);
        let resolved = root.join("target/script_cli").canonicalize().unwrap();
        let name = std::path::Path::new(target).file_name().unwrap();
        let expected = format!(
            "{f}:2:1: writing `{target}` would replace {what} {}: write somewhere else",
            resolved.join(name).display()
        );
        check(&["run", &f, "--metrics", log, "--plot", plot], &[], (2, &expected));
    }
}

/// Found by the hostile-input audit: `--set B=2 --set B=3` kept the last value without a word.
#[test]
fn a_setting_given_twice_is_refused() {
    let expected = "--set B is given twice (2 and 3): give it once";
    check(&["plan", "scripts/bench/mlp.rms", "--set", "B=2", "--set", "B=3"], &[], (2, expected));
}

/// Found by the hostile-input audit: on a machine without a GPU (or with `--device cpu`) the GPU
/// path's settings were never read, so a mistyped value passed unseen where the README says it
/// is refused. Every command refuses it, on every machine.
#[test]
fn the_gpu_settings_are_checked_by_every_command_on_every_machine() {
    let ok = script("ok.rms", "print(1 + 1);\n");
    let cases = [
        (
            "RUMUS_PIPELINE_CACHE",
            "maybe",
            "RUMUS_PIPELINE_CACHE: `maybe` is not `on` (the default) or `off`",
        ),
        (
            "RUMUS_EXCHANGE",
            "foo",
            "RUMUS_EXCHANGE: `foo` is not `host-shared` (the default) or `staged`",
        ),
        (
            "RUMUS_MATMUL_TILE",
            "zz",
            concat!(
                "RUMUS_MATMUL_TILE: `zz` is none of large, small, register, register8, simt, ",
                "simt-128x64, dot"
            ),
        ),
    ];
    for (name, value, expected) in cases {
        check(&["run", &ok, "--device", "cpu"], &[(name, value)], (2, expected));
        check(&["graph", "scripts/gpt.rms", "--params"], &[(name, value)], (2, expected));
    }
}

#[test]
fn device_from_the_environment_is_named_as_such() {
    let ok = script("ok.rms", "print(1 + 1);\n");
    let bogus = [("RUMUS_DEVICE", "bogus")];
    let from_env = "RUMUS_DEVICE: unknown device `bogus` (valid choices: auto, gpu, cpu)";
    check(&["run", &ok], &bogus, (2, from_env));
    check(&["bench", "--kernels"], &bogus, (2, from_env));
    check(
        &["run", &ok, "--device", "tpu"],
        &[],
        (2, "--device: unknown device `tpu` (valid choices: auto, gpu, cpu)"),
    );
    // The flag wins over the variable; commands without a device ignore it.
    check(&["run", &ok, "--device", "cpu"], &bogus, (0, ""));
    check(&["graph", "scripts/gpt.rms", "--params"], &bogus, (0, ""));
}

#[test]
fn exit_in_a_script_is_the_exit_code() {
    for (text, expected) in [
        ("print(1);\nexit(3);\nprint(2);\n", (3, "")),
        ("exit();\n", (0, "")),
        ("exit(0);\nthrow \"not reached\";\n", (0, "")),
        ("fn stop(n) { exit(n) }\nstop(7);\nthrow \"not reached\";\n", (7, "")),
        ("exit(\"bad input\");\n", (1, "bad input")),
        ("exit(256);\n", (1, "target/script_cli/exit.rms:1:1: exit code must be between 0 and 255, got 256")),
        ("exit(-1);\n", (1, "target/script_cli/exit.rms:1:1: exit code must be between 0 and 255, got -1")),
        ("exit(1.5);\n", (1, "target/script_cli/exit.rms:1:1: exit takes an integer code (0 to 255) or a message, got f64")),
    ] {
        let f = script("exit.rms", text);
        check(&["run", &f], &[], expected);
    }
}

#[test]
fn limits_on_operations_and_time_stop_a_run() {
    let f = script("spin_limits.rms", "let i = 0;\nloop { i += 1; }\n");
    let (code, _, err) = rumus(&["run", &f, "--max-operations", "1000"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(": operation limit reached: the script ran more than 1000 operations\n"),
        "{err}"
    );
    let (code, _, err) = rumus(&["run", &f, "--timeout", "0.2"]);
    assert_eq!(code, 1);
    assert!(err.starts_with(&format!("{f}:2:")), "{err}");
    assert!(err.contains(": time limit reached: the script ran longer than 0.2 s\n"), "{err}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_run_with_130() {
    use std::io::BufRead;
    let f = script("spin.rms", "print(\"started\");\nlet i = 0;\nloop { i += 1; }\n");
    let mut child = spawn_run(&f);
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    // SAFETY: kill sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    // Stopped at whichever operation was running: positioned in the file, whatever the line.
    assert!(err.starts_with(&format!("{f}:")), "{err}");
    assert!(err.lines().next().unwrap().ends_with(": interrupted"), "{err}");
}

/// Found by a hostile-input audit: a Ctrl-C during `evaluate` over many batches was answered
/// only when the whole evaluation returned (17 s later for a million rows), without a word.
/// `evaluate` looks at the flag between batches: the run stops there, at the call, without the
/// notice that a call has not stopped within a second.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_an_evaluation_between_batches() {
    use std::io::BufRead;
    let f = script(
        "evaluate.rms",
        "model m(x: f32[B, 4]) { return linear(x, 3) as fc }
let net = m().compile(#{ batch: 1, device: \"cpu\" });
let x = zeros([400000, 4]);
let y = zeros([400000]).to_i32();
print(\"started\");
let r = net.evaluate(x, y);
print(\"evaluated\");
",
    );
    let mut child = spawn_run(&f);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    // Into the evaluation (400,000 batches: seconds, had it not stopped).
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert_eq!(rest, "", "{err}");
    assert!(err.starts_with(&format!("{f}:6:13: interrupted\n")), "{err}");
    assert!(!err.contains("stopping when the running call returns"), "{err}");
}

#[test]
fn output_write_errors_are_errors() {
    let full = || Stdio::from(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
    let run = |args: &[&str], stdout: Stdio| {
        let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(stdout)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let disk_full = "standard output: No space left on device (os error 28)\n".to_string();
    let f = script("prints.rms", "print(\"x\");\n");
    assert_eq!(run(&["run", &f], full()), (Some(2), disk_full.clone()));
    assert_eq!(run(&["graph", "scripts/gpt.rms"], full()), (Some(2), disk_full.clone()));
    assert_eq!(run(&["help"], full()), (Some(2), disk_full));
    let m = script("metric.rms", "log_metric(\"a\", 1.0);\n");
    assert_eq!(
        run(&["run", &m, "--metrics", "/dev/full"], Stdio::null()),
        (Some(2), "/dev/full: No space left on device (os error 28)\n".to_string())
    );
}

/// Found by the hostile-input audit: `--metrics` naming a FIFO that no process reads blocked the
/// run forever before its first line, and a device or a missing folder given to `--plot` or
/// `plan --svg` was found out only when the run wrote there (for `--plot`, after the whole run).
/// The drawings are files: anything else is a usage error before any work. The metrics log may
/// be a pipe or a device (`/dev/null`, `>(jq .)`), but a FIFO nobody reads is an error at once.
#[cfg(unix)]
#[test]
fn outputs_that_cannot_be_written_are_refused_before_the_run() {
    let m = script("metric.rms", "log_metric(\"a\", 1.0);\n");
    let dir = crate::common::ScratchDir::new("outputs");
    let fifo = dir.join("m.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_str().unwrap().to_string();
    let missing = dir.join("no/such/folder/m.svg");
    let missing = missing.to_str().unwrap().to_string();
    let special = "is not a regular file (a device, FIFO or socket); rumus writes files only";
    for out in [fifo.as_str(), "/dev/full", "/dev/null"] {
        check(&["run", &m, "--plot", out], &[], (2, &format!("--plot {out}: {special}")));
    }
    for flag in ["--metrics", "--plot"] {
        let folder = dir.to_str().unwrap();
        let expected = format!("{flag} {folder}: is a folder, not a file name");
        check(&["run", &m, flag, folder], &[], (2, &expected));
        let expected = format!(
            "{flag} {missing}: the folder {} does not exist",
            dir.join("no/such/folder").display()
        );
        check(&["run", &m, flag, &missing], &[], (2, &expected));
        // A folder that is there but takes no new file (`/proc` says "not found") is not
        // called missing (found by the hostile-input audit).
        if std::path::Path::new("/proc/version").exists() {
            let expected = format!("{flag} /proc/version: cannot be written there: No such file or directory (os error 2)");
            check(&["run", &m, flag, "/proc/version"], &[], (2, &expected));
        }
    }
    let unread = format!("{fifo}: a FIFO that no process reads: start its reader first");
    check(&["run", &m, "--metrics", &fifo], &[], (2, &unread));
    check(&["run", &m, "--metrics", "/dev/null"], &[], (0, ""));
    let model = script("svg_model.rms", "model m(x: f32[B, 2], B = 2) { return linear(x, 2) }\n");
    check(&["plan", &model, "--svg", &fifo], &[], (2, &format!("--svg {fifo}: {special}")));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
}

/// A notice the library prints (no hardware GPU: the CPU backend is used) cannot crash the
/// process when standard error is unwritable; the script's own result decides the exit code.
#[test]
fn an_unwritable_stderr_does_not_crash_a_run() {
    let f = script(
        "quiet.rms",
        "model m(x: f32[B, 2]) { return linear(x, 1) }\nlet c = m().compile(#{ loss: \"mse\" });\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["run", &f, "--device", "auto"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::from(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

/// A bad value passed by a script is the script's error (exit 1, InvalidArgument), not a bad
/// command line (exit 2).
#[test]
fn a_bad_argument_in_a_script_is_a_script_error() {
    let f = script("bad_arg.rms", "let m = tensor([1.0, 2.0]);\nlet d = device(\"tpu\");\n");
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown device `tpu`"), "{err}");
}

/// `--matmul-precision` of `run` and `bench`, and the `matmul_precision` compile option: a bad
/// mode is an error listing the choices (a usage error on the command line, an error at the
/// option's line in a script).
#[test]
fn a_bad_matmul_precision_lists_the_choices() {
    let ok = script("ok.rms", "print(1 + 1);\n");
    let choices = "unknown matmul precision `fast` (valid choices: highest, high, medium)";
    let flag = format!("--matmul-precision: {choices}");
    check(&["run", &ok, "--matmul-precision", "fast"], &[], (2, &flag));
    check(&["bench", "scripts/bench/mlp.rms", "--matmul-precision", "fast"], &[], (2, &flag));
    check(&["run", &ok, "--matmul-precision"], &[], (2, "--matmul-precision needs a value"));
    let f = script(
        "precision.rms",
        "model m(x: f32[B, 2]) { return linear(x, 2) }\n\nlet t = m().compile(#{ device: \"cpu\", matmul_precision: \"fast\" });\n",
    );
    let located = format!("{f}:3:");
    let (code, _, err) = rumus(&["run", &f]);
    assert_eq!(code, 1, "{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with(&located) && first.ends_with(&format!("compile: {choices}")),
        "{err}"
    );
}

/// The CPU backend computes in fp32 whatever mode is asked for, and `bench --json` says so;
/// a mode given is accepted by `run` and by the compile option.
#[test]
fn matmul_precision_is_reported_by_bench_and_accepted_by_run() {
    let (code, out, err) = rumus(&[
        "bench",
        "scripts/bench/mlp.rms",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--set",
        "B=4",
        "--matmul-precision",
        "medium",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["matmul_precision"], "highest", "{v}");
    let f = script(
        "precision_ok.rms",
        "model m(x: f32[B, 2]) { return linear(x, 2) }\nlet t = m().compile(#{ device: \"cpu\", matmul_precision: \"medium\" });\nprint(t.step);\n",
    );
    assert_eq!(rumus(&["run", &f, "--matmul-precision", "high"]), (0, "0\n".into(), String::new()));
}

/// On an adapter without cooperative matrices (lavapipe), `high` and `medium` fall back to
/// `highest` with a one-line notice, not an error, and the default is `highest`.
#[test]
fn cooperative_modes_fall_back_to_highest_without_cooperative_matrices() {
    let f = script(
        "precision_gpu.rms",
        "model m(x: f32[B, 2]) { return linear(x, 2) }\nlet t = m().compile(#{ batch: 2 });\nprint(t.step);\n",
    );
    for (mode, expected) in [
        (Some("medium"), "note: matmul precision medium needs cooperative matrices, which `"),
        (Some("high"), "note: matmul precision high needs cooperative matrices, which `"),
        (None, "note: matmul precision highest (fp32)"),
    ] {
        let mut args = vec!["run", &f, "--device", "gpu"];
        args.extend(mode.map(|m| ["--matmul-precision", m]).into_iter().flatten());
        let (code, out, err) = rumus(&args);
        assert_eq!((code, out.as_str()), (0, "0\n"), "{err}");
        let note = err.lines().find(|l| l.starts_with("note: matmul precision")).unwrap_or("");
        assert!(note.starts_with(expected), "{mode:?}: {err}");
        if mode.is_some() {
            assert!(note.ends_with("` lacks; using highest (fp32)"), "{err}");
        }
    }
}

/// `rumus bench --cpu-matmul` at a size that takes a while says what it is timing before it
/// starts (long work shows progress), and still prints its figure.
#[test]
fn a_long_cpu_matmul_benchmark_says_what_it_times() {
    let (code, out, err) = rumus(&["bench", "--cpu-matmul", "--size", "4096"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.starts_with("note: timing 4096 x 4096 x 4096 f32 products on ")
            && err.contains("a warm-up, then 5 timed runs, fewer once 10 s have passed"),
        "{err}"
    );
    assert!(out.contains("\"cpu_matmul_n\":4096"), "{out}");
    let (_, _, quiet) = rumus(&["bench", "--cpu-matmul", "--size", "64"]);
    assert_eq!(quiet, "", "a short run prints only its figure");
}
