//! A bound on how deeply a script's values nest (arrays, maps and closures' captured values
//! inside one another).
//!
//! Rhai walks a value by recursion on the native stack when it clones, drops, prints, compares
//! or size-checks it, and no limit of its own bounds the nesting: `for i in 0..3000000 { let g =
//! f; f = || g; }` built a chain of closures whose drop overflowed the stack (an abort), and
//! `a = [a]` in a loop copied and size-checked the whole nesting at every step (time quadratic
//! in the depth) before it overflowed the stack too. Rhai has no hook where values are built, so
//! the bound is checked where every nesting starts: a value is read from a variable (rhai's
//! `on_var`, [`check`]) before it is wrapped, captured or stored, and a value nested more than
//! [`MAX_NESTING`] levels deep is refused there. A value can still be built a little deeper
//! than that in one operation (a literal or an index chain is at most the expression depth
//! limit, 64, deep), so what a script holds stays below about `2 × MAX_NESTING` levels, a few
//! hundred kilobytes of native stack for rhai's deepest walk.
//!
//! The check visits at most [`WALK_BUDGET`] values and skips an array or map longer than what
//! is left of that budget, so reading a large array costs what it did (`big[i]` in a loop
//! stays constant time). A value whose walk runs out of budget before its nesting is seen
//! passes unchecked: every [`MAX_NESTING`] levels of such a value must then hold
//! `WALK_BUDGET / MAX_NESTING` other values (16 KiB), which the array size limit (for arrays
//! and maps) or the heap limit (`Sandbox::heap_limit`, for closures) bounds.

use super::convert::{to_rhai, ScriptResult};
use crate::err;
use rhai::{Dynamic, EvalContext, FnPtr};
use std::collections::HashSet;

/// Deepest nesting of arrays, maps and closures' captured values a script may read.
pub const MAX_NESTING: usize = 64;

/// Most values one check visits.
pub const WALK_BUDGET: usize = 1 << 16;

/// The `on_var` callback: refuse to read variable `name` when its value nests more than
/// [`MAX_NESTING`] levels deep.
pub fn check(name: &str, index: usize, ctx: EvalContext) -> ScriptResult<Option<Dynamic>> {
    let scope = ctx.scope();
    let value = match index {
        0 => scope.get(name),
        // `index` counts from the scope's end, 1 for the last variable; `iter_raw` runs from
        // the end too.
        i => scope.iter_raw().nth(i - 1).map(|(.., v)| v),
    };
    match value {
        Some(v) if too_deep(v) => Err(to_rhai(err!(
            Limit,
            "`{name}` holds values nested more than {MAX_NESTING} levels deep (arrays, maps or \
             closures inside one another), past the nesting limit: keep the data flatter (an \
             array of rows, a map of names to values) or build it as a tensor"
        ))),
        _ => Ok(None),
    }
}

/// Whether `v` nests more than [`MAX_NESTING`] levels deep, as far as [`WALK_BUDGET`] values
/// show.
pub fn too_deep(v: &Dynamic) -> bool {
    Walk { budget: WALK_BUDGET, seen: HashSet::new() }.deeper_than(v, MAX_NESTING)
}

struct Walk {
    /// Values still to visit.
    budget: usize,
    /// Shared values (closures' captures) already walked, by address: a value captured by
    /// many closures is walked once, and a closure that captured itself ends the walk.
    seen: HashSet<usize>,
}

impl Walk {
    /// Whether `v` holds more than `room` containers inside one another. The recursion is at
    /// most `2 × MAX_NESTING` deep (a container uses one level of room, a shared value holds
    /// one that is not shared).
    fn deeper_than(&mut self, v: &Dynamic, room: usize) -> bool {
        if self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        if v.is_shared() {
            // `None`: locked for writing by the operation that reads it; nothing to walk now.
            let Some(inner) = v.read_lock::<Dynamic>() else { return false };
            if !self.seen.insert(&*inner as *const Dynamic as usize) {
                return false;
            }
            return self.deeper_than(&inner, room);
        }
        if v.is_array() {
            let Ok(items) = v.as_array_ref() else { return false };
            return self.container(items.iter(), items.len(), room);
        }
        if v.is_map() {
            let Ok(map) = v.as_map_ref() else { return false };
            return self.container(map.values(), map.len(), room);
        }
        if v.is_fnptr() {
            if let Some(f) = v.read_lock::<FnPtr>() {
                if !f.curry().is_empty() {
                    return self.container(f.iter_curry(), f.curry().len(), room);
                }
            }
        }
        false
    }

    fn container<'a>(
        &mut self,
        mut items: impl Iterator<Item = &'a Dynamic>,
        len: usize,
        room: usize,
    ) -> bool {
        if room == 0 {
            return true;
        }
        if len > self.budget {
            // Too large to walk at every read; see the module's documentation.
            self.budget = 0;
            return false;
        }
        items.any(|x| self.deeper_than(x, room - 1))
    }
}
