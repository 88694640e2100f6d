//! Scripting: the sandboxed rhai engine that drives everything around the graph (data, models,
//! training loops, evaluation, checkpoints), shared by the script runner, the REPL and
//! `rumus::Engine`.
//!
//! - [`engine`]: the sandbox (limits, file policy, memory budget, interrupt flag);
//! - [`api`]: every type and function scripts see, registered per type in one place;
//! - [`rms`]: `.rms` sources (rhai with model blocks) split, with positions kept;
//! - [`convert`]: errors across the rhai boundary, positioned in the file they came from;
//! - [`calls`]: a guard on calls too wide for rhai's call resolution.
//!
//! A [`Host`] is one persistent script session: one rhai `Scope` plus the functions of every
//! earlier evaluation, so a REPL line or a host call sees what came before.

pub mod api;
pub mod calls;
pub mod convert;
pub mod engine;
pub mod rms;
pub mod runner;
pub mod signal;

pub use engine::{Interrupt, Sandbox};
pub use rhai;

use crate::error::{Result, Source};
use rhai::{Dynamic, Scope, AST};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// How a [`Host`] is set up.
#[derive(Clone, Debug)]
pub struct HostOptions {
    pub sandbox: Sandbox,
    /// `auto`, `gpu` or `cpu`: the default device of `compile`.
    pub device: String,
    /// The default seed of `compile`, shuffling and random tensors.
    pub seed: u64,
}

impl Default for HostOptions {
    fn default() -> HostOptions {
        HostOptions {
            sandbox: Sandbox::default(),
            device: std::env::var("RUMUS_DEVICE").unwrap_or_else(|_| "auto".into()),
            seed: 0,
        }
    }
}

/// Something that happened while a script ran, for progress bars and metrics logs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A training step finished: the trainer's step count after it, and its loss.
    Step { step: u64, loss: f32 },
    /// A script called `log_metric(name, value)`.
    Metric { step: u64, name: String, value: f64 },
}

/// Where a script's `print` output and events go.
pub type PrintSink = Box<dyn FnMut(&str)>;
/// Receives [`Event`]s.
pub type EventSink = Box<dyn FnMut(&Event)>;

/// What the bindings share: the sandbox, defaults, output sinks and defined models.
pub struct Ctx {
    pub sandbox: Sandbox,
    pub device: RefCell<String>,
    pub seed: Cell<u64>,
    /// The step count of the last trainer that stepped (for `log_metric`).
    pub last_step: Cell<u64>,
    print: RefCell<PrintSink>,
    events: RefCell<Option<EventSink>>,
    pub models: RefCell<rms::Models>,
}

impl Ctx {
    /// Send text to the print sink.
    pub fn print(&self, s: &str) {
        if let Ok(mut p) = self.print.try_borrow_mut() {
            p(s)
        }
    }

    /// Report an event to the event sink, if any.
    pub fn emit(&self, e: Event) {
        if let Ok(mut sink) = self.events.try_borrow_mut() {
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
    sources: HashMap<String, Arc<Source>>,
    ctx: Rc<Ctx>,
    interrupt: Interrupt,
}

impl Host {
    pub fn new(opts: HostOptions) -> Host {
        let interrupt = Interrupt::new();
        let ctx = Rc::new(Ctx {
            sandbox: opts.sandbox,
            device: RefCell::new(opts.device),
            seed: Cell::new(opts.seed),
            last_step: Cell::new(0),
            print: RefCell::new(Box::new(|s| println!("{s}"))),
            events: RefCell::new(None),
            models: RefCell::new(rms::Models::default()),
        });
        let mut engine = engine::sandboxed(&ctx.sandbox, &interrupt);
        let c = ctx.clone();
        engine.on_print(move |s| c.print(s));
        let c = ctx.clone();
        engine.on_debug(move |s, _, _| c.print(s));
        api::register(&mut engine, &ctx);
        Host {
            engine,
            scope: Scope::new(),
            functions: AST::empty(),
            sources: HashMap::new(),
            ctx,
            interrupt,
        }
    }

    /// Send `print` output to `sink` instead of stdout.
    pub fn on_print(&mut self, sink: impl FnMut(&str) + 'static) {
        *self.ctx.print.borrow_mut() = Box::new(sink);
    }

    /// Receive training steps and metrics.
    pub fn on_event(&mut self, sink: impl FnMut(&Event) + 'static) {
        *self.ctx.events.borrow_mut() = Some(Box::new(sink));
    }

    /// The flag that stops a running evaluation (Ctrl-C sets it).
    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    /// The shared context the bindings see.
    pub fn ctx(&self) -> &Rc<Ctx> {
        &self.ctx
    }

    /// The rhai engine, to register host functions.
    pub fn engine_mut(&mut self) -> &mut rhai::Engine {
        &mut self.engine
    }

    /// Evaluate a `.rms` source (rhai with model blocks) in this session; returns the value of
    /// its last statement. Models, functions and variables it defines stay for later calls, also
    /// when it fails part-way.
    pub fn eval(&mut self, source: &Arc<Source>) -> Result<Dynamic> {
        self.interrupt.reset();
        self.sources.insert(source.name.clone(), source.clone());
        let script_text = rms::define_models(source, &mut self.engine, &self.ctx)?;
        calls::check_width(&script_text).map_err(|e| e.in_source(source))?;
        let mut ast = self
            .engine
            .compile_with_scope(&self.scope, &script_text)
            .map_err(|e| self.convert(e.into(), source))?;
        ast.set_source(source.name.as_str());
        let run = self.functions.merge(&ast);
        let result = self.engine.eval_ast_with_scope::<Dynamic>(&mut self.scope, &run);
        self.functions = self.functions.merge(&ast.clone_functions_only());
        result.map_err(|e| self.convert(*e, source))
    }

    /// Evaluate a file (must be readable by the sandbox; its folder becomes readable).
    pub fn eval_file(&mut self, path: &std::path::Path) -> Result<Dynamic> {
        let source = rms::read_source(path)?;
        self.eval(&source)
    }

    /// Call a script function (defined by an earlier evaluation) by name.
    pub fn call(&mut self, name: &str, args: impl rhai::FuncArgs) -> Result<Dynamic> {
        self.interrupt.reset();
        let source = Source::new(format!("<call {name}>"), String::new());
        let r = self.engine.call_fn::<Dynamic>(&mut self.scope, &self.functions, name, args);
        r.map_err(|e| self.convert(*e, &source))
    }

    /// Names of variables, script functions and defined models, for completion.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.scope.iter().map(|(n, _, _)| n.to_string()).collect();
        names.extend(self.functions.iter_functions().map(|f| f.name.to_string()));
        names.extend(self.ctx.models.borrow().names());
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

    fn convert(&self, e: rhai::EvalAltResult, source: &Arc<Source>) -> crate::Error {
        convert::from_rhai(e, source, &self.sources, self.ctx.sandbox.max_operations)
    }
}
