//! The fuzz driver: seeded, reproducible mutations of model files, scripts, checkpoints and CSV
//! files, run through rumus's public entry points in worker processes, checking for panics,
//! aborts, hangs and broken invariants (see `harness/` for what each target runs and checks).
//!
//! ```text
//! cargo run --profile fuzz --example fuzz -- --target all --inputs 1000000 --seed 1 --jobs 2
//! ```
//!
//! Options: `--target dsl|script|checkpoint|csv|all`, `--inputs N` (per target), `--start I`
//! (the first input's index, default 0), `--seed S`,
//! `--jobs J` (worker processes), `--limit SECS` (wall limit per input: past it the input is a
//! hang), `--slow-ms MS` (inputs slower than this are listed), `--soft-ms MS` (scripts are
//! interrupted after this long), `--mem-mb MB` (address-space limit of a worker), `--out DIR`
//! (failing inputs are saved under `DIR/<target>/`, default `target/fuzz`), `--no-minimize`.
//!
//! Input `I` of a target under seed `S` is always the same bytes: `--dump I` writes it to
//! stdout, and `--replay PATH` runs a saved input (or every file of a folder) in this process
//! and prints what happened. Exit status 1 when anything failed.

mod findings;
mod harness;
mod supervise;
mod worker;

use harness::{Options, Target, Verdict};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use supervise::Config;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("fuzz: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let mut targets = Target::ALL.to_vec();
    let mut cfg = Config {
        target: Target::Dsl,
        seed: 1,
        start: 0,
        inputs: 10_000,
        jobs: 1,
        chunk: 5_000,
        limit: Duration::from_secs(10),
        slow_ms: 1_000,
        soft_ms: 50,
        mem_mb: 4_096,
        out: harness::repo().join("target/fuzz"),
        scratch: scratch_root(),
        minimize: true,
        keep: 3,
    };
    let (mut worker, mut dump, mut replay, mut scratch) = (false, None, None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => {
                let v = value()?;
                targets = match v.as_str() {
                    "all" => Target::ALL.to_vec(),
                    t => vec![Target::parse(t).ok_or_else(|| format!("unknown target `{t}`"))?],
                };
            }
            "--inputs" => cfg.inputs = number(flag, value()?)?,
            "--start" => cfg.start = number(flag, value()?)?,
            "--seed" => cfg.seed = number(flag, value()?)?,
            "--jobs" => cfg.jobs = number(flag, value()?)? as usize,
            "--chunk" => cfg.chunk = number(flag, value()?)?.max(1),
            "--limit" => cfg.limit = Duration::from_secs(number(flag, value()?)?),
            "--slow-ms" => cfg.slow_ms = number(flag, value()?)?,
            "--soft-ms" => cfg.soft_ms = number(flag, value()?)?,
            "--mem-mb" => cfg.mem_mb = number(flag, value()?)?,
            "--out" => {
                let v = value()?;
                cfg.out = std::path::absolute(v).map_err(|e| format!("--out {v}: {e}"))?;
            }
            "--no-minimize" => cfg.minimize = false,
            "--dump" => dump = Some(number(flag, value()?)?),
            "--replay" => replay = Some(PathBuf::from(value()?)),
            "--worker" => worker = true,
            "--scratch" => scratch = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument `{other}` (see examples/fuzz/main.rs)")),
        }
    }
    let one = |what: &str| match targets.as_slice() {
        [t] => Ok(*t),
        _ => Err(format!("{what} needs one --target")),
    };
    if worker {
        let opts =
            Options { scratch: scratch.ok_or("--worker needs --scratch")?, soft_ms: cfg.soft_ms };
        let args = worker::WorkerArgs {
            target: one("--worker")?,
            seed: cfg.seed,
            opts,
            slow_ms: cfg.slow_ms,
            mem_mb: cfg.mem_mb,
        };
        worker::main(args);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(index) = dump {
        let target = one("--dump")?;
        let opts = local_options(&cfg);
        let h = harness::harness(target, &opts);
        let input = harness::input(h.as_ref(), target, cfg.seed, index);
        drop(h);
        let _ = std::fs::remove_dir_all(&opts.scratch);
        std::io::Write::write_all(&mut std::io::stdout(), &input).map_err(|e| e.to_string())?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = replay {
        let path = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
        return replay_files(one("--replay")?, &path, &cfg);
    }
    let mut reports = Vec::new();
    for target in targets {
        reports.push(supervise::fuzz(&Config { target, ..cfg.clone() }));
    }
    findings::print(&reports, &cfg);
    let failed = reports.iter().any(|r| r.failures() > 0);
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Run saved inputs in this process and print each verdict.
fn replay_files(target: Target, path: &PathBuf, cfg: &Config) -> Result<ExitCode, String> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        v.sort();
        v
    } else {
        vec![path.clone()]
    };
    harness::capture_every_thread();
    let opts = local_options(cfg);
    let mut h = harness::harness(target, &opts);
    let mut failed = false;
    for file in files {
        let input = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let start = std::time::Instant::now();
        let (verdict, accepted) = harness::run_guarded(h.as_mut(), &input);
        let ms = start.elapsed().as_millis();
        let what = match &verdict {
            Verdict::Pass if accepted => "ok (accepted)".to_string(),
            Verdict::Pass => "ok (rejected with a good error)".to_string(),
            Verdict::Failed(f) => format!("FAILED {}: {}", f.invariant, f.detail),
            Verdict::Panicked { message, location } => format!("PANIC at {location}: {message}"),
        };
        println!("{}: {what} ({ms} ms)", file.display());
        if verdict != Verdict::Pass {
            failed = true;
            h = harness::harness(target, &opts);
        }
    }
    let _ = std::fs::remove_dir_all(&opts.scratch);
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn local_options(cfg: &Config) -> Options {
    Options {
        scratch: cfg.scratch.join(format!("{}-local", std::process::id())),
        soft_ms: cfg.soft_ms,
    }
}

/// Scratch files go to memory (`/dev/shm`) where there is one.
fn scratch_root() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    let base = if shm.is_dir() { shm } else { std::env::temp_dir() };
    base.join("rumus-fuzz")
}

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse().map_err(|_| format!("{flag} {v}: not a non-negative integer"))
}
