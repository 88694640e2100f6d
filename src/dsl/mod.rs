//! The model language: text → spanned AST → resolved program → graph.
//!
//! - [`parse()`] turns text into an [`ast::Program`] (pest, `grammar/rumus.pest`);
//! - [`resolve()`] checks names, arities, recursion and initializers without running anything;
//! - [`lower()`] instantiates a model with hyperparameters and input dimensions into a graph,
//!   checking shapes; every node keeps the span of the expression it came from.
//!
//! Model blocks may sit inside `.rms` scripts; [`rms::split`] separates them from the script
//! text without moving anything, so positions stay right in both.
//!
//! # The language
//!
//! ```text
//! // line and /* block */ comments
//! block linear(x: f32[..., IN], out) {      // `...` matches leading dims; IN binds x's last
//!     param weight[IN, out] = xavier        // declares <scope>.weight and binds `weight`
//!     param bias[out] = zeros
//!     return x @ weight + bias
//! }
//! model gpt(idx: i32[B, T], vocab = 65, d = 64, heads = 4, layers = 2, ctx = 16) {
//!     x = embedding(idx, vocab, d) as wte + position_embedding(T, ctx, d) as wpe
//!     repeat layers as blocks {             // iteration i names scope blocks.<i>
//!         x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn
//!         x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp
//!     }
//!     logits = linear(layer_norm(x) as ln_f, vocab) as head
//!     return logits                         // several outputs: `return logits, loss`
//! }
//! ```
//!
//! - **Values** are static (integers, floats, booleans, lists) or tensors. Integer arithmetic
//!   is checked; `a / b` on integers must divide exactly. Unary `sqrt`, `exp`, `log` and `neg`
//!   of a static number fold to a number. A static number next to a tensor becomes a constant.
//! - **Signatures**: `x: f32[B, T, D]` is a tensor argument whose pattern binds (or checks)
//!   named dimensions; `name` / `name = default` is a hyperparameter (defaults may use earlier
//!   names and dimensions). A model's dimensions (`B`, `T`) are given when it is instantiated.
//! - **Statements**: `name = expr`, `const name = expr`, `param name[dims] = init` (also usable
//!   inside an expression), `repeat COUNT [as NAME] { ... }`, and `return a, b` last.
//! - **Initializers**: `zeros`, `ones`, `normal(mean, std)`, `uniform(low, high)`, `xavier`
//!   (Glorot uniform), `kaiming` (He normal).
//! - **Calls**: a bare name is a block when one is defined (the user's shadow the standard
//!   library's), else an op of [`ops::all`]; `ops.NAME(...)` always means the op. Ops take
//!   positional or named arguments (`sum(x, [-1], keepdim = true)`); axes may be negative.
//! - **Precedence**: unary `-` binds tightest, then `* / @`, then `+ -`; all left-associative.
//!
//! # Parameter names
//!
//! A block call is named by `as NAME`, or `<block>_<k>` when anonymous (k counts that block's
//! anonymous calls in the scope); a `repeat ... as NAME` iteration i is `NAME.i` (anonymous
//! repeats are `repeat_<k>`). A parameter's name is its scope path and its own name joined by
//! dots. A name used twice in one scope is an error at the second use. For the GPT above:
//!
//! | rumus                       | nanoGPT (`GPT.state_dict()`)            |
//! |-----------------------------|-----------------------------------------|
//! | `wte.weight`                | `transformer.wte.weight`                |
//! | `wpe.weight`                | `transformer.wpe.weight`                |
//! | `blocks.0.ln1.{weight,bias}`| `transformer.h.0.ln_1.{weight,bias}`    |
//! | `blocks.0.attn.qkv.*`       | `transformer.h.0.attn.c_attn.*`         |
//! | `blocks.0.attn.proj.*`      | `transformer.h.0.attn.c_proj.*`         |
//! | `blocks.0.ln2.*`            | `transformer.h.0.ln_2.*`                |
//! | `blocks.0.mlp.fc.*`         | `transformer.h.0.mlp.c_fc.*`            |
//! | `blocks.0.mlp.proj.*`       | `transformer.h.0.mlp.c_proj.*`          |
//! | `ln_f.*`                    | `transformer.ln_f.*`                    |
//! | `head.weight`               | `lm_head.weight`                        |
//!
//! A linear weight here is `[in, out]` (`x @ weight`); PyTorch's `nn.Linear` stores
//! `[out, in]`, so it is transposed on the way across (GPT-2's HF `Conv1D` weights are already
//! `[in, out]`). nanoGPT's head has no bias and ties its weight to `wte`; rumus's `head.bias`
//! has no counterpart there.
//!
//! # Limits
//!
//! Sources above [`parse::MAX_SOURCE_BYTES`], brackets nested deeper than
//! [`parse::MAX_NESTING`], expressions deeper than [`parse::MAX_EXPR_DEPTH`], block calls
//! deeper than [`lower::MAX_CALL_DEPTH`] and instantiations longer than [`lower::MAX_STEPS`]
//! steps are rejected with a positioned error, so no input overflows the stack or hangs.

pub mod ast;
mod bind;
pub mod parse;
pub mod rms;
pub mod scan;

pub use parse::{parse, parse_text};
pub mod lower;
pub mod ops;
pub mod resolve;

pub use lower::{lower, size_dependent, Value};
pub use resolve::{resolve, Module};

use crate::error::{Result, Source};
use std::sync::Arc;

/// Parse and resolve a standalone model file.
pub fn load(src: &Arc<Source>) -> Result<Module> {
    resolve(parse(src)?, src)
}

/// Parse and resolve the model blocks of a `.rms` script (the script text is ignored here; see
/// [`rms::split`]). Errors point into the whole file.
pub fn load_rms(src: &Arc<Source>) -> Result<Module> {
    let split = rms::split(&src.text);
    let program = parse_text(&split.model_text).map_err(|e| e.in_source(src))?;
    resolve(program, src)
}
