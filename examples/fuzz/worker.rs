//! The worker: a child process that runs inputs for the supervisor, so that an abort (an
//! allocation failure, a stack overflow) or a hang ends the child, not the fuzz run.
//!
//! It reads commands on stdin and answers on stdout, one line each:
//!
//! ```text
//! gen A B        run inputs A..B of the target under the seed
//! file PATH      run the input saved at PATH
//! ```
//!
//! and for each input prints `S index` before it runs (flushed, so the supervisor knows which
//! input a crash or a hang belongs to), then `F index invariant<TAB>detail` or
//! `P index location<TAB>message` if it failed, `T index ms` if it ran longer than the slow
//! threshold, and after the last one `E accepted` (how many inputs were accepted).

use crate::harness::{self, Options, Target, Verdict};
use std::io::{BufRead, Write};
use std::time::Instant;

/// Settings of a worker, passed on its command line.
pub struct WorkerArgs {
    pub target: Target,
    pub seed: u64,
    pub opts: Options,
    pub slow_ms: u64,
    /// Address-space limit in MiB (0: none), so a runaway allocation aborts this child only.
    pub mem_mb: u64,
}

pub fn main(args: WorkerArgs) {
    limit_memory(args.mem_mb);
    harness::capture_every_thread();
    let mut h = harness::harness(args.target, &args.opts);
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut accepted = 0u64;
        match line.split_once(' ') {
            Some(("gen", range)) => {
                let (a, b) = range.split_once(' ').unwrap_or((range, range));
                let (a, b): (u64, u64) = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
                for index in a..b {
                    let input = harness::input(h.as_ref(), args.target, args.seed, index);
                    accepted += run(&args, &mut h, index, &input, &mut out) as u64;
                }
            }
            Some(("file", path)) => match std::fs::read(path) {
                Ok(input) => accepted += run(&args, &mut h, 0, &input, &mut out) as u64,
                Err(e) => {
                    let _ = writeln!(out, "F 0 unreadable\t{path}: {e}");
                }
            },
            _ => {
                let _ = writeln!(out, "F 0 bad-command\t{}", one_line(&line));
            }
        }
        let _ = writeln!(out, "E {accepted}");
        let _ = out.flush();
    }
    let _ = std::fs::remove_dir_all(&args.opts.scratch);
}

/// Run one input and report it; true when it was accepted.
fn run(
    args: &WorkerArgs,
    h: &mut Box<dyn harness::Fuzz>,
    index: u64,
    input: &[u8],
    out: &mut impl Write,
) -> bool {
    let _ = writeln!(out, "S {index}");
    let _ = out.flush();
    let start = Instant::now();
    let (verdict, accepted) = harness::run_guarded(h.as_mut(), input);
    let ms = start.elapsed().as_millis() as u64;
    match verdict {
        Verdict::Pass => {}
        Verdict::Failed(f) => {
            let _ = writeln!(out, "F {index} {}\t{}", f.invariant, one_line(&f.detail));
        }
        Verdict::Panicked { message, location } => {
            let _ = writeln!(out, "P {index} {location}\t{}", one_line(&message));
            // The harness may hold broken state after a panic.
            *h = harness::harness(args.target, &args.opts);
        }
    }
    if ms >= args.slow_ms {
        let _ = writeln!(out, "T {index} {ms}");
    }
    accepted
}

/// `s` on one line: control characters (line breaks, tabs) escaped.
pub fn one_line(s: &str) -> String {
    s.chars()
        .flat_map(|c| if c.is_control() { c.escape_debug().collect() } else { vec![c] })
        .collect()
}

#[cfg(unix)]
fn limit_memory(mb: u64) {
    if mb == 0 {
        return;
    }
    let bytes = mb.saturating_mul(1 << 20) as libc::rlim_t;
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    // SAFETY: setrlimit only reads the struct passed to it.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &limit);
    }
}

#[cfg(not(unix))]
fn limit_memory(_: u64) {}
