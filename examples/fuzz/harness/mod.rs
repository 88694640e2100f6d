//! The fuzz targets and what they share: the seed corpus of each, the input of a given seed and
//! index, and one guarded run (a panic caught and recorded with its message and location).
//!
//! An input is a pure function of (target, seed, index): indices below the corpus size are the
//! corpus files themselves, the others are mutations drawn from `Rng::new(hash(seed, target,
//! index))`. So any input can be regenerated from three numbers, on any machine.

pub mod check;
pub mod checkpoint;
pub mod csv;
pub mod dsl;
pub mod mutate;
pub mod script;

pub use check::Failure;

use rumus::rng::{splitmix64, Rng};
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

/// What is fuzzed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Model-language sources: parse, resolve, lower, training step, plan, one CPU step.
    Dsl,
    /// `.rms` scripts run by `rumus::Engine` in a bounded sandbox on the CPU.
    Script,
    /// safetensors files parsed, round-tripped, and loaded into compiled models.
    Checkpoint,
    /// CSV files (plain or gzip) read as data sets, split and batched; text sequences.
    Csv,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::Dsl, Target::Script, Target::Checkpoint, Target::Csv];

    pub fn name(self) -> &'static str {
        match self {
            Target::Dsl => "dsl",
            Target::Script => "script",
            Target::Checkpoint => "checkpoint",
            Target::Csv => "csv",
        }
    }

    pub fn parse(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }

    /// The file extension of saved inputs.
    pub fn ext(self) -> &'static str {
        match self {
            Target::Dsl | Target::Script => "rms",
            Target::Checkpoint => "safetensors",
            Target::Csv => "csv",
        }
    }
}

/// One target's corpus, mutator and runner.
pub trait Fuzz {
    /// The seed corpus (inputs `0..len` are these, unmutated).
    fn corpus(&self) -> &[Vec<u8>];
    /// A mutated input.
    fn mutate(&self, rng: &mut Rng) -> Vec<u8>;
    /// Run one input through the target's entry points and check its invariants.
    fn run(&mut self, input: &[u8]) -> Result<(), Failure>;
}

/// Settings of a harness.
#[derive(Clone, Debug)]
pub struct Options {
    /// A folder the harness owns (scratch files, the script sandbox's root).
    pub scratch: PathBuf,
    /// After this long a script is interrupted at its next operation (milliseconds).
    pub soft_ms: u64,
}

/// The harness of `target`, working under `opts.scratch` (created if missing).
pub fn harness(target: Target, opts: &Options) -> Box<dyn Fuzz> {
    std::fs::create_dir_all(&opts.scratch).expect("create the scratch folder");
    match target {
        Target::Dsl => Box::new(dsl::Dsl::new()),
        Target::Script => Box::new(script::Script::new(opts)),
        Target::Checkpoint => Box::new(checkpoint::Checkpoint::new(&opts.scratch)),
        Target::Csv => Box::new(csv::Csv::new(&opts.scratch)),
    }
}

/// Input `index` of `target` under `seed`.
pub fn input(h: &dyn Fuzz, target: Target, seed: u64, index: u64) -> Vec<u8> {
    let corpus = h.corpus();
    if let Some(file) = usize::try_from(index).ok().and_then(|i| corpus.get(i)) {
        return file.clone();
    }
    let salt = target as u64 + 1;
    let mut rng = Rng::new(splitmix64(seed ^ splitmix64(index ^ splitmix64(salt))));
    h.mutate(&mut rng)
}

/// How one run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Pass,
    /// An invariant broke.
    Failed(Failure),
    /// The run panicked: the panic message and where (`file:line`).
    Panicked {
        message: String,
        location: String,
    },
}

static EVERY_THREAD: AtomicBool = AtomicBool::new(false);
static ACCEPTED: AtomicU64 = AtomicU64::new(0);
/// The first panic of any thread while [`capture_every_thread`] is on.
static PANIC: Mutex<Option<(String, String)>> = Mutex::new(None);
static HOOK: Once = Once::new();

thread_local! {
    /// `Some` while this thread runs an input: the first panic's message and location.
    static CAPTURE: RefCell<Option<Option<(String, String)>>> = const { RefCell::new(None) };
}

/// Note that the running input went through its target's main entry point without an error
/// (a model lowered, a script ran, a checkpoint loaded, a CSV file read).
pub fn accepted() {
    ACCEPTED.fetch_add(1, Ordering::Relaxed);
}

/// Record (instead of print) panics of every thread, not only the one running an input: a
/// worker process runs nothing else, and a panic in a thread rumus starts (the CPU matmul's)
/// reaches the input's thread only as "a scoped thread panicked".
pub fn capture_every_thread() {
    EVERY_THREAD.store(true, Ordering::SeqCst);
}

/// Run one input with panics caught: the first panic's message and location are recorded
/// (instead of printed) while an input runs. Returns the verdict and whether the input was
/// [`accepted`]. After a panic the harness may hold broken state; the caller builds a new one.
pub fn run_guarded(h: &mut dyn Fuzz, input: &[u8]) -> (Verdict, bool) {
    let before = ACCEPTED.load(Ordering::Relaxed);
    let verdict = guarded(h, input);
    (verdict, ACCEPTED.load(Ordering::Relaxed) != before)
}

fn guarded(h: &mut dyn Fuzz, input: &[u8]) -> Verdict {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let message = payload_text(info.payload());
            let location =
                info.location().map_or("?".into(), |l| format!("{}:{}", l.file(), l.line()));
            let mut first = Some((message, location));
            CAPTURE.with(|c| {
                if let Some(slot) = c.borrow_mut().as_mut() {
                    slot.get_or_insert_with(|| first.take().expect("not taken yet"));
                }
            });
            if first.is_some() && EVERY_THREAD.load(Ordering::SeqCst) {
                let mut slot = PANIC.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert_with(|| first.take().expect("not taken yet"));
            }
            if first.is_some() {
                previous(info);
            }
        }));
    });
    *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = None;
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let r = panic::catch_unwind(AssertUnwindSafe(|| h.run(input)));
    let mine = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    match r {
        Ok(Ok(())) => Verdict::Pass,
        Ok(Err(f)) => Verdict::Failed(f),
        Err(payload) => {
            // A panic in another thread (which made this one panic) says where it started.
            let other = PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (message, location) =
                other.or(mine).unwrap_or_else(|| (payload_text(&*payload), "?".into()));
            Verdict::Panicked { message: check::clip(&message, 500), location }
        }
    }
}

fn payload_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a non-text panic payload)".into())
}

/// The repository root (corpus files are read from it).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The bytes of a repository file.
pub fn repo_file(rel: &str) -> Vec<u8> {
    std::fs::read(repo().join(rel)).unwrap_or_else(|e| panic!("corpus file {rel}: {e}"))
}

/// The files of a repository folder with extension `ext`, sorted by name.
pub fn repo_files(dir: &str, ext: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("corpus folder {dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).expect("read corpus file")).collect()
}

/// Remove everything inside `dir` (not `dir` itself).
pub fn empty_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}
