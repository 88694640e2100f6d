//! The sandbox: every limit (operations, wall time, call depth, sizes, files, memory) stops a
//! script with a `Limit` error at the script's position, an interrupt with an `Interrupted`
//! one, and the session stays usable afterwards.

use rumus::error::Source;
use rumus::memory::human;
use rumus::script::{ExitRequest, Host, HostOptions, Sandbox};
use rumus::ErrorKind;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
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

/// Evaluate `code`, which must succeed.
fn ok(h: &mut Host, code: &str) {
    if let Err(e) = h.eval(&Source::new("t.rms", code)) {
        panic!("{e}");
    }
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
    check_err(&mut h, "let t = randn([1 << 30, 1 << 10], 1);", ErrorKind::Limit, "memory budget");
    check_err(&mut h, "let t = ones([1 << 62, 4]);", ErrorKind::Shape, "more than 2^40 elements");
}

/// A session whose memory budget is `mib` MiB.
fn budget_host(mib: u64) -> Host {
    let sandbox = Sandbox { memory_budget: mib << 20, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, device: "cpu".into(), ..HostOptions::default() });
    h.on_print(|_| {});
    h
}

/// A script's own values are counted by no budget: copies of one large array, each held by a
/// closure (or a variable, or a call's argument), filled the machine's memory until the process
/// was killed. With a heap limit (the `rumus` binary's: its memory budget) the script stops
/// with an error at the operation that passed it, and the session goes on.
#[test]
fn copies_of_a_scripts_arrays_stop_at_the_heap_limit() {
    // The heap is the whole test process's: the limit is what it holds now and 256 MiB more.
    let limit = rumus::memory::heap_bytes() + (256 << 20);
    let sandbox = Sandbox { heap_limit: Some(limit), ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, device: "cpu".into(), ..HostOptions::default() });
    h.on_print(|_| {});
    let code = "let big = [];\nbig.pad(1000000, 0);\nlet fs = [];\n\
                for i in 0..100000 { let c = big; fs.push(|| c); }";
    let e = h.eval(&Source::new("t.rms", code)).expect_err("should fail");
    assert_eq!(e.kind, ErrorKind::Limit, "{e}");
    assert_eq!(
        e.message,
        format!(
            "memory limit reached: the process holds more than {} (the script's arrays, strings, \
             maps and closures count, beside its tensors): keep fewer or smaller values alive at \
             once",
            human(limit)
        )
    );
    assert_eq!(e.location().map(|(_, line, _)| line), Some(4), "{e}");
    still_usable(&mut h);
}

#[test]
fn broadcasting_two_vectors_is_charged_before_allocating() {
    let mut h = budget_host(64);
    check_err(
        &mut h,
        "let a = zeros([100000]);\nlet b = zeros([100000, 1]);\nlet c = a + b;",
        ErrorKind::Limit,
        "t.rms:3:11: a tensor of shape [100000, 100000] needs 37.3 GiB, more than the \
         whole 64.0 MiB memory budget",
    );
}

#[test]
fn many_tensors_share_one_budget_and_give_it_back_when_dropped() {
    let mut h = budget_host(65);
    // 16 MiB each and a few hundred bytes besides the elements (measured, not assumed): the
    // fifth does not fit, and the error says exactly what four left.
    let (limit, before) = (h.ctx().budget.limit(), h.ctx().budget.used());
    ok(&mut h, "let one = zeros([4 << 20]);");
    let each = h.ctx().budget.used() - before;
    ok(&mut h, "one = ();");
    assert_eq!(h.ctx().budget.used(), before);
    check_err(
        &mut h,
        "let keep = [];\nfor i in 0..10 { keep.push(zeros([4 << 20])); }",
        ErrorKind::Limit,
        &format!(
            "t.rms:2:28: a tensor of shape [4194304] needs {} but only {} of the {} memory budget \
             is free",
            human(each),
            human(limit - before - 4 * each),
            human(limit)
        ),
    );
    // `keep` still holds four; dropped, the budget is free again.
    ok(&mut h, "keep = (); let k = []; for i in 0..4 { k.push(zeros([4 << 20])); }");
    // Copies, slices and the rows of a dataset are charged too.
    check_err(&mut h, "let c = k[0] * 2;", ErrorKind::Limit, "a tensor of shape [4194304] needs");
    check_err(
        &mut h,
        "let d = dataset(k[0].reshape([1024, 4096]), zeros([1024]));",
        ErrorKind::Limit,
        "a tensor of shape [1024, 4096] needs",
    );
    check_err(
        &mut h,
        "k = (); let d = dataset(zeros([2048, 4096]), zeros([2048])); let s = d.shuffle(1); let t = d.shuffle(2);",
        ErrorKind::Limit,
        "a tensor of shape [2048, 4096] needs 32.0 MiB",
    );
}

/// Found by the hostile-input audit: `d.batches(1, 0)` on 16 million rows held 6.8 GB of batch
/// objects while 256 MB (their elements) were charged, and two such calls aborted the process.
/// A script tensor's charge covers its overhead besides its elements, and `batches` charges
/// everything its list holds before it builds any of it.
#[test]
fn batches_and_small_tensors_are_charged_what_they_really_hold() {
    let mut h = budget_host(64);
    check_err(
        &mut h,
        "let d = dataset(zeros([1000000, 1]), zeros([1000000]));\nlet b = d.batches(1, 0);",
        ErrorKind::Limit,
        "t.rms:2:11: a list of 1000000 batches needs",
    );
    ok(&mut h, "let b = d.batches(1000, 0); if b.len() != 1000 { throw b.len(); } b = ();");
    // Half a million empty tensors hold far more than their (zero) elements.
    check_err(
        &mut h,
        "let keep = [];\nfor i in 0..500000 { keep.push(zeros([0])); }",
        ErrorKind::Limit,
        "t.rms:2:32: a tensor of shape [0] needs",
    );
    ok(&mut h, "keep = ();");
    // The list's length is checked against the array size limit first.
    let sandbox = Sandbox { max_array_size: 1000, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    check_err(
        &mut h,
        "let d = dataset(zeros([2000, 1]), zeros([2000]));\nd.batches(1, 0)",
        ErrorKind::Limit,
        "t.rms:2:3: batches: batch size 1 makes 2000 batches, over the array size limit of 1000: \
         use larger batches",
    );
}

const MODELS: &str = "
model wide(x: f32[B, 1], n = 2) { return linear(x, n) }
";

#[test]
fn an_8_gib_parameter_is_refused_at_compile() {
    let mut h = budget_host(64);
    check_err(
        &mut h,
        &format!("{MODELS}\nlet m = wide(#{{ n: 1 << 31 }}).compile(#{{ loss: \"mse\" }});"),
        ErrorKind::Limit,
        "model `wide` compiled for training needs",
    );
}

#[test]
fn a_predict_with_a_huge_output_is_refused() {
    let mut h = budget_host(64);
    check_err(
        &mut h,
        &format!(
            "{MODELS}\nlet m = wide(#{{ n: 1 << 16 }}).compile(#{{ loss: \"mse\" }});\n\
             let y = m.predict(zeros([4096, 1]));"
        ),
        ErrorKind::Limit,
        "model `wide` evaluated on a batch of 4096 needs 2.0 GiB",
    );
    // Smaller batches fit, one after the other (copies at earlier sizes make room).
    ok(&mut h, "for b in [64, 32, 16, 8] { let y = m.predict(zeros([b, 1])); }");
}

#[test]
fn repeated_compiles_are_charged_until_their_models_are_dropped() {
    let mut h = budget_host(64);
    check_err(
        &mut h,
        &format!(
            "{MODELS}\nlet nets = [];\nfor i in 0..1000 {{ nets.push(wide(#{{ n: 1 << 20 }}).compile(#{{ loss: \"mse\" }})); }}"
        ),
        ErrorKind::Limit,
        "model `wide` compiled for training needs",
    );
    ok(
        &mut h,
        "nets = (); for i in 0..20 { let m = wide(#{ n: 1 << 20 }).compile(#{ loss: \"mse\" }); }",
    );
}

#[test]
fn a_gzip_csv_that_expands_past_the_budget_is_refused() {
    use std::io::Write;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bomb.csv.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&b"1,2,3,4,5,6,7,8\n".repeat(1 << 20)).unwrap();
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let mut h = budget_host(8);
    check_err(
        &mut h,
        &format!("let d = csv(\"{}\");", path.display()),
        ErrorKind::Limit,
        "rows needs",
    );
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

/// `eval` nested a parse and an evaluation on the native stack without counting a call level:
/// a string that evaluates itself overflowed the stack and aborted the process, whatever the
/// limits. It is a syntax error now, in every form that reaches it.
#[test]
fn eval_is_refused_and_says_so() {
    let mut h = host();
    for (code, col) in [
        ("let s = \"eval(s)\"; eval(s);", 20),
        ("let s = \"1\";\nprint(Fn(\"eval\").call(s));", 10),
        ("let f = Fn(\"ev\" + \"al\"); f.call(\"1\");", 17),
    ] {
        let e = h.eval(&Source::new("t.rms", code)).expect_err(code);
        assert_eq!(e.kind, ErrorKind::Parse, "{e}");
        assert!(
            e.message.ends_with(
                "`eval` is not available in rumus scripts; write the code it would run in the \
                 script itself"
            ),
            "{code}: {e}"
        );
        assert_eq!(e.location().map(|(_, _, c)| c), Some(col), "{code}: {e}");
        still_usable(&mut h);
    }
}

/// `curry` copied the function and its curried values into a new one: `f = f.curry(f)` doubled
/// the memory at every step, out of reach of the array and string limits, and 40 steps exhausted
/// memory (an abort). It is a syntax error now, in every form; closures capture values instead.
#[test]
fn curry_is_refused_and_says_so() {
    let mut h = host();
    // 20 steps, not 40: were `curry` back, this test fails on its `Ok`, not by taking the memory.
    let code = "fn g(x) { 1 }\nlet f = Fn(\"g\");\nfor i in 0..20 { f = f.curry(f); }";
    for (code, col) in [
        (code.to_string(), 24),
        (code.replace("f.curry(f)", "curry(f, f)"), 22),
        (code.replace("f.curry(f)", "call(Fn(\"cur\" + \"ry\"), f)"), 36),
    ] {
        let e = h.eval(&Source::new("t.rms", &code)).expect_err(&code);
        assert_eq!(e.kind, ErrorKind::Parse, "{e}");
        assert!(
            e.message.ends_with(
                "`curry` is not available in rumus scripts; write a closure that captures the \
                 values instead, as in `|x| f.call(a, x)`"
            ),
            "{code}: {e}"
        );
        assert_eq!(e.location().map(|(_, l, c)| (l, c)), Some((3, col)), "{code}: {e}");
        still_usable(&mut h);
    }
    let closures = "let k = 3;\nlet f = |x, y| x + k + y;\nlet g = |y| f.call(1, y);\n\
                    if g.call(2) != 6 { throw \"closure\" }";
    ok(&mut h, closures);
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
fn timed_host(ms: u64) -> (Host, Arc<AtomicU32>) {
    let sandbox = Sandbox { timeout: Some(Duration::from_millis(ms)), ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    h.engine_mut().register_fn("slow", move || {
        c.fetch_add(1, Ordering::SeqCst);
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
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the loop stopped after the first call that overran"
    );
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
    check_err(
        &mut h,
        "let a = tensor(0..2000).to_array();",
        ErrorKind::Limit,
        "to_array: a tensor of shape [2000] makes 0 nested arrays and 2000 numbers, 2000 array \
         entries in all, over the array size limit of 1000",
    );
}

/// Found by the hostile-input audit: `to_array` checked the element count (0 for a shape
/// `[10^12, 0]`) but makes one array per leading index, and the process aborted allocating
/// 16 TB of them. It counts every array entry it makes (as rhai's own limit counts them), and
/// charges them to the memory budget while it builds them; and a script tensor's dimension is at
/// most 2^31, as in the model language.
#[test]
fn to_array_counts_the_arrays_it_makes_not_only_the_elements() {
    let sandbox = Sandbox { max_array_size: 1000, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    check_err(
        &mut h,
        "let t = zeros([40, 40, 0]);\nlet a = t.to_array();",
        ErrorKind::Limit,
        "t.rms:2:11: to_array: a tensor of shape [40, 40, 0] makes 1640 nested arrays and 0 \
         numbers, 1640 array entries in all, over the array size limit of 1000",
    );
    check_err(
        &mut h,
        "let a = zeros([10, 10, 10]).to_array();",
        ErrorKind::Limit,
        "makes 110 nested arrays and 1000 numbers, 1110 array entries in all",
    );
    ok(
        &mut h,
        "let a = zeros([30, 30, 0]).to_array(); if a.len() != 30 || a[29].len() != 30 { throw a; }",
    );
    for (code, d) in [
        ("zeros([1000000000000, 0])", "1000000000000"),
        ("ones([0, 2147483649])", "2147483649"),
        ("tensor(0..0).reshape([0, 4294967296])", "4294967296"),
    ] {
        let over = "is over the limit of 2147483648 (2^31), the largest the model language accepts";
        check_err(&mut h, code, ErrorKind::Shape, &format!("dimension {d} {over}"));
    }
    ok(&mut h, "let t = zeros([2147483648, 0]);");
    // Without an array size limit the memory budget bounds what it builds.
    let sandbox = Sandbox { max_array_size: 0, memory_budget: 64 << 20, ..Sandbox::default() };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    check_err(
        &mut h,
        "let a = zeros([1 << 20, 1 << 20, 0]).to_array();",
        ErrorKind::Limit,
        "to_array of a tensor of shape [1048576, 1048576, 0] needs",
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

#[test]
fn a_model_holds_its_charge_until_dropped_on_either_device() {
    let (devices, _turn) = crate::common::gpu::devices_or_skip("model charge on the gpu");
    for device in devices {
        let mut h = budget_host(64);
        let before = h.ctx().budget.used();
        let code = format!(
            "{MODELS}\nlet m = wide(#{{ n: 1 << 16 }}).compile(#{{ loss: \"mse\", device: \"{device}\" }});\n\
             let y = m.predict(zeros([8, 1]));"
        );
        ok(&mut h, &code);
        // The weight and bias (256 KiB each) with two Adam moments each, at least.
        let held = h.ctx().budget.used() - before;
        assert!(held >= 6 * (256 << 10), "{device}: {held}");
        ok(&mut h, "m = (); y = ();");
        assert_eq!(h.ctx().budget.used(), before, "{device}");
    }
}

/// Found by the hostile-input audit: a `predict` on the GPU at a batch size whose output is
/// larger than one storage binding failed, but kept its evaluation copy (and that copy's
/// charge, 6 GiB for 200,000 rows of 4096) for as long as the model lived. A copy that fails
/// its first run is dropped with its charge; one that runs (an adapter with larger bindings)
/// is kept, as any copy is.
#[test]
fn a_predict_that_fails_on_the_device_gives_its_charge_back() {
    let (devices, _turn) = crate::common::gpu::devices_or_skip("a failed predict's charge");
    for device in devices {
        let mut h = budget_host(1024);
        let code = format!(
            "model wide(x: f32[B, 1]) {{ return linear(x, 4096) as fc }}\n\
             let m = wide().compile(#{{ loss: \"mse\", device: \"{device}\" }});"
        );
        ok(&mut h, &code);
        let before = h.ctx().budget.used();
        // 8193 rows of 4096: just over WebGPU's default 128 MiB binding.
        let failed = h.eval(&Source::new("p.rms", "let y = m.predict(zeros([8193, 1])); y = ();"));
        if failed.is_err() {
            assert_eq!(h.ctx().budget.used(), before, "{device}: {failed:?}");
        }
        still_usable(&mut h);
    }
}

#[test]
fn copies_made_inside_the_model_are_charged_too() {
    let mut h = budget_host(64);
    // Fill the budget to within 1 MiB, then ask for 4 MiB copies.
    let setup = "model wide(x: f32[B, 1]) { return linear(x, 1048576) as fc }
         let m = wide().compile(#{ loss: \"mse\" });
         let w = zeros([1, 1 << 20]);
         let y = m.predict(zeros([1, 1]));
         let x1 = zeros([1, 1]); let y1 = tensor([0], \"i32\");
         let fill = [];
         try { for i in 0..100 { fill.push(zeros([1 << 18])); } } catch {}";
    ok(&mut h, setup);
    // What is free is measured (it depends on what each value holds besides its elements);
    // each call below charges nothing before the charge that fails, and gives back what it
    // charged when it fails.
    let (limit, used) = (h.ctx().budget.limit(), h.ctx().budget.used());
    let only =
        format!("but only {} of the {} memory budget is free", human(limit - used), human(limit));
    check_err(
        &mut h,
        "m.set_param(\"fc.weight\", w);",
        ErrorKind::Limit,
        &format!("copying values into the model needs 4.0 MiB {only}"),
    );
    check_err(
        &mut h,
        "m.accuracy(x1, y1)",
        ErrorKind::Limit,
        &format!("model `wide` evaluated on a batch of 1 needs 8.0 MiB {only}"),
    );
    check_err(
        &mut h,
        "let p = m.param(\"fc.weight\");",
        ErrorKind::Limit,
        &format!("a copy of parameter `fc.weight` needs 4.0 MiB {only}"),
    );
    assert_eq!(h.ctx().budget.used(), used);
    // With room again, both work.
    ok(&mut h, "fill = (); m.set_param(\"fc.weight\", w); let a = m.accuracy(x1, y1);");
}

#[test]
fn benchmarking_a_model_larger_than_the_machine_is_an_error() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("huge.rms");
    // 2^31 outputs of 2^9 inputs: a 4 TiB weight, far past half of any test machine's memory.
    std::fs::write(&file, "model huge(x: f32[B, 512]) { return linear(x, 2147483648) }\n").unwrap();
    let spec = rumus::cli::bench::ModelSpec {
        file: file.display().to_string(),
        model: None,
        sets: vec![("B".into(), "1".into())],
        no_remat: false,
        remat_matmuls: false,
    };
    let e = rumus::cli::bench::bench_model(
        &spec,
        (rumus::runtime::DeviceChoice::Cpu, None),
        1,
        0,
        false,
        &rumus::dist::single(),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit, "{e}");
    assert!(e.message.starts_with(&format!("benchmarking `{}` needs ", file.display())), "{e}");
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_instead_of_blocking_forever() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("pipe.csv");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut h = host();
    for read in ["csv", "read_text", "text"] {
        let args = if read == "text" { ", #{}" } else { "" };
        check_err(
            &mut h,
            &format!("let d = {read}(\"{}\"{args});", fifo.display()),
            ErrorKind::Io,
            &format!(
                "{}: is not a regular file or folder (a device, FIFO or socket); rumus reads \
                 files and folders only",
                fifo.display()
            ),
        );
    }
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

/// A host gives a session its own folder for relative paths without changing the process's
/// working directory (which every thread shares).
#[test]
fn relative_paths_resolve_against_the_sandboxs_base_dir() {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/script_sandbox/base");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::write(base.join("note.txt"), "from the base dir").unwrap();
    let sandbox = Sandbox {
        base_dir: base.clone(),
        read_roots: vec![base.clone()],
        write_roots: vec![base.clone()],
        ..Sandbox::default()
    };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    let v = h
        .eval(&Source::new(
            "t.rms",
            "write_text(\"copy.txt\", read_text(\"note.txt\")); read_text(\"copy.txt\")",
        ))
        .unwrap();
    assert_eq!(v.into_string().unwrap(), "from the base dir");
    assert!(base.join("copy.txt").exists());
    // A relative path names a file in the base dir; the working directory's are outside.
    check_err(&mut h, "read_text(\"Cargo.toml\")", ErrorKind::Io, "Cargo.toml: No such file");
    check_err(
        &mut h,
        "read_text(\"../../../Cargo.toml\")",
        ErrorKind::Limit,
        "reading `../../../Cargo.toml` is not allowed",
    );
}

/// A path ending in `/`, `/.` or `/..` names a folder: `save("ckpt/")` wrote a file `ckpt`, and
/// `read_text("note.txt/")` read `note.txt` (the resolver took the path's last component, which
/// drops a trailing `/` and `.`).
#[test]
fn a_path_ending_in_a_slash_names_a_folder_not_a_file() {
    let base = crate::common::ScratchDir::new("sandbox-slash");
    std::fs::write(base.join("note.txt"), "a note").unwrap();
    let sandbox = Sandbox {
        base_dir: base.to_path_buf(),
        read_roots: vec![base.to_path_buf()],
        write_roots: vec![base.to_path_buf()],
        ..Sandbox::default()
    };
    let mut h = Host::new(HostOptions { sandbox, ..HostOptions::default() });
    let folder = "not a file name (a path ending in `/`, `.` or `..` names a folder)";
    for (code, path) in [
        ("write_text(\"ckpt/\", \"x\")", "ckpt/"),
        ("write_text(\"ckpt/.\", \"x\")", "ckpt/."),
        ("read_text(\"note.txt/\")", "note.txt/"),
        ("read_text(\"note.txt/.\")", "note.txt/."),
        ("csv(\"note.txt/\")", "note.txt/"),
        ("text(\"note.txt/\", #{ seq_len: 2 })", "note.txt/"),
    ] {
        check_err(&mut h, code, ErrorKind::Io, &format!("{path}: {folder}"));
    }
    assert!(!base.join("ckpt").exists(), "a file `ckpt` was written");
    // An existing folder's own spellings are folders, as before; a plain name is a file.
    check_err(
        &mut h,
        "write_text(\"./\", \"x\")",
        ErrorKind::Io,
        "it is a folder; give a file name",
    );
    ok(&mut h, "write_text(\"sub.txt\", read_text(\"./note.txt\"))");
    assert_eq!(std::fs::read_to_string(base.join("sub.txt")).unwrap(), "a note");
}

/// Values nested thousands deep (closures capturing closures, arrays in arrays, maps in maps)
/// overflowed the stack in rhai's recursive drop, clone, print and size check: a chain of three
/// million closures aborted the process, and `a = [a]` in a loop ran for minutes, copying and
/// size-checking the whole nesting at every step. Reading a value nested past 64 levels is
/// refused, at once.
#[test]
fn values_nested_past_the_limit_are_refused_when_read() {
    let mut h = host();
    let message = "nested more than 64 levels deep (arrays, maps or closures inside one another), \
                   past the nesting limit: keep the data flatter";
    for (code, at) in [
        ("let f = || 1;\nfor i in 0..3000000 { let g = f; f = || g; }", "t.rms:2:31: `f`"),
        ("let a = [];\nfor i in 0..3000000 { a = [a]; }", "t.rms:2:28: `a`"),
        ("let m = #{};\nfor i in 0..3000000 { m = #{ x: m }; }", "t.rms:2:33: `m`"),
        ("let a = [];\nfor i in 0..3000000 { let g = a; a = [|| g]; }", "t.rms:2:31: `a`"),
        ("let a = [];\nfor i in 0..3000000 { let b = []; b.push(a); a = b; }", "t.rms:2:50: `b`"),
        ("let a = [[]];\nfor i in 0..3000000 { a[0] = [a[0]]; }", "t.rms:2:31: `a`"),
    ] {
        check_err(&mut h, code, ErrorKind::Limit, at);
        check_err(&mut h, code, ErrorKind::Limit, message);
    }
    // Nesting among thousands of scalars is seen: the walk passes over scalars, it does not
    // stop at them.
    let code = "let a = [];\na.pad(4000, 0);\nfor i in 0..3000 { a.push([a.pop()]); }";
    check_err(&mut h, code, ErrorKind::Limit, message);
    // 64 levels are read, printed and compared as before.
    let mut h = host();
    ok(
        &mut h,
        "let a = 1; for i in 0..64 { a = [a]; }\nlet b = a; print(b); if a != b { throw 1 }",
    );
    ok(&mut h, "let f = || 1; for i in 0..63 { let g = f; f = || g; }\nlet h = f;");
}

/// A host calls rumus on its own thread, whose stack may be small: deep nesting is refused
/// before any walk of it could overflow a 2 MiB stack.
#[test]
fn deep_nesting_is_refused_on_a_hosts_small_stack() {
    let errors = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let mut h = host();
            [
                "let f = || 1;\nfor i in 0..3000000 { let g = f; f = || g; }\nf = ();",
                "let a = [];\nfor i in 0..3000000 { a = [a]; }\nprint(a);",
            ]
            .map(|code| h.eval(&Source::new("t.rms", code)).unwrap_err().to_string())
        })
        .unwrap()
        .join()
        .unwrap();
    for e in errors {
        assert!(e.contains("nested more than 64 levels deep"), "{e}");
    }
}
