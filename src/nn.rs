//! Standard layers built from Rust: the same models the model language's standard library
//! defines, for host applications, tests and benchmarks that build graphs directly.
//! Parameter names follow the model language's (`blocks.0.attn.qkv.weight`).

use crate::error::Result;
use crate::graph::{Graph, Init, NodeId};
use crate::tensor::DType;

/// `x @ weight + bias` with `weight [in, out]` (xavier) and `bias [out]` (zeros).
pub fn linear(g: &mut Graph, name: &str, x: NodeId, out: usize) -> Result<NodeId> {
    let d_in = *g.shape(x).last().unwrap_or(&1);
    let w = g.parameter(&format!("{name}.weight"), &[d_in, out], Init::Xavier)?;
    let b = g.parameter(&format!("{name}.bias"), &[out], Init::Zeros)?;
    let y = g.matmul(x, w)?;
    g.add(y, b)
}

/// LayerNorm over the last axis with `weight` (ones) and `bias` (zeros), eps 1e-5.
pub fn layer_norm(g: &mut Graph, name: &str, x: NodeId) -> Result<NodeId> {
    let d = *g.shape(x).last().unwrap_or(&1);
    let w = g.parameter(&format!("{name}.weight"), &[d], Init::Ones)?;
    let b = g.parameter(&format!("{name}.bias"), &[d], Init::Zeros)?;
    g.layer_norm(x, w, b, 1e-5)
}

/// Causal multi-head self-attention over `x [B, T, D]`: one `qkv` linear, the fused causal
/// `attention` op over the heads, and a `proj` linear.
pub fn causal_self_attention(g: &mut Graph, name: &str, x: NodeId, heads: usize) -> Result<NodeId> {
    let s = g.shape(x).to_vec();
    let (b, t, d) = (s[0], s[1], s[2]);
    let hd = d / heads.max(1);
    let qkv = linear(g, &format!("{name}.qkv"), x, 3 * d)?;
    let mut split = Vec::new();
    for i in 0..3 {
        let part = g.slice(qkv, 2, i * d, (i + 1) * d)?;
        let part = g.reshape(part, &[b, t, heads, hd])?;
        split.push(g.permute(part, &[0, 2, 1, 3])?); // [B, H, T, hd]
    }
    let y = g.attention(split[0], split[1], split[2])?; // [B, H, T, hd]
    let y = g.permute(y, &[0, 2, 1, 3])?;
    let y = g.reshape(y, &[b, t, d])?;
    linear(g, &format!("{name}.proj"), y, d)
}

/// fc (4·d) → gelu_tanh → proj (d).
pub fn mlp(g: &mut Graph, name: &str, x: NodeId) -> Result<NodeId> {
    let d = *g.shape(x).last().unwrap_or(&1);
    let h = linear(g, &format!("{name}.fc"), x, 4 * d)?;
    let h = g.gelu_tanh(h)?;
    linear(g, &format!("{name}.proj"), h, d)
}

/// A pre-LayerNorm transformer block (GPT-2): `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
pub fn transformer_block(g: &mut Graph, name: &str, x: NodeId, heads: usize) -> Result<NodeId> {
    let h = layer_norm(g, &format!("{name}.ln1"), x)?;
    let a = causal_self_attention(g, &format!("{name}.attn"), h, heads)?;
    let x = g.add(x, a)?;
    let h = layer_norm(g, &format!("{name}.ln2"), x)?;
    let m = mlp(g, &format!("{name}.mlp"), h)?;
    g.add(x, m)
}

/// Sizes of a GPT-style model.
#[derive(Clone, Copy, Debug)]
pub struct GptConfig {
    pub vocab: usize,
    pub d: usize,
    pub heads: usize,
    pub layers: usize,
    pub ctx: usize,
}

/// A GPT-style model on token ids `idx [batch, ctx]`: token and position embeddings, `layers`
/// pre-LN blocks, a final LayerNorm and a linear head; output `logits [batch, ctx, vocab]`.
pub fn gpt(g: &mut Graph, c: GptConfig, batch: usize) -> Result<NodeId> {
    let idx = g.input("idx", &[batch, c.ctx], DType::I32)?;
    let wte = g.parameter("wte.weight", &[c.vocab, c.d], Init::Normal { mean: 0.0, std: 0.02 })?;
    let wpe = g.parameter("wpe.weight", &[c.ctx, c.d], Init::Normal { mean: 0.0, std: 0.02 })?;
    let tok = g.embedding(wte, idx)?;
    let mut x = g.add(tok, wpe)?;
    for i in 0..c.layers {
        x = transformer_block(g, &format!("blocks.{i}"), x, c.heads)?;
    }
    let x = layer_norm(g, "ln_f", x)?;
    let logits = linear(g, "head", x, c.vocab)?;
    g.set_output("logits", logits);
    Ok(logits)
}
