//! The sandbox: every limit (operations, wall time, call depth, sizes, files, memory) stops a
//! script with a `Limit` error at the script's position, an interrupt with an `Interrupted`
//! one, and the session stays usable afterwards.

use rumus::error::Source;
use rumus::script::{ExitRequest, Host, HostOptions, Sandbox};
use rumus::ErrorKind;
use std::time::Duration;

fn host() -> Host {
    let sandbox = Sandbox { max_operations: 200_000, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    h.on_print(|_| {});
    h
}

/// Evaluate `code` and return its error rendered, checking its kind.
fn check_err(h: &mut Host, code: &str, kind: ErrorKind, expected: &str) {
    let e = h.eval(&Source::new("t.rms", code)).expect_err("should fail");
    assert_eq!(e.kind, kind, "{e}");
    let text = e.to_string();
    assert!(text.contains(expected), "expected `{expected}` in:\n{text}");
    still_usable(h);
}

fn still_usable(h: &mut Host) {
    let v = h.eval(&Source::new("ok.rms", "40 + 2")).unwrap();
    assert_eq!(v.as_int().unwrap(), 42);
}

#[test]
fn endless_loop_stops_with_a_limit_error() {
    let mut h = host();
    check_err(&mut h, "let x = 0;\nloop { x += 1; }", ErrorKind::Limit, "operation limit");
}

#[test]
fn deep_recursion_errors() {
    let mut h = host();
    check_err(&mut h, "fn f(n) { f(n + 1) }\nf(0)", ErrorKind::Limit, "call depth limit");
}

#[test]
fn interrupt_flag_stops_a_script() {
    let mut h = host();
    h.interrupt().trigger();
    // eval clears the flag before it starts, so set it from inside the script instead.
    let flag = h.interrupt().clone();
    h.engine_mut().register_fn("ctrl_c", move || flag.trigger());
    check_err(
        &mut h,
        "ctrl_c();\nlet i = 0;\nloop { i += 1; }",
        ErrorKind::Interrupted,
        "t.rms:2:1: interrupted",
    );
}

#[test]
fn reading_etc_passwd_is_refused() {
    let mut h = host();
    check_err(
        &mut h,
        "let s = read_text(\"/etc/passwd\");",
        ErrorKind::Limit,
        "t.rms:1:9: reading `/etc/passwd` is not allowed",
    );
}

#[test]
fn writing_outside_the_working_directory_is_refused() {
    let mut h = host();
    check_err(
        &mut h,
        "write_text(\"/tmp/rumus-escape.txt\", \"x\");",
        ErrorKind::Limit,
        "writing `/tmp/rumus-escape.txt` is not allowed",
    );
    check_err(&mut h, "write_text(\"../escape.txt\", \"x\");", ErrorKind::Limit, "is not allowed");
    assert!(!std::path::Path::new("/tmp/rumus-escape.txt").exists());
}

#[test]
fn huge_tensor_is_refused_before_allocation() {
    let mut h = host();
    check_err(&mut h, "let t = zeros([1 << 20, 1 << 20]);", ErrorKind::Limit, "memory budget");
    check_err(&mut h, "let t = randn([1 << 40], 1);", ErrorKind::Limit, "memory budget");
}

#[test]
fn module_import_is_refused_and_says_so() {
    let mut h = host();
    for code in ["import \"Cargo\" as c;", "fn f() { import \"x\"; }\nf();"] {
        check_err(
            &mut h,
            code,
            ErrorKind::Limit,
            "`import` is not available in rumus scripts: define the functions in this file",
        );
    }
}

#[test]
fn engine_default_sandbox_stops_an_endless_loop() {
    let mut engine = rumus::Engine::new();
    let e = engine.run("let i = 0;\nloop { i += 1; }").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit);
    assert!(
        e.to_string().starts_with(
            "<eval:1>:2:8: operation limit reached: the script ran more than 50000000 operations"
        ),
        "{e}"
    );
    assert_eq!(engine.eval("40 + 2").unwrap().as_int().unwrap(), 42);
}

/// A host whose evaluations may run `ms` milliseconds, with `slow()`: a native call of 300 ms
/// that counts how often it ran.
fn timed_host(ms: u64) -> (Host, std::rc::Rc<std::cell::Cell<u32>>) {
    let sandbox = Sandbox { timeout: Some(Duration::from_millis(ms)), ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    let calls = std::rc::Rc::new(std::cell::Cell::new(0));
    let c = calls.clone();
    h.engine_mut().register_fn("slow", move || {
        c.set(c.get() + 1);
        std::thread::sleep(Duration::from_millis(300));
    });
    (h, calls)
}

#[test]
fn time_limit_stops_a_loop_and_the_next_evaluation_gets_its_own_time() {
    let (mut h, _) = timed_host(100);
    check_err(
        &mut h,
        "let i = 0;\nloop { i += 1; }",
        ErrorKind::Limit,
        "time limit reached: the script ran longer than 0.1 s",
    );
    check_err(&mut h, "while true {}", ErrorKind::Limit, "time limit reached");
}

#[test]
fn time_limit_is_checked_when_a_long_native_call_returns() {
    let (mut h, calls) = timed_host(50);
    check_err(
        &mut h,
        "for i in 0..5 {\n    slow();\n}",
        ErrorKind::Limit,
        "time limit reached: the script ran longer than 0.05 s",
    );
    assert_eq!(calls.get(), 1, "the loop stopped after the first call that overran");
}

#[test]
fn exit_ends_an_evaluation_and_the_host_reads_the_request() {
    let mut engine = rumus::Engine::new();
    let v = engine.eval("let a = 1;\nif a == 1 { exit(3); }\n99").unwrap();
    assert_eq!(v.as_int().unwrap(), 3);
    assert_eq!(engine.exit_request(), Some(ExitRequest::Code(3)));
    assert_eq!(engine.eval("2").unwrap().as_int().unwrap(), 2);
    assert_eq!(engine.exit_request(), None, "cleared by the next evaluation");
    let _ = engine.eval("exit(\"done\")").unwrap();
    assert_eq!(engine.exit_request(), Some(ExitRequest::Message("done".into())));
}

#[test]
fn interrupt_from_another_thread_stops_the_engine() {
    let mut engine = rumus::Engine::new();
    let flag = engine.interrupt();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    engine.script_engine().register_fn("started", move || {
        let _ = tx.send(());
    });
    let t = std::thread::spawn(move || {
        rx.recv().unwrap();
        flag.trigger();
    });
    let e = engine.run("started();\nwhile true {}").unwrap_err();
    t.join().unwrap();
    assert_eq!(e.kind, ErrorKind::Interrupted, "{e}");
    assert_eq!(engine.eval("1").unwrap().as_int().unwrap(), 1);
}

#[test]
fn long_strings_and_arrays_are_refused() {
    let sandbox = Sandbox { max_string_size: 1000, max_array_size: 1000, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    check_err(
        &mut h,
        "let s = \"x\"; for i in 0..20 { s += s; }",
        ErrorKind::Limit,
        "over the limit",
    );
    check_err(
        &mut h,
        "let a = []; for i in 0..2000 { a.push(i); }",
        ErrorKind::Limit,
        "over the limit",
    );
}

#[test]
fn errors_point_at_the_scripts_line_and_column() {
    let mut h = host();
    let e = h.eval(&Source::new("p.rms", "let a = 1;\nlet b = a + nope;\n")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Script);
    let text = e.to_string();
    assert!(text.starts_with("p.rms:2:13: "), "{text}");
    assert!(text.ends_with("    let b = a + nope;\n                ^"), "{text}");
}

#[test]
fn state_persists_across_evaluations() {
    let mut h = host();
    let _ = h.eval(&Source::new("a", "let x = 20; fn twice(v) { v * 2 }")).unwrap();
    let v = h.eval(&Source::new("b", "twice(x) + 2")).unwrap();
    assert_eq!(v.as_int().unwrap(), 42);
}
