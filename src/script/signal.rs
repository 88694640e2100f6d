//! Ctrl-C: the first press sets the session's [`Interrupt`] flag, which the script polls at its
//! next operation (so it stops with an error and the REPL returns to its prompt); a second press
//! while the flag is still set exits at once (for a long native call that cannot be stopped).

use super::engine::Interrupt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Route SIGINT to `interrupt` for the rest of the process. Only the first call installs.
pub fn install(interrupt: &Interrupt) {
    if FLAG.set(interrupt.flag()).is_ok() {
        install_handler();
    }
}

#[cfg(unix)]
fn install_handler() {
    extern "C" fn on_sigint(_: libc::c_int) {
        // Only an atomic load and store: async-signal-safe.
        if let Some(flag) = FLAG.get() {
            if flag.swap(true, Ordering::SeqCst) {
                unsafe { libc::_exit(130) };
            }
        }
    }
    // SAFETY: the handler only touches atomics (and `_exit`), which is allowed in a handler.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
}

#[cfg(not(unix))]
fn install_handler() {}
