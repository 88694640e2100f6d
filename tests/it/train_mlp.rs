//! A two-layer MLP built from Rust trains with every optimizer on a small fixed problem and
//! reaches a stated loss on the CPU backend; the same run twice gives bit-identical losses.

use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::graph::{training_graph, Graph, Init, OptimConfig, Optimizer};
use rumus::DType;

const N: usize = 64;
const HIDDEN: usize = 32;
const CLASSES: usize = 3;

/// Three interleaved 2-D spirals, 64 points: not linearly separable, so the hidden layer matters.
fn spirals() -> (Vec<f32>, Vec<i32>) {
    let mut x = Vec::new();
    let mut y = Vec::new();
    for i in 0..N {
        let class = i % CLASSES;
        let t = (i / CLASSES) as f32 / (N / CLASSES) as f32;
        let angle = 4.0 * t + class as f32 * 2.0 * std::f32::consts::PI / CLASSES as f32;
        x.extend([t * angle.cos(), t * angle.sin()]);
        y.push(class as i32);
    }
    (x, y)
}

/// Train for `steps` full-batch steps; return the loss at every step.
fn train(cfg: &OptimConfig, lr: f32, steps: usize) -> Vec<f32> {
    let mut g = Graph::new();
    let x = g.input("x", &[N, 2], DType::F32).unwrap();
    let labels = g.input("y", &[N], DType::I32).unwrap();
    let w1 = g.parameter("fc1.weight", &[2, HIDDEN], Init::Kaiming).unwrap();
    let b1 = g.parameter("fc1.bias", &[HIDDEN], Init::Zeros).unwrap();
    let w2 = g.parameter("fc2.weight", &[HIDDEN, CLASSES], Init::Xavier).unwrap();
    let b2 = g.parameter("fc2.bias", &[CLASSES], Init::Zeros).unwrap();
    let h = g.matmul(x, w1).unwrap();
    let h = g.add(h, b1).unwrap();
    let h = g.relu(h).unwrap();
    let o = g.matmul(h, w2).unwrap();
    let logits = g.add(o, b2).unwrap();
    let loss = g.cross_entropy(logits, labels, None).unwrap();
    let t = training_graph(g, loss, cfg).unwrap();

    let (xs, ys) = spirals();
    let mut exec = Executor::<f32>::new(&t.graph, 42).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let mut feeds = vec![(x, Buf::F(xs.clone())), (labels, Buf::I(ys.clone()))];
        for (id, v) in t.optim.host_feeds(lr, step as u64) {
            feeds.push((id, Buf::F(v.to_f32_vec())));
        }
        let out = exec
            .run(&t.graph, &feeds, &[t.loss], RunOptions { training: true, step: step as u64 })
            .unwrap();
        let Buf::F(l) = &out[0] else { panic!("loss is float") };
        losses.push(l[0]);
    }
    losses
}

#[test]
fn every_optimizer_fits_the_spirals() {
    let cases = [
        (Optimizer::sgd(), 0.5, 0.45),
        (Optimizer::Sgd { momentum: 0.9, weight_decay: 1e-4 }, 0.1, 0.35),
        (Optimizer::adam(), 0.03, 0.25),
        (Optimizer::adamw(), 0.03, 0.25),
    ];
    for (opt, lr, target) in cases {
        for clip_norm in [None, Some(1.0)] {
            let cfg = OptimConfig { clip_norm, ..OptimConfig::new(opt.clone()) };
            let losses = train(&cfg, lr, 300);
            let last = *losses.last().unwrap();
            assert!(
                last < target,
                "{} (clip {clip_norm:?}): loss {} -> {last}, wanted below {target}",
                opt.name(),
                losses[0]
            );
        }
    }
}

#[test]
fn same_run_twice_is_bit_identical() {
    let cfg = OptimConfig { clip_norm: Some(1.0), ..OptimConfig::new(Optimizer::adamw()) };
    let a: Vec<u32> = train(&cfg, 0.03, 40).iter().map(|l| l.to_bits()).collect();
    let b: Vec<u32> = train(&cfg, 0.03, 40).iter().map(|l| l.to_bits()).collect();
    assert_eq!(a, b);
}
