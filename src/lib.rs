//! rumus: an embeddable machine-learning engine.

pub mod checkpoint;
pub mod codegen;
pub mod cpu;
pub mod data;
pub mod dsl;
pub mod error;
pub mod graph;
pub mod nn;
pub mod plan;
pub mod rng;
pub mod runtime;
pub mod session;
pub mod tensor;

pub use error::{Error, ErrorKind, Result, Source, Span};
pub use tensor::{DType, Tensor, TensorData};
