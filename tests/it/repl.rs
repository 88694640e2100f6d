//! The REPL, driven through the same code as the terminal loop: `Repl::feed` line by line,
//! `rumus repl --batch` through the binary, and `rumus repl` on a pseudo-terminal (Ctrl-C).

use rumus::repl::{Outcome, Repl};
use rumus::script::HostOptions;

fn feed_all(repl: &mut Repl, lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match repl.feed(l) {
            Outcome::Done(s) => s,
            Outcome::More => "<more>".to_string(),
            Outcome::Quit { output, code } => format!("{output}<quit {code}>"),
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
    assert_eq!(out[13], "<quit 0>");
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
    // Found by the third hostile-input audit: a command missing its argument said "no
    // variable ``", and `:quit now` quit.
    assert_eq!(
        repl.eval_line(":plan"),
        "usage: :plan NAME (a variable holding a trainer: a compiled model); try :help\n"
    );
    assert_eq!(
        repl.eval_line(":graph"),
        "usage: :graph NAME (a variable holding a model or trainer); try :help\n"
    );
    // Found by the hostile-input hunt: `:plan` of a number asked for "a model or a trainer",
    // of a model for a trainer. A plan is a trainer's.
    assert_eq!(repl.eval_line("let n = 3;"), "");
    assert_eq!(repl.eval_line(":plan n"), ":plan needs a compiled model (a trainer), got i64\n");
    assert_eq!(repl.eval_line(":load   "), "usage: :load FILE; try :help\n");
    assert_eq!(repl.eval_line(":quit now"), "usage: :quit (it takes nothing); try :help\n");
    assert_eq!(repl.eval_line("1 + 1"), "2\n", "the session goes on");
    let (start, names) = repl.complete("let a = ten", 11);
    assert_eq!((start, names), (8, vec!["tensor".to_string()]));
}

/// Found by the hostile-input audit: a script function and a model of one name, defined in two
/// inputs, left the name calling the function (rhai runs a script function before a native one)
/// whichever came first.
#[test]
fn a_model_and_a_script_function_of_one_name_are_refused_across_inputs() {
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(
        &mut repl,
        &[
            "fn f() { 1 }",
            "model f(x: f32[B, 2]) { return x }",
            "model g(x: f32[B, 2]) { return x }",
            "fn g(o) { 2 }",
            "f()",
            "type_of(g())",
        ],
    );
    assert_eq!(
        out[1],
        "<repl:2>:1:7: model `f`: a script function `f` is already defined (`fn f`), and a call \
         `f(..)` would run the function instead of the model: rename one\n    \
         model f(x: f32[B, 2]) { return x }\n          ^\n"
    );
    assert_eq!(
        out[3],
        "<repl:4>:1:4: fn `g`: a model `g` is defined, and a call `g(..)` would run this \
         function instead of the model: rename one\n    fn g(o) { 2 }\n       ^\n"
    );
    assert_eq!(out[4], "1\n", "the refused model was not defined");
    assert_eq!(out[5], "Model\n", "the refused function was not defined");
}

/// `:help NAME` shows the reference's entry (compiled in), `:help` lists every name, and an
/// unknown name suggests the nearest one.
#[test]
fn help_shows_the_reference_entry_of_a_name() {
    let mut repl = Repl::new(HostOptions::default());
    let help = repl.eval_line(":help");
    assert!(help.contains("tensor, zeros, ones") && help.contains(":help NAME"), "{help}");
    let check = |repl: &mut Repl, input: &str, expected: &str| {
        assert_eq!(repl.eval_line(input), expected, "{input}");
    };
    check(&mut repl, ":help numel", "### numel\n`t.numel()`: the number of elements.\n");
    check(&mut repl, ":help ones", "### ones\n`ones(shape)`: an f32 tensor of ones.\n");
    // The last entry of a section ends at the next section's heading.
    let to_i32 = repl.eval_line(":h to_i32");
    assert!(
        to_i32.starts_with("### to_i32\n`t.to_i32()`") && to_i32.ends_with("and get gradients.\n")
    );
    let evaluate = repl.eval_line(":help evaluate");
    assert!(evaluate.starts_with("### evaluate\n") && evaluate.contains("batch"), "{evaluate}");
    check(
        &mut repl,
        ":help tensr",
        "no script function `tensr`; did you mean `tensor`? (:help lists them)\n",
    );
    check(
        &mut repl,
        ":help evalute",
        "no script function `evalute`; did you mean `evaluate`? (:help lists them)\n",
    );
    // Found by the hostile-input audit: a REPL command was offered a function (`exp`).
    check(
        &mut repl,
        ":help :help",
        "`:help` is a REPL command, not a script function: :help lists both\n",
    );
}

/// Each case: lines fed one by one, and what each gave (`<more>` while the input is incomplete).
#[test]
fn input_is_complete_when_nothing_is_left_open() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["let a = [1,", "2]; a.len()"], &["<more>", "2\n"]),
        (&["fn f(x) {", "  x + 1", "}", "f(1)"], &["<more>", "<more>", "", "2\n"]),
        (&["let s = `a (", "b`; s.len()"], &["<more>", "5\n"]),
        (&["1 /* (", "*/ + 1"], &["<more>", "2\n"]),
        (&["let s = \"(\"; s.len()"], &["1\n"]),
        (&["let c = '{'; 1 // ("], &["1\n"]),
        // A closing bracket with nothing open cannot be mended by more lines: run it.
        (&["1) + ((2"], &["<repl:1>:1:2: syntax error: Expecting ';' to terminate this statement\n    1) + ((2\n     ^\n"]),
    ];
    for (lines, expected) in cases {
        let mut repl = Repl::new(HostOptions::default());
        assert_eq!(feed_all(&mut repl, lines), *expected, "lines: {lines:?}");
    }
}

/// `rumus repl --batch` fed `input` on its standard input (written from a thread, so a long
/// input cannot block on a full pipe while the REPL writes its answers).
fn batch(input: Vec<u8>) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rumus"))
        .args(["repl", "--batch"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out
}

#[test]
fn batch_mode_through_the_binary() {
    let out = batch(SESSION.join("\n").into_bytes());
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
            "model m(x: f32[2, 3], k = 2) {",
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
        "<repl:3>:1:9: model `m` has no hyperparameter or dimension `bogus` (it has hyperparameters `k`; no dimensions)\n    let n = m(#{ bogus: 1 });\n            ^\n"
    );
    // A mistake inside the model, in the input that defined it.
    assert_eq!(
        out[5],
        "<repl:1>:2:12: reshape: cannot reshape [2, 3] (6 elements) into [1, 4] (4 elements)\n        return reshape(linear(x, k), [1, 4])\n               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    );
}

#[test]
fn completion_after_multibyte_characters_does_not_panic() {
    let repl = Repl::new(HostOptions::default());
    let tensor = || vec!["tensor".to_string()];
    /// (line, byte position) -> (start of the word, candidates)
    type Case<'a> = (&'a str, usize, (usize, Vec<String>));
    let cases: &[Case] = &[
        ("→ten", 6, (3, tensor())),
        ("let é = ten", 12, (9, tensor())),
        ("\"日本\"ten", 11, (8, tensor())),
        ("→ten", 1, (0, vec![])), // inside the arrow: the boundary before it
        ("→ten", 99, (3, tensor())), // past the end: the end
        ("→", 3, (3, vec![])),
        ("", 0, (0, vec![])),
        ("é", 2, (2, vec![])),
        ("πten", 5, (2, tensor())), // a non-ASCII letter is not part of a name
    ];
    for (line, pos, expected) in cases {
        assert_eq!(&repl.complete(line, *pos), expected, "{line:?} at {pos}");
    }
}

#[test]
fn exit_in_a_script_ends_the_session_with_its_code() {
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(&mut repl, &["print(\"bye\"); exit(3); print(\"not reached\")"]);
    assert_eq!(out, ["bye\n<quit 3>"]);
    let mut repl = Repl::new(HostOptions::default());
    assert_eq!(feed_all(&mut repl, &["exit(\"failed\")"]), ["failed\n<quit 1>"]);
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(&mut repl, &["exit(256)", "1 + 1"]);
    assert_eq!(
        out,
        [
            "<repl:1>:1:1: exit code must be between 0 and 255, got 256\n    exit(256)\n    ^\n",
            "2\n"
        ]
    );
}

#[test]
fn values_from_files_are_shown_escaped() {
    let mut repl = Repl::new(HostOptions::default());
    assert_eq!(repl.eval_line("\"a\\x1b[2J\\nb\\r\""), "a\\u{1b}[2J\nb\\r\n");
}

#[test]
fn batch_mode_exit_code_and_closed_output() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let run = |input: &str, stdout: Stdio| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rumus"))
            .args(["repl", "--batch"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::piped())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(run("print(1);\nexit(4);\nprint(2);\n", Stdio::null()), (Some(4), String::new()));
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    assert_eq!(
        run("print(1);\n", Stdio::from(full)),
        (Some(2), "standard output: No space left on device (os error 28)\n".to_string())
    );
}

/// `rumus repl` on a pseudo-terminal, as a person runs it (rustyline active, TERM set).
#[cfg(unix)]
mod terminal {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::common::ScratchDir;

    /// A child on the slave side of a new pty, with the master's output collected by a thread.
    struct Pty {
        child: std::process::Child,
        master: std::fs::File,
        output: mpsc::Receiver<u8>,
        seen: String,
        /// The child's home, when the Pty made it.
        _home: Option<ScratchDir>,
    }

    impl Pty {
        fn spawn(args: &[&str]) -> Pty {
            let home = ScratchDir::new("pty");
            let mut pty = Pty::spawn_at_home(args, &home);
            pty._home = Some(home);
            pty
        }

        fn spawn_at_home(args: &[&str], home: &std::path::Path) -> Pty {
            let (mut master, mut slave) = (0, 0);
            // SAFETY: openpty writes two new descriptors into the given integers.
            let rc = unsafe {
                libc::openpty(
                    &mut master,
                    &mut slave,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            assert_eq!(rc, 0, "openpty failed");
            // SAFETY: both descriptors are fresh and owned here.
            let (master, slave) =
                unsafe { (std::fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
            std::fs::create_dir_all(home).unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_rumus"));
            cmd.args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("TERM", "xterm")
                .env("HOME", home)
                .stdin(Stdio::from(slave.try_clone().unwrap()))
                .stdout(Stdio::from(slave.try_clone().unwrap()))
                .stderr(Stdio::from(slave));
            // SAFETY: only async-signal-safe calls between fork and exec: a new session whose
            // controlling terminal is the pty, so the terminal's Ctrl-C reaches the child.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn().expect("spawn rumus on a pty");
            let (tx, output) = mpsc::channel();
            let mut reader = master.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = reader.read(&mut buf) {
                    if n == 0 || buf[..n].iter().any(|&b| tx.send(b).is_err()) {
                        break;
                    }
                }
            });
            let _ = master.as_raw_fd();
            Pty { child, master, output, seen: String::new(), _home: None }
        }

        fn send(&mut self, bytes: &str) {
            self.master.write_all(bytes.as_bytes()).unwrap();
        }

        /// Read until `text` has appeared (after what earlier waits consumed); fails after a
        /// minute of silence, showing what came.
        fn wait_for(&mut self, text: &str) {
            let mut bytes = Vec::new();
            loop {
                if String::from_utf8_lossy(&bytes).contains(text) {
                    self.seen.push_str(&String::from_utf8_lossy(&bytes));
                    return;
                }
                match self.output.recv_timeout(Duration::from_secs(60)) {
                    Ok(b) => bytes.push(b),
                    Err(_) => {
                        let _ = self.child.kill();
                        panic!(
                            "no `{text}` from the terminal; got:\n{}{}",
                            self.seen,
                            String::from_utf8_lossy(&bytes)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ctrl_c_stops_a_running_loop_and_the_session_goes_on() {
        let mut pty = Pty::spawn(&["repl", "--device", "cpu"]);
        pty.wait_for("rumus> ");
        // The printed word is built at run time so that the echo of the typed line cannot match it.
        pty.send("let n = 0; print(\"spin\" + \"ning\"); loop { n += 1; }\r");
        pty.wait_for("spinning");
        pty.send("\x03"); // Ctrl-C, as the terminal sends it
        pty.wait_for(": interrupted");
        pty.wait_for("rumus> ");
        // The session, and the variable the loop counted in, survive.
        pty.send("n > 0\r");
        pty.wait_for("true");
        pty.send("for i in 0..1000000000 { if i == 0 { print(\"count\" + \"ing\") } }\r");
        pty.wait_for("counting");
        pty.send("\x03");
        pty.wait_for(": interrupted");
        pty.send("40 + 2\r");
        pty.wait_for("42");
        pty.send("exit(5)\r");
        let status = pty.child.wait().unwrap();
        assert_eq!(status.code(), Some(5), "{}", pty.seen);
    }

    /// Found by the hostile-input audit: a FIFO as `~/.rumus_history` blocked the REPL before
    /// its first prompt, and bytes that are not UTF-8 typed at the prompt ended the session
    /// ("line editor: invalid data"). The history is skipped, the line dropped with an error.
    #[test]
    fn a_fifo_history_and_bytes_that_are_not_utf8_do_not_end_the_session() {
        let home = ScratchDir::new("pty-fifo");
        let fifo = home.join(".rumus_history");
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let mut pty = Pty::spawn_at_home(&["repl", "--device", "cpu"], &home);
        pty.wait_for("rumus> ");
        pty.master.write_all(b"\xFF\xFE\r").unwrap();
        pty.wait_for("invalid UTF-8 from the terminal: the line is dropped");
        pty.send("40 + 2\r");
        pty.wait_for("42");
        pty.send(":quit\r");
        let status = pty.child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{}", pty.seen);
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }
}

#[test]
fn error_inside_a_function_points_into_the_input_or_file_that_defined_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/repl_load");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lib.rms");
    std::fs::write(&file, "fn g(x) {\n    x + missing\n}\n").unwrap();
    let load = format!(":load {}", file.display());
    let mut repl = Repl::new(HostOptions::default());
    let out = feed_all(&mut repl, &["fn f(x) {", "  x * nope", "}", "f(1)", &load]);
    assert_eq!(out[3], "<repl:1>:2:7: variable not found: nope\n      x * nope\n          ^\n");
    // The file is loaded again after an edit that breaks it: `g` is still the first version,
    // and its error is shown against the text it was defined in, not the new one.
    std::fs::write(&file, "let broken = ;\n").unwrap();
    let out = feed_all(&mut repl, &[&load, "g(1)"]);
    assert!(out[0].contains("lib.rms:1:14: "), "{}", out[0]);
    let name = file.display();
    assert_eq!(
        out[1],
        format!("{name}:2:9: variable not found: missing\n        x + missing\n            ^\n")
    );
}

/// Found by the hostile-input audit: each line of an input whose brackets stay open scans the
/// whole input so far again, so 100,000 lines of `1,` after `let a = [` took 42 s. An input
/// continues over at most 1,000 lines and 256 KiB; past that it is dropped with an error and
/// the session goes on.
#[test]
fn a_long_open_input_is_dropped_with_an_error_and_the_session_goes_on() {
    let expected = "an input may continue over at most 1000 lines and 262144 bytes (brackets were \
                    still open); put longer code in a file and `:load` it\n";
    let mut repl = Repl::new(HostOptions::default());
    let mut lines = vec!["let a = ["];
    lines.extend(std::iter::repeat_n("1,", 999));
    assert!(feed_all(&mut repl, &lines).iter().all(|s| s == "<more>"));
    assert_eq!(feed_all(&mut repl, &["1,", "40 + 2"]), [expected, "42\n"]);
    let wide = "1,".repeat(500);
    let mut lines = vec!["let a = ["];
    lines.extend(std::iter::repeat_n(wide.as_str(), 261));
    assert!(feed_all(&mut repl, &lines).iter().all(|s| s == "<more>"));
    assert_eq!(feed_all(&mut repl, &[&wide, "40 + 2"]), [expected, "42\n"]);
    // An input within both limits still runs.
    let mut lines = vec!["let a = ["];
    lines.extend(std::iter::repeat_n("1,", 998));
    lines.extend(["];", "a.len()"]);
    assert_eq!(feed_all(&mut repl, &lines).last().unwrap(), "998\n");
}

/// Found by the hostile-input audit: one line of stdin that was not UTF-8 ended a batch
/// session with an I/O error, and a line without end was read whole into memory. Each is
/// now an error at its line, skipped, and the session goes on.
#[test]
fn batch_mode_skips_a_line_that_is_not_utf8_or_too_long() {
    let mut input = b"print(1)\n\xFF\nprint(2)\r\nlet a = \"\xC3\xA9\xC3\";\nprint(3)\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 17 << 20));
    input.extend(b"\nprint(4)");
    let out = batch(input);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n\
         <stdin>:2:1: invalid UTF-8 (byte 0xFF): input must be UTF-8 text (skipped)\n\
         2\n\
         <stdin>:4:12: invalid UTF-8 (byte 0xC3): input must be UTF-8 text (skipped)\n\
         3\n\
         <stdin>:6: a line may have at most 16777216 bytes; this one has more (skipped)\n\
         4\n"
    );
}

/// Found by the hostile-input hunt: `:load "s1.rms"` opened a file named with the quotes. A
/// command's path may be written bare or between double or single quotes (a path with spaces);
/// a quote left open, or text after the closing one, is an error.
#[test]
fn a_commands_path_may_be_quoted() {
    let dir = crate::common::ScratchDir::new("repl-quoted");
    let file = dir.join("with space.rms");
    std::fs::write(&file, "let loaded = 7;\n").unwrap();
    let name = file.display().to_string();
    let mut repl = Repl::new(HostOptions::default());
    for load in [format!(":load \"{name}\""), format!(":load '{name}'  "), format!(":load {name}")]
    {
        assert_eq!(repl.eval_line("let loaded = 0;"), "");
        assert_eq!(repl.eval_line(&load), "", "{load}");
        assert_eq!(repl.eval_line("loaded"), "7\n", "{load}");
    }
    // A quote of the other kind inside a quoted path is part of the path.
    for (file_name, open) in [("it's.rms", '"'), ("say \"hi\".rms", '\'')] {
        let file = dir.join(file_name);
        std::fs::write(&file, "let loaded = 8;\n").unwrap();
        assert_eq!(repl.eval_line("let loaded = 0;"), "");
        assert_eq!(repl.eval_line(&format!(":load {open}{}{open}", file.display())), "");
        assert_eq!(repl.eval_line("loaded"), "8\n", "{file_name}");
    }
    assert_eq!(
        repl.eval_line(&format!(":load \"{name}")),
        "unterminated quote: the path after :load opens with \" and never closes it; end the \
         path with \"\n"
    );
    assert_eq!(
        repl.eval_line(&format!(":load '{name}")),
        "unterminated quote: the path after :load opens with ' and never closes it; end the \
         path with '\n"
    );
    assert_eq!(
        repl.eval_line(&format!(":load '{name}' more.rms")),
        ":load takes one path, and `more.rms` follows its closing quote '\n"
    );
    assert_eq!(repl.eval_line(":load \"\""), ":load: the quoted path is empty\n");
    assert_eq!(repl.eval_line("1 + 1"), "2\n", "the session goes on");
}
