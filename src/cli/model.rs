//! The model a command line names: a model file (standalone or `.rms`), `--model NAME` and
//! `--set NAME=VALUE`. `rumus graph`, `plan` and `bench` all come in here, so a mistake gets
//! one message and one kind (one exit code) whichever command met it.

use crate::dsl::{self, Value};
use crate::err;
use crate::error::Result;
use crate::graph::Graph;
use crate::Source;
use std::collections::HashMap;
use std::sync::Arc;

/// Which model a file's models give when `--model` is not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The file's only model; several are a usage error asking for `--model` (`graph`).
    Only,
    /// The file's first model (`plan`, `bench`).
    First,
}

/// A model of a model file, lowered.
pub struct Lowered {
    /// The model's graph.
    pub graph: Graph,
    /// The model's name.
    pub name: String,
    /// The model file's source, for the positions of later errors.
    pub src: Arc<Source>,
}

/// Lower model `model` (else the one `pick` gives) of `file` with the `--set` values `sets`;
/// a dimension left unset takes `default_dim` where given, and is an error otherwise.
pub fn lower_model(
    file: &str,
    model: Option<&str>,
    pick: Pick,
    sets: &[(String, String)],
    default_dim: Option<i64>,
) -> Result<Lowered> {
    let src = crate::files::read_source(std::path::Path::new(file))?;
    // A `.rms` file may be a script with model blocks in it; only the blocks matter here.
    let module = if file.ends_with(".rms") { dsl::load_rms(&src) } else { dsl::load(&src) }
        .map_err(|e| e.in_source(&src))?;
    let name = match model {
        Some(m) => m.to_string(),
        None => {
            let user: Vec<&str> = module
                .models()
                .filter(|m| !module.is_std(&m.name.name))
                .map(|m| m.name.name.as_str())
                .collect();
            match (user.as_slice(), pick) {
                // What the file holds, as "no model named `m`" is for `--model m`: a model
                // error (exit code 1), whichever command reads the file.
                ([], _) => return Err(err!(Name, "{file}: no model in this file")),
                ([one], _) | ([one, ..], Pick::First) => one.to_string(),
                (many, Pick::Only) => {
                    return Err(err!(
                        Usage,
                        "{file} has several models ({}); pick one with --model",
                        many.join(", ")
                    ))
                }
            }
        }
    };
    let bindings = bindings(sets)?;
    let graph = match dsl::lower(&module, &name, &bindings, default_dim) {
        Ok(g) => g,
        Err(mut e) => {
            // A mistake of the default size alone (`x @ x` of an `f32[B, 4]` is a model only
            // at B = 4), which lowering at another size does not repeat, says how to give the
            // sizes.
            if let Some(d) =
                default_dim.filter(|&d| dsl::size_dependent(&module, &name, &bindings, d, &e))
            {
                e.message.push_str(&format!(
                    " (dimensions that --set does not give are {d} here: give their sizes with --set NAME=VALUE)"
                ));
            }
            return Err(e.in_source(&src));
        }
    };
    Ok(Lowered { graph, name, src })
}

/// The `--set NAME=VALUE` values as the model's bindings: each name once, each value a finite
/// number, `true` or `false`.
fn bindings(sets: &[(String, String)]) -> Result<Vec<(&str, Value)>> {
    let mut out = Vec::with_capacity(sets.len());
    // The first value of each name, by name: searching the earlier flags for each made 60,000
    // `--set` flags (a command line holds 100,000) take 5 s.
    let mut first: HashMap<&str, &str> = HashMap::with_capacity(sets.len());
    for (k, v) in sets {
        if let Some(first) = first.insert(k.as_str(), v.as_str()) {
            return Err(err!(Usage, "--set {k} is given twice ({first} and {v}): give it once"));
        }
        let integer = v.strip_prefix(['-', '+']).unwrap_or(v);
        let value = match (v.parse::<i64>(), v.parse::<f64>()) {
            _ if v == "true" || v == "false" => Value::Bool(v == "true"),
            (Ok(i), _) => Value::Int(i),
            // Read as a float it would be a "number" where the model wants an integer.
            _ if !integer.is_empty() && integer.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(err!(
                    Usage,
                    "--set {k}={v}: the integer is beyond the largest a model takes, {}",
                    i64::MAX
                ));
            }
            (_, Ok(f)) if f.is_finite() => Value::Float(f),
            _ => {
                return Err(err!(
                    Usage,
                    "--set {k}={v}: the value must be a finite number, true or false"
                ))
            }
        };
        out.push((k.as_str(), value));
    }
    Ok(out)
}
