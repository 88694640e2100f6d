//! `rumus::Engine`: rumus inside a host application.
//!
//! The host evaluates `.rms` code (rhai with model blocks) in one persistent sandboxed session,
//! registers its own functions with the script engine, and takes compiled models out of script
//! variables to feed them `&[f32]` and read their outputs directly from Rust.
//!
//! An [`Engine`] and the [`Compiled`] handles it gives out are `Send`: a worker thread or a
//! server can own them (`examples/worker.rs`). So host functions registered through
//! [`Engine::script_engine`] must be `Send + Sync`, and the print sink `Send`.
//!
//! ```no_run
//! let mut engine = rumus::Engine::new();
//! engine.run(r#"
//!     model lin(x: f32[B, 2]) { return linear(x, 1) }
//!     let net = lin().compile(#{ batch: 4, loss: "mse", optimizer: sgd(#{ lr: 0.1 }) });
//! "#)?;
//! let net = engine.compiled("net")?;
//! let y = net.predict(&[1.0, 2.0], &[1, 2])?;
//! # Ok::<(), rumus::Error>(())
//! ```

use crate::error::{Result, Source};
pub use crate::script::api::model::TrainerGuard;
use crate::script::{
    load_checkpoint, save_checkpoint, ExitRequest, Host, HostOptions, Interrupt, Sandbox,
    ScriptTrainer,
};
use crate::tensor::Tensor;
use crate::{err, Error};
use std::path::Path;

/// An embedded rumus session.
pub struct Engine {
    host: Host,
    n_evals: usize,
}

/// A compiled model held by a script variable, driven from Rust. It shares the model with the
/// script: a step taken here is seen there and the other way round. Clones share it too, also
/// across threads: each call locks the model for its duration.
#[derive(Clone)]
pub struct Compiled {
    trainer: ScriptTrainer,
}

impl Default for Engine {
    fn default() -> Engine {
        Engine::new()
    }
}

impl Engine {
    /// A session with the bounded sandbox ([`Sandbox::bounded`]: reads and writes below the
    /// working directory; each evaluation stops with a `Limit` error after
    /// [`BOUNDED_OPERATIONS`](crate::script::engine::BOUNDED_OPERATIONS) operations or
    /// [`BOUNDED_TIMEOUT`](crate::script::engine::BOUNDED_TIMEOUT), so `loop {}` cannot hang
    /// the host). Widen it with [`Engine::with_options`].
    pub fn new() -> Engine {
        Engine::with_options(HostOptions { sandbox: Sandbox::bounded(), ..HostOptions::default() })
    }

    /// A session with the given sandbox, device and seed.
    pub fn with_options(opts: HostOptions) -> Engine {
        Engine { host: Host::new(opts), n_evals: 0 }
    }

    /// Evaluate `.rms` code; returns the value of its last statement.
    pub fn eval(&mut self, code: &str) -> Result<rhai::Dynamic> {
        self.n_evals += 1;
        let source = Source::new(format!("<eval:{}>", self.n_evals), code);
        self.host.eval(&source)
    }

    /// Run `.rms` code for its effects (models, variables and functions it defines stay).
    pub fn run(&mut self, code: &str) -> Result<()> {
        self.eval(code).map(drop)
    }

    /// Evaluate a `.rms` file (the host may read any file it names; the script inside is
    /// sandboxed as usual).
    pub fn eval_file(&mut self, path: impl AsRef<Path>) -> Result<rhai::Dynamic> {
        self.host.eval_file(path.as_ref())
    }

    /// The flag that stops the running evaluation at its next operation (with an `Interrupted`
    /// error); clone it to another thread, or to a signal handler.
    pub fn interrupt(&self) -> Interrupt {
        self.host.interrupt().clone()
    }

    /// What the last evaluation asked for with `exit(..)`, if it called it (`exit` ends the
    /// evaluation successfully; the host decides what it means).
    pub fn exit_request(&self) -> Option<ExitRequest> {
        self.host.exit_request()
    }

    /// The script engine, to register host functions and types.
    pub fn script_engine(&mut self) -> &mut rhai::Engine {
        self.host.engine_mut()
    }

    /// The persistent script session.
    pub fn host(&mut self) -> &mut Host {
        &mut self.host
    }

    /// Send the scripts' `print` output to `sink` (stdout by default).
    pub fn on_print(&mut self, sink: impl FnMut(&str) + Send + 'static) {
        self.host.on_print(sink);
    }

    /// The compiled model in script variable `name`.
    pub fn compiled(&self, name: &str) -> Result<Compiled> {
        let v = self.host.get(name).ok_or_else(|| err!(Name, "no script variable `{name}`"))?;
        let type_name = crate::script::api::type_name(&v);
        v.try_cast::<ScriptTrainer>().map(|trainer| Compiled { trainer }).ok_or_else(|| {
            err!(
                Name,
                "`{name}` is a {type_name}, not a compiled model (call .compile(..) on a model)"
            )
        })
    }
}

impl Compiled {
    /// One training step on a batch: `x` (row-major, `x_shape`) for the model's first input
    /// and `target` for the loss. Returns the loss.
    pub fn train_step(&self, x: &[f32], x_shape: &[usize], target: &Tensor) -> Result<f32> {
        let x = Tensor::f32(x_shape, x.to_vec())?;
        let input = self.first_input()?;
        self.trainer
            .lock()?
            .train_step(&[(input.as_str(), &x), (crate::session::TARGET_INPUT, target)])
    }

    /// The model's loss output (or first output) for `x` (row-major, `x_shape`), any batch size.
    pub fn predict(&self, x: &[f32], x_shape: &[usize]) -> Result<Tensor> {
        let x = Tensor::f32(x_shape, x.to_vec())?;
        let input = self.first_input()?;
        let out = self.predict_named(&[(input.as_str(), &x)])?;
        out.into_iter()
            .find(|(n, _)| *n == self.trainer.output)
            .map(|(_, t)| t)
            .ok_or_else(|| err!(Name, "the model has no output `{}`", self.trainer.output))
    }

    /// Every output for named inputs.
    pub fn predict_named(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.trainer.lock()?.predict(inputs)
    }

    /// Save parameters, optimizer state and step count (atomically, safetensors).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_checkpoint(&*self.trainer.lock()?, path.as_ref())
    }

    /// Load a checkpoint written by [`Compiled::save`]: every parameter must be in it (see
    /// [`Trainer::load_checkpoint`](crate::session::Trainer::load_checkpoint)).
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        load_checkpoint(&mut *self.trainer.lock()?, path.as_ref(), true, None).map(drop)
    }

    /// The underlying trainer (parameters by name, plan report, step count), locked until the
    /// guard is dropped. While this thread holds it, script code and other calls on this
    /// thread that use the same model are errors (they would wait for the guard forever);
    /// other threads wait for it.
    pub fn trainer(&self) -> Result<TrainerGuard<'_>> {
        self.trainer.lock()
    }

    fn first_input(&self) -> Result<String> {
        self.trainer
            .inputs
            .first()
            .cloned()
            .ok_or_else(|| Error::new(crate::ErrorKind::Name, "the model has no inputs"))
    }
}
