//! `.rms` sources: rhai code with model blocks at top level. The model language's splitter
//! (`dsl::rms::split`) blanks the blocks out of the script text without moving anything, so
//! rhai's line and column numbers stay those of the file; each model block becomes a native
//! function `name(#{ hyperparams })` that returns an instantiable model.

use super::api;
use crate::dsl;
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
    api::model::define(engine, &module);
    for m in module.models() {
        if !models.names.contains(&m.name.name) {
            models.names.push(m.name.name.clone());
        }
    }
    Ok(split.script_text)
}
