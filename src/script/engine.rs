//! The sandbox: a rhai engine built from `Engine::new_raw()` with only the packages scripts need,
//! limits on operations, wall time, call depth, expression depth, strings, arrays and maps, no
//! module import, an interrupt flag polled while a script runs, a file-access policy that the API
//! bindings consult before they touch a file, and the size of the session's memory budget
//! (`crate::memory`), which they charge before they allocate.
//!
//! Operations, the interrupt flag and the time limit are checked between script operations, so
//! a native call (a training step, a large matmul) is stopped at its end, not in its middle.
//!
//! Nothing here knows about tensors or models; `api` registers those.

use super::lock;
use crate::err;
use crate::error::{Error, Result};
use rhai::packages::{Package, StandardPackage};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// What a script may do. [`Sandbox::default`] suits a person running their own script (the
/// runner and the REPL: no limit on operations or time, as Python has none);
/// [`Sandbox::bounded`] suits a host running scripts it did not write (`rumus::Engine`).
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// Most rhai operations one evaluation may run (0: no limit).
    pub max_operations: u64,
    /// Longest wall time one evaluation may run (`None`: no limit). Checked between script
    /// operations: a native call that is running when time is up ends first.
    pub timeout: Option<Duration>,
    /// Deepest script function call nesting.
    pub max_call_levels: usize,
    /// Deepest expression nesting (global level, inside functions).
    pub max_expr_depth: (usize, usize),
    /// Longest string, in bytes.
    pub max_string_size: usize,
    /// Largest array, in elements.
    pub max_array_size: usize,
    /// Largest object map, in entries.
    pub max_map_size: usize,
    /// Most bytes that everything one session owns may hold at once: script tensors,
    /// datasets, compiled models (host and device buffers), evaluation copies and readers'
    /// buffers, all counted against one memory budget. The default is half
    /// of the memory the process may use ([`crate::memory::usable_memory`]).
    pub memory_budget: u64,
    /// Most bytes the whole process may hold on its heap while a script runs, checked at every
    /// operation against [`crate::memory::heap_bytes`] (`None`: not checked). The script's own
    /// values (arrays, strings, maps, closures) are counted by no budget, and copies of them
    /// (one per variable, call or closure) filled the machine's memory until the process was
    /// killed. Only for a process that runs one session with
    /// [`crate::memory::CountingAllocator`] installed: the `rumus` binary sets it to
    /// `memory_budget`.
    pub heap_limit: Option<u64>,
    /// The folder relative paths in scripts are resolved against (the process's working
    /// directory by default), so a host can give each session its own without `chdir`.
    pub base_dir: PathBuf,
    /// Folders (and everything below them) that scripts may read.
    pub read_roots: Vec<PathBuf>,
    /// Folders (and everything below them) that scripts may write.
    pub write_roots: Vec<PathBuf>,
    /// Files no script may write, though they lie below a write root, each with what it is:
    /// the script being run (`net.save("train.rms")` would destroy it), the run's metrics log
    /// and plot. Resolved paths ([`Sandbox::protect`]).
    pub protected: Vec<(PathBuf, String)>,
}

impl Default for Sandbox {
    /// Generous limits, no limit on operations or time; reads and writes below the working
    /// directory.
    fn default() -> Sandbox {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Sandbox {
            max_operations: 0,
            timeout: None,
            max_call_levels: 48,
            max_expr_depth: (64, 48),
            max_string_size: 64 << 20,
            max_array_size: 1 << 24,
            max_map_size: 1 << 16,
            memory_budget: crate::memory::default_limit(),
            heap_limit: None,
            read_roots: vec![cwd.clone()],
            write_roots: vec![cwd.clone()],
            protected: Vec::new(),
            base_dir: cwd,
        }
    }
}

impl Sandbox {
    /// The default limits plus [`BOUNDED_OPERATIONS`] operations and [`BOUNDED_TIMEOUT`] of wall
    /// time per evaluation, so that `loop {}` in a script a host did not write ends in an error.
    pub fn bounded() -> Sandbox {
        Sandbox {
            max_operations: BOUNDED_OPERATIONS,
            timeout: Some(BOUNDED_TIMEOUT),
            ..Sandbox::default()
        }
    }

    /// Allow reads below `dir` (the folder of a script being run, a data folder a host grants).
    pub fn allow_read(&mut self, dir: impl Into<PathBuf>) {
        self.read_roots.push(dir.into());
    }

    /// Refuse writes to `file`, which is `what` (`the running script`, `the metrics log`),
    /// links and relative spellings resolved; a file not there yet (a plot written at the
    /// end) by its folder.
    pub fn protect(&mut self, file: &Path, what: &str) {
        if let Some(resolved) = crate::files::resolved(file) {
            self.protected.push((resolved, what.to_string()));
        }
    }

    /// Allow writes (and reads) below `dir`.
    pub fn allow_write(&mut self, dir: impl Into<PathBuf>) {
        let dir = dir.into();
        self.read_roots.push(dir.clone());
        self.write_roots.push(dir);
    }

    /// The path a script may read, resolved (symlinks followed), or a `Limit` error (outside
    /// the read roots). Only regular files and folders are readable, another file an `Io`
    /// error: a FIFO would block the script forever and a device may never end.
    pub fn check_read(&self, path: &str) -> Result<PathBuf> {
        let resolved = resolve(&self.base_dir, path)?;
        if within(&resolved, &self.read_roots) {
            match std::fs::metadata(&resolved) {
                // As writing one is (`files::open_for_write`): a file that cannot be read, an
                // I/O error (exit code 2), where loading one was a sandbox refusal (1).
                Ok(m) if !(m.is_file() || m.is_dir()) => Err(err!(
                    Io,
                    "{}: is not a regular file or folder (a device, FIFO or socket); rumus reads files and folders only",
                    resolved.display()
                )),
                _ => Ok(resolved), // a missing file is the reader's error, with its path
            }
        } else {
            Err(err!(
                Limit,
                "reading `{path}` is not allowed: scripts read only below the script's folder and the working directory"
            ))
        }
    }

    /// The path a script may write, resolved (the folder must exist), or a `Limit` error: a
    /// file (not a folder) whose folder, symbolic links followed, lies below a write root, so
    /// that the file and the temporary file written beside it stay inside.
    pub fn check_write(&self, path: &str) -> Result<PathBuf> {
        let resolved = resolve(&self.base_dir, path)?;
        let inside = |p: &Path| within(p, &self.write_roots);
        if inside(&resolved) && resolved.is_dir() {
            return Err(err!(Io, "writing `{path}`: it is a folder; give a file name"));
        }
        if let Some((p, what)) = self.protected.iter().find(|(p, _)| *p == resolved) {
            return Err(err!(
                Io,
                "writing `{path}` would replace {what} {}: write somewhere else",
                p.display()
            ));
        }
        if resolved.parent().is_some_and(inside) {
            Ok(resolved)
        } else {
            Err(err!(
                Limit,
                "writing `{path}` is not allowed: scripts write only below the working directory"
            ))
        }
    }
}

/// `path` (relative to `base`) made absolute with symlinks resolved. A file that does not exist
/// yet resolves through its parent folder, which must exist.
fn resolve(base: &Path, path: &str) -> Result<PathBuf> {
    let p = &base.join(path);
    if path.is_empty() {
        return Err(err!(Io, "empty path"));
    }
    if let Ok(c) = p.canonicalize() {
        return Ok(c);
    }
    // The last name as written: `components` drops a trailing `/` and `.`, which made
    // `save("ckpt/")` write a file `ckpt` and `read_text("notes.txt/")` read `notes.txt`.
    let written = path.rsplit(std::path::is_separator).next().unwrap_or(path);
    let name = match p.components().next_back() {
        Some(Component::Normal(n)) if n == written => n.to_owned(),
        _ => {
            return Err(err!(
                Io,
                "{path}: not a file name (a path ending in `/`, `.` or `..` names a folder)"
            ))
        }
    };
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => base.to_path_buf(),
    };
    let parent = parent.canonicalize().map_err(|e| Error::io(parent.display(), e))?;
    Ok(parent.join(name))
}

fn within(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| match r.canonicalize() {
        Ok(r) => path.starts_with(r),
        Err(_) => false,
    })
}

/// Operations per evaluation under [`Sandbox::bounded`] (rhai runs some tens of millions a
/// second; a training loop spends a handful per step).
pub const BOUNDED_OPERATIONS: u64 = 50_000_000;
/// Wall time per evaluation under [`Sandbox::bounded`].
pub const BOUNDED_TIMEOUT: Duration = Duration::from_secs(60);

/// A flag that stops a running script at its next operation (set by Ctrl-C or by the host).
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A flag that is not set.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Ask the running script to stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for (and not reset since).
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Clear the flag (before the next evaluation).
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// The shared flag, for a signal handler.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// When the running evaluation's time is up ([`Sandbox::timeout`]). A watchdog thread per
/// evaluation waits out the limit and raises a flag, so the check between script operations is
/// two atomic loads, not a clock read. Evaluations are numbered: a watchdog that fires late
/// cannot stop the next one.
#[derive(Clone, Debug, Default)]
pub struct Deadline(Arc<DeadlineState>);

#[derive(Debug)]
struct DeadlineState {
    /// The running evaluation's number.
    current: AtomicU64,
    /// The number of the last evaluation whose time ran out.
    expired: AtomicU64,
    /// Dropping it wakes and ends the running evaluation's watchdog.
    cancel: Mutex<Option<mpsc::Sender<()>>>,
}

impl Default for DeadlineState {
    fn default() -> DeadlineState {
        // Evaluations count from 1; none has expired.
        DeadlineState {
            current: AtomicU64::new(0),
            expired: AtomicU64::new(u64::MAX),
            cancel: Mutex::default(),
        }
    }
}

impl Deadline {
    /// Start the clock for a new evaluation allowed `limit` (`None`: no limit).
    pub fn start(&self, limit: Option<Duration>) {
        self.stop();
        let n = self.0.current.fetch_add(1, Ordering::SeqCst) + 1;
        let Some(limit) = limit else {
            return;
        };
        let (tx, rx) = mpsc::channel::<()>();
        let state = self.0.clone();
        let watchdog = std::thread::Builder::new().name("rumus-deadline".into()).spawn(move || {
            if rx.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                state.expired.store(n, Ordering::SeqCst);
            }
        });
        match watchdog {
            Ok(_) => *lock(&self.0.cancel) = Some(tx),
            // No thread to spare: no time to spare either.
            Err(_) => self.0.expired.store(n, Ordering::SeqCst),
        }
    }

    /// The evaluation has ended: let its watchdog go.
    pub fn stop(&self) {
        lock(&self.0.cancel).take();
    }

    /// Whether the running evaluation's time is up.
    pub fn passed(&self) -> bool {
        self.0.expired.load(Ordering::Relaxed) == self.0.current.load(Ordering::Relaxed)
    }
}

/// The value an interrupted script terminates with; `script::convert` turns it into an
/// `Interrupted` error.
pub const INTERRUPTED: &str = "interrupted";
/// The value a script past its time limit terminates with; `script::convert` turns it into a
/// `Limit` error.
pub const TIMED_OUT: &str = "timed out";
/// The value a script terminates with when the process's heap passes `Sandbox::heap_limit`.
pub const OUT_OF_MEMORY: &str = "out of memory";

/// A raw rhai engine with the standard package (no file or module access in it), the sandbox's
/// limits, no module resolver (so `import` fails), and `interrupt` and `deadline` checked on
/// every operation.
pub fn sandboxed(sandbox: &Sandbox, interrupt: &Interrupt, deadline: &Deadline) -> rhai::Engine {
    let mut engine = rhai::Engine::new_raw();
    engine.register_global_module(StandardPackage::new().as_shared_module());
    engine
        .set_max_operations(sandbox.max_operations)
        .set_max_call_levels(sandbox.max_call_levels)
        .set_max_expr_depths(sandbox.max_expr_depth.0, sandbox.max_expr_depth.1)
        .set_max_string_size(sandbox.max_string_size)
        .set_max_array_size(sandbox.max_array_size)
        .set_max_map_size(sandbox.max_map_size)
        .set_max_variables(10_000)
        .set_max_functions(10_000)
        .set_max_modules(0);
    engine.set_fail_on_invalid_map_property(true);
    // `eval` nests a fresh parse and evaluation on the native stack without counting it as a
    // call level, so `let s = "eval(s)"; eval(s);` overflowed the stack (an abort, whatever the
    // limits). Scripts have no need for it: the code it would run can be written out.
    engine.disable_symbol("eval");
    engine.disable_symbol("curry");
    // Values nested thousands deep overflowed the stack in rhai's recursive clone, drop, print
    // and size check: refuse to read one nested past `nesting::MAX_NESTING`.
    #[allow(deprecated)] // rhai marks `on_var` volatile, not deprecated
    engine.on_var(super::nesting::check);
    let flag = interrupt.flag();
    let deadline = deadline.clone();
    let heap_limit = sandbox.heap_limit.unwrap_or(u64::MAX);
    engine.on_progress(move |_| {
        if flag.load(Ordering::Relaxed) {
            Some(INTERRUPTED.into())
        } else if deadline.passed() {
            Some(TIMED_OUT.into())
        } else if crate::memory::heap_bytes() > heap_limit {
            Some(OUT_OF_MEMORY.into())
        } else {
            None
        }
    });
    engine
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_roots_are_refused() {
        let s = Sandbox::default();
        assert_eq!(s.check_read("/etc/passwd").unwrap_err().kind, crate::ErrorKind::Limit);
        assert!(s.check_write("../escape.txt").is_err());
        assert!(s.check_read("Cargo.toml").is_ok());
    }
}
