//! Ctrl-C: the first press sets the session's [`Interrupt`] flag, which the script polls at its
//! next operation (so it stops with an `Interrupted` error: `rumus run` exits 130, the REPL
//! returns to its prompt); a second press while the flag is still set exits at once with 130
//! (for a long native call that cannot be stopped), saying so.
//!
//! rustyline replaces the SIGINT handler when its editor is created, so the REPL installs this
//! one after creating the editor.

use super::engine::Interrupt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Route SIGINT to `interrupt` for the rest of the process: the first call picks the flag,
/// every call (re)installs the handler, undoing a library that replaced it.
pub fn install(interrupt: &Interrupt) {
    let _ = FLAG.set(interrupt.flag());
    install_handler();
}

#[cfg(unix)]
fn install_handler() {
    extern "C" fn on_sigint(_: libc::c_int) {
        // Only an atomic swap, `write` and `_exit`: async-signal-safe.
        if let Some(flag) = FLAG.get() {
            if flag.swap(true, Ordering::SeqCst) {
                const MSG: &[u8] = b"\ninterrupted twice: exiting\n";
                unsafe {
                    libc::write(2, MSG.as_ptr().cast(), MSG.len());
                    libc::_exit(130);
                }
            }
        }
    }
    // SAFETY: the handler only touches atomics, `write` and `_exit`, which are allowed in a
    // signal handler.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
}

#[cfg(not(unix))]
fn install_handler() {}
