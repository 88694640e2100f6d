//! Target `script`: `.rms` files run by a fresh `rumus::Engine` (`eval_file`) on the CPU, in a
//! sandbox bounded the way a host running untrusted scripts would bound it: an operation limit,
//! a memory budget, reads below the scratch folder (which holds a copy of `scripts/data`) and
//! writes below its `target/` and `out/` (emptied after each input). A watchdog interrupts a
//! script that runs longer than the soft limit at its next operation. The scratch folder is the
//! sandbox's `base_dir`, so the scripts' relative paths name files there (the process's working
//! directory is left alone: other tests share the process).
//!
//! Invariants: every error passes [`check::error`].

use super::check::{self, Failure};
use super::mutate::Mutator;
use super::{empty_dir, repo, repo_files, Fuzz, Options};
use rumus::rng::Rng;
use rumus::script::{HostOptions, Interrupt, Sandbox};
use rumus::Engine;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Words of rhai and of the script API, option keys, paths and the model language's keywords.
pub const DICT: &[&str] = &[
    "let",
    "const",
    "fn",
    "for",
    "in",
    "while",
    "loop",
    "if",
    "else",
    "return",
    "break",
    "continue",
    "throw",
    "try",
    "catch",
    "import",
    "export",
    "this",
    "Fn",
    "call",
    "switch",
    "print",
    "debug",
    "type_of",
    "#{",
    "}",
    "{",
    "[",
    "]",
    "(",
    ")",
    ";",
    ",",
    ".",
    ":",
    "=>",
    "=",
    "==",
    "+",
    "-",
    "*",
    "/",
    "%",
    "**",
    "..",
    "..=",
    "`${x}`",
    "\"",
    "'a'",
    "()",
    "true",
    "x",
    "y",
    "net",
    "data",
    "batch",
    "tensor",
    "zeros",
    "ones",
    "full",
    "randn",
    "rand",
    "shape",
    "dtype",
    "numel",
    "rank",
    "len",
    "to_array",
    "item",
    "reshape",
    "to_f32",
    "to_i32",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "sample",
    "exp",
    "ln",
    "sqrt",
    "abs",
    "relu",
    "pow",
    "csv",
    "text",
    "dataset",
    "split",
    "shuffle",
    "batches",
    "compile",
    "sgd",
    "adam",
    "adamw",
    "step_lr",
    "cosine",
    "train_step",
    "predict",
    "accuracy",
    "step",
    "lr",
    "plan",
    "params",
    "param",
    "set_param",
    "save",
    "load",
    "read_text",
    "write_text",
    "log_metric",
    "seed",
    "device",
    "classes",
    "batch:",
    "loss:",
    "optimizer:",
    "schedule:",
    "dims:",
    "clip:",
    "seed:",
    "lr:",
    "momentum:",
    "weight_decay:",
    "betas:",
    "eps:",
    "warmup:",
    "total:",
    "min_lr:",
    "every:",
    "gamma:",
    "label_col:",
    "labels:",
    "header:",
    "scale:",
    "seq_len:",
    "stride:",
    "ignore_index:",
    "output:",
    "device:",
    "\"cross_entropy\"",
    "\"mse\"",
    "\"output\"",
    "\"i32\"",
    "\"f32\"",
    "\"targets\"",
    "\"classes\"",
    "\"cpu\"",
    "\"scripts/data/blobs.csv\"",
    "\"scripts/data/iris.csv\"",
    "\"scripts/data/digits.csv.gz\"",
    "\"scripts/data/tiny.txt\"",
    "\"target/m.safetensors\"",
    "\"out/x.txt\"",
    "\"/etc/passwd\"",
    "\"..\"",
    "\".\"",
    "\"\"",
    "\"target\"",
    "\"scripts/data\"",
    "model",
    "block",
    "param",
    "repeat",
    "as",
    "f32[B, 4]",
    "i32[B, T]",
    "linear",
    "relu",
    "layer_norm",
    "embedding",
];

pub struct Script {
    corpus: Vec<Vec<u8>>,
    scratch: PathBuf,
    sandbox: Sandbox,
    soft: Duration,
    watch: Arc<Watch>,
}

/// What the watchdog thread watches: the running input's deadline and interrupt flag.
#[derive(Default)]
struct Watch {
    armed: Mutex<Option<(Instant, Interrupt)>>,
    stop: AtomicBool,
}

impl Script {
    pub fn new(opts: &Options) -> Script {
        let scratch = opts.scratch.clone();
        let data = scratch.join("scripts/data");
        std::fs::create_dir_all(&data).expect("create the scratch data folder");
        for e in std::fs::read_dir(repo().join("scripts/data")).expect("scripts/data").flatten() {
            std::fs::copy(e.path(), data.join(e.file_name())).expect("copy scripts/data");
        }
        for dir in ["target", "out"] {
            std::fs::create_dir_all(scratch.join(dir)).expect("create a scratch folder");
        }
        let sandbox = Sandbox {
            max_operations: 50_000,
            max_string_size: 1 << 20,
            max_array_size: 1 << 16,
            max_map_size: 1 << 10,
            memory_budget: 64 << 20,
            base_dir: scratch.clone(),
            read_roots: vec![scratch.clone()],
            write_roots: vec![scratch.join("target"), scratch.join("out")],
            ..Sandbox::default()
        };
        let mut corpus = repo_files("scripts", "rms");
        corpus.extend(repo_files("scripts/bench", "rms"));
        corpus.extend(repo_files("examples/fuzz/seeds", "rms"));
        let watch = Arc::new(Watch::default());
        let w = watch.clone();
        std::thread::spawn(move || {
            while !w.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                if let Some((deadline, flag)) = &*w.armed.lock().unwrap_or_else(|e| e.into_inner())
                {
                    if Instant::now() > *deadline {
                        flag.trigger();
                    }
                }
            }
        });
        let soft = Duration::from_millis(opts.soft_ms);
        Script { corpus, scratch, sandbox, soft, watch }
    }

    fn arm(&self, flag: Option<Interrupt>) {
        *self.watch.armed.lock().unwrap_or_else(|e| e.into_inner()) =
            flag.map(|f| (Instant::now() + self.soft, f));
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Relaxed);
    }
}

impl Fuzz for Script {
    fn corpus(&self) -> &[Vec<u8>] {
        &self.corpus
    }

    fn mutate(&self, rng: &mut Rng) -> Vec<u8> {
        let mut s = Mutator { corpus: &self.corpus, dict: DICT }.text(rng);
        // The CPU only: no GPU adapter is opened in the fuzz loop.
        for (from, to) in [(&b"gpu"[..], &b"cpu"[..]), (b"auto", b"cpu ")] {
            replace_all(&mut s, from, to);
        }
        s
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        let path = self.scratch.join("input.rms");
        std::fs::write(&path, input).expect("write the input to the scratch folder");
        let opts = HostOptions {
            sandbox: self.sandbox.clone(),
            device: "cpu".into(),
            ..HostOptions::default()
        };
        let mut engine = Engine::with_options(opts);
        engine.on_print(|_| {});
        self.arm(Some(engine.host().interrupt().clone()));
        let result = engine.eval_file(&path);
        self.arm(None);
        drop(engine);
        empty_dir(&self.scratch.join("target"));
        empty_dir(&self.scratch.join("out"));
        match result {
            Ok(_) => {
                super::accepted();
                Ok(())
            }
            Err(e) => check::error(&e),
        }
    }
}

fn replace_all(buf: &mut [u8], from: &[u8], to: &[u8]) {
    let mut i = 0;
    while i + from.len() <= buf.len() {
        if buf[i..].starts_with(from) {
            buf[i..i + to.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
}
