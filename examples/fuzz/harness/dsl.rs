//! Target `dsl`: model-language text through `dsl::load` and `dsl::load_rms` (parse, resolve),
//! then every model lowered (`dsl::lower`, unset dimensions 2), extended into a training step
//! (cross-entropy on the first output, AdamW), planned, and, when small, run one step on the
//! CPU interpreter with random inputs: what `rumus graph`, `rumus plan` and a script's `compile`
//! do.
//!
//! Invariants: every error passes [`check::error`]; a lowered graph and its training graph pass
//! `graph::verify`; no constant of a lowered graph is inf or NaN (a number the source wrote
//! must not silently leave f32's range).

use super::check::{self, Failure};
use super::mutate::Mutator;
use super::{repo_file, repo_files, Fuzz};
use rumus::backend::Backend;
use rumus::cpu::CpuBackend;
use rumus::cpu::RunOptions;
use rumus::dsl::{self, Module};
use rumus::graph::{training_graph, verify, Graph, Op, OptimConfig, Optimizer};
use rumus::plan::{plan, PlanOptions};
use rumus::rng::Rng;
use rumus::session::TARGET_INPUT;
use rumus::tensor::{DType, Tensor};
use rumus::{Error, Source};
use std::sync::Arc;

/// Most models lowered per input.
const MAX_MODELS: usize = 3;
/// Largest graph (elements over all nodes) extended into a training step and planned.
const MAX_PLANNED_ELEMENTS: usize = 1 << 20;
/// Largest training graph (elements over all nodes) run on the CPU.
const MAX_RUN_ELEMENTS: usize = 1 << 15;

/// Words and punctuation of the model language.
pub const DICT: &[&str] = &[
    "model",
    "block",
    "param",
    "const",
    "repeat",
    "return",
    "as",
    "ops.",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "...",
    "+",
    "-",
    "*",
    "/",
    "@",
    "x",
    "y",
    "B",
    "T",
    "D",
    "IN",
    "f32",
    "i32",
    "f64",
    "true",
    "false",
    "zeros",
    "ones",
    "normal(0, 1)",
    "uniform(-1, 1)",
    "xavier",
    "kaiming",
    "linear",
    "layer_norm",
    "embedding",
    "mlp",
    "causal_self_attention",
    "transformer_block",
    "position_embedding",
    "keepdim = true",
    "axis = 0",
    "//",
    "/*",
    "*/",
    "\n",
    "x: f32[B, 4]",
    "idx: i32[B, T]",
    "[...]",
    "[..., D]",
    "[]",
    "é",
    "\"",
];

pub struct Dsl {
    corpus: Vec<Vec<u8>>,
    dict: Vec<&'static str>,
}

impl Dsl {
    pub fn new() -> Dsl {
        let mut corpus = vec![repo_file("src/dsl/std.rms")];
        corpus.extend(repo_files("examples/fuzz/seeds", "rms"));
        for dir in ["scripts", "scripts/bench"] {
            for file in repo_files(dir, "rms") {
                let models = dsl::rms::split(&String::from_utf8_lossy(&file)).model_text;
                corpus.push(models.trim().as_bytes().to_vec());
                corpus.push(file);
            }
        }
        let mut dict = DICT.to_vec();
        dict.extend(dsl::ops::all().map(|o| o.name));
        Dsl { corpus, dict }
    }

    fn model(&self, module: &Module, name: &str, src: &Arc<Source>) -> Result<(), Failure> {
        let g = match dsl::lower(module, name, &[], Some(2)) {
            Ok(g) => {
                super::accepted();
                g
            }
            Err(e) => return check::error(&e.in_source(src)),
        };
        if let Err(e) = verify(&g) {
            return Err(Failure::new("lowered-graph-fails-verify", check::clip(&e.message, 300)));
        }
        // A number the source wrote must not silently become inf or NaN in f32.
        for (_, n) in g.nodes() {
            if let Op::Constant { value } = n.op {
                if !value.is_finite() {
                    return Err(Failure::new(
                        "non-finite-constant",
                        format!("{value} in `{name}`"),
                    ));
                }
            }
        }
        if elements(&g) <= MAX_PLANNED_ELEMENTS {
            if let Err(e) = train(g) {
                return check::error(&e.in_source(src));
            }
        }
        Ok(())
    }
}

impl Fuzz for Dsl {
    fn corpus(&self) -> &[Vec<u8>] {
        &self.corpus
    }

    fn mutate(&self, rng: &mut Rng) -> Vec<u8> {
        Mutator { corpus: &self.corpus, dict: &self.dict }.text(rng)
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        let src = Source::new("fuzz.rms", String::from_utf8_lossy(input));
        for loaded in [dsl::load(&src), dsl::load_rms(&src)] {
            let module = match loaded {
                Ok(m) => m,
                Err(e) => {
                    check::error(&e.in_source(&src))?;
                    continue;
                }
            };
            let names: Vec<String> = module
                .models()
                .filter(|m| !module.is_std(&m.name.name))
                .map(|m| m.name.name.clone())
                .take(MAX_MODELS)
                .collect();
            for name in names {
                self.model(&module, &name, &src)?;
            }
        }
        Ok(())
    }
}

/// Cross-entropy on the first output against i32 targets (as `rumus plan` does), AdamW, the
/// plan, and one CPU step when small. Broken invariants come back as `Invariant` errors.
fn train(mut g: Graph) -> Result<(), Error> {
    let Some(&(_, out)) = g.outputs.first() else { return Ok(()) };
    let shape = g.shape(out).to_vec();
    let labels = &shape[..shape.len().saturating_sub(1)];
    let target = g.input(TARGET_INPUT, labels, DType::I32)?;
    let loss = g.cross_entropy(out, target, None)?;
    let cfg = OptimConfig { clip_norm: Some(1.0), ..OptimConfig::new(Optimizer::adamw()) };
    let t = training_graph(g, loss, &cfg)?;
    verify(&t.graph)
        .map_err(|e| Error::invariant(format!("training graph fails verify: {}", e.message)))?;
    plan(&t.graph, &[t.loss], true, PlanOptions::default())?;
    if elements(&t.graph) <= MAX_RUN_ELEMENTS {
        let feeds = rumus::cli::bench::random_feeds(&t, 1)?;
        let feeds: Vec<_> = feeds.iter().map(|(id, v)| (*id, v)).collect();
        let mut cpu = CpuBackend::new(t.graph.clone(), 0)?;
        let out: Vec<Tensor> =
            cpu.run(&feeds, &[t.loss], RunOptions { training: true, step: 0 })?;
        if out.len() != 1 {
            return Err(Error::invariant(format!("one value asked, {} returned", out.len())));
        }
    }
    Ok(())
}

/// Elements over all nodes of a graph (saturating).
fn elements(g: &Graph) -> usize {
    g.nodes().fold(0usize, |n, (id, _)| {
        n.saturating_add(g.shape(id).iter().fold(1usize, |a, &d| a.saturating_mul(d)))
    })
}
