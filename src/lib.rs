//! rumus: an embeddable machine-learning engine.

pub mod error;
pub mod tensor;

pub use error::{Error, ErrorKind, Result, Source, Span};
pub use tensor::{DType, Tensor, TensorData};
