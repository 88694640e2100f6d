//! The supervisor: hands chunks of input indices to worker processes (one per job), reads what
//! they report, and turns a worker that dies into a `crash` record and one that goes silent past
//! the wall limit into a `hang` record, each at the input it was running; then it starts a new
//! worker at the next input. At the end it saves the first inputs of each distinct failure
//! (regenerated from their index), minimises one of each, and summarises.

use crate::harness::{self, Options, Target};
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
    save(cfg, &mut report);
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
struct Worker {
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
fn rerun(cfg: &Config, path: &Path, worker: &mut Option<Worker>) -> Option<String> {
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

/// Save the first `keep` inputs of each signature and a minimised copy of the first.
fn save(cfg: &Config, report: &mut Report) {
    if report.records.is_empty() {
        return;
    }
    let dir = cfg.out.join(cfg.target.name());
    std::fs::create_dir_all(&dir).expect("create the failure folder");
    let opts = Options {
        scratch: cfg.scratch.join(format!("{}-gen", std::process::id())),
        soft_ms: cfg.soft_ms,
    };
    let h = harness::harness(cfg.target, &opts);
    let mut worker = None;
    // A hang is confirmed by running the input again alone: on a machine shared with other
    // work a worker can stall past the limit once. Unconfirmed ones are listed as slow.
    let candidate = cfg.scratch.join(format!("{}-hang.{}", std::process::id(), cfg.target.ext()));
    for r in report.records.iter_mut().filter(|r| r.kind == Kind::Hang).take(20) {
        let input = harness::input(h.as_ref(), cfg.target, cfg.seed, r.index);
        std::fs::write(&candidate, &input).expect("write a candidate");
        if rerun(cfg, &candidate, &mut worker).as_deref() != Some("hang") {
            r.kind = Kind::Slow;
            r.signature = "slow".into();
            r.detail = "past the wall limit once, not when run again alone".into();
        }
    }
    let _ = std::fs::remove_file(&candidate);
    let mut by_signature: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &report.records {
        by_signature.entry(&r.signature).or_default().push(r);
    }
    for (signature, records) in by_signature {
        let slug = slug(signature);
        let mut paths = Vec::new();
        for r in records.iter().take(cfg.keep) {
            let input = harness::input(h.as_ref(), cfg.target, cfg.seed, r.index);
            let path = dir.join(format!("{slug}-s{}-i{}.{}", cfg.seed, r.index, cfg.target.ext()));
            std::fs::write(&path, &input).expect("save a failing input");
            paths.push(path);
        }
        let first = &records[0];
        if cfg.minimize && first.kind != Kind::Slow && first.kind != Kind::Hang {
            let input = std::fs::read(&paths[0]).expect("saved above");
            let min = minimize(cfg, &input, signature, &mut worker);
            let path =
                dir.join(format!("{slug}-s{}-i{}-min.{}", cfg.seed, first.index, cfg.target.ext()));
            std::fs::write(&path, &min).expect("save a minimised input");
            paths.push(path);
        }
        report.saved.insert(signature.to_string(), paths);
    }
    let _ = std::fs::remove_dir_all(&opts.scratch);
}

/// Shrink `input` while it still fails with `signature`: whole lines, then byte ranges, halving
/// the range each round; at most a few hundred runs or a minute.
fn minimize(cfg: &Config, input: &[u8], signature: &str, worker: &mut Option<Worker>) -> Vec<u8> {
    let start = Instant::now();
    let path = cfg.scratch.join(format!("{}-candidate.{}", std::process::id(), cfg.target.ext()));
    let runs = std::cell::Cell::new(0);
    let out_of_time = || runs.get() > 400 || start.elapsed() > Duration::from_secs(60);
    let mut still_fails = |candidate: &[u8]| {
        runs.set(runs.get() + 1);
        std::fs::write(&path, candidate).expect("write a candidate");
        rerun(cfg, &path, worker).as_deref() == Some(signature)
    };
    let mut best = input.to_vec();
    if !still_fails(&best) {
        return best; // not reproducible alone (it depended on timing or an earlier input)
    }
    for by_lines in [true, false] {
        let units = |b: &[u8]| -> Vec<(usize, usize)> {
            if by_lines {
                let mut v = Vec::new();
                let mut a = 0;
                for (i, &c) in b.iter().enumerate() {
                    if c == b'\n' {
                        v.push((a, i + 1));
                        a = i + 1;
                    }
                }
                if a < b.len() {
                    v.push((a, b.len()));
                }
                v
            } else {
                (0..b.len()).map(|i| (i, i + 1)).collect()
            }
        };
        let mut size = units(&best).len().div_ceil(2).max(1);
        loop {
            let mut i = 0;
            loop {
                let u = units(&best);
                if i >= u.len() || out_of_time() {
                    break;
                }
                let (a, b) = (u[i].0, u[(i + size).min(u.len()) - 1].1);
                let mut candidate = best[..a].to_vec();
                candidate.extend_from_slice(&best[b..]);
                if still_fails(&candidate) {
                    best = candidate;
                } else {
                    i += size;
                }
            }
            if size == 1 || out_of_time() {
                break;
            }
            size = size.div_ceil(2);
        }
    }
    let _ = std::fs::remove_file(&path);
    best
}

fn slug(signature: &str) -> String {
    let s: String = signature
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect();
    let s = s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-");
    s.chars().take(60).collect()
}

/// The summary table and the distinct failures.
pub fn print(reports: &[Report], cfg: &Config) {
    println!(
        "{:<11} {:>9} {:>9} {:>7} {:>7} {:>6} {:>10} {:>5} {:>9} {:>9}",
        "target",
        "inputs",
        "accepted",
        "panics",
        "crashes",
        "hangs",
        "invariant",
        "slow",
        "seconds",
        "inputs/s"
    );
    for r in reports {
        println!(
            "{:<11} {:>9} {:>9} {:>7} {:>7} {:>6} {:>10} {:>5} {:>9.1} {:>9.0}",
            r.target.name(),
            r.inputs,
            r.accepted,
            r.count(Kind::Panic),
            r.count(Kind::Crash),
            r.count(Kind::Hang),
            r.count(Kind::Invariant),
            r.count(Kind::Slow),
            r.seconds,
            r.inputs as f64 / r.seconds.max(1e-9)
        );
    }
    println!(
        "seed {}, {} jobs, wall limit {:?}, soft limit {} ms",
        cfg.seed, cfg.jobs, cfg.limit, cfg.soft_ms
    );
    for r in reports {
        let mut by: BTreeMap<&str, (usize, &Record)> = BTreeMap::new();
        for rec in &r.records {
            by.entry(&rec.signature).or_insert((0, rec)).0 += 1;
        }
        for (signature, (n, first)) in by {
            println!(
                "{}: {signature}: {n} inputs, first {} ({})",
                r.target.name(),
                first.index,
                first.detail
            );
            for p in r.saved.get(signature).into_iter().flatten() {
                println!("    {}", p.display());
            }
        }
    }
}
