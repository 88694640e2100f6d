//! rumus: an embeddable machine-learning engine.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod codegen;
pub mod cpu;
pub mod data;
pub mod dsl;
pub mod engine;
pub mod error;
pub mod files;
pub mod graph;
pub mod memory;
pub mod nn;
pub mod num;
pub mod plan;
pub mod repl;
pub mod rng;
pub mod runtime;
pub mod script;
pub mod session;
pub mod source;
pub mod tensor;

pub use engine::Engine;
pub use error::{Error, ErrorKind, Result, Source, Span};
pub use tensor::{DType, Tensor, TensorData};
