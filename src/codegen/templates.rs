//! The hand-written WGSL templates of `shaders/`, compiled into the binary, and the placeholder
//! filler.
//!
//! A template is WGSL text in which generated code fills `{{NAME}}` placeholders. Every template
//! carries a default for each of its placeholders, so it is valid WGSL once filled with them
//! (`tests/it/wgsl_valid.rs` checks this for every file in `shaders/`).

use crate::err;
use crate::error::Result;

/// A WGSL template from `shaders/` and the default of each of its placeholders.
#[derive(Clone, Copy, Debug)]
pub struct Template {
    /// File name in `shaders/`.
    pub file: &'static str,
    /// The file's text.
    pub text: &'static str,
    /// `(NAME, default)` for every `{{NAME}}` in `text`.
    pub defaults: &'static [(&'static str, &'static str)],
}

/// `shaders/matmul.wgsl` (see [`super::matmul`]).
pub const MATMUL: Template = Template {
    file: "matmul.wgsl",
    text: include_str!("../../shaders/matmul.wgsl"),
    defaults: &[
        ("BM", "128"),
        ("BN", "128"),
        ("BK", "8"),
        ("TM", "8"),
        ("TN", "8"),
        ("EPILOGUE_BINDINGS", ""),
        ("EPILOGUE", "return v;"),
    ],
};

/// `shaders/layer_norm.wgsl` (see [`super::layer_norm`]).
pub const LAYER_NORM: Template = Template {
    file: "layer_norm.wgsl",
    text: include_str!("../../shaders/layer_norm.wgsl"),
    defaults: &[("WG", "256"), ("NG", "16"), ("CPT", "4")],
};

/// `shaders/layer_norm_bw.wgsl` (see [`super::layer_norm`]).
pub const LAYER_NORM_BW: Template = Template {
    file: "layer_norm_bw.wgsl",
    text: include_str!("../../shaders/layer_norm_bw.wgsl"),
    defaults: &[
        ("WG", "256"),
        ("NG", "16"),
        ("CPT", "4"),
        ("ADD", ""),
        ("NP", "2"),
        ("SUM", ""),
        ("SUM_STORE", ""),
        ("SUM_LOAD", "0.0"),
        ("SUM_WRITE", ""),
    ],
};

/// `shaders/rank_mean.wgsl`: data-parallel training's mean of a bucket of gradients over the
/// ranks (`runtime/exchange.rs`); no placeholders.
pub const RANK_MEAN: Template = Template {
    file: "rank_mean.wgsl",
    text: include_str!("../../shaders/rank_mean.wgsl"),
    defaults: &[],
};

/// Every template in `shaders/`.
pub const TEMPLATES: &[Template] = &[MATMUL, LAYER_NORM, LAYER_NORM_BW, RANK_MEAN];

impl Template {
    /// The text with `values` substituted and every other placeholder at its default. An error
    /// when `values` names a placeholder the template lacks or a `{{` is left over.
    pub fn fill(&self, values: &[(&str, &str)]) -> Result<String> {
        for (name, _) in values {
            if !self.defaults.iter().any(|(d, _)| d == name) {
                return Err(err!(Invariant, "{}: no placeholder `{{{{{name}}}}}`", self.file));
            }
        }
        let mut text = self.text.to_string();
        for (name, default) in self.defaults {
            let value = values.iter().find(|(n, _)| n == name).map_or(*default, |(_, v)| *v);
            text = text.replace(&format!("{{{{{name}}}}}"), value);
        }
        if let Some(at) = text.find("{{") {
            let rest: String = text[at..].chars().take(40).collect();
            return Err(err!(Invariant, "{}: unfilled placeholder at `{rest}`", self.file));
        }
        Ok(text)
    }

    /// The text with every placeholder at its default.
    pub fn with_defaults(&self) -> String {
        self.fill(&[]).unwrap_or_else(|_| self.text.to_string())
    }
}
