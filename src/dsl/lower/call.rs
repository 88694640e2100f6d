//! Calls: a call's arguments are evaluated and bound by [`crate::dsl::bind`], then it becomes
//! either a block activation (a new scope named by `as` or `<block>_<k>`, the arguments matched
//! against the block's patterns, defaults evaluated, the body run) or an op (see `args`).

use super::pattern::{self, Deferred};
use super::{Frame, Lowerer, Value, MAX_CALL_DEPTH};
use crate::dsl::ast::*;
use crate::dsl::bind::{self, bind};
use crate::dsl::ops;
use crate::dsl::resolve::STD_NAME;
use crate::err;
use crate::error::{Result, Source, Span};
use std::collections::HashSet;
use std::sync::Arc;

/// A call's arguments, one per parameter of the callee (`None`: not given).
type Slots = Vec<Option<(Value, Span)>>;

impl Lowerer<'_> {
    pub(super) fn call(&mut self, c: &Call, span: Span, frame: &mut Frame) -> Result<Value> {
        let mut values = Vec::with_capacity(c.args.len());
        for a in &c.args {
            values.push(self.expr(&a.value, frame)?);
        }
        let args = c.args.iter().zip(values).map(|(a, value)| bind::Arg {
            name: a.name.as_ref(),
            value,
            span: a.value.span,
        });
        let block = if c.op_only { None } else { self.module.callable(&c.callee.name) };
        if let Some((item, src)) = block {
            let what = || format!("block `{}`", item.name.name);
            let slots = bind(&item.params[..], args, what, self.span(span))?;
            return self.block_call(c, item, src, span, slots, frame);
        }
        let Some(sig) = ops::op(&c.callee.name) else {
            return Err(
                err!(Name, "unknown op or block `{}`", c.callee.name).at(self.span(c.callee.span))
            );
        };
        let slots = bind(sig.params, args, || format!("`{}`", sig.usage()), self.span(span))?;
        self.op(&sig, slots, self.span(span), &frame.prefix)
    }

    fn block_call(
        &mut self,
        c: &Call,
        item: &Item,
        src: &Arc<Source>,
        span: Span,
        args: Slots,
        frame: &mut Frame,
    ) -> Result<Value> {
        let call_span = self.span(span);
        if self.depth >= MAX_CALL_DEPTH {
            return Err(
                err!(Name, "block calls nested deeper than {MAX_CALL_DEPTH} levels").at(call_span)
            );
        }
        // Name the scope.
        let short = match &c.alias {
            Some(a) => a.name.clone(),
            None => frame.anonymous(&c.callee.name),
        };
        let alias_span = c.alias.as_ref().map_or(c.callee.span, |a| a.span);
        self.claim(format!("{}{short}", frame.prefix), alias_span, &short).map_err(|e| {
            match c.alias {
                Some(_) => e,
                // The name was made here, not written: say so, and how to choose another.
                None => err!(
                    Name,
                    "duplicate name `{short}`: this anonymous `{0}` call is named by its place \
                     (`{0}_<k>`), and `{short}` is taken already (by an `as {short}` or a \
                     parameter); name this call with `as NAME`",
                    c.callee.name
                )
                .at(self.span(alias_span)),
            }
        })?;
        let mut callee = Frame::new(format!("{}{short}.", frame.prefix));
        let is_std = src.name == STD_NAME && self.outer_span.is_none();
        let saved = self.outer_span;
        if is_std {
            self.outer_span = Some(call_span);
        }
        self.depth += 1;
        let r = self.block_body(item, &mut callee, args, call_span);
        self.depth -= 1;
        self.outer_span = saved;
        r.map_err(|mut e| {
            if is_std {
                // An op's message already starts with its name (`conv2d: ...`).
                let name = &item.name.name;
                if !e.message.starts_with(&format!("{name}: ")) {
                    e.message = format!("in `{name}`: {}", e.message);
                }
                e.span = Some(call_span);
            }
            e
        })
    }

    /// Binds a block's parameters in `callee` and runs its body: given hyperparameters first,
    /// then tensor arguments against their patterns, then defaults (which may use the
    /// dimensions just bound), then the dimensions that had to wait for a hyperparameter.
    fn block_body(
        &mut self,
        item: &Item,
        callee: &mut Frame,
        args: Slots,
        call_span: Span,
    ) -> Result<Value> {
        let hypers: HashSet<&str> = item.hyper_names().collect();
        for (p, a) in item.params.iter().zip(&args) {
            if let (SigParam::Hyper { name, .. }, Some((v, _))) = (p, a) {
                callee.env.insert(name.name.clone(), v.clone());
            }
        }
        let mut deferred: Vec<Deferred> = Vec::new();
        for (p, a) in item.params.iter().zip(&args) {
            let (SigParam::Tensor { name, dtype, dims, .. }, Some((v, vspan))) = (p, a) else {
                continue;
            };
            let vspan = self.span(*vspan);
            let Value::Tensor(id) = *v else {
                return Err(err!(
                    Name,
                    "argument `{}` of `{}` must be a tensor, got {}",
                    name.name,
                    item.name.name,
                    v.kind()
                )
                .at(vspan));
            };
            let got_dtype = self.g.dtype(id);
            if got_dtype != *dtype {
                return Err(err!(
                    Shape,
                    "argument `{}` of `{}` must be {dtype}, got {got_dtype}",
                    name.name,
                    item.name.name
                )
                .at(vspan));
            }
            let place = (name.name.as_str(), item.name.name.as_str(), vspan);
            let shape = self.g.shape(id).to_vec();
            pattern::match_shape(&shape, dims, place, &hypers, &mut callee.env, &mut deferred)?;
            callee.env.insert(name.name.clone(), Value::Tensor(id));
        }
        for (p, a) in item.params.iter().zip(&args) {
            if let (SigParam::Hyper { name, default: Some(e) }, None) = (p, a) {
                let v = self.expr(e, callee)?;
                callee.env.insert(name.name.clone(), v);
            }
        }
        pattern::check_deferred(deferred, &callee.env)?;
        match self.body(&item.body, callee)? {
            Some((mut vals, _)) if vals.len() == 1 => Ok(vals.remove(0).1),
            Some((_, rspan)) => Err(err!(Name, "a block returns one value").at(self.span(rspan))),
            None => Err(err!(Name, "block `{}` has no `return`", item.name.name).at(call_span)),
        }
    }
}
