//! Scripting: the sandboxed rhai engine that drives everything around the graph (data, models,
//! training loops, evaluation, checkpoints), shared by the script runner, the REPL and
//! `rumus::Engine`.
//!
//! - [`engine`]: the sandbox (limits, file policy, memory budget size, interrupt flag);
//! - `api`: every type and function scripts see, registered per type in one place;
//! - [`rms`]: `.rms` sources (rhai with model blocks) split, with positions kept;
//! - [`convert`]: errors across the rhai boundary, positioned in the file they came from;
//! - [`calls`]: a guard on calls too wide for rhai's call resolution;
//! - [`nesting`]: a bound on how deeply values nest, so that rhai's recursive walks of them fit
//!   the stack.
//!
//! A [`Host`] is one persistent script session: one rhai `Scope` plus the functions of every
//! earlier evaluation, so a REPL line or a host call sees what came before. A `Host` is `Send`
//! (rhai's `sync` feature; shared state behind `Arc` and `Mutex`), so a host application can
//! move it to a worker thread.

pub(crate) mod api;
pub mod calls;
pub mod convert;
pub mod engine;
pub mod nesting;
pub mod rms;
pub mod runner;
pub mod signal;

pub use api::model::{
    load as load_checkpoint, save as save_checkpoint, HeldTrainer, ScriptTrainer,
};
pub use engine::{Deadline, Interrupt, Sandbox};
pub use rhai;

use crate::dist::Communicator;
use crate::error::{Error, Result, Source};
use crate::memory::Budget;
use crate::session::MatmulPrecision;
use rhai::{Dynamic, Scope, AST};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

/// How a [`Host`] is set up.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// What the scripts may do (files, limits, memory).
    pub sandbox: Sandbox,
    /// `auto`, `gpu` or `cpu`: the default device of `compile`.
    pub device: String,
    /// The default seed of `compile`, shuffling and random tensors.
    pub seed: u64,
    /// The default `matmul_precision` of `compile` (`None`: the device's default).
    pub matmul_precision: Option<MatmulPrecision>,
    /// The ranks of a data-parallel job this session is one of ([`crate::dist::single`]: none).
    pub comm: Arc<dyn Communicator>,
}

impl Default for HostOptions {
    fn default() -> HostOptions {
        HostOptions {
            sandbox: Sandbox::default(),
            device: std::env::var("RUMUS_DEVICE").unwrap_or_else(|_| "auto".into()),
            seed: 0,
            matmul_precision: None,
            comm: crate::dist::single(),
        }
    }
}

/// Something that happened while a script ran, for progress bars and metrics logs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A training step finished: the trainer's step count after it, and its loss.
    Step {
        /// The trainer's step count after the step.
        step: u64,
        /// The step's loss.
        loss: f32,
        /// The learning rate the step used.
        lr: f32,
        /// The epoch the script last declared with `epoch(n)`, if any.
        epoch: Option<u64>,
    },
    /// A script called `log_metric(name, value)`.
    Metric {
        /// The step count of the last trainer that stepped.
        step: u64,
        /// The metric's name.
        name: String,
        /// Its value.
        value: f64,
        /// The epoch the script last declared with `epoch(n)`, if any.
        epoch: Option<u64>,
    },
    /// A script declared how long it trains: `progress(#{ steps })` or `progress(#{ epochs })`.
    Total(Total),
    /// A script called `epoch(n)`: epoch `n` (counted from 0) starts.
    Epoch(u64),
}

/// How long a script says it trains, for a progress bar with an estimate of the time left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Total {
    /// This many training steps in all.
    Steps(u64),
    /// This many epochs in all (the script calls `epoch(n)` as each starts).
    Epochs(u64),
}

/// Where a script's `print` output and events go (`Send`: the session may move to another
/// thread).
pub type PrintSink = Box<dyn FnMut(&str) + Send>;
/// Receives [`Event`]s.
pub type EventSink = Box<dyn FnMut(&Event) + Send>;

/// What the bindings share: the sandbox, the memory budget, defaults, output sinks, and how
/// the evaluation ended (an output error, an `exit(n)`). The bindings hold it through an `Arc`;
/// its mutable parts are atomics and mutexes, each locked only for the moment it is read or
/// written, never across a call into rhai or a host sink's re-entry.
pub struct Ctx {
    /// What the scripts may do.
    pub sandbox: Sandbox,
    /// What everything this session owns is charged to (sized by `sandbox.memory_budget`).
    pub budget: Budget,
    /// The default device of `compile` (`auto`, `gpu` or `cpu`).
    pub device: Mutex<String>,
    /// The default seed of `compile`, shuffling and random tensors.
    pub seed: AtomicU64,
    /// The default `matmul_precision` of `compile` (`None`: the device's default).
    pub matmul_precision: Option<MatmulPrecision>,
    /// The ranks of the data-parallel job this session is one of.
    pub comm: Arc<dyn Communicator>,
    /// The step count of the last trainer that stepped (for `log_metric`).
    pub last_step: AtomicU64,
    /// The epoch the script last declared with `epoch(n)` (for metrics and progress).
    pub epoch: Mutex<Option<u64>>,
    /// Where `print` goes; `None`: standard output.
    print: Mutex<Option<PrintSink>>,
    events: Mutex<Option<EventSink>>,
    /// The first output that could not be written (a full disk): it stops the script and is
    /// what the evaluation returns.
    output_error: Mutex<Option<Error>>,
    /// What the running (or last) evaluation asked for with `exit`.
    exit: Mutex<Option<ExitRequest>>,
    interrupt: Interrupt,
}

/// Lock `m`, also after a panic elsewhere left it poisoned (what it guards is plain data that
/// stays valid: a sink, a setting, a trainer between steps).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ctx {
    /// Send text to the print sink (standard output unless a host set one); in a data-parallel
    /// job, only rank 0's.
    pub fn print(&self, s: &str) {
        if self.comm.rank() != 0 {
            return;
        }
        // `try_lock`: a sink that prints (re-entry) is dropped, not deadlocked.
        let Ok(mut p) = self.print.try_lock() else { return };
        match p.as_mut() {
            Some(sink) => sink(s),
            None => {
                let mut out = std::io::stdout().lock();
                if let Err(e) = writeln!(out, "{s}").and_then(|()| out.flush()) {
                    self.fail_output(Error::io("standard output", e));
                }
            }
        }
    }

    /// Stop the running script because its output could not be written: the evaluation ends
    /// with `e` (the first such error), not with the interruption it causes.
    pub fn fail_output(&self, e: Error) {
        lock(&self.output_error).get_or_insert(e);
        self.interrupt.trigger();
    }

    /// For a native call that loops (evaluate's batches): an `Interrupted` error once Ctrl-C
    /// (or a host's [`Interrupt::trigger`]) asked the script to stop, as the script itself
    /// stops at its next operation.
    pub fn check_interrupt(&self) -> convert::ScriptResult<()> {
        match self.interrupt.is_set() {
            true => Err(Box::new(rhai::EvalAltResult::ErrorTerminated(
                engine::INTERRUPTED.into(),
                rhai::Position::NONE,
            ))),
            false => Ok(()),
        }
    }

    /// Report an event to the event sink, if any.
    pub fn emit(&self, e: Event) {
        if let Ok(mut sink) = self.events.try_lock() {
            if let Some(sink) = sink.as_mut() {
                sink(&e)
            }
        }
    }
}

/// One persistent script session.
pub struct Host {
    engine: rhai::Engine,
    scope: Scope<'static>,
    /// Functions defined by every earlier evaluation.
    functions: AST,
    /// The source each script function was (last) defined in, by name: rhai reports an error
    /// inside a function with the function's name and a position in its body, but names the
    /// caller's source, so this is how the position finds its text.
    fn_sources: HashMap<String, Arc<Source>>,
    /// The model blocks defined so far.
    models: rms::Models,
    ctx: Arc<Ctx>,
    interrupt: Interrupt,
    deadline: Deadline,
}

/// What a script asked for with `exit`: a process exit code, or a message (printed to stderr;
/// the code is then 1, as in Python). Rhai's `exit` ends the evaluation as if it had run to the
/// end; the runner and the REPL turn the request into the process's exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitRequest {
    /// `exit()` (code 0) or `exit(code)`.
    Code(u8),
    /// `exit(message)`: print the message, exit with code 1.
    Message(String),
}

impl Host {
    /// A fresh session: the sandboxed engine with every binding registered, an empty scope.
    pub fn new(opts: HostOptions) -> Host {
        let interrupt = Interrupt::new();
        let deadline = Deadline::default();
        let ctx = Arc::new(Ctx {
            budget: Budget::new(opts.sandbox.memory_budget),
            sandbox: opts.sandbox,
            device: Mutex::new(opts.device),
            seed: AtomicU64::new(opts.seed),
            matmul_precision: opts.matmul_precision,
            comm: opts.comm,
            last_step: AtomicU64::new(0),
            epoch: Mutex::new(None),
            print: Mutex::new(None),
            events: Mutex::new(None),
            output_error: Mutex::new(None),
            exit: Mutex::new(None),
            interrupt: interrupt.clone(),
        });
        let mut engine = engine::sandboxed(&ctx.sandbox, &interrupt, &deadline);
        let c = ctx.clone();
        engine.on_print(move |s| c.print(s));
        let c = ctx.clone();
        engine.on_debug(move |s, _, _| c.print(s));
        api::register(&mut engine, &ctx);
        register_exit(&mut engine, &ctx);
        Host {
            engine,
            scope: Scope::new(),
            functions: AST::empty(),
            fn_sources: HashMap::new(),
            models: rms::Models::default(),
            ctx,
            interrupt,
            deadline,
        }
    }

    /// Send `print` output to `sink` instead of stdout.
    pub fn on_print(&mut self, sink: impl FnMut(&str) + Send + 'static) {
        *lock(&self.ctx.print) = Some(Box::new(sink));
    }

    /// Receive training steps and metrics.
    pub fn on_event(&mut self, sink: impl FnMut(&Event) + Send + 'static) {
        *lock(&self.ctx.events) = Some(Box::new(sink));
    }

    /// The flag that stops a running evaluation (Ctrl-C sets it).
    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    /// The shared context the bindings see.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The rhai engine, to register host functions.
    pub fn engine_mut(&mut self) -> &mut rhai::Engine {
        &mut self.engine
    }

    /// Evaluate a `.rms` source (rhai with model blocks) in this session; returns the value of
    /// its last statement. Models, functions and variables it defines stay for later calls, also
    /// when it fails part-way. Output that cannot be written (a full disk) stops the script with
    /// that error.
    pub fn eval(&mut self, source: &Arc<Source>) -> Result<Dynamic> {
        self.start();
        let result = self.eval_inner(source);
        self.finish(result)
    }

    /// An output error, when one stopped the script, in place of the evaluation's own result.
    /// Clears the interrupt flag: a Ctrl-C that stopped this evaluation is spent (a second
    /// press exits only while the flag is set, and its notice waits for it).
    fn finish(&self, result: Result<Dynamic>) -> Result<Dynamic> {
        self.interrupt.reset();
        match lock(&self.ctx.output_error).take() {
            Some(e) => Err(e),
            None => result,
        }
    }

    fn eval_inner(&mut self, source: &Arc<Source>) -> Result<Dynamic> {
        let script_text =
            rms::define_models(source, &mut self.engine, &mut self.models, &self.functions)?;
        calls::check_width(&script_text).map_err(|e| e.in_source(source))?;
        let mut ast = self
            .engine
            .compile_with_scope(&self.scope, &script_text)
            .map_err(|e| self.convert(e.into(), source))?;
        ast.set_source(source.name.as_str());
        rms::check_functions(source, &script_text, &ast, &self.models)?;
        for f in ast.iter_functions() {
            self.fn_sources.insert(f.name.to_string(), source.clone());
        }
        let run = self.functions.merge(&ast);
        let result = self.engine.eval_ast_with_scope::<Dynamic>(&mut self.scope, &run);
        self.deadline.stop();
        self.functions = self.functions.merge(&ast.clone_functions_only());
        result.map_err(|e| self.convert(*e, source))
    }

    /// Evaluate a file (must be readable by the sandbox; its folder becomes readable).
    pub fn eval_file(&mut self, path: &std::path::Path) -> Result<Dynamic> {
        self.eval(&crate::files::read_source(path)?)
    }

    /// Call a script function (defined by an earlier evaluation) by name.
    pub fn call(&mut self, name: &str, args: impl rhai::FuncArgs) -> Result<Dynamic> {
        self.start();
        let source = Source::new(format!("<call {name}>"), String::new());
        let r = self.engine.call_fn::<Dynamic>(&mut self.scope, &self.functions, name, args);
        self.deadline.stop();
        let result = r.map_err(|e| self.convert(*e, &source));
        self.finish(result)
    }

    /// Names of variables, script functions and defined models, for completion.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.scope.iter().map(|(n, _, _)| n.to_string()).collect();
        names.extend(self.functions.iter_functions().map(|f| f.name.to_string()));
        names.extend(self.models.names());
        names
    }

    /// The value of a variable of the session.
    pub fn get(&self, name: &str) -> Option<Dynamic> {
        self.scope.get_value::<Dynamic>(name)
    }

    /// Set (or add) a variable of the session.
    pub fn set(&mut self, name: &str, value: Dynamic) {
        self.scope.set_or_push(name.to_string(), value);
    }

    /// What the last evaluation asked for with `exit`, if it called it.
    pub fn exit_request(&self) -> Option<ExitRequest> {
        lock(&self.ctx.exit).clone()
    }

    /// Before an evaluation: clear the interrupt flag and the exit request, start the clock.
    fn start(&mut self) {
        self.interrupt.reset();
        lock(&self.ctx.exit).take();
        self.deadline.start(self.ctx.sandbox.timeout);
    }

    fn convert(&self, e: rhai::EvalAltResult, source: &Arc<Source>) -> crate::Error {
        convert::from_rhai(e, source, &self.fn_sources, &self.ctx.sandbox)
    }
}

/// `exit()`, `exit(code)` and `exit(message)`: record the request, then end the evaluation the
/// way rhai's own `exit` does.
fn register_exit(engine: &mut rhai::Engine, ctx: &Arc<Ctx>) {
    use rhai::EvalAltResult;
    let request = |ctx: &Ctx, v: Dynamic| {
        let r = if v.is_unit() {
            ExitRequest::Code(0)
        } else if let Ok(code) = v.as_int() {
            match u8::try_from(code) {
                Ok(c) => ExitRequest::Code(c),
                Err(_) => {
                    return Err(convert::script_err(format!(
                        "exit code must be between 0 and 255, got {code}"
                    )))
                }
            }
        } else if v.is_string() {
            ExitRequest::Message(v.to_string())
        } else {
            return Err(convert::script_err(format!(
                "exit takes an integer code (0 to 255) or a message, got {}",
                api::type_name(&v)
            )));
        };
        *lock(&ctx.exit) = Some(r);
        Err(Box::new(EvalAltResult::Exit(v, rhai::Position::NONE)))
    };
    let c = ctx.clone();
    engine.register_fn("exit", move |v: Dynamic| -> convert::ScriptResult<()> { request(&c, v) });
    let c = ctx.clone();
    engine.register_fn("exit", move || -> convert::ScriptResult<()> { request(&c, Dynamic::UNIT) });
}
