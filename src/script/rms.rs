//! `.rms` sources: rhai code with model blocks at top level. The model language's splitter
//! (`dsl::rms::split`) blanks the blocks out of the script text without moving anything, so
//! rhai's line and column numbers stay those of the file; each model block becomes a native
//! function `name(#{ hyperparams })` that returns an instantiable model.

use super::api;
use crate::dsl;
use crate::err;
use crate::error::{Result, Source};
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
/// evaluation only.
pub fn define_models(
    source: &Arc<Source>,
    engine: &mut rhai::Engine,
    models: &mut Models,
) -> Result<String> {
    let split = dsl::rms::split(&source.text);
    if split.model_text.trim().is_empty() {
        return Ok(split.script_text);
    }
    let module = Arc::new(dsl::load_rms(source)?);
    for m in module.models().filter(|m| !module.is_std(&m.name.name)) {
        check_model_name(&m.name.name).map_err(|e| e.at(m.name.span).in_source(source))?;
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
