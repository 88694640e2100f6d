//! The argument binder: the one place that slots a call's arguments into the callee's
//! parameters, for op calls and block calls alike. `resolve` runs it to check calls before any
//! value exists; `lower` runs it again to place the values (it cannot fail there on a resolved
//! module, but it is the same code, so the two cannot disagree).
//!
//! Positional arguments fill parameters in order and may not follow a named one; a named
//! argument fills the parameter of its name, once; a parameter left empty must have a default
//! (which the caller supplies: an op's is a constant, a block's an expression).

use super::ast::{Ident, SigParam};
use super::ops::OpParam;
use crate::err;
use crate::error::{Result, Span};
use std::collections::HashMap;

/// A callee's parameter list, as the binder sees it.
pub trait Params {
    /// How many parameters there are.
    fn count(&self) -> usize;
    /// The name of parameter `i`.
    fn name(&self, i: usize) -> &str;
    /// Whether parameter `i` must be given (has no default).
    fn required(&self, i: usize) -> bool;
}

impl Params for [OpParam] {
    fn count(&self) -> usize {
        self.len()
    }
    fn name(&self, i: usize) -> &str {
        self[i].name
    }
    fn required(&self, i: usize) -> bool {
        self[i].default.is_none()
    }
}

impl Params for [SigParam] {
    fn count(&self) -> usize {
        self.len()
    }
    fn name(&self, i: usize) -> &str {
        &self[i].name().name
    }
    fn required(&self, i: usize) -> bool {
        !matches!(self[i], SigParam::Hyper { default: Some(_), .. })
    }
}

/// One argument of a call: its name when given as `name = value`, its value, and the value's
/// span.
pub struct Arg<'a, T> {
    pub name: Option<&'a Ident>,
    pub value: T,
    pub span: Span,
}

/// Slots `args` into `params`: the result has one entry per parameter, `None` where the
/// parameter was not given (it then has a default). `what` names the callee in messages
/// ("block `linear`", "`softmax(x, axis = -1)`"); `call_span` is where a missing argument is
/// reported.
pub fn bind<'a, T>(
    params: &(impl Params + ?Sized),
    args: impl ExactSizeIterator<Item = Arg<'a, T>>,
    what: impl Fn() -> String,
    call_span: Span,
) -> Result<Vec<Option<(T, Span)>>> {
    let n = params.count();
    let n_args = args.len();
    let mut slots: Vec<Option<(T, Span)>> = (0..n).map(|_| None).collect();
    let mut seen_named = false;
    // Parameters by name, built at the first named argument: a search of the list for each
    // one made a call of 40,000 named arguments take 6 s (the first of a name wins, as a
    // search would find it; resolve refuses a signature that repeats one).
    let mut by_name: Option<HashMap<&str, usize>> = None;
    for (i, a) in args.enumerate() {
        let k = match a.name {
            None if seen_named => {
                return Err(err!(Name, "positional argument after a named one").at(a.span))
            }
            None if i >= n => {
                let s = if n == 1 { "" } else { "s" };
                return Err(
                    err!(Name, "{} takes at most {n} argument{s}, got {n_args}", what()).at(a.span)
                );
            }
            None => i,
            Some(id) => {
                seen_named = true;
                let by_name = by_name.get_or_insert_with(|| {
                    let mut m = HashMap::with_capacity(n);
                    for k in 0..n {
                        m.entry(params.name(k)).or_insert(k);
                    }
                    m
                });
                let Some(&k) = by_name.get(id.name.as_str()) else {
                    return Err(err!(Name, "{} has no parameter `{}`", what(), id.name).at(id.span));
                };
                if slots[k].is_some() {
                    return Err(err!(Name, "argument `{}` given twice", id.name).at(id.span));
                }
                k
            }
        };
        slots[k] = Some((a.value, a.span));
    }
    if let Some(k) = (0..n).find(|&k| slots[k].is_none() && params.required(k)) {
        return Err(err!(Name, "{} is missing argument `{}`", what(), params.name(k)).at(call_span));
    }
    Ok(slots)
}
