//! rumus: an embeddable machine-learning engine.
//!
//! Models are written in a small declarative model language, training is driven from
//! [rhai](https://rhai.rs) scripts (`.rms` files: rhai with model blocks), and rumus compiles
//! the whole training step (forward, loss, backward, optimizer update) into one static plan of
//! fused WGSL kernels run on wgpu. Without a GPU the same plan runs on a deterministic CPU
//! reference backend.
//!
//! The public API:
//!
//! - [`Engine`] runs `.rms` code inside a host application and hands out the models it
//!   compiles ([`engine::Compiled`]) to be trained and queried from Rust;
//! - [`session`] compiles a graph for a device ([`session::Model`]) and trains it
//!   ([`session::Trainer`]);
//! - [`graph`] builds graphs directly, without the model language;
//! - [`Tensor`] holds host data, [`Error`] is every fallible call's error;
//! - [`script`], [`repl`] and [`cli`] are the script host, the interactive session and the
//!   `rumus` command line.
//!
//! # Example
//!
//! Define a model in the model language, compile it on the CPU and take one training step:
//!
//! ```
//! use rumus::script::HostOptions;
//! use rumus::{Engine, Tensor};
//!
//! let mut engine =
//!     Engine::with_options(HostOptions { device: "cpu".into(), ..HostOptions::default() });
//! engine.run(
//!     r#"
//!     model regressor(x: f32[B, 2]) {
//!         return linear(x, 1) as fc
//!     }
//!     let net = regressor().compile(#{
//!         batch: 2, loss: "mse", optimizer: sgd(#{ lr: 0.1 }), device: "cpu", seed: 1,
//!     });
//!     "#,
//! )?;
//! let net = engine.compiled("net")?;
//! // Two rows of two features (row-major) and their targets.
//! let target = Tensor::f32(&[2, 1], vec![1.0, 0.0])?;
//! let loss = net.train_step(&[0.0, 1.0, 1.0, 0.0], &[2, 2], &target)?;
//! assert!(loss.is_finite());
//! assert_eq!(net.trainer()?.step(), 1);
//! # Ok::<(), rumus::Error>(())
//! ```

#![warn(missing_docs)]

pub mod cli;
pub mod dist;
pub mod engine;
pub mod error;
pub mod graph;
pub mod repl;
pub mod script;
pub mod session;
pub mod tensor;

/// Internal modules: public only for the integration tests (tests/it) and the fuzz driver
/// (examples/fuzz); hidden from the documentation and not part of the API.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc(hidden)]
            #[allow(missing_docs)]
            pub mod $name;
        )*
    };
}

internal!(
    backend, checkpoint, codegen, cpu, data, dsl, files, memory, nn, num, plan, plot, rng, runtime,
    source,
);

pub use engine::Engine;
pub use error::{Error, ErrorKind, Result, Source, Span};
pub use tensor::{DType, Tensor, TensorData};
