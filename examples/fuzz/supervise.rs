//! The supervisor: hands chunks of input indices to worker processes (one per job), reads what
//! they report, and turns a worker that dies into a `crash` record and one that goes silent past
//! the wall limit into a `hang` record, each at the input it was running; then it starts a new
//! worker at the next input. What a run found is saved and summarised by `findings`.

use crate::findings;
use crate::harness::{self, Target};
use crate::worker::one_line;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a fuzz run is set up.
#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub seed: u64,
    /// Inputs `start..start + inputs` are run.
    pub start: u64,
    pub inputs: u64,
    pub jobs: usize,
    /// Inputs per worker command.
    pub chunk: u64,
    /// An input still running after this long is a hang (the worker is killed).
    pub limit: Duration,
    pub slow_ms: u64,
    pub soft_ms: u64,
    pub mem_mb: u64,
    /// Failing inputs are saved under `out/<target>/`.
    pub out: PathBuf,
    /// Folder for the workers' scratch folders.
    pub scratch: PathBuf,
    pub minimize: bool,
    /// Most inputs saved per distinct failure.
    pub keep: usize,
}

/// What went wrong with one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Panic,
    Crash,
    Hang,
    Invariant,
    Slow,
}

#[derive(Clone, Debug)]
pub struct Record {
    pub kind: Kind,
    pub index: u64,
    /// Groups equal failures: the panic location, the invariant, the crash's cause.
    pub signature: String,
    pub detail: String,
}

/// The figures of one target's run.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: Target,
    pub inputs: u64,
    pub accepted: u64,
    pub seconds: f64,
    pub records: Vec<Record>,
    /// Paths of saved inputs by signature.
    pub saved: BTreeMap<String, Vec<PathBuf>>,
}

impl Report {
    pub fn count(&self, kind: Kind) -> usize {
        self.records.iter().filter(|r| r.kind == kind).count()
    }

    /// Panics, crashes, hangs and broken invariants (slow inputs are not failures).
    pub fn failures(&self) -> usize {
        self.records.iter().filter(|r| r.kind != Kind::Slow).count()
    }
}

/// Run `cfg.inputs` inputs of `cfg.target` from `cfg.start` and save what failed.
pub fn fuzz(cfg: &Config) -> Report {
    let start = Instant::now();
    let next = AtomicU64::new(cfg.start);
    let end = cfg.start.saturating_add(cfg.inputs);
    let done = AtomicU64::new(0);
    let accepted = AtomicU64::new(0);
    let records = Mutex::new(Vec::new());
    let running = AtomicUsize::new(cfg.jobs.max(1));
    std::thread::scope(|s| {
        for job in 0..cfg.jobs.max(1) {
            let (next, done, accepted, records, running) =
                (&next, &done, &accepted, &records, &running);
            s.spawn(move || {
                let mut pool = Pool { cfg, job, spawned: 0, worker: None };
                loop {
                    let a = next.fetch_add(cfg.chunk, Ordering::SeqCst);
                    if a >= end {
                        break;
                    }
                    let b = (a + cfg.chunk).min(end);
                    let mut found = Vec::new();
                    let acc = pool.range(a, b, done, &mut found);
                    accepted.fetch_add(acc, Ordering::Relaxed);
                    records.lock().unwrap().extend(found);
                }
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
        s.spawn(|| progress(cfg, start, &done, &records, &running));
    });
    let mut records = records.into_inner().unwrap();
    records.sort_by_key(|r| (r.kind, r.signature.clone(), r.index));
    let mut report = Report {
        target: cfg.target,
        inputs: done.load(Ordering::SeqCst),
        accepted: accepted.load(Ordering::SeqCst),
        seconds: start.elapsed().as_secs_f64(),
        records,
        saved: BTreeMap::new(),
    };
    findings::save(cfg, &mut report);
    report
}

/// Print a progress line every 10 seconds while jobs are running.
fn progress(
    cfg: &Config,
    start: Instant,
    done: &AtomicU64,
    records: &Mutex<Vec<Record>>,
    running: &AtomicUsize,
) {
    let mut last = Instant::now();
    while running.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(200));
        if last.elapsed() < Duration::from_secs(10) {
            continue;
        }
        last = Instant::now();
        let n = done.load(Ordering::SeqCst);
        let failures = records.lock().unwrap().iter().filter(|r| r.kind != Kind::Slow).count();
        let rate = n as f64 / start.elapsed().as_secs_f64();
        eprintln!(
            "fuzz {}: {n}/{} inputs, {failures} failures, {rate:.0} inputs/s",
            cfg.target.name(),
            cfg.inputs
        );
    }
}

/// One job's worker process, restarted after a crash or a hang.
struct Pool<'a> {
    cfg: &'a Config,
    job: usize,
    spawned: usize,
    worker: Option<Worker>,
}

impl Pool<'_> {
    /// Run inputs `a..b`; returns how many were accepted.
    fn range(&mut self, a: u64, b: u64, done: &AtomicU64, found: &mut Vec<Record>) -> u64 {
        let mut from = a;
        let mut accepted = 0;
        let limit = self.cfg.limit;
        while from < b {
            let w = self.worker();
            w.send(&format!("gen {from} {b}"));
            let mut current = from;
            loop {
                let next = w.next(limit);
                w.answered |= next.is_ok();
                match next {
                    Ok(line) => match parse(&line) {
                        Some(('S', index, _)) => {
                            current = index;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(('E', n, _)) => {
                            accepted += n;
                            from = b;
                            break;
                        }
                        Some((c, index, rest)) => found.extend(record(c, index, rest)),
                        None => {}
                    },
                    Err(end) => {
                        let w = self.worker.take().expect("a running worker");
                        let answered = w.answered;
                        let r = w.end(end, current);
                        // A worker that never answered failed to start: a driver bug, not a find.
                        assert!(answered, "a fuzz worker failed to start: {}", r.detail);
                        found.push(r);
                        from = current + 1;
                        break;
                    }
                }
            }
        }
        accepted
    }

    fn worker(&mut self) -> &mut Worker {
        if self.worker.is_none() {
            self.spawned += 1;
            let name = format!("{}-{}-{}", std::process::id(), self.job, self.spawned);
            self.worker = Some(Worker::spawn(self.cfg, &self.cfg.scratch.join(name)));
        }
        self.worker.as_mut().expect("spawned above")
    }
}

/// `X index rest` lines from a worker.
fn parse(line: &str) -> Option<(char, u64, &str)> {
    let mut chars = line.chars();
    let c = chars.next()?;
    let rest = line.get(2..)?;
    let (index, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((c, index.parse().ok()?, rest))
}

fn record(c: char, index: u64, rest: &str) -> Option<Record> {
    let (head, detail) = rest.split_once('\t').unwrap_or((rest, ""));
    let (kind, signature) = match c {
        'F' => (Kind::Invariant, format!("invariant {head}")),
        'P' => (Kind::Panic, format!("panic at {head}")),
        'T' => (Kind::Slow, "slow".to_string()),
        _ => return None,
    };
    let detail = if c == 'T' { format!("{head} ms") } else { detail.to_string() };
    Some(Record { kind, index, signature, detail })
}

/// Why a worker stopped answering.
#[derive(Debug)]
enum End {
    /// Its stdout closed: it exited or was killed by a signal.
    Died,
    /// No line for the wall limit.
    Silent,
}

/// A running worker process.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    scratch: PathBuf,
    /// Whether it has sent a line yet.
    answered: bool,
}

impl Worker {
    fn spawn(cfg: &Config, scratch: &Path) -> Worker {
        let exe = std::env::current_exe().expect("the fuzz binary's path");
        let mut child = Command::new(exe)
            .args(["--worker", "--target", cfg.target.name()])
            .args(["--seed", &cfg.seed.to_string(), "--soft-ms", &cfg.soft_ms.to_string()])
            .args(["--slow-ms", &cfg.slow_ms.to_string(), "--mem-mb", &cfg.mem_mb.to_string()])
            .arg("--scratch")
            .arg(scratch)
            // No GPU adapter in the fuzz loop, whatever a script asks for.
            .env("WGPU_BACKEND", "metal")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a fuzz worker");
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(String::new()));
        let t = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = t.lock().unwrap();
                t.push_str(&String::from_utf8_lossy(&buf[..n]));
                if t.len() > 8192 {
                    let cut = t.len() - 4096;
                    let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(t.len());
                    t.drain(..cut);
                }
            }
        });
        Worker {
            child,
            stdin,
            lines,
            stderr: tail,
            scratch: scratch.to_path_buf(),
            answered: false,
        }
    }

    fn send(&mut self, cmd: &str) {
        // A worker that died already shows as `Died` at the next read.
        let _ = writeln!(self.stdin, "{cmd}");
        let _ = self.stdin.flush();
    }

    fn next(&self, limit: Duration) -> Result<String, End> {
        match self.lines.recv_timeout(limit) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => Err(End::Silent),
            Err(RecvTimeoutError::Disconnected) => Err(End::Died),
        }
    }

    /// Stop the worker and describe why it stopped at input `index`.
    fn end(mut self, end: End, index: u64) -> Record {
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        std::thread::sleep(Duration::from_millis(50)); // the stderr reader's last bytes
        let _ = std::fs::remove_dir_all(&self.scratch);
        let tail = self.stderr.lock().unwrap().clone();
        match end {
            End::Silent => Record {
                kind: Kind::Hang,
                index,
                signature: "hang".into(),
                detail: "no answer within the wall limit".into(),
            },
            End::Died => Record {
                kind: Kind::Crash,
                index,
                signature: format!("crash: {}", crash_cause(&tail, &status)),
                detail: one_line(&harness::check::clip(tail.trim(), 600)),
            },
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// A short, stable cause from a dead worker's last stderr lines and exit status.
fn crash_cause(stderr: &str, status: &str) -> String {
    if stderr.contains("memory allocation of") {
        "memory allocation failed".into()
    } else if stderr.contains("overflowed its stack") {
        "stack overflow".into()
    } else {
        status.to_string()
    }
}

/// The outcome of one saved input run again in a fresh worker: its signature, if it failed.
pub fn rerun(cfg: &Config, path: &Path, worker: &mut Option<Worker>) -> Option<String> {
    let scratch = cfg.scratch.join(format!("{}-min", std::process::id()));
    let w = worker.get_or_insert_with(|| Worker::spawn(cfg, &scratch));
    w.send(&format!("file {}", path.display()));
    let mut signature = None;
    loop {
        match w.next(cfg.limit) {
            Ok(line) => match parse(&line) {
                Some(('E', _, _)) => return signature,
                Some((c, index, rest)) if c != 'S' && c != 'T' => {
                    signature = record(c, index, rest).map(|r| r.signature);
                }
                _ => {}
            },
            Err(end) => return Some(worker.take().expect("running").end(end, 0).signature),
        }
    }
}
