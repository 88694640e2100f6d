//! Resolved module → [`Graph`]: instantiates one model with hyperparameters and input
//! dimensions, evaluating static values (hyperparameters, dimensions, `4 * d`), matching tensor
//! patterns, naming parameters by scope (`blocks.0.attn.qkv.weight`), and building nodes through
//! the graph's checked builder, which reports shape mistakes at the current span.
//!
//! Every node carries the span of the user expression it came from; nodes made inside a
//! standard-library block carry the span of the user's call of that block, and errors raised
//! there are moved to that call too. Lowering is bounded: block calls nest at most
//! [`MAX_CALL_DEPTH`] deep and at most [`MAX_STEPS`] statements and expressions are evaluated,
//! so no model makes lowering hang.
//!
//! This file owns the lowerer's state and the model's own instantiation (its hyperparameters,
//! inputs and outputs); the rest is in parts:
//! - `eval`: statements and expressions (static arithmetic, `param`, initializers);
//! - `call`: calls, block activations and their scopes;
//! - `pattern`: tensor patterns (`x: f32[..., IN]`) against shapes;
//! - `args`: an op call's arguments, typed, for the lowerings in [`super::ops`].

mod args;
mod call;
mod eval;
mod pattern;

pub(crate) use args::Args;

use super::ast::*;
use super::resolve::Module;
use crate::err;
use crate::error::{Error, Result, Span};
use crate::graph::{Graph, NodeId};
use std::collections::{HashMap, HashSet};

/// Deepest nesting of block calls.
pub const MAX_CALL_DEPTH: usize = 64;
/// Most statements and expressions one instantiation may evaluate.
pub const MAX_STEPS: usize = 200_000;
/// Largest dimension accepted.
pub const MAX_DIM: i64 = 1 << 31;

/// A value in the language: static (known while lowering) or a tensor (a graph node).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<Value>),
    Tensor(NodeId),
}

impl Value {
    /// Values in it, itself included: a list's copy costs that many steps.
    fn size(&self) -> usize {
        match self {
            Value::List(items) => 1 + items.iter().map(Value::size).sum::<usize>(),
            _ => 1,
        }
    }

    /// The value as a message shows it: numbers and lists written out (a float with its
    /// decimal point, `2.0`, so it reads apart from the integer 2; at most 8 entries of a list),
    /// a tensor by its kind.
    fn show(&self) -> String {
        match self {
            Value::Int(i) => i.to_string(),
            Value::Float(f) => format!("{f:?}"),
            Value::Bool(b) => b.to_string(),
            Value::Tensor(_) => "a tensor".to_string(),
            Value::List(vs) => {
                let mut items: Vec<String> = vs.iter().take(8).map(Value::show).collect();
                if vs.len() > 8 {
                    items.push(format!("... ({} entries)", vs.len()));
                }
                format!("[{}]", items.join(", "))
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Bool(_) => "a boolean",
            Value::List(_) => "a list",
            Value::Tensor(_) => "a tensor",
        }
    }
}

/// Whether `e`, the error of lowering `model` with its unset dimensions at `default_dim`, comes
/// from that size (`x @ x` of an `f32[B, 4]` is a model only at B = 4; `B / 2` at B = 1) rather
/// than from the model itself: lowered again with them 5 larger (`OTHER_DIM`), the model does not
/// fail with the same message.
pub fn size_dependent(
    module: &Module,
    model: &str,
    bindings: &[(&str, Value)],
    default_dim: i64,
    e: &Error,
) -> bool {
    let again = lower(module, model, bindings, Some(default_dim + OTHER_DIM));
    again.err().is_none_or(|again| again.message != e.message)
}

/// How much larger than the default size [`size_dependent`] sets the unset dimensions.
const OTHER_DIM: i64 = 5;

/// Instantiate `model` from `module` into a graph. `bindings` set hyperparameters and the named
/// dimensions of the model's inputs (e.g. `B`, `T`); a dimension left unset takes `default_dim`
/// when given, and is an error otherwise.
pub fn lower(
    module: &Module,
    model: &str,
    bindings: &[(&str, Value)],
    default_dim: Option<i64>,
) -> Result<Graph> {
    let Some((item, src)) = module.item(model) else {
        let models: Vec<String> = module
            .models()
            .filter(|m| !module.is_std(&m.name.name))
            .map(|m| m.name.name.clone())
            .collect();
        let have = match models.is_empty() {
            true => "the source has none".to_string(),
            false => format!("its models: {}", crate::error::name_list(&models)),
        };
        return Err(err!(Name, "no model named `{model}` ({have})"));
    };
    if item.kind != ItemKind::Model {
        return Err(err!(Name, "`{model}` is a block, not a model"));
    }
    let mut lw = Lowerer {
        module,
        g: Graph::new(),
        steps: 0,
        depth: 0,
        claimed: HashSet::new(),
        outer_span: None,
    };
    lw.model(item, bindings, default_dim).map_err(|e| e.in_source(src))?;
    Ok(lw.g)
}

struct Lowerer<'m> {
    module: &'m Module,
    g: Graph,
    steps: usize,
    depth: usize,
    /// Dotted names taken by parameters and named scopes.
    claimed: HashSet<String>,
    /// While inside a standard-library block: the user's call span, used for every node/error.
    outer_span: Option<Span>,
}

/// Variables of one block or model activation.
struct Frame {
    env: HashMap<String, Value>,
    /// Dotted prefix of this scope ("" at the model's root, else ending in ".").
    prefix: String,
    /// Anonymous calls per (prefix, block), for `<block>_<k>` names, and anonymous `repeat`s
    /// per prefix (under the keyword, which names no block), for `repeat_<k>`.
    anon: HashMap<(String, String), usize>,
}

impl Frame {
    fn new(prefix: String) -> Frame {
        Frame { env: HashMap::new(), prefix, anon: HashMap::new() }
    }

    /// The name of the next anonymous `kind` (a block's name, or `repeat`) in this scope:
    /// `<kind>_<k>`, named by place.
    fn anonymous(&mut self, kind: &str) -> String {
        let k = self.anon.entry((self.prefix.clone(), kind.to_string())).or_insert(0);
        *k += 1;
        format!("{kind}_{}", *k - 1)
    }
}

/// A model's division by a constant that is 0 as an f32 is an error, however it is spelled
/// (`x / 0`, `div(x, 0)`, `x / 1e-46`, which rounds to 0): every element would be infinite or
/// NaN, and a GPU need not keep them (WGSL lets a compiler assume there are none: lavapipe
/// folded `x / 0.0` to 0). The graph itself takes such a division (codegen folds one of two
/// constants as the CPU computes it).
fn nonzero_divisor(g: &Graph, divisor: NodeId) -> Result<()> {
    if matches!(g.node(divisor).op, crate::graph::Op::Constant { value } if value == 0.0) {
        return Err(err!(
            Name,
            "division by zero: the divisor is 0 as an f32, which makes every element of the tensor infinite or NaN; divide by a nonzero number"
        ));
    }
    Ok(())
}

/// What a model's bindings may set, for messages: "hyperparameters `a`, `b`; dimensions `B`".
fn settable(item: &Item) -> String {
    let (mut hypers, mut dims) = (Vec::new(), Vec::new());
    for p in &item.params {
        match p {
            SigParam::Hyper { name, .. } => hypers.push(name.name.clone()),
            SigParam::Tensor { dims: ds, .. } => {
                for d in ds {
                    if let DimPat::Name(n) = d {
                        if !dims.contains(&n.name) {
                            dims.push(n.name.clone());
                        }
                    }
                }
            }
        }
    }
    // At most 8 names of each (a signature may hold 100,000).
    let list = |what: &str, v: Vec<String>| match v.is_empty() {
        true => format!("no {what}"),
        false => format!("{what} {}", crate::error::name_list(&v)),
    };
    format!("it has {}; {}", list("hyperparameters", hypers), list("dimensions", dims))
}

impl Lowerer<'_> {
    fn span(&self, s: Span) -> Span {
        self.outer_span.unwrap_or(s)
    }

    fn step(&mut self, span: Span) -> Result<()> {
        self.steps_of(1, span)
    }

    /// `n` steps at once: work that grows with a value, where one step per expression let
    /// `a = [a, a, a, a, a, a, a, a, a, a]` repeated 9 times build 10^10 values.
    fn steps_of(&mut self, n: usize, span: Span) -> Result<()> {
        self.steps = self.steps.saturating_add(n);
        if self.steps > MAX_STEPS {
            return Err(err!(Name, "model is too large to lower: more than {MAX_STEPS} steps")
                .at(self.span(span)));
        }
        Ok(())
    }

    fn claim(&mut self, name: String, span: Span, short: &str) -> Result<()> {
        if !self.claimed.insert(name) {
            return Err(err!(Name, "duplicate name `{short}`").at(self.span(span)));
        }
        Ok(())
    }

    fn model(
        &mut self,
        item: &Item,
        bindings: &[(&str, Value)],
        default_dim: Option<i64>,
    ) -> Result<()> {
        let mut given: HashMap<String, Value> = HashMap::new();
        let dim_names: HashSet<&str> = item
            .params
            .iter()
            .flat_map(|p| match p {
                SigParam::Tensor { dims, .. } => dims.iter().collect(),
                _ => Vec::new(),
            })
            .filter_map(|d| match d {
                DimPat::Name(n) => Some(n.name.as_str()),
                _ => None,
            })
            .collect();
        // By name: a search of the signature for each binding made a model of 60,000
        // hyperparameters, all given by a script, take 4 s to lower (at every call, compile
        // and new batch size).
        let hyper_names: HashSet<&str> = item
            .params
            .iter()
            .filter_map(|p| match p {
                SigParam::Hyper { name, .. } => Some(name.name.as_str()),
                _ => None,
            })
            .collect();
        for (name, v) in bindings {
            if !hyper_names.contains(name) && !dim_names.contains(name) {
                return Err(err!(
                    Name,
                    "model `{}` has no hyperparameter or dimension `{name}` ({})",
                    item.name.name,
                    settable(item)
                ));
            }
            given.insert(name.to_string(), v.clone());
        }
        let mut frame = Frame::new(String::new());
        // Hyperparameters: given values, else defaults, in order (defaults may use earlier ones).
        for p in &item.params {
            if let SigParam::Hyper { name, default } = p {
                let v = match (given.get(&name.name), default) {
                    (Some(v), _) => v.clone(),
                    (None, Some(e)) => self.expr(e, &mut frame)?,
                    (None, None) => {
                        return Err(err!(
                            Name,
                            "hyperparameter `{}` has no default and was not set",
                            name.name
                        )
                        .at(name.span))
                    }
                };
                frame.env.insert(name.name.clone(), v);
            }
        }
        for p in &item.params {
            let SigParam::Tensor { name, dtype, dims, .. } = p else {
                continue;
            };
            let shape = pattern::input_shape(name, dims, &given, &mut frame.env, default_dim)?;
            self.g.set_span(name.span);
            let id = self.g.input(&name.name, &shape, *dtype)?;
            frame.env.insert(name.name.clone(), Value::Tensor(id));
        }
        let values = self.body(&item.body, &mut frame)?;
        let Some((exprs, _)) = values else {
            return Err(err!(Name, "model `{}` has no `return`", item.name.name).at(item.name.span));
        };
        let n = exprs.len();
        let mut names = HashSet::new();
        for (i, (e, v)) in exprs.into_iter().enumerate() {
            let name = match &e.kind {
                ExprKind::Name(n) => n.clone(),
                ExprKind::Call(Call { alias: Some(a), .. }) => a.name.clone(),
                _ if n == 1 => "output".to_string(),
                _ => format!("output_{i}"),
            };
            let Value::Tensor(id) = v else {
                return Err(
                    err!(Name, "output `{name}` must be a tensor, got {}", v.kind()).at(e.span)
                );
            };
            if !names.insert(name.clone()) {
                return Err(err!(Name, "duplicate output name `{name}`").at(e.span));
            }
            self.g.set_output(&name, id);
        }
        Ok(())
    }
}

/// A static number as the f32 the graph stores: a finite number outside f32's range is an error
/// at `span`, as an out-of-range literal is, and so is an integer without an exact f32 value
/// (16777217 would be 16777216; a float rounds, as floats do).
fn f32_at(v: &Value, span: Span) -> Result<f32> {
    match v {
        Value::Int(i) => crate::num::f32_of_int(*i).map_err(|m| {
            err!(Name, "{m}: write it as a float ({i}.0) to accept rounding").at(span)
        }),
        v => crate::num::f32_of(num(v)).map_err(|m| err!(Name, "{m}").at(span)),
    }
}

/// A static number as f64 (NaN for anything else; callers match numbers first).
fn num(v: &Value) -> f64 {
    match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}
