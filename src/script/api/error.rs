//! The `Error` type scripts see: what `catch (e)` binds when a rumus call fails. Its text is
//! `file:line:col: message` (the place in a model block, a data file or a script when the error
//! has one) or the message alone, for `print(e)`, `e.to_string()` and `` `${e}` ``; `e.message`
//! is the message, `e.line` and `e.position` the line and column or `()`, the property names
//! rhai gives its own caught errors (an object map), so a `catch` block reads both alike.

use super::super::convert::Carried;
use rhai::{Dynamic, Engine, INT};

/// Register the type, its text and its properties.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Carried>("Error");
    engine.register_fn("to_string", |e: &mut Carried| text(e));
    engine.register_fn("to_debug", |e: &mut Carried| text(e));
    let hint = "`throw` a new error to change it";
    super::read_only(engine, "Error", "message", hint, |e: &mut Carried| Ok(e.0.message.clone()));
    super::read_only(engine, "Error", "line", hint, |e: &mut Carried| {
        Ok(at(e, |(_, line, _)| line))
    });
    super::read_only(engine, "Error", "position", hint, |e: &mut Carried| {
        Ok(at(e, |(_, _, col)| col))
    });
}

/// `file:line:col: message`, or the message when the error has no position.
pub fn text(e: &Carried) -> String {
    match e.0.location() {
        Some((file, line, col)) => {
            format!("{}:{line}:{col}: {}", crate::error::escape(&file), e.0.message)
        }
        None => e.0.message.clone(),
    }
}

fn at(e: &Carried, part: fn((String, usize, usize)) -> usize) -> Dynamic {
    e.0.location().map_or(Dynamic::UNIT, |l| Dynamic::from(part(l) as INT))
}
