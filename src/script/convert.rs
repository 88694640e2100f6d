//! Values across the rhai boundary. Errors, both ways: a rumus [`Error`] raised by a binding
//! travels through rhai inside the runtime error value, and comes back out (with the script
//! position of the call that raised it) as the same `Error`; rhai's own errors become `Script`,
//! `Parse` or `Limit` errors pointing at the script's line and column. Numbers, one way: every
//! binding turns script numbers into Rust numbers through the checked conversions here
//! ([`to_usize`], [`to_u64`], [`to_i32`], [`to_f32`], and [`Opts`] for options maps), whose
//! errors name the value and the allowed range.

use super::engine::{Sandbox, INTERRUPTED, OUT_OF_MEMORY, TIMED_OUT};
use crate::err;
use crate::error::{Error, ErrorKind, Source, Span};
use crate::num;
use rhai::{Dynamic, EvalAltResult, Map, Position, FLOAT, INT};
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
    /// The error wrapped for rhai ([`to_rhai`]).
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

/// `v` as a size or count (`>= 0`); `what` names it in the error (`"batch size"`).
pub fn to_usize(v: INT, what: &str) -> ScriptResult<usize> {
    checked(num::int_in(v, 0, i64::MAX), what)
}

/// `v` as a tensor dimension: `1..=MAX_DIM`, the model language's bound, so a size the model
/// would refuse is refused here, where the script gave it.
pub fn to_dim(v: INT, what: &str) -> ScriptResult<usize> {
    checked(num::int_in(v, 1, crate::dsl::lower::MAX_DIM), what)
}

/// `v` as a seed or step count (`>= 0`).
pub fn to_u64(v: INT, what: &str) -> ScriptResult<u64> {
    checked(num::int_in(v, 0, i64::MAX), what)
}

/// `v` as an i32 (a label, an index).
pub fn to_i32(v: INT, what: &str) -> ScriptResult<i32> {
    checked(num::int_in(v, i32::MIN.into(), i32::MAX.into()), what)
}

/// `v` as f32: the one conversion of a script float to f32, for options (`lr`, `clip`, ...) and
/// for tensor elements alike. NaN and infinities are errors ([`not_finite`]), and so is a finite
/// number outside f32's range (it would become infinite); others round to the nearest f32.
pub fn to_f32(v: FLOAT, what: &str) -> ScriptResult<f32> {
    if !v.is_finite() {
        return Err(script_err(format!("{what}: {}", not_finite(v))));
    }
    num::f32_of(v).map_err(|m| script_err(format!("{what}: {m}")))
}

/// Why a script float that is not finite is refused, a message fragment: a literal beyond
/// f64's range (1e400) reads as infinity, so an infinity is no proof that one was meant.
pub fn not_finite(v: FLOAT) -> String {
    if v.is_nan() {
        "NaN is not a finite number".to_string()
    } else {
        format!(
            "{v} is not a finite number (a number beyond f64's range, such as 1e400, reads as infinity)"
        )
    }
}

fn checked<T>(r: Result<T, String>, what: &str) -> ScriptResult<T> {
    r.map_err(|m| script_err(format!("{what} {m}")))
}

/// An options map (`#{ lr: 0.1, seed: 3 }`) read through the checked conversions. `context`
/// (the function's name) starts every error; a key the function does not know is an error, so
/// a misspelt option is never silently ignored.
pub struct Opts<'a> {
    map: &'a Map,
    context: &'a str,
}

impl<'a> Opts<'a> {
    /// Read `map` for function `context`; an error when it has a key not in `known`.
    pub fn new(map: &'a Map, context: &'a str, known: &[&str]) -> ScriptResult<Opts<'a>> {
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(script_err(format!(
                "{context}: unknown setting `{k}` (settings: {})",
                known.join(", ")
            )));
        }
        Ok(Opts { map, context })
    }

    /// The raw value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&'a Dynamic> {
        self.map.get(key)
    }

    fn name(&self, key: &str) -> String {
        format!("{}: `{key}`", self.context)
    }

    fn wrong(&self, key: &str, want: &str, v: &Dynamic) -> Box<EvalAltResult> {
        script_err(format!("{} must be {want}, got {}", self.name(key), super::api::type_name(v)))
    }

    /// An integer in `min..=max`.
    pub fn int<T: TryFrom<i64>>(&self, key: &str, min: i64, max: i64) -> ScriptResult<Option<T>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let i = v.as_int().map_err(|_| self.wrong(key, "an integer", v))?;
        checked(num::int_in(i, min, max), &self.name(key)).map(Some)
    }

    /// A size or count `>= min`.
    pub fn usize(&self, key: &str, min: i64) -> ScriptResult<Option<usize>> {
        self.int(key, min, i64::MAX)
    }

    /// A tensor dimension ([`to_dim`]).
    pub fn dim(&self, key: &str) -> ScriptResult<Option<usize>> {
        self.int(key, 1, crate::dsl::lower::MAX_DIM)
    }

    /// A seed or step count `>= min`.
    pub fn u64(&self, key: &str, min: i64) -> ScriptResult<Option<u64>> {
        self.int(key, min, i64::MAX)
    }

    /// A number (integer or float).
    pub fn f64(&self, key: &str) -> ScriptResult<Option<f64>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let x = v.as_float().or_else(|_| v.as_int().map(|i| i as f64));
        x.map(Some).map_err(|_| self.wrong(key, "a number", v))
    }

    /// A number that fits f32.
    pub fn f32(&self, key: &str) -> ScriptResult<Option<f32>> {
        match self.f64(key)? {
            None => Ok(None),
            Some(x) => to_f32(x, &self.name(key)).map(Some),
        }
    }

    /// A boolean, when the key is there (an error when it is not a boolean).
    pub fn bool(&self, key: &str) -> ScriptResult<Option<bool>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_bool().map(Some).map_err(|_| self.wrong(key, "true or false", v))
    }

    /// A string, when the key is there (an error when it is not a string).
    pub fn string(&self, key: &str) -> ScriptResult<Option<String>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.clone().into_string().map(Some).map_err(|_| self.wrong(key, "a string", v))
    }

    /// A nested options map.
    pub fn map(&self, key: &str) -> ScriptResult<Option<Map>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.read_lock::<Map>().map(|m| Some(m.clone())).ok_or_else(|| self.wrong(key, "a map", v))
    }
}

/// Turn a rhai error into a rumus error positioned in the source it came from: `source` for
/// the evaluated code, `fn_sources` (by function name) for the body of a script function that
/// an earlier evaluation (a REPL input, a loaded file) defined.
pub fn from_rhai(
    err: EvalAltResult,
    source: &Arc<Source>,
    fn_sources: &HashMap<String, Arc<Source>>,
    sandbox: &Sandbox,
) -> Error {
    let mut source = source.clone();
    let mut err = err;
    // Descend to the innermost error: that is where the mistake is, in the body of the
    // innermost function named on the way.
    while let EvalAltResult::ErrorInFunctionCall(..) | EvalAltResult::ErrorInModule(..) = err {
        err = match err {
            EvalAltResult::ErrorInFunctionCall(name, _, inner, _) => {
                if let Some(s) = fn_sources.get(name.as_str()) {
                    source = s.clone();
                }
                *inner
            }
            EvalAltResult::ErrorInModule(_, inner, _) => *inner,
            other => other,
        };
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
        EvalAltResult::ErrorTerminated(value, _) => match value.to_string().as_str() {
            INTERRUPTED => err!(Interrupted, "interrupted"),
            TIMED_OUT => err!(
                Limit,
                "time limit reached: the script ran longer than {}",
                seconds(sandbox.timeout.unwrap_or_default())
            ),
            OUT_OF_MEMORY => err!(
                Limit,
                "memory limit reached: the process holds more than {} (the script's arrays, \
                 strings, maps and closures count, beside its tensors): keep fewer or smaller \
                 values alive at once",
                crate::memory::human(sandbox.heap_limit.unwrap_or_default())
            ),
            other => err!(Limit, "terminated: {other}"),
        },
        EvalAltResult::ErrorTooManyOperations(_) => err!(
            Limit,
            "operation limit reached: the script ran more than {} operations",
            sandbox.max_operations
        ),
        EvalAltResult::ErrorStackOverflow(_) => {
            err!(Limit, "call depth limit reached: too many nested function calls")
        }
        EvalAltResult::ErrorDataTooLarge(what, _) => err!(Limit, "{} over the limit", lower(&what)),
        EvalAltResult::ErrorTooManyVariables(_) => {
            err!(Limit, "{}", lower(&without_position(err)))
        }
        // The sandbox allows no modules, so rhai reports any `import` as one too many.
        EvalAltResult::ErrorTooManyModules(_) | EvalAltResult::ErrorModuleNotFound(..) => err!(
            Limit,
            "`import` is not available in rumus scripts: define the functions in this file"
        ),
        EvalAltResult::ErrorParsing(..) => {
            let said = lower(&without_position(err));
            match disabled(&said, &source.text, pos) {
                Some(why) => err!(Parse, "{said}: {why}"),
                None => err!(Parse, "{said}"),
            }
        }
        EvalAltResult::ErrorFunctionNotFound(signature, at) => {
            let said = EvalAltResult::ErrorFunctionNotFound(signature.clone(), at);
            let said = lower(&without_position(said));
            match forms(&signature) {
                Some((name, forms)) => err!(
                    Script,
                    "{said}; `{name}` is called as {forms} (`:help {name}` in the REPL, or \
                     docs/script-api.md)"
                ),
                None => err!(Script, "{said}"),
            }
        }
        // rhai says "indexer unavailable: Tensor [f64]": the value's type, then the index's.
        EvalAltResult::ErrorIndexingType(what, _) => {
            // (An element write says "Tensor [f64] = f64": the index is up to the `]`.)
            let (ty, index) = match what.split_once(" [") {
                Some((ty, rest)) => (ty, rest.split_once(']').map_or(rest, |(index, _)| index)),
                None => (what.as_str(), "that"),
            };
            match ty {
                "Tensor" => err!(
                    Script,
                    "a Tensor is indexed by an integer (`t[0]`) or an array of integers, one per \
                     axis (`t[[0, 1]]`), not by {index}"
                ),
                _ => err!(Script, "a value of type {ty} cannot be indexed by {index}"),
            }
        }
        other => err!(Script, "{}", lower(&without_position(other))),
    };
    place(e, pos, &source)
}

/// Why a keyword the sandbox disables (`script::engine::sandboxed`) is not there and what to
/// write instead, when the syntax error `said` at `pos` is about one: rhai names it in the
/// message (`eval(s)`, `Fn("eval")`) or only points at it (`f.curry(x)`).
fn disabled(said: &str, text: &str, pos: Position) -> Option<&'static str> {
    let at = offset_of(text, pos).map_or("", |o| text[o..].trim_start_matches('"'));
    let word = at.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("");
    let is = |k: &str| word == k || said.contains(&format!("'{k}'"));
    if is("eval") {
        Some(
            "`eval` is not available in rumus scripts; write the code it would run in the \
             script itself",
        )
    } else if is("curry") {
        Some(
            "`curry` is not available in rumus scripts; write a closure that captures the \
             values instead, as in `|x| f.call(a, x)`",
        )
    } else {
        None
    }
}

/// For a call rhai found no function for (`signature`: the name, then the argument types)
/// whose name is a rumus function: the name and its forms as the script API reference gives
/// them (the code spans of its entry's first paragraph that call it, as `name(..)` or
/// `receiver.name(..)`, or read it as a property), e.g. `net.predict(x)` for a `predict` given
/// a model instead of a trainer.
fn forms(signature: &str) -> Option<(&str, String)> {
    let name = signature.split([' ', '(']).next()?;
    let entry = super::api::doc::entry(name)?;
    let first = entry.lines().skip(1).take_while(|l| !l.trim().is_empty()).collect::<Vec<_>>();
    let text = first.join(" ");
    let call = format!("{name}(");
    let spans: Vec<String> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            // `name(...)` or `receiver.name(...)`, not an example that calls it on the way.
            // A property (`t.shape`) is a form too.
            let (receiver, rest) = span.split_once('.').unwrap_or(("", span));
            let plain = receiver.chars().all(|c| c.is_alphanumeric() || c == '_');
            span.starts_with(&call) || (plain && (rest.starts_with(&call) || rest == name))
        })
        .map(|span| format!("`{span}`"))
        .take(6)
        .collect();
    (!spans.is_empty()).then(|| (name, spans.join(", ")))
}

/// Attach the position `pos` in `source` to `e`, unless it already has a position (a span and
/// the source it points into).
pub fn place(e: Error, pos: Position, source: &Arc<Source>) -> Error {
    if e.position().is_some() {
        return e;
    }
    let e = e.without_position();
    let Some(offset) = offset_of(&source.text, pos) else {
        return e;
    };
    let end = source.text[offset..].chars().next().map_or(offset, |c| offset + c.len_utf8());
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

/// A duration as the limits are given: `5 s`, `0.25 s`.
fn seconds(d: std::time::Duration) -> String {
    format!("{} s", d.as_secs_f64())
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
