//! The sandbox: every limit stops a script with a `Limit` error at the script's position, and
//! the session stays usable afterwards.

use rumus::error::Source;
use rumus::script::{Host, HostOptions, Sandbox};
use rumus::ErrorKind;

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
    check_err(&mut h, "ctrl_c();\nlet i = 0;\nloop { i += 1; }", ErrorKind::Limit, "interrupted");
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
fn module_import_is_refused() {
    let mut h = host();
    let e = h.eval(&Source::new("t.rms", "import \"Cargo\" as c;")).unwrap_err();
    assert!(e.to_string().contains("t.rms:1:"), "{e}");
    still_usable(&mut h);
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

/// Found by the fuzz driver: rhai resolves a call no function matches by retrying it with every
/// subset of up to 16 arguments made `Dynamic`, hashing all the arguments each time, in native
/// code no operation limit reaches; `tensor([0, 1], 1, 1, ...)` with 35,000 arguments ran for
/// 10 to 20 seconds. Wide calls are refused before the script runs.
#[test]
fn a_call_with_35000_arguments_is_refused() {
    let mut h = host();
    let code = format!("let y = 1;\nlet z = tensor([0, 1]{});", ",1".repeat(35_000));
    check_err(
        &mut h,
        &code,
        ErrorKind::Limit,
        "t.rms:2:15: more than 64 arguments in one call or parameter list: pass an array instead",
    );
    let code = format!("fn f(a) {{ a }}\nf({})", vec!["1"; 64].join(", "));
    check_err(&mut h, &code, ErrorKind::Script, "function not found: f (i64, i64");
}
