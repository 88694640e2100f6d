//! Running a script in a fresh session and collecting what it prints, for the script tests.

use rumus::error::Source;
use rumus::script::{Host, HostOptions};
use std::cell::RefCell;
use std::rc::Rc;

/// Run `code` in a fresh session with `opts`; its printed lines, then `error: ...` if it failed.
pub fn printed(opts: HostOptions, code: &str) -> String {
    let mut h = Host::new(opts);
    let out = Rc::new(RefCell::new(String::new()));
    let o = out.clone();
    h.on_print(move |s| {
        o.borrow_mut().push_str(s);
        o.borrow_mut().push('\n');
    });
    if let Err(e) = h.eval(&Source::new("t.rms", code)) {
        out.borrow_mut().push_str(&format!("error: {}\n", e.message));
    }
    let s = out.borrow().clone();
    s
}
