//! Parameter groups: hyperparameters (weight decay, a learning-rate scale) for the parameters
//! whose dotted names match glob patterns, as PyTorch's `param_groups` give them (the usual
//! GPT recipe: no weight decay on biases, LayerNorm weights and embeddings).
//!
//! A pattern is matched against the whole name: `*` matches any run of characters, dots
//! included (`*.bias` matches `blocks.0.attn.qkv.bias`), `?` one character, anything else
//! itself. A parameter takes the first group with a pattern that matches it; parameters no
//! group matches keep the optimizer's own hyperparameters. A pattern that matches no parameter
//! is an error: it is almost always a misspelt name; so is one whose every parameter an
//! earlier group takes (its group's settings would apply to none of them).

use crate::err;
use crate::error::Result;
use crate::num::show;

/// The hyperparameters of the parameters that some pattern of `params` matches.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamGroup {
    /// Glob patterns over dotted parameter names (`*`: any run of characters, `?`: one).
    pub params: Vec<String>,
    /// The group's weight decay (`None`: the optimizer's).
    pub weight_decay: Option<f64>,
    /// The group's learning rate is the step's learning rate times this.
    pub lr_scale: f64,
}

impl ParamGroup {
    /// A group of `params` with the optimizer's weight decay and learning rate.
    pub fn new(params: &[&str]) -> ParamGroup {
        ParamGroup {
            params: params.iter().map(|p| p.to_string()).collect(),
            weight_decay: None,
            lr_scale: 1.0,
        }
    }
}

/// Whether `name` matches the glob `pattern` as a whole.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut i, mut j) = (0, 0);
    // The last `*` seen and the name position it was tried at: on a mismatch, let it take
    // one more character (linear backtracking, enough for a pattern with one kind of star).
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// For each of `names`, the index of the first group with a pattern matching it (`None`: no
/// group matches). An error names the optimizer (`context`) and the group when a group has no
/// pattern, a pattern matches no parameter, or a value is out of range.
pub fn assign(
    context: &str,
    groups: &[ParamGroup],
    names: &[String],
) -> Result<Vec<Option<usize>>> {
    for (i, group) in groups.iter().enumerate() {
        let at = format!("{context}: groups[{i}]");
        if group.params.is_empty() {
            return Err(err!(
                InvalidArgument,
                "{at}: `params` is empty; give at least one pattern"
            ));
        }
        if let Some(wd) = group.weight_decay {
            if !(wd >= 0.0 && (wd as f32).is_finite()) {
                return Err(err!(
                    InvalidArgument,
                    "{at}: `weight_decay` must be a finite number >= 0, got {}",
                    show(wd)
                ));
            }
        }
        if !(group.lr_scale >= 0.0 && (group.lr_scale as f32).is_finite()) {
            return Err(err!(
                InvalidArgument,
                "{at}: `lr_scale` must be a finite number >= 0, got {}",
                show(group.lr_scale)
            ));
        }
        for p in &group.params {
            if !names.iter().any(|n| glob_match(p, n)) {
                return Err(err!(
                    Name,
                    "{at}: pattern `{p}` matches no parameter (parameters: {})",
                    some_names(names)
                ));
            }
        }
    }
    let assigned: Vec<Option<usize>> = names
        .iter()
        .map(|n| groups.iter().position(|g| g.params.iter().any(|p| glob_match(p, n))))
        .collect();
    // A pattern whose every parameter an earlier group takes changes nothing: its group's
    // settings were silently not applied to them (`[#{ params: ["*"] }, #{ params:
    // ["*.bias"], weight_decay: 0.0 }]` decayed the biases).
    for (i, group) in groups.iter().enumerate().skip(1) {
        for p in &group.params {
            let mut matched = names.iter().zip(&assigned).filter(|(n, _)| glob_match(p, n));
            if matched.clone().any(|(_, g)| *g == Some(i)) {
                continue;
            }
            // Every pattern matches a parameter (checked above), which some group takes.
            let Some((first, Some(taker))) = matched.next() else { continue };
            return Err(err!(
                InvalidArgument,
                "{context}: groups[{i}]: pattern `{p}` matches only parameters that an earlier group takes (`{first}` is in groups[{taker}]): a parameter takes the first group that matches it, so put this group before groups[{taker}] or narrow that group's patterns"
            ));
        }
    }
    Ok(assigned)
}

/// The first few of `names`, for an error message.
fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<&str> = names.iter().take(SHOWN).map(String::as_str).collect();
    if names.len() > SHOWN {
        s.push("...");
    }
    if s.is_empty() {
        return "none".to_string();
    }
    s.join(", ")
}
