//! Running a script in a fresh session and collecting what it prints, for the script tests.

use rumus::error::Source;
use rumus::script::{Host, HostOptions};
use std::sync::{Arc, Mutex};

/// What a session's scripts printed, one line each (the sink is `Send`, as sessions are).
pub type Printed = Arc<Mutex<String>>;

/// Collect what `h`'s scripts print from now on.
pub fn capture(h: &mut Host) -> Printed {
    let out = Printed::default();
    let o = out.clone();
    h.on_print(move |s| o.lock().unwrap().push_str(&format!("{s}\n")));
    out
}

/// Run `code` in a fresh session with `opts`; its printed lines, then `error: ...` if it failed.
pub fn printed(opts: HostOptions, code: &str) -> String {
    let mut h = Host::new(opts);
    let out = capture(&mut h);
    if let Err(e) = h.eval(&Source::new("t.rms", code)) {
        out.lock().unwrap().push_str(&format!("error: {}\n", e.message));
    }
    let s = out.lock().unwrap().clone();
    s
}
