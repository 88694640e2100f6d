//! Tensor patterns against shapes: a model input's pattern gives its shape from the dimensions
//! the host set; a block argument's shape is matched against the block's pattern, binding the
//! pattern's named dimensions (`x: f32[..., IN]` binds `IN`) or checking them.

use super::{Value, MAX_DIM};
use crate::dsl::ast::{DimPat, Ident};
use crate::err;
use crate::error::{Error, Result, Span};
use crate::tensor::{checked_numel, fmt_shape};
use std::collections::{HashMap, HashSet};

/// A named dimension that is also a hyperparameter of the block: checked once the
/// hyperparameter's value is known (it may come from a default that uses other dimensions).
pub(super) struct Deferred {
    name: String,
    actual: usize,
    span: Span,
    pattern: String,
}

/// The shape of model input `name` from its pattern `dims`: each named dimension is what the
/// host gave (`given`), else a hyperparameter's value (`env`), else `default_dim`. Named
/// dimensions are bound in `env`.
pub(super) fn input_shape(
    name: &Ident,
    dims: &[DimPat],
    given: &HashMap<String, Value>,
    env: &mut HashMap<String, Value>,
    default_dim: Option<i64>,
) -> Result<Vec<usize>> {
    let mut shape = Vec::new();
    for d in dims {
        let (v, span) = match d {
            DimPat::Size(v, s) => (*v, *s),
            DimPat::Ellipsis(s) => return Err(err!(Name, "a model input cannot use `...`").at(*s)),
            DimPat::Name(n) => match given.get(&n.name).or_else(|| env.get(&n.name)) {
                Some(Value::Int(v)) => (*v, n.span),
                Some(other) => {
                    return Err(err!(
                        Name,
                        "dimension `{}` must be an integer, got {}",
                        n.name,
                        other.kind()
                    )
                    .at(n.span))
                }
                None => match default_dim {
                    Some(v) => (v, n.span),
                    None => {
                        return Err(err!(
                            Name,
                            "dimension `{}` of input `{}` is not set",
                            n.name,
                            name.name
                        )
                        .at(n.span))
                    }
                },
            },
        };
        if !(1..=MAX_DIM).contains(&v) {
            // Named, with where its value came from: a value the host gave (`--set`, `dims`,
            // a batch) has no place in the file, so the message says which it was.
            let e = match d {
                DimPat::Name(n) if given.contains_key(&n.name) => err!(
                    Shape,
                    "dimension `{}` of input `{}` must be between 1 and {MAX_DIM}, got {v} (the value given for `{}`, as by `--set {}=...`, `dims` or `batch`)",
                    n.name, name.name, n.name, n.name
                ),
                DimPat::Name(n) => err!(
                    Shape,
                    "dimension `{}` of input `{}` must be between 1 and {MAX_DIM}, got {v}",
                    n.name,
                    name.name
                ),
                _ => err!(Shape, "dimension must be between 1 and {MAX_DIM}, got {v}"),
            };
            return Err(e.at(span));
        }
        if let DimPat::Name(n) = d {
            env.insert(n.name.clone(), Value::Int(v));
        }
        shape.push(v as usize);
    }
    checked_numel(&shape).map_err(|e| e.at(name.span))?;
    Ok(shape)
}

/// Matches `shape`, the shape of argument `arg` of block `block` (the value at `span`), against
/// the pattern `dims`: sizes must be equal, `...` takes the leading dimensions left over, a
/// named dimension binds in `env` or must equal its binding there. Names in `hypers` are
/// deferred (see [`check_deferred`]).
pub(super) fn match_shape(
    shape: &[usize],
    dims: &[DimPat],
    (arg, block, span): (&str, &str, Span),
    hypers: &HashSet<&str>,
    env: &mut HashMap<String, Value>,
    deferred: &mut Vec<Deferred>,
) -> Result<()> {
    let pattern = fmt_pattern(dims);
    let mismatch = || -> Error {
        err!(
            Shape,
            "argument `{arg}` of `{block}` has shape {}, expected {pattern}",
            fmt_shape(shape)
        )
        .at(span)
    };
    let has_ellipsis = dims.iter().any(|d| matches!(d, DimPat::Ellipsis(_)));
    let fixed = dims.len() - usize::from(has_ellipsis);
    if shape.len() < fixed || (!has_ellipsis && shape.len() != fixed) {
        return Err(mismatch());
    }
    let mut k = 0;
    for d in dims {
        match d {
            DimPat::Ellipsis(_) => k += shape.len() - fixed,
            DimPat::Size(s, _) => {
                if shape[k] as i64 != *s {
                    return Err(mismatch());
                }
                k += 1;
            }
            DimPat::Name(n) => {
                let actual = shape[k] as i64;
                if hypers.contains(n.name.as_str()) {
                    deferred.push(Deferred {
                        name: n.name.clone(),
                        actual: shape[k],
                        span,
                        pattern: pattern.clone(),
                    });
                } else {
                    match env.get(&n.name) {
                        Some(Value::Int(v)) if *v != actual => return Err(mismatch()),
                        _ => {
                            env.insert(n.name.clone(), Value::Int(actual));
                        }
                    }
                }
                k += 1;
            }
        }
    }
    Ok(())
}

/// Checks the deferred dimensions against the hyperparameters' values in `env`.
pub(super) fn check_deferred(deferred: Vec<Deferred>, env: &HashMap<String, Value>) -> Result<()> {
    for Deferred { name: n, actual, span, pattern } in deferred {
        if env.get(&n) != Some(&Value::Int(actual as i64)) {
            let set = env.get(&n).map_or("nothing".into(), Value::show);
            return Err(err!(
                Shape,
                "dimension `{n}` is {actual} in the argument, but `{n}` is set to {set}; \
                 expected {pattern}"
            )
            .at(span));
        }
    }
    Ok(())
}

fn fmt_pattern(dims: &[DimPat]) -> String {
    let v: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DimPat::Ellipsis(_) => "...".to_string(),
            DimPat::Name(n) => n.name.clone(),
            DimPat::Size(s, _) => s.to_string(),
        })
        .collect();
    format!("[{}]", v.join(", "))
}
