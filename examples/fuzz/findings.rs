//! What a fuzz run found: hangs confirmed by running them again alone, the first inputs of each
//! distinct failure saved (regenerated from their index), the first one minimised, and the
//! summary table.

use crate::harness::{self, Options};
use crate::supervise::{rerun, Config, Kind, Record, Report, Worker};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Confirm hangs, then save the first `keep` inputs of each signature and a minimised copy of the first.
pub fn save(cfg: &Config, report: &mut Report) {
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
