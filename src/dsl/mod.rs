//! The model language: text → spanned AST → resolved program → graph.
//!
//! - [`parse`] turns text into an [`ast::Program`] (pest, `grammar/rumus.pest`);
//! - [`resolve`] checks names, arities, recursion and initializers without running anything;
//! - [`lower`] instantiates a model with hyperparameters and input dimensions into a graph,
//!   checking shapes; every node keeps the span of the expression it came from.
//!
//! Model blocks may sit inside `.rms` scripts; [`rms::split`] separates them from the script
//! text without moving anything, so positions stay right in both.

pub mod ast;
pub mod cli;
pub mod parse;
pub mod rms;

pub use parse::{parse, parse_text};
pub mod lower;
pub mod ops;
pub mod resolve;

pub use cli::cli_graph;
pub use lower::{lower, Value};
pub use resolve::{resolve, Module};

use crate::error::{Result, Source};
use std::sync::Arc;

/// Parse and resolve a standalone model file.
pub fn load(src: &Arc<Source>) -> Result<Module> {
    resolve(parse(src)?, src)
}

/// Parse and resolve the model blocks of a `.rms` script (the script text is ignored here; see
/// [`rms::split`]). Errors point into the whole file.
pub fn load_rms(src: &Arc<Source>) -> Result<Module> {
    let split = rms::split(&src.text);
    let program = parse_text(&split.model_text).map_err(|e| e.in_source(src))?;
    resolve(program, src)
}
