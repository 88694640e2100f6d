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

/// While the host holds `Compiled::trainer()`'s guard, using the same model again on that
/// thread (from script code or through the handle) is an error saying what to do, where it
/// used to wait for the guard forever; once the guard is dropped everything works, and another
/// thread that wants the model waits for the guard instead of failing.
#[test]
fn a_host_holding_the_trainer_gets_an_error_not_a_hang() {
    let (mut engine, net) = cpu_net(1);
    let said = "this model is already in use on this thread (a guard from `Compiled::trainer()` is alive): drop it before using the model again";
    let guard = net.trainer().unwrap();
    assert_eq!(guard.step(), 0);
    for code in ["net.step", "net.plan()", "net.predict(#{ x: tensor([[1.0, 2.0]]) })"] {
        let e = engine.eval(code).unwrap_err();
        assert!(e.message.contains(said), "`{code}`: {}", e.message);
    }
    assert_eq!(net.trainer().unwrap_err().message, said);
    assert_eq!(net.predict(&[1.0, 2.0], &[1, 2]).unwrap_err().message, said);
    drop(guard);
    assert_eq!(engine.eval("net.step").unwrap().as_int().unwrap(), 0);

    // Another thread holds it: this one waits, then goes on.
    let (locked, go) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    std::thread::scope(|s| {
        let net = &net;
        s.spawn(move || {
            let g = net.trainer().unwrap();
            locked.0.send(()).unwrap();
            go.1.recv().unwrap();
            drop(g);
        });
        locked.1.recv().unwrap();
        go.0.send(()).unwrap();
        assert_eq!(net.trainer().unwrap().step(), 0);
    });
}

/// A host's feeds give each input once: the same name twice, or an input the optimizer feeds
/// itself (`optim.lr`), is an error that names the input and says what to do, from the Rust API
/// and from a script alike. Before, the GPU backend wrote both and took the last without a word
/// (for `optim.lr`, the optimizer's own value, written after the host's), and the CPU
/// interpreter refused the second with "input `x` is fed twice", of kind `Shape`, saying
/// nothing of what to do. A refused step changes neither the step count nor a parameter.
#[test]
fn a_host_feeding_an_input_twice_gets_an_error_naming_it() {
    use rumus::{ErrorKind, Tensor};
    let (mut engine, net) = cpu_net(2);
    let x = Tensor::f32(&[2, 2], vec![0.0, 1.0, 1.0, 0.0]).unwrap();
    let other = Tensor::f32(&[2, 2], vec![5.0, 6.0, 7.0, 8.0]).unwrap();
    let y = Tensor::i32(&[2], vec![1, 0]).unwrap();
    let lr = Tensor::scalar(100.0);
    let twice = "input `x` is given twice: give each input one tensor";
    let drivers = "input `optim.lr` is the optimizer's own, fed by rumus at every step: leave it \
                   out of the feeds";
    let mut tr = net.trainer().unwrap();
    let before = tr.parameters().unwrap();
    let e = tr.train_step(&[("x", &x), ("target", &y), ("x", &other)]).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InvalidArgument, twice));
    let e = tr.train_step(&[("x", &x), ("target", &y), ("optim.lr", &lr)]).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InvalidArgument, drivers));
    let e = tr.predict(&[("x", &x), ("x", &other)]).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InvalidArgument, twice));
    assert_eq!(tr.step(), 0);
    assert_eq!(tr.parameters().unwrap(), before);
    drop(tr);
    let e = net.predict_named(&[("x", &x), ("x", &x)]).unwrap_err();
    assert_eq!(e.message, twice);
    let code = r#"net.train_step(#{ x: tensor([[0.0, 1.0], [1.0, 0.0]]),
                                   target: tensor([1, 0], "i32"),
                                   "optim.lr": tensor([100.0]) })"#;
    let e = engine.eval(code).unwrap_err();
    assert!(e.message.contains(drivers), "{}", e.message);
    // Each once, the same step goes through.
    let loss = net.trainer().unwrap().train_step(&[("x", &x), ("target", &y)]).unwrap();
    assert!(loss.is_finite() && net.trainer().unwrap().step() == 1, "{loss}");
}

/// A host's list of named values to load gives each name once: `Trainer::load_state` and
/// `Trainer::load_checkpoint` given one twice are errors naming it, and nothing is written.
/// Before, both values were written, the last one kept without a word (and a name the model
/// does not have, given twice, was reported twice).
#[test]
fn a_host_loading_a_value_twice_gets_an_error_naming_it() {
    use rumus::{ErrorKind, Tensor};
    let (_engine, net) = cpu_net(2);
    let mut tr = net.trainer().unwrap();
    let before = tr.parameters().unwrap();
    let names: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["fc.weight", "fc.bias"]);
    let ones = Tensor::f32(&[2, 2], vec![1.0; 4]).unwrap();
    let twos = Tensor::f32(&[2, 2], vec![2.0; 4]).unwrap();
    let bias = Tensor::f32(&[2], vec![0.0; 2]).unwrap();
    let twice = "tensor `fc.weight` is given twice: give each value once";
    let e = tr.load_state(&[("fc.weight", &ones), ("fc.weight", &twos)]).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Checkpoint, twice));
    let all = [("fc.weight", &ones), ("fc.bias", &bias), ("fc.weight", &twos)];
    let e = tr.load_checkpoint(&all, true).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Checkpoint, twice));
    let e = tr.load_checkpoint(&[("extra", &ones), ("extra", &ones)], false).unwrap_err();
    assert_eq!(e.message, "tensor `extra` is given twice: give each value once");
    assert_eq!(tr.parameters().unwrap(), before);
    // Each once, the values are loaded.
    tr.load_state(&[("fc.weight", &twos)]).unwrap();
    assert_eq!(tr.parameter("fc.weight").unwrap(), twos);
}

/// An engine on the CPU whose script compiled `net`, a linear layer from 2 inputs to
/// `outputs`, and the host's handle to it.
fn cpu_net(outputs: usize) -> (rumus::Engine, rumus::engine::Compiled) {
    use rumus::script::HostOptions;
    let mut engine =
        rumus::Engine::with_options(HostOptions { device: "cpu".into(), ..HostOptions::default() });
    engine
        .run(&format!(
            "model m(x: f32[B, 2]) {{ return linear(x, {outputs}) as fc }}
             let net = m().compile(#{{ batch: 2, optimizer: sgd(#{{ lr: 0.1 }}) }});"
        ))
        .unwrap();
    let net = engine.compiled("net").unwrap();
    (engine, net)
}
