//! Shared op-table cases: small graphs, each exercising one op on shapes that include
//! broadcasting, size-1 dimensions and sizes that are not multiples of any workgroup size. Used
//! by the gradient checks (CPU, f64) and by the GPU-vs-CPU comparison.
#![allow(dead_code)]

pub mod conv;
pub mod gpu;
pub mod script;

use rumus::cpu::Buf;
use rumus::graph::{BinaryOp, Graph, NodeId, UnaryOp};
use rumus::rng::Rng;
use rumus::Result;

/// A fresh directory under the system's temporary folder, named for `name`, the test process
/// and a count (tests run in parallel), removed with its contents when dropped: tests leave
/// nothing behind.
pub struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    pub fn new(name: &str) -> ScratchDir {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("rumus-{name}-{pid}-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How an input's values are drawn.
#[derive(Clone, Copy)]
pub enum Dom {
    /// N(0, 1), kept away from 0 (so kinks of relu/abs and ties of max are not hit).
    Any,
    /// U(0.5, 2).
    Positive,
    /// 0.0 or 1.0.
    Mask,
    /// i32 in 0..n (the last one set to `ignore` when given).
    Index(i32),
}

/// Builds a case's forward graph from its inputs, returning the output.
pub type BuildFn = dyn Fn(&mut Graph, &[NodeId]) -> Result<NodeId>;

pub struct Case {
    pub name: String,
    pub inputs: Vec<(Vec<usize>, Dom)>,
    pub build: Box<BuildFn>,
}

pub fn case(
    name: &str,
    inputs: &[(&[usize], Dom)],
    build: impl Fn(&mut Graph, &[NodeId]) -> Result<NodeId> + 'static,
) -> Case {
    Case {
        name: name.to_string(),
        inputs: inputs.iter().map(|(s, d)| (s.to_vec(), *d)).collect(),
        build: Box::new(build),
    }
}

pub fn cases() -> Vec<Case> {
    use Dom::*;
    let mut cs = Vec::new();
    let unary = [
        (UnaryOp::Neg, Any),
        (UnaryOp::Exp, Any),
        (UnaryOp::Log, Positive),
        (UnaryOp::Sqrt, Positive),
        (UnaryOp::Rsqrt, Positive),
        (UnaryOp::Abs, Any),
        (UnaryOp::Square, Any),
        (UnaryOp::Tanh, Any),
        (UnaryOp::Sigmoid, Any),
        (UnaryOp::Relu, Any),
        (UnaryOp::Gelu, Any),
        (UnaryOp::GeluTanh, Any),
        (UnaryOp::Silu, Any),
        (UnaryOp::Softplus, Any),
        (UnaryOp::LogSigmoid, Any),
    ];
    for (u, dom) in unary {
        for shape in [&[3, 4][..], &[2, 1, 3][..], &[][..]] {
            cs.push(case(&format!("{} {:?}", u.name(), shape), &[(shape, dom)], move |g, x| {
                g.unary(u, x[0])
            }));
        }
    }
    let binary = [
        (BinaryOp::Add, Any, Any),
        (BinaryOp::Sub, Any, Any),
        (BinaryOp::Mul, Any, Any),
        (BinaryOp::Div, Any, Positive),
        (BinaryOp::Pow, Positive, Any),
        (BinaryOp::Maximum, Any, Any),
        (BinaryOp::Minimum, Any, Any),
    ];
    for (b, da, db) in binary {
        for (sa, sb) in [
            (&[2, 3][..], &[2, 3][..]),
            (&[2, 3][..], &[3][..]),
            (&[4, 1][..], &[1, 5][..]),
            (&[][..], &[2, 1][..]),
        ] {
            cs.push(case(
                &format!("{} {sa:?} {sb:?}", b.name()),
                &[(sa, da), (sb, db)],
                move |g, x| g.binary(b, x[0], x[1]),
            ));
        }
    }
    cs.push(case("where broadcast", &[(&[2, 3], Mask), (&[2, 3], Any), (&[3], Any)], |g, x| {
        g.select(x[0], x[1], x[2])
    }));
    cs.push(case("where size-1", &[(&[4, 1], Mask), (&[1, 5], Any), (&[], Any)], |g, x| {
        g.select(x[0], x[1], x[2])
    }));
    for (axes, keep) in [(&[1][..], false), (&[0, 2][..], true), (&[0, 1, 2][..], false)] {
        let a = axes.to_vec();
        cs.push(case(&format!("sum {axes:?} {keep}"), &[(&[2, 3, 4], Any)], move |g, x| {
            g.sum(x[0], &a, keep)
        }));
        let a = axes.to_vec();
        cs.push(case(&format!("mean {axes:?} {keep}"), &[(&[2, 3, 4], Any)], move |g, x| {
            g.mean(x[0], &a, keep)
        }));
        let a = axes.to_vec();
        cs.push(case(&format!("max {axes:?} {keep}"), &[(&[2, 3, 4], Any)], move |g, x| {
            g.max(x[0], &a, keep)
        }));
    }
    cs.push(case("max size-1 axis", &[(&[3, 1], Any)], |g, x| g.max(x[0], &[1], false)));
    cs.push(case("reshape", &[(&[2, 3, 4], Any)], |g, x| g.reshape(x[0], &[6, 1, 4])));
    cs.push(case("reshape scalar", &[(&[1, 1], Any)], |g, x| g.reshape(x[0], &[])));
    cs.push(case("permute", &[(&[2, 3, 4], Any)], |g, x| g.permute(x[0], &[2, 0, 1])));
    cs.push(case("transpose size-1", &[(&[1, 3], Any)], |g, x| g.transpose(x[0], 0, 1)));
    cs.push(case("broadcast_to", &[(&[3, 1], Any)], |g, x| g.broadcast_to(x[0], &[2, 3, 4])));
    cs.push(case("broadcast_to scalar", &[(&[], Any)], |g, x| g.broadcast_to(x[0], &[2, 2])));
    cs.push(case("slice middle", &[(&[2, 5], Any)], |g, x| g.slice(x[0], 1, 1, 4)));
    cs.push(case("slice edge", &[(&[4, 1, 3], Any)], |g, x| g.slice(x[0], 0, 0, 1)));
    // A value split into slices: its gradient is one concat of theirs (disjoint parts), or a
    // sum where parts overlap.
    cs.push(case("split in three", &[(&[2, 9], Any)], |g, x| {
        let parts = [g.slice(x[0], 1, 0, 3)?, g.slice(x[0], 1, 3, 5)?, g.slice(x[0], 1, 6, 9)?];
        let a = g.mul(parts[0], parts[2])?;
        let b = g.slice(a, 1, 0, 2)?;
        g.add(b, parts[1])
    }));
    cs.push(case("overlapping slices", &[(&[2, 5], Any)], |g, x| {
        let (a, b) = (g.slice(x[0], 1, 0, 3)?, g.slice(x[0], 1, 2, 5)?);
        g.mul(a, b)
    }));
    cs.push(case("concat", &[(&[2, 3], Any), (&[2, 1], Any)], |g, x| g.concat(&[x[0], x[1]], 1)));
    cs.push(case("concat three", &[(&[1, 2], Any), (&[3, 2], Any), (&[1, 2], Any)], |g, x| {
        g.concat(x, 0)
    }));
    // More inputs than one concat kernel takes (`plan::fuse::MAX_INLINED_NODES` nodes): the
    // columns reversed, forward and in the gradient's concat of 600 slices.
    cs.push(case("concat of 600 slices", &[(&[2, 600], Any)], |g, x| {
        let parts: Vec<_> =
            (0..600).rev().map(|i| g.slice(x[0], 1, i, i + 1)).collect::<Result<_>>()?;
        g.concat(&parts, 1)
    }));
    cs.push(case("matmul", &[(&[3, 4], Any), (&[4, 5], Any)], |g, x| g.matmul(x[0], x[1])));
    cs.push(case(
        "matmul batched broadcast",
        &[(&[2, 1, 3, 4], Any), (&[3, 4, 2], Any)],
        |g, x| g.matmul(x[0], x[1]),
    ));
    cs.push(case("matmul nd @ 2d", &[(&[2, 3, 4], Any), (&[4, 1], Any)], |g, x| {
        g.matmul(x[0], x[1])
    }));
    // Long K, small M x N: the GPU splits K (split-k path).
    cs.push(case("matmul long k", &[(&[3, 1024], Any), (&[1024, 5], Any)], |g, x| {
        g.matmul(x[0], x[1])
    }));
    // The split-K sum with an epilogue that reads a buffer at (i, j): a bias over outputs of
    // 4-element vectors (rows of 8) and of single elements (5 columns), and a residual of the
    // output's shape over rows of 6, so a vector's lanes fall in two rows.
    let long_k: [(usize, usize, &[usize], &str); 3] = [
        (3, 8, &[8], "matmul long k bias gelu"),
        (2, 6, &[2, 6], "matmul long k residual gelu rows across vectors"),
        (3, 5, &[5], "matmul long k bias gelu odd columns"),
    ];
    for (m, n, extra, name) in long_k {
        cs.push(case(name, &[(&[m, 1024], Any), (&[1024, n], Any), (extra, Any)], |g, x| {
            let y = g.matmul(x[0], x[1])?;
            let y = g.add(y, x[2])?;
            g.gelu_tanh(y)
        }));
    }
    cs.push(case("matmul 1x1", &[(&[1, 1], Any), (&[1, 1], Any)], |g, x| g.matmul(x[0], x[1])));
    // Layout ops read in place (`plan::view`): a transposed right operand, a permute of a
    // reshape (batched, transposed), a slice (an offset and a wider row), and a transpose read
    // by a matmul and a reduction at once.
    cs.push(case("matmul transposed right view", &[(&[3, 4], Any), (&[5, 4], Any)], |g, x| {
        let w = g.permute(x[1], &[1, 0])?;
        g.matmul(x[0], w)
    }));
    cs.push(case(
        "matmul permute of reshape view",
        &[(&[6, 4], Any), (&[2, 3, 5], Any)],
        |g, x| {
            let a = g.reshape(x[0], &[2, 3, 4])?;
            let a = g.permute(a, &[0, 2, 1])?;
            g.matmul(a, x[1])
        },
    ));
    cs.push(case("matmul slice view", &[(&[4, 10], Any), (&[5, 3], Any)], |g, x| {
        let a = g.slice(x[0], 1, 2, 7)?;
        g.matmul(a, x[1])
    }));
    cs.push(case("matmul view read twice", &[(&[3, 4], Any), (&[3, 2], Any)], |g, x| {
        let p = g.permute(x[0], &[1, 0])?;
        let y = g.matmul(p, x[1])?;
        let s = g.sum(p, &[1], true)?;
        g.add(y, s)
    }));
    cs.push(case("softmax", &[(&[3, 5], Any)], |g, x| g.softmax(x[0])));
    cs.push(case("softmax size-1", &[(&[2, 1], Any)], |g, x| g.softmax(x[0])));
    cs.push(case("log_softmax", &[(&[2, 3, 4], Any)], |g, x| g.log_softmax(x[0])));
    cs.push(case("log_softmax size-1 rows", &[(&[1, 6], Any)], |g, x| g.log_softmax(x[0])));
    cs.push(case("causal_mask then softmax", &[(&[2, 4, 4], Any)], |g, x| {
        let m = g.causal_mask(x[0])?;
        g.softmax(m)
    }));
    cs.push(case("causal_mask rectangular", &[(&[2, 3], Any)], |g, x| {
        let m = g.causal_mask(x[0])?;
        g.softmax(m)
    }));
    cs.push(case("layer_norm", &[(&[3, 5], Any), (&[5], Any), (&[5], Any)], |g, x| {
        g.layer_norm(x[0], x[1], x[2], 1e-5)
    }));
    cs.push(case("layer_norm 3d", &[(&[2, 2, 4], Any), (&[4], Any), (&[4], Any)], |g, x| {
        g.layer_norm(x[0], x[1], x[2], 1e-5)
    }));
    // A pre-LN residual block over a linear layer's output h: h's gradient is the residual's
    // plus the LayerNorm's, which the LayerNorm backward kernel adds itself, and the bias
    // gradient is its column sum, which that kernel also computes.
    cs.push(case(
        "layer_norm residual",
        &[(&[3, 4], Any), (&[4, 5], Any), (&[5], Any), (&[5], Any), (&[5], Any), (&[5, 5], Any)],
        |g, x| {
            let h = g.matmul(x[0], x[1])?;
            let h = g.add(h, x[2])?;
            let y = g.layer_norm(h, x[3], x[4], 1e-5)?;
            let z = g.matmul(y, x[5])?;
            g.add(h, z)
        },
    ));
    cs.push(case("embedding repeated", &[(&[5, 3], Any), (&[2, 4], Index(5))], |g, x| {
        g.embedding(x[0], x[1])
    }));
    cs.push(case("embedding single", &[(&[1, 2], Any), (&[3], Index(1))], |g, x| {
        g.embedding(x[0], x[1])
    }));
    cs.push(case("cross_entropy", &[(&[4, 5], Any), (&[4], Index(5))], |g, x| {
        g.cross_entropy(x[0], x[1], None)
    }));
    cs.push(case("cross_entropy ignore 3d", &[(&[2, 3, 4], Any), (&[2, 3], Index(4))], |g, x| {
        g.cross_entropy(x[0], x[1], Some(3))
    }));
    cs.push(case("mse", &[(&[3, 2], Any), (&[3, 2], Any)], |g, x| g.mse(x[0], x[1])));
    cs.push(case("dropout", &[(&[4, 5], Any)], |g, x| g.dropout(x[0], 0.3, 7)));
    cs.push(case("dropout size-1", &[(&[1, 1, 3], Any)], |g, x| g.dropout(x[0], 0.5, 1)));
    cs.extend(conv::cases());
    cs.extend(zero_size_cases());
    cs.extend(degenerate_cases());
    cs
}

/// Causal attention at sequence lengths 1, 7 and 64 (ragged against any block size), and an
/// empty batch; each also over the heads of one projection (q, k, v strided views of one
/// value, as `causal_self_attention` makes them). T = 300 is in [`attention_long`] (its
/// gradient check samples elements).
pub fn attention_cases() -> Vec<Case> {
    use Dom::*;
    let mut cs = Vec::new();
    for shape in [[2, 2, 1, 3], [2, 1, 7, 4], [1, 1, 64, 4], [0, 2, 3, 4]] {
        let s: &[usize] = &shape;
        cs.push(case(&format!("attention {shape:?}"), &[(s, Any), (s, Any), (s, Any)], |g, x| {
            g.attention(x[0], x[1], x[2])
        }));
        cs.push(attention_heads(shape));
    }
    let s: &[usize] = &[2, 2, 7, 4];
    cs.push(case(
        "attention heads merged",
        &[(s, Any), (s, Any), (s, Any), (&[8, 3], Any)],
        |g, x| {
            // As `causal_self_attention` merges the heads for its projection: the gradient split
            // back into heads is a view the attention backward kernels read in place.
            let y = g.attention(x[0], x[1], x[2])?;
            let y = g.permute(y, &[0, 2, 1, 3])?;
            let y = g.reshape(y, &[2, 7, 8])?;
            g.matmul(y, x[3])
        },
    ));
    cs
}

/// Causal attention over the heads of one `[b, t, 3·h·dh]` projection: q, k and v are slices
/// of it, split into heads and permuted to `[b, h, t, dh]`.
fn attention_heads(shape: [usize; 4]) -> Case {
    let [b, h, t, dh] = shape;
    let d = h * dh;
    let name = format!("attention heads of one projection {shape:?}");
    case(&name, &[(&[b, t, 3 * d], Dom::Any)], move |g, x| {
        let mut heads = Vec::new();
        for i in 0..3 {
            let part = g.slice(x[0], 2, i * d, (i + 1) * d)?;
            let part = g.reshape(part, &[b, t, h, dh])?;
            heads.push(g.permute(part, &[0, 2, 1, 3])?);
        }
        g.attention(heads[0], heads[1], heads[2])
    })
}

/// Causal attention at T = 300 with one head of width 2, from separate q, k, v and from one
/// projection: cheap enough for the CPU, more key blocks than any kernel's block.
pub fn attention_long() -> Vec<Case> {
    let s: &[usize] = &[1, 1, 300, 2];
    let separate =
        case("attention [1, 1, 300, 2]", &[(s, Dom::Any), (s, Dom::Any), (s, Dom::Any)], |g, x| {
            g.attention(x[0], x[1], x[2])
        });
    vec![separate, attention_heads([1, 1, 300, 2])]
}

/// Every op with a dimension of size 0: no element to compute, or reductions over nothing (a
/// sum of nothing is 0, a mean of nothing NaN, as on the CPU).
pub fn zero_size_cases() -> Vec<Case> {
    use Dom::*;
    let mut cs = Vec::new();
    cs.push(case("exp empty", &[(&[0, 3], Any)], |g, x| g.exp(x[0])));
    cs.push(case("add empty broadcast", &[(&[0, 3], Any), (&[3], Any)], |g, x| g.add(x[0], x[1])));
    cs.push(case("where empty", &[(&[2, 0], Mask), (&[2, 0], Any), (&[], Any)], |g, x| {
        g.select(x[0], x[1], x[2])
    }));
    cs.push(case("sum over an empty axis", &[(&[2, 0, 3], Any)], |g, x| g.sum(x[0], &[1], false)));
    cs.push(case("mean over an empty axis", &[(&[2, 0, 3], Any)], |g, x| g.mean(x[0], &[1], true)));
    cs.push(case("sum of an empty tensor", &[(&[0, 4], Any)], |g, x| g.sum(x[0], &[0, 1], false)));
    cs.push(case("max empty output", &[(&[0, 3], Any)], |g, x| g.max(x[0], &[1], false)));
    cs.push(case("reshape empty", &[(&[0, 6], Any)], |g, x| g.reshape(x[0], &[3, 0, 2])));
    cs.push(case("permute empty", &[(&[2, 0, 3], Any)], |g, x| g.permute(x[0], &[2, 0, 1])));
    cs.push(case("broadcast_to empty", &[(&[1, 3], Any)], |g, x| g.broadcast_to(x[0], &[0, 3])));
    cs.push(case("slice empty", &[(&[2, 3], Any)], |g, x| g.slice(x[0], 1, 2, 2)));
    cs.push(case("concat with an empty part", &[(&[2, 3], Any), (&[2, 0], Any)], |g, x| {
        g.concat(&[x[0], x[1]], 1)
    }));
    cs.push(case("matmul no rows", &[(&[0, 4], Any), (&[4, 5], Any)], |g, x| g.matmul(x[0], x[1])));
    cs.push(case("matmul empty k", &[(&[3, 0], Any), (&[0, 5], Any)], |g, x| g.matmul(x[0], x[1])));
    cs.push(case("matmul no columns", &[(&[3, 4], Any), (&[4, 0], Any)], |g, x| {
        g.matmul(x[0], x[1])
    }));
    cs.push(case("matmul empty batch", &[(&[0, 3, 4], Any), (&[4, 2], Any)], |g, x| {
        g.matmul(x[0], x[1])
    }));
    cs.push(case("matmul empty k then relu", &[(&[3, 0], Any), (&[0, 5], Any)], |g, x| {
        let y = g.matmul(x[0], x[1])?;
        g.relu(y)
    }));
    cs.push(case("softmax no rows", &[(&[0, 5], Any)], |g, x| g.softmax(x[0])));
    cs.push(case("log_softmax no rows", &[(&[2, 0, 5], Any)], |g, x| g.log_softmax(x[0])));
    cs.push(case("causal_mask no batch", &[(&[0, 3, 3], Any)], |g, x| {
        let m = g.causal_mask(x[0])?;
        g.softmax(m)
    }));
    cs.push(case("layer_norm no rows", &[(&[0, 4], Any), (&[4], Any), (&[4], Any)], |g, x| {
        g.layer_norm(x[0], x[1], x[2], 1e-5)
    }));
    cs.push(case("embedding no indices", &[(&[5, 3], Any), (&[0], Index(5))], |g, x| {
        g.embedding(x[0], x[1])
    }));
    cs.push(case("embedding empty rows", &[(&[5, 0], Any), (&[2, 3], Index(5))], |g, x| {
        g.embedding(x[0], x[1])
    }));
    cs.push(case("cross_entropy no rows", &[(&[0, 5], Any), (&[0], Index(5))], |g, x| {
        g.cross_entropy(x[0], x[1], None)
    }));
    cs.push(case("mse empty", &[(&[0, 2], Any), (&[0, 2], Any)], |g, x| g.mse(x[0], x[1])));
    cs.push(case("dropout empty", &[(&[0], Any)], |g, x| g.dropout(x[0], 0.3, 7)));
    cs
}

/// Size-1 axes where an op reduces or normalizes, and a sequence of length 1.
pub fn degenerate_cases() -> Vec<Case> {
    use Dom::*;
    vec![
        case("layer_norm width 1", &[(&[3, 1], Any), (&[1], Any), (&[1], Any)], |g, x| {
            g.layer_norm(x[0], x[1], x[2], 1e-5)
        }),
        case("causal_mask t=1", &[(&[2, 1, 1], Any)], |g, x| {
            let m = g.causal_mask(x[0])?;
            g.softmax(m)
        }),
        case("cross_entropy one class", &[(&[3, 1], Any), (&[3], Index(1))], |g, x| {
            g.cross_entropy(x[0], x[1], None)
        }),
        case("mean size-1 axes", &[(&[1, 1, 3], Any)], |g, x| g.mean(x[0], &[0, 1], false)),
        case("matmul k=1", &[(&[2, 1], Any), (&[1, 3], Any)], |g, x| g.matmul(x[0], x[1])),
    ]
}

pub fn draw(rng: &mut Rng, shape: &[usize], dom: Dom) -> Buf<f64> {
    let n: usize = shape.iter().product();
    match dom {
        Dom::Any => Buf::F(
            (0..n)
                .map(|_| {
                    let v = rng.normal();
                    if v.abs() < 0.1 {
                        v.signum() * 0.1 + v
                    } else {
                        v
                    }
                })
                .collect(),
        ),
        Dom::Positive => Buf::F((0..n).map(|_| 0.5 + 1.5 * rng.uniform()).collect()),
        Dom::Mask => Buf::F((0..n).map(|_| (rng.uniform() < 0.5) as u8 as f64).collect()),
        Dom::Index(k) => Buf::I((0..n).map(|_| rng.below(k as u64) as i32).collect()),
    }
}

/// A case's forward graph extended with `loss = Σ out · r` and the gradients of the loss with
/// respect to every float input.
pub struct Built {
    pub g: Graph,
    pub xs: Vec<NodeId>,
    pub out: NodeId,
    pub r: NodeId,
    pub loss: NodeId,
    /// (input position, gradient node) for every differentiable input.
    pub grads: Vec<(usize, NodeId)>,
}

pub fn build(c: &Case) -> Result<Built> {
    let mut g = Graph::new();
    let mut xs = Vec::new();
    for (i, (shape, dom)) in c.inputs.iter().enumerate() {
        let dtype =
            if matches!(dom, Dom::Index(_)) { rumus::DType::I32 } else { rumus::DType::F32 };
        xs.push(g.input(&format!("x{i}"), shape, dtype)?);
    }
    let out = (c.build)(&mut g, &xs)?;
    let out_shape = g.shape(out).to_vec();
    let r = g.input("r", &out_shape, rumus::DType::F32)?;
    let weighted = g.mul(out, r)?;
    let loss = g.sum_all(weighted)?;
    let diff: Vec<usize> =
        (0..xs.len()).filter(|&i| !matches!(c.inputs[i].1, Dom::Index(_) | Dom::Mask)).collect();
    let wrt: Vec<NodeId> = diff.iter().map(|&i| xs[i]).collect();
    let grads = rumus::graph::autodiff::grad(&mut g, loss, &wrt)?;
    rumus::graph::verify(&g)?;
    Ok(Built { g, xs, out, r, loss, grads: diff.into_iter().zip(grads).collect() })
}

/// Random feeds for a built case: one per input, then `r`.
pub fn feeds(c: &Case, b: &Built, seed: u64) -> Vec<(NodeId, Buf<f64>)> {
    let mut rng = Rng::new(seed);
    let mut f: Vec<(NodeId, Buf<f64>)> =
        c.inputs.iter().zip(&b.xs).map(|((s, d), &x)| (x, draw(&mut rng, s, *d))).collect();
    let out_shape = b.g.shape(b.out).to_vec();
    f.push((b.r, draw(&mut rng, &out_shape, Dom::Any)));
    f
}

/// A GPT of `c` over `batch` sequences of `c.ctx` tokens, with a cross-entropy loss against
/// an i32 input `target` of shape `[batch, c.ctx]`: the graph and its loss, which each test
/// then turns into the training step it needs.
pub fn gpt_loss(c: rumus::nn::GptConfig, batch: usize) -> (Graph, NodeId) {
    let mut g = Graph::new();
    let logits = rumus::nn::gpt(&mut g, c, batch).unwrap();
    let target = g.input("target", &[batch, c.ctx], rumus::DType::I32).unwrap();
    let loss = g.cross_entropy(logits, target, None).unwrap();
    (g, loss)
}

/// The training step `rumus plan` makes of a model written in the model language: `body` is
/// the statements of a model taking `x: f32[B, 4]` (B = 2), written to a file named after
/// `test`; the loss is a cross-entropy of the model's output against an i32 input `target` of
/// shape `[B]`, the optimizer AdamW.
pub fn model_step(test: &str, body: &str) -> rumus::graph::TrainGraph {
    let dir = ScratchDir::new(test);
    let file = dir.join("model.rms");
    std::fs::write(&file, format!("model m(x: f32[B, 4], B = 2) {{\n{body}}}\n")).unwrap();
    let spec = rumus::cli::bench::ModelSpec {
        file: file.to_str().unwrap().to_string(),
        ..Default::default()
    };
    rumus::cli::bench::training_step(&spec).unwrap().0
}

/// `n` lines `line(0)`, `line(1)`, ... between `head` and `tail`: a model `n` layers deep.
pub fn repeated(head: &str, n: usize, line: &dyn Fn(usize) -> String, tail: &str) -> String {
    let mut body = String::from(head);
    for i in 0..n {
        body += &line(i);
    }
    body + tail
}

/// The SGD training step of a cross-entropy over `[2, classes]` logits (an input `x` plus a
/// zero-initialized bias `b`, labels `y` of shape `[2]`), and the ids of `x`, `b` and `y`: the
/// widest rows a software adapter's loop budget takes (`codegen::loops`).
pub fn wide_cross_entropy(classes: usize) -> (rumus::graph::TrainGraph, [NodeId; 3]) {
    use rumus::graph::{training_graph, Init, OptimConfig, Optimizer};
    let mut g = Graph::new();
    let x = g.input("x", &[2, classes], rumus::DType::F32).unwrap();
    let b = g.parameter("b", &[classes], Init::Zeros).unwrap();
    let logits = g.add(x, b).unwrap();
    let y = g.input("y", &[2], rumus::DType::I32).unwrap();
    let loss = g.cross_entropy(logits, y, None).unwrap();
    let t = training_graph(g, loss, &OptimConfig::new(Optimizer::sgd())).unwrap();
    (t, [x, b, y])
}
