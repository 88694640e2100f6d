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
pub mod parse;
pub mod rms;

pub use parse::{parse, parse_text};
