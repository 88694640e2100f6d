//! Differential testing of whole training steps: random small models written in the model
//! language, trained a few steps on the GPU (`highest`, the fp32 path) and on the CPU reference
//! from the same initial parameters and inputs; the losses of every step and every parameter and
//! optimizer state after the last must agree.
//!
//! The generator ([`Gen`]) writes chains and DAGs of the language's ops over small ragged
//! shapes (1, 3, 5, 7, 17, 33 ...): linear layers, products with transposed and batched
//! operands, elementwise ops and activations, broadcasting, sums, means and maxima over any
//! axes, softmax, LayerNorm, slices, permutes, reshapes, concats, causal self-attention (the
//! standard library's, and the `attention` op over heads split by hand), embeddings, residual
//! adds; then a cross-entropy or mean-squared-error loss, and SGD (with momentum, weight decay)
//! or Adam/AdamW, with gradient clipping sometimes. Every value the model computes reaches the
//! loss, so every kernel of the step is checked.
//!
//! Seeds 2 and 3 of every 4, and the fixed seeds whose models have chains a product can read
//! through a prologue, plan with operand prologues (`PlanOptions::matmul_prologues`, as plans
//! for cooperative products do); `GPU_DIFF_PROLOGUES=1` every seed.
//! `GPU_DIFF_SEEDS=a..b` runs those seeds instead of the fixed list (for hunting:
//! `GPU_DIFF_SEEDS=0..500 cargo test --test it gpu_diff:: -- --nocapture`); `GPU_DIFF_SHOW=1`
//! prints each model.

use crate::common::gpu::both_or_skip;
use rumus::backend::Backend;
use rumus::cpu::{Buf, CpuBackend, Executor, RunOptions};
use rumus::graph::{training_graph, Op, OptimConfig, Optimizer, TrainGraph};
use rumus::plan::PlanOptions;
use rumus::rng::Rng;
use rumus::runtime::backend::GpuBackend;
use rumus::runtime::Gpu;
use rumus::{dsl, Source, Tensor};

/// Ragged sizes: none a multiple of a workgroup or tile size but 8, and sizes of 1.
const SIZES: &[usize] = &[1, 3, 5, 7, 8, 17, 33];

/// What an input holds: floats, or integers below a bound (embedding indices, class labels).
#[derive(Clone, Copy, Debug)]
enum Kind {
    F32,
    I32(usize),
}

#[derive(Clone, Debug)]
struct Val {
    name: String,
    shape: Vec<usize>,
    /// Read by a later value (the loss reads every value no other one reads).
    used: bool,
}

/// A random model: its source and what the training step needs to run it.
pub struct Model {
    pub source: String,
    inputs: Vec<(String, Vec<usize>, Kind)>,
    optimizer: OptimConfig,
    lr: f32,
}

struct Gen {
    rng: Rng,
    lines: Vec<String>,
    vals: Vec<Val>,
    inputs: Vec<(String, Vec<usize>, Kind)>,
    /// Every `[in, out]` weight declared so far, by its dotted name: a later product may read
    /// one again (weight tying).
    weights: Vec<(String, usize, usize)>,
    n: usize,
}

fn dims(shape: &[usize]) -> String {
    let d: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", d.join(", "))
}

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.rng.below(n as u64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.uniform() < p
    }

    fn size(&mut self) -> usize {
        SIZES[self.below(SIZES.len())]
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}{}", self.n)
    }

    /// Binds `expr` of shape `shape` to a new name.
    fn push(&mut self, expr: String, shape: Vec<usize>) -> usize {
        let name = self.fresh("v");
        self.lines.push(format!("    {name} = {expr}"));
        self.vals.push(Val { name, shape, used: false });
        self.vals.len() - 1
    }

    /// An operand: mostly the newest value (chains), sometimes an older one (a DAG).
    fn operand(&mut self) -> usize {
        let n = self.vals.len();
        if self.chance(0.6) {
            n - 1
        } else {
            self.below(n)
        }
    }

    fn take(&mut self, i: usize) -> (String, Vec<usize>) {
        self.vals[i].used = true;
        (self.vals[i].name.clone(), self.vals[i].shape.clone())
    }

    fn input(&mut self, name: &str, shape: Vec<usize>, kind: Kind) {
        self.inputs.push((name.to_string(), shape, kind));
    }

    /// The model's first value: an input, or an embedding of one.
    fn start(&mut self) {
        let b = [1, 2, 3][self.below(3)];
        let t = [1, 3, 5, 7, 17][self.below(5)];
        let d = [3, 4, 6, 8, 15, 17, 65][self.below(7)];
        match self.below(4) {
            0 => {
                let vocab = [3, 7, 17][self.below(3)];
                self.input("idx", vec![b, t], Kind::I32(vocab));
                let mut e = format!("embedding(idx, {vocab}, {d}) as wte");
                if self.chance(0.5) {
                    let ctx = t + self.below(3);
                    e += &format!(" + position_embedding({t}, {ctx}, {d}) as wpe");
                }
                self.push(e, vec![b, t, d]);
            }
            1 => {
                self.input("x", vec![b * t, d], Kind::F32);
                self.vals.push(Val { name: "x".into(), shape: vec![b * t, d], used: false });
            }
            _ => {
                self.input("x", vec![b, t, d], Kind::F32);
                self.vals.push(Val { name: "x".into(), shape: vec![b, t, d], used: false });
            }
        }
    }

    /// One op on earlier values; `false` when the op drawn does not apply to its operand.
    fn step(&mut self) -> bool {
        let i = self.operand();
        let shape = self.vals[i].shape.clone();
        let rank = shape.len();
        let last = *shape.last().unwrap();
        // Layout ops drawn twice as often: chains of them are views the planner folds into
        // their readers' addressing.
        let op = match self.below(22) {
            17 | 18 => 9,
            19 => 10,
            20 => 11,
            21 => 12,
            op => op,
        };
        match op {
            0 => {
                if rank < 2 {
                    return false;
                }
                let (v, _) = self.take(i);
                let out = self.size();
                let name = self.fresh("lin");
                self.weights.push((format!("{name}.weight"), last, out));
                let mut s = shape;
                *s.last_mut().unwrap() = out;
                self.push(format!("linear({v}, {out}) as {name}"), s);
            }
            1 | 2 => {
                let (v, s) = self.take(i);
                const UNARY: &[&str] = &[
                    "relu(#)",
                    "gelu(#)",
                    "gelu_tanh(#)",
                    "tanh(#)",
                    "sigmoid(#)",
                    "silu(#)",
                    "softplus(#)",
                    "log_sigmoid(#)",
                    "exp(tanh(#))",
                    "log(1.0 + square(#))",
                    "sqrt(square(#) + 0.5)",
                    "rsqrt(square(#) + 1.0)",
                    "# / (1.0 + abs(#))",
                    "-#",
                    "0.5 * #",
                    "pow(abs(#) + 1.0, 1.5)",
                    "dropout(#, 0.25, 5)",
                    "where(#, #, 0.1 * #)",
                    "max(relu(#), [-1], keepdim = true) * #",
                ];
                let f = UNARY[self.below(UNARY.len())];
                self.push(f.replace('#', &v), s);
            }
            3 => {
                // Broadcast against a parameter over the last axis (or the last two).
                let (v, s) = self.take(i);
                let name = self.fresh("p");
                let pshape = if rank >= 2 && self.chance(0.3) {
                    vec![s[rank - 2], last]
                } else if self.chance(0.2) {
                    vec![1]
                } else {
                    vec![last]
                };
                let (op, init) = if self.chance(0.5) {
                    ("*", "normal(1.0, 0.1)")
                } else {
                    ("+", "normal(0.0, 0.1)")
                };
                self.push(format!("{v} {op} (param {name}{} = {init})", dims(&pshape)), s);
            }
            4 | 5 => {
                // With another value whose shape broadcasts against this one.
                let fits = |u: &[usize]| {
                    u.len() <= rank
                        && u.iter().rev().zip(shape.iter().rev()).all(|(&a, &b)| a == b || a == 1)
                };
                let others: Vec<usize> =
                    (0..self.vals.len()).filter(|&j| fits(&self.vals[j].shape)).collect();
                let j = others[self.below(others.len())];
                let (v, s) = self.take(i);
                let (u, _) = self.take(j);
                let f = [
                    "# + @",
                    "# - @",
                    "# * @",
                    "# / (1.0 + square(@))",
                    "maximum(#, @)",
                    "minimum(#, @)",
                    "where(@, #, -#)",
                ];
                let f = f[self.below(f.len())];
                self.push(f.replace('#', &v).replace('@', &u), s);
            }
            6 => {
                // A reduction over some axes; kept dimensions are often broadcast back.
                let mut axes: Vec<usize> = (0..rank).filter(|_| self.chance(0.4)).collect();
                if axes.is_empty() {
                    axes.push(self.below(rank));
                }
                let keep = self.chance(0.6) || axes.len() == rank;
                let op = ["sum", "mean", "max"][self.below(3)];
                let (v, s) = self.take(i);
                let ax: Vec<String> = axes
                    .iter()
                    .map(|&a| {
                        if self.chance(0.3) {
                            format!("{}", a as i64 - rank as i64)
                        } else {
                            a.to_string()
                        }
                    })
                    .collect();
                let r = format!("{op}({v}, [{}], keepdim = {keep})", ax.join(", "));
                if keep && self.chance(0.6) {
                    self.push(format!("{v} - {r}"), s);
                } else {
                    let out: Vec<usize> = if keep {
                        s.iter()
                            .enumerate()
                            .map(|(k, &d)| if axes.contains(&k) { 1 } else { d })
                            .collect()
                    } else {
                        s.iter()
                            .enumerate()
                            .filter(|(k, _)| !axes.contains(k))
                            .map(|(_, &d)| d)
                            .collect()
                    };
                    self.push(r, out);
                }
            }
            7 => {
                let (v, s) = self.take(i);
                let f = ["softmax(#)", "log_softmax(#)", "softmax(# * 2.0) * #"][self.below(3)];
                self.push(f.replace('#', &v), s);
            }
            8 => {
                let (v, s) = self.take(i);
                let name = self.fresh("ln");
                if self.chance(0.5) {
                    self.push(format!("layer_norm({v}) as {name}"), s);
                } else {
                    self.push(format!("{v} + layer_norm({v}) as {name}"), s);
                }
            }
            9 => {
                let axes: Vec<usize> = (0..rank).filter(|&a| shape[a] > 1).collect();
                if axes.is_empty() {
                    return false;
                }
                let a = axes[self.below(axes.len())];
                let start = self.below(shape[a]);
                let end = start + 1 + self.below(shape[a] - start);
                let (v, mut s) = self.take(i);
                s[a] = end - start;
                let ax = if self.chance(0.3) { a as i64 - rank as i64 } else { a as i64 };
                self.push(format!("slice({v}, {ax}, {start}, {end})"), s);
            }
            10 => {
                if rank < 2 {
                    return false;
                }
                let (v, s) = self.take(i);
                if self.chance(0.5) {
                    let a = self.below(rank);
                    let b = (a + 1 + self.below(rank - 1)) % rank;
                    let mut out = s.clone();
                    out.swap(a, b);
                    self.push(format!("transpose({v}, {a}, {b})"), out);
                } else {
                    let mut perm: Vec<usize> = (0..rank).collect();
                    self.rng.shuffle(&mut perm);
                    let out: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
                    let p: Vec<String> = perm.iter().map(|p| p.to_string()).collect();
                    self.push(format!("permute({v}, [{}])", p.join(", ")), out);
                }
            }
            11 => {
                // Merge two neighbouring axes, split one, or flatten.
                let mut out = shape.clone();
                let choice = self.below(3);
                if choice == 0 && rank >= 2 {
                    let a = self.below(rank - 1);
                    let m = out[a] * out[a + 1];
                    out.splice(a..a + 2, [m]);
                } else if choice == 1 {
                    let a = self.below(rank);
                    let d = out[a];
                    let f: Vec<usize> = (2..d).filter(|&f| d.is_multiple_of(f)).collect();
                    if f.is_empty() || rank >= 4 {
                        out.insert(a, 1);
                    } else {
                        let f = f[self.below(f.len())];
                        out.splice(a..a + 1, [f, d / f]);
                    }
                } else {
                    out = if rank >= 2 && self.chance(0.5) {
                        vec![shape[..rank - 1].iter().product(), last]
                    } else {
                        vec![shape.iter().product()]
                    };
                }
                let (v, _) = self.take(i);
                let mut d: Vec<String> = out.iter().map(|d| d.to_string()).collect();
                if self.chance(0.3) {
                    let k = self.below(d.len());
                    d[k] = "-1".into();
                }
                self.push(format!("reshape({v}, [{}])", d.join(", ")), out);
            }
            12 => {
                // Joined along an axis with part of itself, an activation of itself, or
                // another value of its shape but on that axis.
                let a = self.below(rank);
                let others: Vec<usize> = (0..self.vals.len())
                    .filter(|&j| {
                        let u = &self.vals[j].shape;
                        j != i && u.len() == rank && (0..rank).all(|k| k == a || u[k] == shape[k])
                    })
                    .collect();
                let (v, mut s) = self.take(i);
                let ax = if self.chance(0.3) { a as i64 - rank as i64 } else { a as i64 };
                let (other, len) = if !others.is_empty() && self.chance(0.5) {
                    let j = others[self.below(others.len())];
                    let (u, us) = self.take(j);
                    (u, us[a])
                } else if shape[a] > 1 && self.chance(0.5) {
                    let start = self.below(shape[a]);
                    (format!("slice({v}, {ax}, {start}, {})", shape[a]), shape[a] - start)
                } else {
                    (format!("tanh({v})"), shape[a])
                };
                let parts = if self.chance(0.5) {
                    format!("[{v}, {other}]")
                } else {
                    format!("[{other}, {v}]")
                };
                s[a] += len;
                self.push(format!("concat({parts}, {ax})"), s);
            }
            13 | 14 => {
                if rank < 2 {
                    return false;
                }
                let (m, k) = (shape[rank - 2], last);
                let batch = &shape[..rank - 2];
                // Another value with the same batch axes and a matching inner dimension, read
                // as is or transposed.
                let others: Vec<(usize, bool)> = (0..self.vals.len())
                    .flat_map(|j| [(j, false), (j, true)])
                    .filter(|&(j, t)| {
                        let u = &self.vals[j].shape;
                        let r = u.len();
                        r >= 2
                            && (r == 2 || &u[..r - 2] == batch)
                            && (if t { u[r - 1] == k } else { u[r - 2] == k })
                    })
                    .collect();
                let (v, s) = self.take(i);
                let transpose_left = self.chance(0.25);
                let tied: Vec<(String, usize, usize)> =
                    self.weights.iter().filter(|w| w.1 == k || w.2 == k).cloned().collect();
                if !tied.is_empty() && self.chance(0.3) {
                    let (w, i, o) = tied[self.below(tied.len())].clone();
                    let (rhs, n) = if i == k && (o != k || self.chance(0.5)) {
                        (w, o)
                    } else {
                        (format!("transpose({w}, 0, 1)"), i)
                    };
                    let mut out = s.clone();
                    out[rank - 1] = n;
                    self.push(format!("{v} @ {rhs}"), out);
                } else if others.is_empty() || self.chance(0.4) {
                    let n = self.size();
                    let name = self.fresh("w");
                    let (lhs, inner, rows) = if transpose_left {
                        (format!("transpose({v}, -1, -2)"), m, k)
                    } else {
                        (v, k, m)
                    };
                    let mut out = s.clone();
                    out[rank - 2] = rows;
                    out[rank - 1] = n;
                    let w = if self.chance(0.5) {
                        self.weights.push((name.clone(), inner, n));
                        format!("(param {name}[{inner}, {n}] = xavier)")
                    } else {
                        format!("transpose((param {name}[{n}, {inner}] = xavier), 0, 1)")
                    };
                    self.push(format!("{lhs} @ {w}"), out);
                } else {
                    let (j, t) = others[self.below(others.len())];
                    let (u, us) = self.take(j);
                    let r = us.len();
                    let (rhs, n) = if t {
                        (format!("transpose({u}, -1, -2)"), us[r - 2])
                    } else {
                        (u, us[r - 1])
                    };
                    let mut out = s.clone();
                    out[rank - 1] = n;
                    self.push(format!("0.5 * ({v} @ {rhs})"), out);
                }
            }
            15 => {
                // A square product of a sequence with itself, causally masked.
                if rank != 3 {
                    return false;
                }
                let (v, s) = self.take(i);
                let e = format!("softmax(causal_mask({v} @ transpose({v}, 1, 2) * 0.3)) @ {v}");
                self.push(e, s);
            }
            _ => {
                // Attention: the standard library's block (a residual), or the op over heads
                // split by hand from values of this shape.
                if rank != 3 {
                    return false;
                }
                // Heads of at most 128: the GPU's attention kernels refuse wider ones with an
                // error (`codegen::attention`), which the CPU has no reason to.
                let heads: Vec<usize> =
                    (1..=4).filter(|&h| last.is_multiple_of(h) && last / h <= 128).collect();
                if heads.is_empty() {
                    return false;
                }
                let h = heads[self.below(heads.len())];
                let (b, t, d) = (shape[0], shape[1], last);
                let (v, s) = self.take(i);
                if self.chance(0.5) {
                    let name = self.fresh("attn");
                    self.push(format!("{v} + causal_self_attention({v}, {h}) as {name}"), s);
                } else {
                    let split = |x: &str| {
                        format!("permute(reshape({x}, [{b}, {t}, {h}, {}]), [0, 2, 1, 3])", d / h)
                    };
                    let lin = self.fresh("kv");
                    let kv =
                        self.push(format!("linear({v}, {}) as {lin}", 2 * d), vec![b, t, 2 * d]);
                    let (kv, _) = self.take(kv);
                    let q = split(&v);
                    let k = split(&format!("slice({kv}, 2, 0, {d})"));
                    let vv = split(&format!("slice({kv}, -1, {d}, {})", 2 * d));
                    let y = format!("attention({q}, {k}, {vv})");
                    let merged = format!("reshape(permute({y}, [0, 2, 1, 3]), [{b}, {t}, {d}])");
                    self.push(merged, s);
                }
            }
        }
        true
    }

    /// The loss: a cross-entropy over the last value (through a head) or its mean squared
    /// error against a target, plus a small term for each value nothing else read.
    fn finish(&mut self) -> String {
        let last = self.vals.len() - 1;
        let (f, shape) = self.take(last);
        let mut loss = if shape.len() >= 2 && self.chance(0.6) {
            let c = [2, 3, 5, 7][self.below(4)];
            let labels = shape[..shape.len() - 1].to_vec();
            self.input("y", labels, Kind::I32(c));
            format!("cross_entropy(linear({f}, {c}) as head, y)")
        } else {
            self.input("target", shape.clone(), Kind::F32);
            format!("mse({f}, target)")
        };
        for v in self.vals.clone() {
            if !v.used {
                let axes: Vec<String> = (0..v.shape.len()).map(|a| a.to_string()).collect();
                loss += &format!(" + 0.1 * mean(square({}), [{}])", v.name, axes.join(", "));
            }
        }
        loss
    }
}

/// The model of `seed`: a chain or DAG of 3 to 10 ops, its loss and optimizer.
pub fn model(seed: u64) -> Model {
    let mut g = Gen {
        rng: Rng::new(seed),
        lines: Vec::new(),
        vals: Vec::new(),
        inputs: Vec::new(),
        weights: Vec::new(),
        n: 0,
    };
    g.start();
    let ops = 3 + g.below(8);
    let mut done = 0;
    while done < ops {
        if g.step() {
            done += 1;
        }
    }
    let loss = g.finish();
    let sig: Vec<String> = g
        .inputs
        .iter()
        .map(|(n, s, k)| {
            format!("{n}: {}32{}", if matches!(k, Kind::F32) { "f" } else { "i" }, dims(s))
        })
        .collect();
    let source =
        format!("model m({}) {{\n{}\n    return {loss}\n}}\n", sig.join(", "), g.lines.join("\n"));
    let (optimizer, lr) = match g.below(3) {
        0 => {
            let momentum = if g.chance(0.5) { 0.9 } else { 0.0 };
            let weight_decay = if g.chance(0.3) { 1e-3 } else { 0.0 };
            (Optimizer::Sgd { momentum, weight_decay }, 0.05)
        }
        // eps 1e-3: a gradient that is zero up to rounding (a softmax's shift, a bias before a
        // LayerNorm) would otherwise be scaled to a full step whose sign is the rounding's.
        1 => (Optimizer::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-3, weight_decay: 0.0 }, 0.01),
        _ => (Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-3, weight_decay: 0.01 }, 0.01),
    };
    let clip_norm = if g.chance(0.3) { Some(0.5) } else { None };
    let accumulate = if g.chance(0.2) { 2 } else { 1 };
    let optimizer = OptimConfig { clip_norm, accumulate, ..OptimConfig::new(optimizer) };
    Model { source, inputs: g.inputs, optimizer, lr }
}

/// The training step of a model.
fn step(m: &Model) -> rumus::Result<TrainGraph> {
    let src = Source::new("gen.rms", m.source.as_str());
    let at = |e: rumus::Error| e.in_source(&src);
    let module = dsl::load(&src).map_err(at)?;
    let mut g = dsl::lower(&module, "m", &[], None).map_err(at)?;
    let loss = g.outputs[0].1;
    g.outputs.clear();
    training_graph(g, loss, &m.optimizer).map_err(at)
}

/// Deterministic inputs for the model (floats in [-1.5, 1.5], integers within their bound).
fn feeds(m: &Model, t: &TrainGraph, seed: u64) -> Vec<(rumus::graph::NodeId, Tensor)> {
    let mut rng = Rng::new(seed ^ 0xfeed);
    let mut out = Vec::new();
    for (name, shape, kind) in &m.inputs {
        let id = t
            .graph
            .nodes()
            .find(|(_, n)| matches!(&n.op, Op::Input { name: x } if x == name))
            .map(|(id, _)| id)
            .unwrap();
        let len: usize = shape.iter().product();
        let tensor = match kind {
            Kind::F32 => {
                let v = (0..len).map(|_| (rng.uniform() * 3.0 - 1.5) as f32).collect();
                Tensor::f32(shape, v).unwrap()
            }
            Kind::I32(n) => {
                let v = (0..len).map(|_| rng.below(*n as u64) as i32).collect();
                Tensor::i32(shape, v).unwrap()
            }
        };
        out.push((id, tensor));
    }
    out
}

const STEPS: u64 = 3;

/// The feeds of each micro-batch of a training step (one without accumulation): other inputs
/// for each micro-batch, the same at every step.
fn step_feeds(
    m: &Model,
    t: &TrainGraph,
    seed: u64,
) -> Vec<(usize, Vec<(rumus::graph::NodeId, Tensor)>)> {
    (0..m.optimizer.accumulate)
        .map(|micro| {
            let mut f = feeds(m, t, seed + 1000 * micro as u64);
            f.extend(t.optim.micro_batch_feed(micro));
            (micro, f)
        })
        .collect()
}

/// The loss of each step, then every parameter and state value (by name) after the last.
type Trained = (Vec<f32>, Vec<(String, Vec<f32>)>);

fn train(
    backend: &mut dyn Backend,
    m: &Model,
    t: &TrainGraph,
    seed: u64,
) -> rumus::Result<Trained> {
    let mut losses = Vec::new();
    for step in 0..STEPS {
        for (micro, mut f) in step_feeds(m, t, seed) {
            f.extend(t.optim.host_feeds(m.lr, step));
            let refs: Vec<_> = f.iter().map(|(id, t)| (*id, t)).collect();
            let out = if micro + 1 < m.optimizer.accumulate {
                backend.run_micro_batch(&refs, &[t.loss], step)?
            } else {
                backend.run(&refs, &[t.loss], RunOptions { training: true, step })?
            };
            losses.push(out[0].to_f32_vec()[0]);
        }
    }
    let mut values = Vec::new();
    for (id, n) in t.graph.nodes() {
        if let Op::Parameter { name, .. } | Op::State { name, .. } = &n.op {
            values.push((name.clone(), backend.read(id)?.to_f32_vec()));
        }
    }
    Ok((losses, values))
}

/// Feeds for the f64 interpreter.
fn f64_feeds(f: &[(rumus::graph::NodeId, Tensor)]) -> Vec<(rumus::graph::NodeId, Buf<f64>)> {
    let to_buf = |t: &Tensor| match t.as_f32() {
        Some(v) => Buf::F(v.iter().map(|&x| x as f64).collect()),
        None => Buf::I(t.as_i32().unwrap().to_vec()),
    };
    f.iter().map(|(id, t)| (*id, to_buf(t))).collect()
}

/// What the interpreter runs for a micro-batch that only accumulates: the graph with only the
/// accumulators' updates, as `CpuBackend::run_micro_batch` does.
fn micro_graph(g: &rumus::graph::Graph) -> rumus::graph::Graph {
    let mut micro = g.clone();
    micro.updates.retain(|u| u.every_micro_batch);
    micro
}

/// The same steps in f64 on the CPU interpreter: the reference both f32 runs are measured
/// against.
fn train_f64(m: &Model, t: &TrainGraph, seed: u64) -> rumus::Result<(Vec<f64>, Vec<Vec<f64>>)> {
    let g = &t.graph;
    let mut exec = Executor::<f64>::new(g, 7)?;
    let micro_graph = micro_graph(g);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        for (micro, mut f) in step_feeds(m, t, seed) {
            f.extend(t.optim.host_feeds(m.lr, step));
            let bufs = f64_feeds(&f);
            let run = if micro + 1 < m.optimizer.accumulate { &micro_graph } else { g };
            let out = exec.run(run, &bufs, &[t.loss], RunOptions { training: true, step })?;
            let Buf::F(l) = &out[0] else { unreachable!("the loss is f32") };
            losses.push(l[0]);
        }
    }
    let values = g
        .nodes()
        .filter(|(_, n)| n.op.is_persistent())
        .map(|(id, _)| exec.persistent(id).unwrap().to_vec())
        .collect();
    Ok((losses, values))
}

/// The tolerance: `|gpu − ref| ≤ ATOL + RTOL·|ref| + NOISE·noise`, where `ref` is the f64
/// reference and `noise` the farther from it of two f32 runs on the CPU, one from the
/// parameters the GPU starts from and one from them nudged by an ulp ([`nudged`]). The GPU
/// sums in other orders than the CPU, so it rounds differently but about as much: the CPU's
/// distance from f64 measures how much this element's f32 rounding was amplified (Adam dividing
/// a gradient that is zero up to rounding by sqrt(v) + eps, a loss that grows each step), and
/// the GPU may be a few times further. One run can land near f64 by chance where the element is
/// ill-conditioned (seed 37: a softmax of scores near 8000 whose gradients are 200% off on
/// both devices, the CPU within 5e-7 at one accumulated element), so the nudged run samples the
/// rounding again. ATOL and RTOL bound the rest, where both happen to round to the f64 value.
const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-4;
const NOISE: f64 = 16.0;

/// How far `gpu` is from `reference` in units of the tolerance (`> 1`: a mismatch), with `cpu`
/// and `nudged` the CPU's two f32 runs; a disagreeing NaN or infinity is infinitely far.
fn excess(gpu: f32, cpu: f32, nudged: f32, reference: f64) -> f64 {
    let (g, c) = (gpu as f64, cpu as f64);
    if g == c || (g.is_nan() && c.is_nan()) {
        return 0.0;
    }
    let d = (g - reference).abs();
    let noise = (c - reference).abs().max((nudged as f64 - reference).abs());
    if d.is_nan() || noise.is_nan() {
        return f64::INFINITY;
    }
    d / (ATOL + RTOL * reference.abs() + NOISE * noise)
}

/// The outcome of one model on one device.
#[derive(Debug)]
pub enum Outcome {
    /// Within tolerance; the largest excess (for the log).
    Agree(#[allow(dead_code)] f64),
    /// The CPU reference's own loss is not finite (a model the generator should not write).
    Unstable,
    /// A mismatch, an error on one side only, or a GPU error.
    Finding(String),
}

/// A CPU backend for `t` whose parameters start one ulp up or down (at random) from where the
/// other runs' start: its f32 run samples the rounding noise again ([`excess`]).
fn nudged(t: &TrainGraph, seed: u64) -> rumus::Result<CpuBackend> {
    let mut b = CpuBackend::new(t.graph.clone(), 7)?;
    let mut rng = Rng::new(seed ^ 0x0dd5);
    for (id, n) in t.graph.nodes() {
        if let Op::Parameter { .. } = n.op {
            let v = b.read(id)?.to_f32_vec();
            let up = |x: f32, r: f64| if r < 0.5 { x.next_up() } else { x.next_down() };
            let v: Vec<f32> = v.into_iter().map(|x| up(x, rng.uniform())).collect();
            b.write(id, &Tensor::f32(&n.shape, v)?)?;
        }
    }
    Ok(b)
}

/// Runs model `seed` on the CPU and on `gpu`, and compares.
pub fn check(gpu: &'static Gpu, seed: u64) -> Outcome {
    let m = model(seed);
    if std::env::var("GPU_DIFF_SHOW").is_ok() {
        println!("seed {seed}:\n{}", m.source);
    }
    check_model(gpu, &m, seed)
}

/// Trains `m` (inputs drawn from `seed`) on the CPU and on `gpu`, and compares.
fn check_model(gpu: &'static Gpu, m: &Model, seed: u64) -> Outcome {
    let t = match step(m) {
        Ok(t) => t,
        Err(e) => return Outcome::Finding(format!("the generated model does not lower: {e}")),
    };
    let cpu = CpuBackend::new(t.graph.clone(), 7).and_then(|mut b| train(&mut b, m, &t, seed));
    let nudged = nudged(&t, seed).and_then(|mut b| train(&mut b, m, &t, seed));
    // Half the seeds with operand prologues (chains of unary ops fused into the products that
    // read them), which plans for cooperative products make; `GPU_DIFF_PROLOGUES=1`: all.
    let prologues = std::env::var("GPU_DIFF_PROLOGUES").is_ok()
        || seed % 4 >= 2
        || PROLOGUE_SEEDS.contains(&seed);
    let options = PlanOptions { matmul_prologues: prologues, ..PlanOptions::default() };
    let gpu = GpuBackend::new(gpu, t.graph.clone(), 7, options)
        .and_then(|mut b| train(&mut b, m, &t, seed));
    let ((cl, cv), (gl, gv), (nl, nv)) = match (cpu, gpu, nudged) {
        (Ok(c), Ok(g), Ok(n)) => (c, g, n),
        (c, g, _) => {
            return Outcome::Finding(format!(
                "cpu {:?}, gpu {:?}",
                c.map(|_| ()).map_err(|e| e.to_string()),
                g.map(|_| ()).map_err(|e| e.to_string())
            ))
        }
    };
    if cl.iter().any(|l| !l.is_finite()) {
        return Outcome::Unstable;
    }
    let (rl, rv) = match train_f64(m, &t, seed) {
        Ok(r) => r,
        Err(e) => return Outcome::Finding(format!("f64 reference: {e}")),
    };
    let mut worst = 0f64;
    for (s, (((&g, &c), &n), &r)) in gl.iter().zip(&cl).zip(&nl).zip(&rl).enumerate() {
        let e = excess(g, c, n, r);
        if e > 1.0 {
            return Outcome::Finding(format!("loss of step {s}: gpu {gl:?}, cpu {cl:?}"));
        }
        worst = worst.max(e);
    }
    for ((((name, g), (_, c)), (_, n)), r) in gv.iter().zip(&cv).zip(&nv).zip(&rv) {
        for (k, (((&a, &b), &n), &r)) in g.iter().zip(c).zip(n).zip(r).enumerate() {
            let e = excess(a, b, n, r);
            if e > 1.0 {
                return Outcome::Finding(format!(
                    "{name}[{k}]: gpu {a}, cpu {b}, f64 {r} (losses gpu {gl:?}, cpu {cl:?})"
                ));
            }
            worst = worst.max(e);
        }
    }
    Outcome::Agree(worst)
}

/// Seeds whose models have a chain of unary ops that only a product reads (their plans with
/// prologues have fewer kernels; found by counting for seeds 0 to 400, 2026-12-02), run with
/// prologues.
const PROLOGUE_SEEDS: [u64; 5] = [13, 98, 111, 144, 199];

/// The seeds the test runs: `GPU_DIFF_SEEDS=a..b`, or a fixed list.
fn seeds() -> Vec<u64> {
    if let Ok(r) = std::env::var("GPU_DIFF_SEEDS") {
        let (a, b) = r.split_once("..").expect("GPU_DIFF_SEEDS=a..b");
        return (a.parse().unwrap()..b.parse().unwrap()).collect();
    }
    (0..12).chain(PROLOGUE_SEEDS).collect()
}

/// Random models train alike on the GPU and the CPU, on the adapter's own limits and on
/// WebGPU's defaults (the seeds split between them).
#[test]
fn random_models_train_alike_on_the_gpu_and_the_cpu() {
    let (gpus, _turn) = both_or_skip("random_models_train_alike_on_the_gpu_and_the_cpu");
    if gpus.is_empty() {
        return;
    }
    let mut findings = Vec::new();
    for seed in seeds() {
        let gpu = gpus[seed as usize % gpus.len()];
        let started = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(gpu, seed)))
            .unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Outcome::Finding(format!("panic: {msg}"))
            });
        let max = gpu.limits.max_storage_buffers_per_shader_stage;
        println!("seed {seed} at {max} buffers: {outcome:?} ({:.1?})", started.elapsed());
        if let Outcome::Finding(f) = outcome {
            findings.push(format!("seed {seed} at {max} buffers: {f}\n{}", model(seed).source));
        }
    }
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}

/// Found by this generator: a model without parameters trained with gradient accumulation ran
/// its micro-batches on the CPU (the forward pass and the loss) but failed on the GPU with "a
/// micro-batch run of a plan that accumulates nothing": a plan of a graph without updates has
/// no micro-batch part, and the GPU refused to run one instead of running the whole plan.
#[test]
fn a_model_without_parameters_accumulates_as_on_the_cpu() {
    let (gpus, _turn) = both_or_skip("a_model_without_parameters_accumulates_as_on_the_cpu");
    let m = Model {
        source: "model m(x: f32[3, 5], target: f32[5]) {\n    return mse(max(x, [0]), target)\n}\n"
            .into(),
        inputs: vec![("x".into(), vec![3, 5], Kind::F32), ("target".into(), vec![5], Kind::F32)],
        optimizer: OptimConfig { accumulate: 2, ..OptimConfig::new(Optimizer::sgd()) },
        lr: 0.05,
    };
    for gpu in gpus {
        let outcome = check_model(gpu, &m, 1);
        assert!(matches!(outcome, Outcome::Agree(_)), "{outcome:?}");
    }
}

/// Every value of a random model's first training step (or micro-batch), read back from the
/// GPU, agrees with the CPU's: each tensor within `ATOL + RTOL·max|ref| + NOISE·max|cpu − ref|`
/// of the f64 reference in its largest element (normwise: an intermediate of an ill-conditioned
/// model is far from f64 on both devices, seed 37's scores' gradients by 200% on the CPU). A
/// value read from the wrong place or at the wrong time is far off. Found this way: a
/// parameter's view and the parameters' arena were read after the update. Seeds 0 to 5 and 37;
/// `GPU_DIFF_SEEDS=a..b` those instead.
#[test]
fn every_value_of_a_step_reads_as_on_the_cpu() {
    let (gpus, _turn) = both_or_skip("every_value_of_a_step_reads_as_on_the_cpu");
    if gpus.is_empty() {
        return;
    }
    let mut findings = Vec::new();
    let hunting = std::env::var("GPU_DIFF_SEEDS").is_ok();
    for seed in if hunting { seeds() } else { (0..6).chain([37]).collect() } {
        let gpu = gpus[seed as usize % gpus.len()];
        let m = model(seed);
        let t = step(&m).unwrap();
        let g = &t.graph;
        let want: Vec<_> = g
            .nodes()
            .filter(|(_, n)| n.dtype == rumus::DType::F32 && !matches!(n.op, Op::Constant { .. }))
            .map(|(id, _)| id)
            .collect();
        let (_, mut f) = step_feeds(&m, &t, seed).swap_remove(0);
        f.extend(t.optim.host_feeds(m.lr, 0));
        let refs: Vec<_> = f.iter().map(|(id, t)| (*id, t)).collect();
        let opts = RunOptions { training: true, step: 0 };
        let micro = m.optimizer.accumulate > 1;
        let run = |b: &mut dyn Backend| {
            if micro {
                b.run_micro_batch(&refs, &want, 0)
            } else {
                b.run(&refs, &want, opts)
            }
        };
        let cpu = run(&mut CpuBackend::new(g.clone(), 7).unwrap()).unwrap();
        let options = PlanOptions { matmul_prologues: seed % 4 >= 2, ..PlanOptions::default() };
        let on_gpu = run(&mut GpuBackend::new(gpu, g.clone(), 7, options).unwrap()).unwrap();
        let graph = if micro { &micro_graph(g) } else { g };
        let mut exec = Executor::<f64>::new(g, 7).unwrap();
        let reference = exec.run(graph, &f64_feeds(&f), &want, opts).unwrap();
        for (i, id) in want.iter().enumerate() {
            let Buf::F(r) = &reference[i] else { unreachable!("an f32 value") };
            let far = |v: &Tensor| {
                let v = v.to_f32_vec();
                v.iter().zip(r).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max)
            };
            let (dg, dc) = (far(&on_gpu[i]), far(&cpu[i]));
            let scale = r.iter().fold(0f64, |a, &x| a.max(x.abs()));
            // NaN on the GPU alone is a finding too.
            let agree = dg <= ATOL + RTOL * scale + NOISE * dc || (dg.is_nan() && dc.is_nan());
            if !agree {
                let n = g.node(*id);
                findings.push(format!(
                    "seed {seed}: node {} ({}, {:?}): gpu off by {dg:.3e}, cpu by {dc:.3e}, largest {scale:.3e}",
                    id.index(),
                    n.op.name(),
                    n.shape
                ));
            }
        }
    }
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}
