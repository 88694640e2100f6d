//! Errors across the rhai boundary, both ways: a rumus [`Error`] raised by a binding travels
//! through rhai inside the runtime error value, and comes back out (with the script position of
//! the call that raised it) as the same `Error`; rhai's own errors become `Script`, `Parse` or
//! `Limit` errors pointing at the script's line and column.

use super::engine::INTERRUPTED;
use crate::err;
use crate::error::{Error, ErrorKind, Source, Span};
use rhai::{EvalAltResult, Position};
use std::collections::HashMap;
use std::sync::Arc;

/// A rumus error wrapped so that it can ride through rhai as a runtime error value.
#[derive(Clone, Debug)]
pub struct Carried(pub Error);

/// What a fallible binding returns.
pub type ScriptResult<T> = Result<T, Box<EvalAltResult>>;

/// Wrap a rumus error as a rhai error (the position is filled in by rhai at the call site).
pub fn to_rhai(e: Error) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorRuntime(rhai::Dynamic::from(Carried(e)), Position::NONE))
}

/// `Result<T>` → `ScriptResult<T>`.
pub trait IntoScript<T> {
    fn script(self) -> ScriptResult<T>;
}

impl<T> IntoScript<T> for crate::Result<T> {
    fn script(self) -> ScriptResult<T> {
        self.map_err(to_rhai)
    }
}

/// A `Script` error with a message, as a rhai error.
pub fn script_err(msg: impl Into<String>) -> Box<EvalAltResult> {
    to_rhai(Error::new(ErrorKind::Script, msg))
}

/// Turn a rhai error into a rumus error positioned in the source it came from. `sources` maps
/// the source names that rhai reports for functions defined in earlier evaluations (REPL lines,
/// loaded files) to their text.
pub fn from_rhai(
    err: EvalAltResult,
    source: &Arc<Source>,
    sources: &HashMap<String, Arc<Source>>,
    max_operations: u64,
) -> Error {
    let mut source = source.clone();
    let mut err = err;
    // Descend to the innermost error: that is where the mistake is.
    while let EvalAltResult::ErrorInFunctionCall(_, src, inner, _)
    | EvalAltResult::ErrorInModule(src, inner, _) = err
    {
        if let Some(s) = sources.get(src.as_str()) {
            source = s.clone();
        }
        err = *inner;
    }
    let pos = err.position();
    let e = match err {
        EvalAltResult::ErrorRuntime(value, _) => {
            if value.is::<Carried>() {
                value.cast::<Carried>().0
            } else if value.to_string().trim().is_empty() {
                err!(
                    Script,
                    "`throw` without a message: give one, as in `throw \"what went wrong\"`"
                )
            } else {
                err!(Script, "{value}")
            }
        }
        EvalAltResult::ErrorTerminated(value, _) => {
            if value.to_string() == INTERRUPTED {
                err!(Limit, "interrupted")
            } else {
                err!(Limit, "terminated: {value}")
            }
        }
        EvalAltResult::ErrorTooManyOperations(_) => err!(
            Limit,
            "operation limit reached: the script ran more than {max_operations} operations"
        ),
        EvalAltResult::ErrorStackOverflow(_) => {
            err!(Limit, "call depth limit reached: too many nested function calls")
        }
        EvalAltResult::ErrorDataTooLarge(what, _) => err!(Limit, "{} over the limit", lower(&what)),
        EvalAltResult::ErrorTooManyVariables(_) | EvalAltResult::ErrorTooManyModules(_) => {
            err!(Limit, "{}", lower(&without_position(err)))
        }
        EvalAltResult::ErrorModuleNotFound(name, _) => {
            err!(Limit, "module import is not allowed: `{name}`")
        }
        EvalAltResult::ErrorParsing(..) => err!(Parse, "{}", lower(&without_position(err))),
        other => err!(Script, "{}", lower(&without_position(other))),
    };
    place(e, pos, &source)
}

/// Attach the position `pos` in `source` to `e`, unless it already has a position.
pub fn place(e: Error, pos: Position, source: &Arc<Source>) -> Error {
    if e.span.is_some_and(|s| !s.is_none()) && e.source.is_some() {
        return e;
    }
    let Some(offset) = offset_of(&source.text, pos) else {
        return e;
    };
    let end = source.text[offset..].chars().next().map_or(offset, |c| offset + c.len_utf8());
    let mut e = e;
    e.span = None;
    e.at(Span::new(offset, end)).in_source(source)
}

/// Byte offset of a rhai position (1-based line, 1-based column in characters).
pub fn offset_of(text: &str, pos: Position) -> Option<usize> {
    let line = pos.line()?;
    let col = pos.position().unwrap_or(1).max(1);
    let mut start = 0;
    for _ in 1..line {
        start += text[start..].find('\n')? + 1;
    }
    let line_text = &text[start..];
    let line_end = line_text.find('\n').unwrap_or(line_text.len());
    let in_line = line_text[..line_end].char_indices().nth(col - 1).map_or(line_end, |(i, _)| i);
    Some(start + in_line)
}

fn without_position(mut e: EvalAltResult) -> String {
    let _ = e.take_position();
    e.to_string()
}

fn lower(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) if !c.as_str().starts_with(|ch: char| ch.is_uppercase()) => {
            f.to_lowercase().chain(c).collect()
        }
        _ => s.to_string(),
    }
}
