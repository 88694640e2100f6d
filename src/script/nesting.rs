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
//! The check visits at most [`WALK_BUDGET`] containers (arrays, maps, closures, shared values)
//! and passes over scalars by their tag, without a call (about 0.4 ns each in release); it does
//! not look into an array or map longer than [`SCAN_LIMIT`] entries but goes on with the
//! values beside it. So reading an array costs at most a scan of 65,536 tags (about 26 µs),
//! and reading a longer one costs what it did (`big[i]` in a loop stays constant time); the
//! first version visited every scalar by a recursive call, and reading an array of 60,000
//! numbers in a loop took ten times as long as without the check (now 3.3 times: 0.96 to 3.2 s).
//!
//! What the check does not see, it does not bound. A value passes unchecked when its walk runs
//! out of budget, which takes `WALK_BUDGET / MAX_NESTING` (1,024) containers a level, or when
//! its nesting goes on below an array or map longer than [`SCAN_LIMIT`]. A long array counts
//! as one container and the walk goes on beside it (ending the walk there would let one long
//! array hide any sibling), but what is below it is not seen. The walk sees the top 64 levels
//! and an expression wraps what it read at most 64 levels deeper, so a chain built by reading
//! and wrapping holds a long array (65,537 entries, 1 MiB) every 128 levels: 8 KiB of heap a
//! level, for up to 2 KB of stack a level in rhai's print and `==` (arrays and maps; a closure
//! prints by name, and its drop takes about 350 bytes a level). Such a chain needs a heap four
//! times the stack it overflows; the `rumus` binary runs scripts on a stack of half its heap
//! limit (`src/main.rs`), so the heap limit stops the chain first. (A `SCAN_LIMIT` of 4,096
//! made reads of arrays up to that length cheaper still, but let 64 MiB of chain overflow a
//! 256 MiB stack.) Nesting inside one long array (`a.push([a.pop()])` in a loop) is bounded by
//! time: each step costs rhai a size check of the whole nesting, so `n` levels take time
//! quadratic in `n` (40,000 took 26 s in release, and print needs over 100,000 levels to
//! overflow 256 MiB). A host that runs scripts it did not write on its own threads bounds
//! their time and operations (`Sandbox::bounded`), and its stack is its own.
use super::convert::{to_rhai, ScriptResult};
use crate::err;
use rhai::{Dynamic, EvalContext, FnPtr};
use std::collections::HashSet;

/// Deepest nesting of arrays, maps and closures' captured values a script may read.
pub const MAX_NESTING: usize = 64;

/// Most containers (arrays, maps, closures, shared values) one check visits.
pub const WALK_BUDGET: usize = 1 << 16;

/// Longest array or map one check looks into.
pub const SCAN_LIMIT: usize = 1 << 16;

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

/// Whether `v` nests more than [`MAX_NESTING`] levels deep, as far as [`WALK_BUDGET`]
/// containers and arrays and maps of at most [`SCAN_LIMIT`] entries show.
pub fn too_deep(v: &Dynamic) -> bool {
    Walk { budget: WALK_BUDGET, seen: HashSet::new() }.deeper_than(v, MAX_NESTING)
}

/// Whether `v` can hold other values: an array, a map, a closure or a shared value (what rhai
/// walks by recursion). A match on the value's tag for anything not shared.
fn is_container(v: &Dynamic) -> bool {
    v.is_shared() || v.is_array() || v.is_map() || v.is_fnptr()
}

struct Walk {
    /// Containers still to visit.
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
        if self.budget == 0 || !is_container(v) {
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
        if let Some(f) = v.read_lock::<FnPtr>() {
            if !f.curry().is_empty() {
                return self.container(f.iter_curry(), f.curry().len(), room);
            }
        }
        false
    }

    fn container<'a>(
        &mut self,
        items: impl Iterator<Item = &'a Dynamic>,
        len: usize,
        room: usize,
    ) -> bool {
        if room == 0 {
            return true;
        }
        if len > SCAN_LIMIT {
            // Too long to scan at every read; see the module's documentation.
            return false;
        }
        for x in items {
            // The scalars, most of a large array, are passed over without a call.
            if is_container(x) && self.deeper_than(x, room - 1) {
                return true;
            }
        }
        false
    }
}
