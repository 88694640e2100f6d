//! PyTorch and Hugging Face state dicts onto a model's names: what `load(path, #{ from:
//! "pytorch" })` does between reading the file and loading the values.
//!
//! A state dict saved by `safetensors.torch.save_file(model.state_dict(), path)` differs from a
//! rumus checkpoint in three ways, and [`map`] undoes each:
//!
//! - Names. [`Rename`] rules rewrite them: a rule's pattern matches the first whole dotted
//!   segments of a tensor's name (`*` matches any one segment) and those segments are replaced
//!   by the target, with each `*` filled in order; the rest of the name (`.weight`) is kept.
//!   When several rules match, the one with the most segments wins. Names no rule matches are
//!   kept as they are.
//! - Layout. `nn.Linear` stores its weight `[out, in]`; a rumus linear weight is `[in, out]`
//!   (`x @ weight`). A tensor landing on a linear weight (a 2-D parameter the model uses as the
//!   right operand of `@`) is transposed, unless [`Transpose`] says otherwise (Hugging Face's
//!   GPT-2 stores its `Conv1D` weights `[in, out]` already).
//! - Tying. A rule may name several targets (one tensor used for two of our names), and several
//!   tensors may land on one name (PyTorch keeps both `wte.weight` and a tied `lm_head.weight`)
//!   when they hold the same values.
//!
//! A BatchNorm's `num_batches_tracked` (a count PyTorch keeps for `momentum=None`, which rumus's
//! `batch_norm` has no use for) is dropped unless the model has a value of that name, so a
//! state dict with BatchNorm layers loads strictly, as PyTorch's `save_file` writes it.
//!
//! Every tensor that lands on a parameter with the wrong shape is named in one error, with the
//! shape expected in the file's layout and the shape found.
//!
//! Mapping costs at most [`MAX_RULES`] pattern tests per tensor (a file may hold a million
//! tensors), and every copy it makes (a tensor's second name, a transpose) is charged to the
//! caller's budget before it is made.

use super::Checkpoint;
use crate::err;
use crate::error::Result;
use crate::memory::Charge;
use crate::graph::{Graph, NodeId, Op};
use crate::tensor::{fmt_shape, Tensor, TensorData};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most rename targets (over all rules) and most `transpose` patterns one load takes: each is
/// tried against every tensor of the file.
pub const MAX_RULES: usize = 256;

/// A dotted name pattern: its segments, `*` matching any one segment.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern(Vec<String>);

impl Pattern {
    /// Parse `text`: dotted segments, none empty; `""` is the pattern of no segments (a rename
    /// target that drops the matched prefix).
    pub fn parse(text: &str) -> Result<Pattern> {
        if text.is_empty() {
            return Ok(Pattern(Vec::new()));
        }
        let segments: Vec<String> = text.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(err!(
                InvalidArgument,
                "name pattern `{text}` has an empty segment: write dotted names like `h.*.ln_1`"
            ));
        }
        // A `*` inside a segment was a literal character: `"0": "fc*"` named `fc*.weight`.
        if let Some(s) = segments.iter().find(|s| s.contains('*') && *s != "*") {
            return Err(err!(
                InvalidArgument,
                "name pattern `{text}`: `*` stands for a whole segment (`h.*.ln_1`), not part of \
                 one (`{s}`)"
            ));
        }
        Ok(Pattern(segments))
    }

    fn stars(&self) -> usize {
        self.0.iter().filter(|s| *s == "*").count()
    }

    /// The segments `*` matched, when this pattern matches the first segments of `name`.
    fn match_prefix<'n>(&self, name: &[&'n str]) -> Option<Vec<&'n str>> {
        if self.0.len() > name.len() {
            return None;
        }
        let mut caps = Vec::new();
        for (p, &n) in self.0.iter().zip(name) {
            if p == "*" {
                caps.push(n);
            } else if p != n {
                return None;
            }
        }
        Some(caps)
    }

    /// This pattern's segments with each `*` replaced by the next capture.
    fn fill<'a>(&'a self, caps: &[&'a str]) -> Vec<&'a str> {
        let mut caps = caps.iter();
        self.0.iter().map(|s| if s == "*" { caps.next().copied().unwrap_or("*") } else { s }).collect()
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

/// One rename rule: names starting with `from` get the segments of each of `to` instead.
#[derive(Clone, Debug)]
pub struct Rename {
    from: Pattern,
    to: Vec<Pattern>,
}

impl Rename {
    /// A rule from `from` to each of `to`; every target must use as many `*` as `from`.
    pub fn new(from: &str, to: &[String]) -> Result<Rename> {
        let from = Pattern::parse(from)?;
        if from.0.is_empty() {
            return Err(err!(InvalidArgument, "rename: an empty pattern matches nothing"));
        }
        let to = to.iter().map(|t| Pattern::parse(t)).collect::<Result<Vec<_>>>()?;
        if to.is_empty() {
            return Err(err!(InvalidArgument, "rename: `{from}` has no target"));
        }
        for t in &to {
            if t.stars() != from.stars() {
                return Err(err!(
                    InvalidArgument,
                    "rename: `{from}` has {} `*` but its target `{t}` has {}: give each the same",
                    from.stars(),
                    t.stars()
                ));
            }
        }
        Ok(Rename { from, to })
    }
}

/// Which tensors landing on our names are transposed from `[out, in]`.
#[derive(Clone, Debug)]
pub enum Transpose {
    /// Those landing on a linear weight (the default).
    Linear,
    /// None (`transpose: false`).
    Never,
    /// The 2-D tensors landing on names these patterns match (their first segments).
    Only(Vec<Pattern>),
}

/// How a state dict maps onto a model.
#[derive(Clone, Debug)]
pub struct Options {
    /// The rename rules.
    pub rename: Vec<Rename>,
    /// Which tensors are transposed.
    pub transpose: Transpose,
}

impl Options {
    /// Options a load can use: at most [`MAX_RULES`] rename targets and transpose patterns, and
    /// no empty pattern. [`map`] checks them too; a caller checks them before reading a file, so
    /// that a mistake in them is not reported as one of the file's.
    pub fn check(&self) -> Result<()> {
        let rules = self.rename.iter().map(|r| r.to.len()).sum::<usize>();
        let patterns = self.transpose_patterns();
        if rules > MAX_RULES || patterns > MAX_RULES {
            return Err(err!(
                InvalidArgument,
                "{rules} rename targets and {patterns} transpose patterns: at most {MAX_RULES} of \
                 each (use `*` for the segments that vary)"
            ));
        }
        if let Transpose::Only(patterns) = &self.transpose {
            if patterns.iter().any(|p| p.0.is_empty()) {
                return Err(err!(InvalidArgument, "transpose: an empty pattern matches nothing"));
            }
        }
        Ok(())
    }

    /// How many name patterns `transpose` lists (0 unless it lists some).
    fn transpose_patterns(&self) -> usize {
        match &self.transpose {
            Transpose::Only(p) => p.len(),
            _ => 0,
        }
    }
}

/// A parameter a tensor may land on.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its dotted name.
    pub name: String,
    /// Its shape (rumus's layout).
    pub shape: Vec<usize>,
    /// Whether it is a linear weight: 2-D and the right operand of a matmul.
    pub linear: bool,
}

/// The parameters of `g` as targets.
pub fn targets(g: &Graph) -> Vec<Target> {
    let right_operands: BTreeSet<NodeId> = g
        .nodes()
        .filter(|(_, n)| n.op == Op::MatMul)
        .filter_map(|(_, n)| n.inputs.get(1).copied())
        .collect();
    g.parameters()
        .into_iter()
        .map(|(id, name)| Target {
            name: name.to_string(),
            shape: g.shape(id).to_vec(),
            linear: g.shape(id).len() == 2 && right_operands.contains(&id),
        })
        .collect()
}

/// The tensors of `ckpt` under our names, each in our layout (see the module documentation).
/// A tensor whose name matches no target keeps its (renamed) name, so that the load reports it.
/// `charge` holds the bytes of `ckpt`'s tensors: a tensor that lands on several names is copied
/// for each but the last, and one transposed is copied, each copy charged to `charge` before
/// it is made; what is dropped is given back, so that on return `charge` holds what is
/// returned.
pub fn map(
    ckpt: Checkpoint,
    targets: &[Target],
    opts: &Options,
    charge: &mut Charge,
) -> Result<Vec<(String, Tensor)>> {
    opts.check()?;
    let patterns = opts.transpose_patterns();
    let targets: HashMap<&str, &Target> = targets.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut out: BTreeMap<String, (String, Tensor)> = BTreeMap::new();
    let mut problems = Vec::new();
    // A rule or pattern that matches no tensor is a mistake (a typo would load the state dict
    // untransposed or unrenamed without a word).
    let mut renamed = vec![false; opts.rename.len()];
    let mut flipped = vec![false; patterns];
    let first_names: Vec<String> = ckpt.tensors.iter().take(3).map(|(n, _)| n.clone()).collect();
    for (source, tensor) in ckpt.tensors {
        let (rule, names) = rename(&opts.rename, &source)?;
        if let Some(r) = rule {
            renamed[r] = true;
        }
        let counter = source.rsplit('.').next() == Some("num_batches_tracked");
        if counter && !names.iter().any(|n| targets.contains_key(n.as_str())) {
            drop(charge.split_off(tensor.bytes()));
            continue;
        }
        // The tensor is in `charge` already. Its last name takes it as it is; every other
        // value made of it (a copy for an earlier name, a transpose) is charged before it is
        // made, and whatever is dropped (the tensor once nothing takes it, a tied value equal
        // to the one kept) is given back, so the bytes held never pass what is charged.
        let last = names.len().saturating_sub(1);
        let mut original = Some(tensor);
        for (i, name) in names.into_iter().enumerate() {
            let Some(tensor) = original.as_ref() else { break };
            if let Transpose::Only(patterns) = &opts.transpose {
                let segs: Vec<&str> = name.split('.').collect();
                for (used, p) in flipped.iter_mut().zip(patterns) {
                    *used |= p.match_prefix(&segs).is_some();
                }
            }
            let target = targets.get(name.as_str()).copied();
            let flip = tensor.shape().len() == 2
                && match &opts.transpose {
                    Transpose::Linear => target.is_some_and(|t| t.linear),
                    Transpose::Never => false,
                    Transpose::Only(patterns) => {
                        let segs: Vec<&str> = name.split('.').collect();
                        patterns.iter().any(|p| p.match_prefix(&segs).is_some())
                    }
                };
            if let Some(t) = target {
                let mut expected = t.shape.clone();
                if flip {
                    expected.reverse();
                }
                if tensor.shape() != expected {
                    let hint = if tensor.shape().iter().rev().eq(expected.iter()) {
                        " (its transpose fits: see the `transpose` option)"
                    } else {
                        ""
                    };
                    problems.push(format!(
                        "`{source}` for `{name}`: expected {}, found {}{hint}",
                        fmt_shape(&expected),
                        fmt_shape(tensor.shape())
                    ));
                    continue;
                }
            }
            let value = if flip {
                charge.grow(tensor.bytes(), format!("`{source}` transposed for `{name}`"))?;
                transposed(tensor)?
            } else if i < last {
                charge.grow(tensor.bytes(), format!("`{source}` copied to `{name}` as well"))?;
                tensor.clone()
            } else {
                let Some(taken) = original.take() else { break };
                taken
            };
            match out.entry(name) {
                Entry::Vacant(e) => {
                    e.insert((source.clone(), value));
                }
                Entry::Occupied(e) => {
                    let (first, held) = e.get();
                    if !same_values(held, &value) {
                        problems.push(format!(
                            "`{first}` and `{source}` both land on `{}` but hold different values",
                            e.key()
                        ));
                    }
                    drop(charge.split_off(value.bytes()));
                }
            }
        }
        if let Some(unused) = original {
            drop(charge.split_off(unused.bytes()));
        }
    }
    let seen = crate::error::name_list(&first_names);
    if let Some(r) = renamed.iter().position(|&used| !used) {
        return Err(err!(
            InvalidArgument,
            "rename: `{}` matches no tensor of the state dict (its names begin {seen})",
            opts.rename[r].from
        ));
    }
    if let (Transpose::Only(patterns), Some(p)) =
        (&opts.transpose, flipped.iter().position(|&used| !used))
    {
        return Err(err!(
            InvalidArgument,
            "transpose: `{}` matches no tensor name (after renaming; the state dict's begin {seen})",
            patterns[p]
        ));
    }
    if !problems.is_empty() {
        return Err(err!(
            Checkpoint,
            "the state dict does not fit the model: {}",
            problems.join("; ")
        ));
    }
    Ok(out.into_iter().map(|(name, (_, t))| (name, t)).collect())
}

/// The names `source` lands on under `rules`, and which rule renamed it.
fn rename(rules: &[Rename], source: &str) -> Result<(Option<usize>, Vec<String>)> {
    let segs: Vec<&str> = source.split('.').collect();
    let mut best: Option<(&Rename, Vec<&str>)> = None;
    let mut index = None;
    for (r, rule) in rules.iter().enumerate() {
        let Some(caps) = rule.from.match_prefix(&segs) else { continue };
        match &best {
            Some((b, _)) if b.from.0.len() > rule.from.0.len() => {}
            Some((b, _)) if b.from.0.len() == rule.from.0.len() => {
                return Err(err!(
                    InvalidArgument,
                    "rename: `{}` and `{}` both match `{source}`: make one of them longer",
                    b.from,
                    rule.from
                ));
            }
            _ => {
                best = Some((rule, caps));
                index = Some(r);
            }
        }
    }
    let Some((rule, caps)) = best else {
        return Ok((None, vec![source.to_string()]));
    };
    let rest = &segs[rule.from.0.len()..];
    let names = rule
        .to
        .iter()
        .map(|to| {
            let mut name = to.fill(&caps);
            name.extend_from_slice(rest);
            if name.is_empty() {
                return Err(err!(
                    InvalidArgument,
                    "rename: `{}` → `{to}` leaves `{source}` with no name",
                    rule.from
                ));
            }
            Ok(name.join("."))
        })
        .collect::<Result<_>>()?;
    Ok((index, names))
}

/// Whether `a` and `b` hold the same shape, dtype and bits (a NaN equals itself), compared in
/// place: no copy of either.
fn same_values(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && match (a.data(), b.data()) {
            (TensorData::F32(x), TensorData::F32(y)) => {
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            (TensorData::I32(x), TensorData::I32(y)) => x == y,
            _ => false,
        }
}

/// A 2-D tensor `[r, c]` as `[c, r]`.
fn transposed(t: &Tensor) -> Result<Tensor> {
    let &[r, c] = t.shape() else {
        return Ok(t.clone());
    };
    // Allocated once at its size: collected from a `flat_map`, which gives no exact length,
    // the vector grew by doubling (up to 1.5 times the copy charged for it, at the last move).
    fn flip<T: Copy>(v: &[T], r: usize, c: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(v.len());
        out.extend((0..c).flat_map(|j| (0..r).map(move |i| v[i * c + j])));
        out
    }
    let data = match t.data() {
        TensorData::F32(v) => TensorData::F32(flip(v, r, c)),
        TensorData::I32(v) => TensorData::I32(flip(v, r, c)),
    };
    Tensor::new(&[c, r], data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::per_thread::peak;
    use crate::memory::Budget;

    fn checkpoint(tensors: Vec<(&str, Tensor)>) -> Checkpoint {
        let tensors = tensors.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        Checkpoint { tensors, metadata: Default::default() }
    }

    fn ramp(shape: &[usize]) -> Tensor {
        let n = shape.iter().product::<usize>();
        Tensor::f32(shape, (0..n).map(|i| i as f32).collect()).unwrap()
    }

    /// Found by the review of the charged readers: a weight transposed from PyTorch's layout
    /// was copied with nothing charged for the copy (a checkpoint of one linear weight as large
    /// as the budget held twice the budget for a moment), into a vector grown by doubling (1.5
    /// times the copy at its last move); the first of a tensor's names took a copy uncharged
    /// too, and two tensors tied to one name were compared through a byte copy of each. Every
    /// copy is charged before it is made (a transpose the budget has no room for is an error
    /// naming it) and allocated once, the last name takes the tensor itself, tied tensors are
    /// compared in place, and on return the charge holds exactly what is returned.
    #[test]
    fn every_copy_is_charged_before_it_is_made() {
        let w = ramp(&[128, 256]);
        let bytes = w.bytes(); // 128 KiB
        let targets = [Target { name: "fc.weight".into(), shape: vec![256, 128], linear: true }];
        let linear = Options { rename: Vec::new(), transpose: Transpose::Linear };
        // Room for the file's tensor, not for its transpose beside it.
        let budget = Budget::new(bytes + bytes / 2);
        let mut charge = budget.charge(bytes, "the file's tensors").unwrap();
        let ckpt = checkpoint(vec![("fc.weight", w.clone())]);
        let e = map(ckpt, &targets, &linear, &mut charge).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Limit);
        assert!(
            e.message.starts_with(
                "`fc.weight` transposed for `fc.weight` needs 128.0 KiB but only 64.0 KiB of the \
                 192.0 KiB memory budget is free"
            ),
            "{e}"
        );
        // With room: the transpose, and the tensor given back once transposed.
        let budget = Budget::new(2 * bytes);
        let mut charge = budget.charge(bytes, "the file's tensors").unwrap();
        let ckpt = checkpoint(vec![("fc.weight", w.clone())]);
        let (out, most) = peak(|| map(ckpt, &targets, &linear, &mut charge));
        let out = out.unwrap();
        assert_eq!(out, [("fc.weight".to_string(), transposed(&w).unwrap())]);
        assert!(most <= bytes + 4096, "{most}");
        assert_eq!((charge.bytes(), budget.used()), (bytes, bytes));

        // One tensor on two names: one copy, charged; two tensors tied to one name: no copy.
        let never = |rename: Vec<Rename>| Options { rename, transpose: Transpose::Never };
        let onto = |from: &str, names: &[&str]| {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            Rename::new(from, &names).unwrap()
        };
        let v = ramp(&[1 << 15]);
        let bytes = v.bytes();
        let tied = vec![onto("a", &["x"]), onto("b", &["x"])];
        let cases = [
            (vec![("a", v.clone())], vec![onto("a", &["x", "y"])], 2, 1),
            (vec![("a", v.clone()), ("b", v.clone())], tied, 1, 0),
        ];
        for (tensors, rename, kept, copies) in cases {
            let budget = Budget::new(4 * bytes);
            let mut charge = budget.charge(tensors.len() as u64 * bytes, "the tensors").unwrap();
            let (out, most) = peak(|| map(checkpoint(tensors), &[], &never(rename), &mut charge));
            let out = out.unwrap();
            assert_eq!(out.len(), kept);
            assert!(out.iter().all(|(_, t)| *t == v));
            assert!(most <= copies * bytes + 4096, "{most} bytes for {copies} copies");
            assert_eq!(charge.bytes(), kept as u64 * bytes);
        }
    }
}
