//! `.rms` sources: rhai code with model blocks at top level. The model language's splitter
//! (`dsl::rms::split`) blanks the blocks out of the script text without moving anything, so
//! rhai's line and column numbers stay those of the file; each model block becomes a native
//! function `name(#{ hyperparams })` that returns an instantiable model.

use super::api;
use crate::dsl;
use crate::dsl::scan::{Piece, Scanner, Token};
use crate::err;
use crate::error::{Result, Source};
use crate::source::Span;
use std::sync::Arc;

/// The names of the model blocks defined so far in a session.
#[derive(Default)]
pub struct Models {
    names: Vec<String>,
}

impl Models {
    /// The names, in definition order.
    pub fn names(&self) -> Vec<String> {
        self.names.clone()
    }
}

/// Define the model blocks of `source` in the session and return its script text (as long as
/// the source, blocks blanked). A block in one evaluation is visible to models of that
/// evaluation only. `functions` holds the script functions earlier evaluations defined: a model
/// may not take the name of one (see [`check_functions`]).
pub fn define_models(
    source: &Arc<Source>,
    engine: &mut rhai::Engine,
    models: &mut Models,
    functions: &rhai::AST,
) -> Result<String> {
    let split = dsl::rms::split(&source.text);
    if split.model_text.trim().is_empty() {
        return Ok(split.script_text);
    }
    let module = Arc::new(dsl::load_rms(source)?);
    for m in module.models().filter(|m| !module.is_std(&m.name.name)) {
        let name = &m.name.name;
        check_model_name(name).map_err(|e| e.at(m.name.span).in_source(source))?;
        if functions.iter_functions().any(|f| f.name == name) {
            return Err(err!(
                Name,
                "model `{name}`: a script function `{name}` is already defined (`fn {name}`), \
                 and a call `{name}(..)` would run the function instead of the model: rename one"
            )
            .at(m.name.span)
            .in_source(source));
        }
    }
    api::model::define(engine, &module);
    for m in module.models() {
        if !models.names.contains(&m.name.name) {
            models.names.push(m.name.name.clone());
        }
    }
    Ok(split.script_text)
}

/// Words of the script language (rhai's keywords and the ones it reserves): a model of that name
/// could never be called.
#[rustfmt::skip]
const SCRIPT_KEYWORDS: &[&str] = &[
    "true", "false", "let", "const", "if", "else", "switch", "do", "while", "until", "loop", "for",
    "in", "continue", "break", "return", "throw", "try", "catch", "fn", "private", "import",
    "export", "as", "global", "Fn", "call", "curry", "this", "type_of", "print", "debug", "eval",
    "is_shared", "is_def_fn", "is_def_var", "var", "static", "shared", "goto", "exit", "match",
    "case", "public", "protected", "new", "use", "with", "module", "package", "super", "thread",
    "spawn", "go", "await", "async", "sync", "yield", "default", "void", "null", "nil",
];

/// A model block becomes a script function of its name: one that a keyword or a function of
/// the script API already has would silently replace it (`model exit` made `exit()` build a
/// model) or never be callable.
fn check_model_name(name: &str) -> Result<()> {
    if SCRIPT_KEYWORDS.contains(&name) {
        return Err(err!(
            Name,
            "model `{name}`: `{name}` is a word of the script language, so the model could not be called: rename it"
        ));
    }
    if api::doc::names().any(|n| n == name) {
        return Err(err!(
            Name,
            "model `{name}`: `{name}` is a function of the script API (see `:help {name}`), which the model would replace: rename it"
        ));
    }
    Ok(())
}

/// A script function of `ast` (compiled from `script_text`, the script text of `source`) may
/// not take the name of a model of the session: rhai runs a script function before a native one
/// of the same name and arity, so `fn net() {..}` beside `model net` silently replaced the
/// model's call `net()` (and `fn net(opts)` its call `net(#{..})`). The error points at the
/// function's name.
pub fn check_functions(
    source: &Arc<Source>,
    script_text: &str,
    ast: &rhai::AST,
    models: &Models,
) -> Result<()> {
    for f in ast.iter_functions() {
        let name = f.name;
        if models.names.iter().any(|m| m == name) {
            let e = err!(
                Name,
                "fn `{name}`: a model `{name}` is defined, and a call `{name}(..)` would run \
                 this function instead of the model: rename one"
            );
            return Err(match definition_of(script_text, name) {
                Some(span) => e.at(span).in_source(source),
                None => e,
            });
        }
    }
    Ok(())
}

/// Where `fn NAME` defines `name` in script text: the name's bytes (comments may stand between
/// `fn` and the name; strings and comments are never searched).
fn definition_of(text: &str, name: &str) -> Option<Span> {
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    // Whether the last word read was `fn`, with only blanks and comments since; the start of
    // the word being read.
    let (mut after_fn, mut word) = (false, None);
    for t in Scanner::new(text).map(Some).chain([None]) {
        if let Some(Token { piece: Piece::Code(c), start, .. }) = t {
            if ident(c) {
                word.get_or_insert(start);
                continue;
            }
        }
        if let Some(start) = word.take() {
            let end = t.map_or(text.len(), |t| t.start);
            let w = &text[start..end];
            if after_fn && w == name {
                return Some(Span::new(start, end));
            }
            after_fn = w == "fn";
        }
        match t.map(|t| t.piece) {
            Some(Piece::Code(c)) if c.is_ascii_whitespace() => {}
            Some(Piece::LineComment | Piece::BlockComment { .. }) => {}
            _ => after_fn = false,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_is_found_by_its_name_outside_strings_and_comments() {
        let text = "let fn_q = \"fn q\"; // fn q\nfn  qq() {}\nfn /* c */ q(a) { q }";
        let span = definition_of(text, "q").unwrap();
        assert_eq!(&text[span.start as usize..span.end as usize], "q");
        assert_eq!(text[..span.start as usize].matches('\n').count(), 2);
        assert_eq!(definition_of(text, "qq").map(|s| s.start), text.find("qq").map(|i| i as u32));
        assert_eq!(definition_of(text, "fn_q"), None);
        assert_eq!(definition_of("fn q", "q"), Some(Span::new(3, 4)));
    }
}
