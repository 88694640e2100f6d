//! rumus: an embeddable machine-learning engine.

pub mod error;

pub use error::{Error, ErrorKind, Result, Source, Span};
