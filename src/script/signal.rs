//! Ctrl-C: the first press sets the session's [`Interrupt`] flag, which the script polls at its
//! next operation (so it stops with an `Interrupted` error: `rumus run` exits 130, the REPL
//! returns to its prompt); a second press while the flag is still set exits at once with 130
//! (for a long native call that cannot be stopped), saying so. A first press that has not
//! stopped the script within a second says that it will stop when the running call returns.
//! The flag is cleared when an evaluation ends.
//!
//! The `ctrlc` crate catches the signal (SIGINT on Unix, the console's Ctrl-C event on
//! Windows) and runs the handler on a thread of its own, not inside the signal handler, so
//! the handler may print and exit like any code.
//!
//! rustyline replaces the SIGINT handler for as long as its editor lives, so the REPL installs
//! this one after creating the editor.

use super::engine::Interrupt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// How long a Ctrl-C may go unanswered before rumus says why.
const NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Route Ctrl-C to `interrupt` for the rest of the process: the first call picks the flag and
/// installs the handler; later calls change nothing.
pub fn install(interrupt: &Interrupt) {
    if FLAG.set(interrupt.flag()).is_err() {
        return;
    }
    let handler = || {
        if let Some(flag) = FLAG.get() {
            if flag.swap(true, Ordering::SeqCst) {
                eprintln!("\ninterrupted twice: exiting");
                std::process::exit(130);
            }
            // A script stops within milliseconds; a long native call (a prediction over a
            // large batch) only when it returns: say so if it has not stopped in a second.
            // (A thread that cannot start only costs the notice; a panic here would end the
            // handler's thread, and with it the second press's exit.)
            let flag = flag.clone();
            let _ = std::thread::Builder::new().spawn(move || {
                std::thread::sleep(NOTICE_AFTER);
                if flag.load(Ordering::SeqCst) {
                    eprintln!("\nstopping when the running call returns (Ctrl-C again exits now)");
                }
            });
        }
    };
    // Without a handler (the platform refused one) Ctrl-C keeps its default, ending the
    // process, which is what it would do anyway; nothing else is lost.
    let _ = ctrlc::set_handler(handler);
}
