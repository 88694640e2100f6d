//! The fuzz driver (`examples/fuzz`) in CI: the first inputs of every target run in this
//! process (the corpus files, then seeded mutations), and every input saved under
//! `tests/fuzz_corpus/<target>/` (failures the driver found, minimised, now fixed) replayed.
//! The full runs (10^6 inputs per target, in worker processes) are in RELIABILITY.md.

use crate::harness;

use harness::{Options, Target, Verdict};
use std::path::PathBuf;

/// Inputs per target here (the corpus files come first).
const INPUTS: u64 = 150;
const SEED: u64 = 1;

fn options(target: Target) -> Options {
    let scratch = std::env::temp_dir().join(format!(
        "rumus-fuzz-smoke-{}-{}",
        std::process::id(),
        target.name()
    ));
    Options { scratch, soft_ms: 200 }
}

/// Run `inputs` through a fresh harness; every failure and panic, as text.
fn failures(target: Target, inputs: impl IntoIterator<Item = (String, Vec<u8>)>) -> Vec<String> {
    let opts = options(target);
    let mut h = harness::harness(target, &opts);
    let mut out = Vec::new();
    for (name, input) in inputs {
        let (verdict, _) = harness::run_guarded(h.as_mut(), &input);
        match verdict {
            Verdict::Pass => {}
            Verdict::Failed(f) => out.push(format!("{name}: {} ({})", f.invariant, f.detail)),
            Verdict::Panicked { message, location } => {
                out.push(format!("{name}: panic at {location}: {message}"));
                h = harness::harness(target, &opts);
            }
        }
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&opts.scratch);
    out
}

fn generated(target: Target) -> Vec<String> {
    let opts = options(target);
    let h = harness::harness(target, &opts);
    let inputs: Vec<(String, Vec<u8>)> = (0..INPUTS)
        .map(|i| {
            (format!("{} input {i}", target.name()), harness::input(h.as_ref(), target, SEED, i))
        })
        .collect();
    drop(h);
    failures(target, inputs)
}

fn saved(target: Target) -> Vec<String> {
    let dir = harness::repo().join("tests/fuzz_corpus").join(target.name());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let inputs = files.into_iter().map(|p| {
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (p.display().to_string(), bytes)
    });
    failures(target, inputs)
}

#[test]
fn dsl_inputs_pass() {
    let mut f = generated(Target::Dsl);
    f.extend(saved(Target::Dsl));
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn script_inputs_pass() {
    let mut f = generated(Target::Script);
    f.extend(saved(Target::Script));
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn checkpoint_inputs_pass() {
    let mut f = generated(Target::Checkpoint);
    f.extend(saved(Target::Checkpoint));
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn csv_inputs_pass() {
    let mut f = generated(Target::Csv);
    f.extend(saved(Target::Csv));
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn an_input_is_a_function_of_target_seed_and_index() {
    let opts = options(Target::Dsl);
    let h = harness::harness(Target::Dsl, &opts);
    let n = h.corpus().len() as u64;
    assert_eq!(harness::input(h.as_ref(), Target::Dsl, SEED, 0), h.corpus()[0]);
    let a = harness::input(h.as_ref(), Target::Dsl, SEED, n + 5);
    assert_eq!(a, harness::input(h.as_ref(), Target::Dsl, SEED, n + 5));
    assert_ne!(a, harness::input(h.as_ref(), Target::Dsl, SEED + 1, n + 5));
    assert_ne!(a, harness::input(h.as_ref(), Target::Dsl, SEED, n + 6));
}

#[test]
fn a_panic_is_caught_with_its_message_and_location() {
    struct Panics;
    impl harness::Fuzz for Panics {
        fn corpus(&self) -> &[Vec<u8>] {
            &[]
        }
        fn mutate(&self, _: &mut rumus::rng::Rng) -> Vec<u8> {
            Vec::new()
        }
        fn run(&mut self, input: &[u8]) -> Result<(), harness::Failure> {
            let v = [1, 2, 3];
            Err(harness::Failure::new("unreachable", v[input.len() + 3].to_string()))
        }
    }
    let (verdict, accepted) = harness::run_guarded(&mut Panics, b"");
    let Verdict::Panicked { message, location } = verdict else { panic!("{verdict:?}") };
    assert!(message.contains("index out of bounds"), "{message}");
    assert!(location.starts_with("tests/it/fuzz_smoke.rs:"), "{location}");
    assert!(!accepted);
}
