//! Everything scripts see, registered per type in one place: one module per type, each with a
//! `register` function, and [`register`] calling them all. Every fallible binding returns a
//! script error (a [`Carried`](super::convert::Carried) rumus error), never panics.

pub mod data;
pub mod doc;
pub mod error;
pub mod evaluate;
pub mod io;
pub mod math;
pub mod model;
pub mod tensor;

use super::Ctx;
use std::sync::Arc;

/// Register every type and function of the script API.
pub fn register(engine: &mut rhai::Engine, ctx: &Arc<Ctx>) {
    tensor::register(engine, ctx);
    math::register(engine, ctx);
    data::register(engine, ctx);
    model::register(engine, ctx);
    evaluate::register(engine, ctx);
    io::register(engine, ctx);
    error::register(engine);
}

/// Register property `name` of `T`, read by `get`, as read-only. rhai drops a write made
/// through a getter that has no setter (`d.x[[0, 0]] = 9` changed a copy and said nothing,
/// `t.shape[0] = 5` as well), so the property gets a setter that fails with `hint`, what to do
/// instead. rhai also writes the value back after any method that takes it by reference
/// (`t.shape.len()`, `d.y.sum()`), changed or not: the setter lets a value through that
/// [`unchanged`] says is the property's own.
pub fn read_only<T, V>(
    engine: &mut rhai::Engine,
    ty: &'static str,
    name: &'static str,
    hint: &'static str,
    get: impl Fn(&mut T) -> super::convert::ScriptResult<V> + Clone + Send + Sync + 'static,
) where
    T: Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    engine.register_get(name, get.clone());
    engine.register_set(name, move |obj: &mut T, new: rhai::Dynamic| -> super::convert::ScriptResult<()> {
        if unchanged(&rhai::Dynamic::from(get(obj)?), &new) {
            return Ok(());
        }
        Err(super::convert::script_err(format!(
            "`{name}` of a {ty} is read-only (writing it, or an element of it, would change a copy): {hint}"
        )))
    });
}

/// Whether `new` is `old` as a property's getter gave it: the same tensor (not a copy that an
/// element write made), equal numbers (bit for bit), text, flags and arrays of them.
fn unchanged(old: &rhai::Dynamic, new: &rhai::Dynamic) -> bool {
    use rhai::{Array, ImmutableString, FLOAT, INT};
    if let (Some(a), Some(b)) =
        (old.read_lock::<tensor::ScriptTensor>(), new.read_lock::<tensor::ScriptTensor>())
    {
        return a.same(&b);
    }
    if let (Some(a), Some(b)) = (old.read_lock::<Array>(), new.read_lock::<Array>()) {
        return a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| unchanged(x, y));
    }
    if let (Some(a), Some(b)) = (old.read_lock::<FLOAT>(), new.read_lock::<FLOAT>()) {
        return a.to_bits() == b.to_bits();
    }
    if let (Some(a), Some(b)) = (old.read_lock::<INT>(), new.read_lock::<INT>()) {
        return *a == *b;
    }
    if let (Some(a), Some(b)) =
        (old.read_lock::<ImmutableString>(), new.read_lock::<ImmutableString>())
    {
        return *a == *b;
    }
    if let (Some(a), Some(b)) = (old.read_lock::<bool>(), new.read_lock::<bool>()) {
        return *a == *b;
    }
    old.is_unit() && new.is_unit()
}

/// The type of a script value as scripts know it: rumus's own by the names the script engine
/// registers (`Tensor`, `Dataset`, ...), others as rhai names them (`i64`, `array`, ...).
/// (`Dynamic::type_name` gives a registered type's Rust path: messages said "got
/// rumus::script::api::tensor::ScriptTensor".)
pub fn type_name(v: &rhai::Dynamic) -> &'static str {
    let full = v.type_name();
    match full.rsplit("::").next().unwrap_or(full) {
        "ScriptTensor" => "Tensor",
        "ScriptDataset" => "Dataset",
        "ScriptBatch" => "Batch",
        "ScriptModel" => "Model",
        "ScriptTrainer" => "Trainer",
        "Carried" => "Error",
        _ => full,
    }
}

/// A script value as the REPL shows it (the API's own types by their `to_string`).
pub fn display(v: &rhai::Dynamic) -> String {
    if let Some(t) = v.read_lock::<tensor::ScriptTensor>() {
        return t.to_string();
    }
    if let Some(d) = v.read_lock::<data::ScriptDataset>() {
        return data::describe(&d);
    }
    if let Some(m) = v.read_lock::<model::ScriptModel>() {
        return format!("model {}", m.model.name);
    }
    if let Some(t) = v.read_lock::<model::ScriptTrainer>() {
        return model::describe_trainer(&t);
    }
    if let Some(e) = v.read_lock::<super::convert::Carried>() {
        return error::text(&e);
    }
    v.to_string()
}

/// The text of the REPL's `:plan`, `:graph` and `:params` for a script value.
pub fn describe(what: &str, value: &rhai::Dynamic) -> crate::Result<String> {
    if let Some(t) = value.clone().try_cast::<model::ScriptTrainer>() {
        let tr = t.lock()?;
        return Ok(match what {
            "plan" => format!("{}\n", tr.plan_report()),
            "graph" => {
                // Grouped by the kernels of the compiled training step.
                let g = tr.graph();
                let loss: Vec<_> = g.output("loss").into_iter().collect();
                let p = crate::plan::plan(g, &loss, true, Default::default()).ok();
                crate::plan::report::dot(g, "model", p.as_ref())
            }
            _ => model::params_text(tr.graph()),
        });
    }
    if let Some(m) = value.clone().try_cast::<model::ScriptModel>() {
        let g = model::model_graph(&m)?;
        return match what {
            "plan" => Err(crate::err!(
                Usage,
                ":plan needs a compiled model (a trainer); compile it first"
            )),
            "graph" => Ok(crate::plan::report::dot(&g, "model", None)),
            _ => Ok(model::params_text(&g)),
        };
    }
    // A plan is a trainer's (as said above for a model); the graph and parameters either's.
    let needs =
        if what == "plan" { "a compiled model (a trainer)" } else { "a model or a trainer" };
    Err(crate::err!(InvalidArgument, ":{what} needs {needs}, got {}", type_name(value)))
}
