//! Checkpoints: named tensors in the safetensors layout, saved atomically and loaded with the
//! same validation as the reference implementation (Hugging Face `safetensors`).
//!
//! A file is
//!
//! ```text
//! [8 bytes: header length N, little-endian u64]
//! [N bytes: JSON object, UTF-8, padded with spaces to a multiple of 8]
//! [data: the tensors' raw little-endian bytes, back to back]
//! ```
//!
//! and the header maps each tensor name to `{"dtype": "F32"|"I32", "shape": [...],
//! "data_offsets": [begin, end]}` (offsets relative to the start of the data), plus an optional
//! `"__metadata__"` object of string to string.
//!
//! This module owns the byte format only. Which names a model expects is the model's business; it
//! states them to [`check_against`]. Loading never panics on any file content: every malformed
//! case is an [`ErrorKind::Checkpoint`](crate::ErrorKind::Checkpoint) error with its own message.

use crate::err;
use crate::error::{Error, Result};
use crate::memory::{read_all, Charge};
use crate::tensor::{checked_numel, fmt_shape, DType, Tensor, TensorData};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::Path;

/// Largest header accepted, as in the reference implementation (100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The header key that holds free-form string metadata.
pub const METADATA_KEY: &str = "__metadata__";

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The tensors in file order: sorted by their data offsets (ties, which only zero-sized
    /// tensors can have, broken by name). Files written by [`save`] store tensors sorted by name,
    /// so for them this is also name order.
    pub tensors: Vec<(String, Tensor)>,
    /// The `__metadata__` entries (empty when the file has none).
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// The tensor called `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// Write `tensors` and `metadata` to `path` atomically ([`crate::files::write_atomic`]): a
/// crash leaves either the old file or the new one, never half of one.
pub fn save(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    crate::files::write_atomic(path, &to_bytes(tensors, metadata)?)
}

/// The bytes of a checkpoint file holding `tensors` (stored sorted by name) and `metadata`.
/// Errors on duplicate or reserved names.
pub fn to_bytes(
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut sorted: Vec<(&str, &Tensor)> = tensors.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    for pair in sorted.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(err!(Checkpoint, "duplicate tensor name `{}`", pair[0].0));
        }
    }
    // Written by hand, not through a JSON map, to keep the reference writer's key order:
    // `__metadata__` first, tensors in data order, fields as dtype, shape, data_offsets.
    let mut entries = Vec::with_capacity(sorted.len() + 1);
    if !metadata.is_empty() {
        entries.push(format!("{}:{}", json_text(METADATA_KEY)?, json_text(metadata)?));
    }
    let mut offset = 0usize;
    for &(name, tensor) in &sorted {
        if name == METADATA_KEY {
            return Err(err!(Checkpoint, "`{METADATA_KEY}` is reserved and cannot name a tensor"));
        }
        let end = (tensor.numel().checked_mul(tensor.dtype().size()))
            .and_then(|n| offset.checked_add(n))
            .ok_or_else(|| err!(Checkpoint, "checkpoint data does not fit in memory"))?;
        entries.push(format!(
            r#"{}:{{"dtype":"{}","shape":{},"data_offsets":[{offset},{end}]}}"#,
            json_text(name)?,
            dtype_tag(tensor.dtype()),
            json_text(tensor.shape())?
        ));
        offset = end;
    }
    let mut json = format!("{{{}}}", entries.join(",")).into_bytes();
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = Vec::with_capacity(8 + json.len() + offset);
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    for (_, tensor) in &sorted {
        bytes.extend_from_slice(&tensor.to_le_bytes());
    }
    Ok(bytes)
}

/// Read and validate the checkpoint at `path`. Messages of malformed files start with the path.
/// The file's bytes and then its tensors are charged to `charge` before they are held; on return
/// it holds the tensors' bytes, for as long as the caller keeps them.
pub fn load(path: &Path, charge: &mut Charge) -> Result<Checkpoint> {
    let name = path.display().to_string();
    let file = fs::File::open(path).map_err(|e| Error::io(&name, e))?;
    let bytes = read_all(file, charge, &name)?;
    charge.grow(bytes.len() as u64, format!("the tensors of {name}"))?;
    let ckpt = from_bytes(&bytes).map_err(|e| err!(Checkpoint, "{name}: {}", e.message))?;
    drop(bytes);
    charge.resize(ckpt.tensors.iter().map(|(_, t)| t.bytes()).sum(), &name)?;
    Ok(ckpt)
}

/// Parse and validate the bytes of a checkpoint file.
pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint> {
    let (len_bytes, rest) = bytes.split_first_chunk::<8>().ok_or_else(|| {
        err!(Checkpoint, "file is {} bytes, too short for the 8-byte header length", bytes.len())
    })?;
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(err!(
            Checkpoint,
            "header length {header_len} is over the limit of {MAX_HEADER_LEN} bytes"
        ));
    }
    // At most 100 MB, so it fits in usize.
    let header_len = header_len as usize;
    if header_len > rest.len() {
        return Err(err!(
            Checkpoint,
            "header length {header_len} runs past the end of the file ({} bytes after the length)",
            rest.len()
        ));
    }
    let (header, data) = rest.split_at(header_len);
    let header = std::str::from_utf8(header)
        .map_err(|e| err!(Checkpoint, "header is not valid UTF-8 (at byte {})", e.valid_up_to()))?;
    if !header.trim_start().starts_with('{') {
        return Err(err!(Checkpoint, "header is not a JSON object"));
    }
    let Entries(entries) = serde_json::from_str(header)
        .map_err(|e| err!(Checkpoint, "header is not valid JSON: {e}"))?;

    let mut names = BTreeSet::new();
    let mut metadata = None;
    let mut infos = Vec::new();
    for (name, value) in entries {
        if !names.insert(name.clone()) {
            return Err(err!(Checkpoint, "duplicate key `{name}` in header"));
        }
        if name == METADATA_KEY {
            metadata = Some(parse_metadata(value)?);
        } else {
            infos.push(parse_info(name, value, data.len())?);
        }
    }
    infos.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    check_layout(&infos, data.len())?;

    let tensors = infos
        .into_iter()
        .map(|info| {
            let raw = &data[info.begin..info.end];
            let elements = match info.dtype {
                DType::F32 => TensorData::F32(raw.chunks_exact(4).map(le_f32).collect()),
                DType::I32 => TensorData::I32(raw.chunks_exact(4).map(le_i32).collect()),
            };
            let tensor = Tensor::new(&info.shape, elements)
                .map_err(|e| err!(Checkpoint, "tensor `{}`: {}", info.name, e.message))?;
            Ok((info.name, tensor))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Checkpoint { tensors, metadata: metadata.unwrap_or_default() })
}

/// Names as a message lists them: `` `a`, `b`, `c` ``, the first eight and a count of the rest.
pub fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    if names.len() > SHOWN {
        s.push(format!("and {} more", names.len() - SHOWN));
    }
    s.join(", ")
}

/// Check that `ckpt` holds exactly the `expected` tensors, each with its shape and dtype. One
/// error lists every missing name, every unexpected name and every mismatch.
pub fn check_against(ckpt: &Checkpoint, expected: &[(&str, &[usize], DType)]) -> Result<()> {
    let mut problems = Vec::new();
    let missing: Vec<String> = expected
        .iter()
        .filter(|(name, _, _)| ckpt.get(name).is_none())
        .map(|(name, _, _)| name.to_string())
        .collect();
    if !missing.is_empty() {
        problems.push(format!("missing {}", name_list(&missing)));
    }
    let unexpected: Vec<String> = ckpt
        .tensors
        .iter()
        .filter(|(name, _)| !expected.iter().any(|(e, _, _)| e == name))
        .map(|(name, _)| name.clone())
        .collect();
    if !unexpected.is_empty() {
        problems.push(format!("unexpected {}", name_list(&unexpected)));
    }
    for &(name, shape, dtype) in expected {
        let Some(t) = ckpt.get(name) else { continue };
        if t.shape() != shape || t.dtype() != dtype {
            problems.push(format!(
                "`{name}` is {} {}, expected {} {}",
                t.dtype(),
                fmt_shape(t.shape()),
                dtype,
                fmt_shape(shape)
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(err!(Checkpoint, "checkpoint does not match the model: {}", problems.join("; ")))
    }
}

/// One header entry, checked on its own.
struct Info {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

fn parse_metadata(value: Value) -> Result<BTreeMap<String, String>> {
    let Value::Object(map) = value else {
        return Err(err!(Checkpoint, "`{METADATA_KEY}` is not a JSON object"));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(err!(Checkpoint, "`{METADATA_KEY}` entry `{k}` is not a string")),
        })
        .collect()
}

fn parse_info(name: String, value: Value, data_len: usize) -> Result<Info> {
    let Value::Object(mut map) = value else {
        return Err(err!(Checkpoint, "tensor `{name}`: entry is not a JSON object"));
    };
    let field = |map: &mut serde_json::Map<String, Value>, key: &str| {
        map.remove(key).ok_or_else(|| err!(Checkpoint, "tensor `{name}`: missing `{key}`"))
    };
    let dtype = match field(&mut map, "dtype")? {
        Value::String(tag) => {
            parse_dtype(&tag).map_err(|m| err!(Checkpoint, "tensor `{name}`: {m}"))?
        }
        _ => return Err(err!(Checkpoint, "tensor `{name}`: `dtype` is not a string")),
    };
    let shape = usize_list(field(&mut map, "shape")?)
        .ok_or_else(|| err!(Checkpoint, "tensor `{name}`: `shape` is not a list of sizes"))?;
    let offsets = usize_list(field(&mut map, "data_offsets")?);
    let Some(&[begin, end]) = offsets.as_deref() else {
        return Err(err!(Checkpoint, "tensor `{name}`: `data_offsets` is not a pair of offsets"));
    };
    if let Some(key) = map.keys().next() {
        return Err(err!(Checkpoint, "tensor `{name}`: unknown field `{key}`"));
    }
    if begin > end {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: data_offsets [{begin}, {end}] are reversed"
        ));
    }
    if end > data_len {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: data_offsets [{begin}, {end}] run past the end of the data ({data_len} bytes)"
        ));
    }
    let numel =
        checked_numel(&shape).map_err(|e| err!(Checkpoint, "tensor `{name}`: {}", e.message))?;
    let n_bytes = numel * dtype.size(); // at most 4 × MAX_ELEMENTS
    if n_bytes != end - begin {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: shape {} of {dtype} needs {n_bytes} bytes, data_offsets [{begin}, {end}] hold {}",
            fmt_shape(&shape),
            end - begin
        ));
    }
    Ok(Info { name, dtype, shape, begin, end })
}

/// Tensors (sorted by offsets) must tile the data exactly: from 0, no gaps, no overlaps, no
/// trailing bytes.
fn check_layout(infos: &[Info], data_len: usize) -> Result<()> {
    let mut prev: Option<&Info> = None;
    for info in infos {
        let expected = prev.map_or(0, |p| p.end);
        match prev {
            None if info.begin != 0 => {
                return Err(err!(
                    Checkpoint,
                    "data of the first tensor `{}` starts at byte {}, not 0",
                    info.name,
                    info.begin
                ))
            }
            Some(p) if info.begin > expected => {
                return Err(err!(
                    Checkpoint,
                    "gap of {} bytes between tensors `{}` (ends at {}) and `{}` (starts at {})",
                    info.begin - expected,
                    p.name,
                    p.end,
                    info.name,
                    info.begin
                ))
            }
            Some(p) if info.begin < expected => {
                return Err(err!(
                    Checkpoint,
                    "tensors `{}` [{}, {}] and `{}` [{}, {}] overlap",
                    p.name,
                    p.begin,
                    p.end,
                    info.name,
                    info.begin,
                    info.end
                ))
            }
            _ => {}
        }
        prev = Some(info);
    }
    let used = prev.map_or(0, |p| p.end);
    if used != data_len {
        return Err(err!(
            Checkpoint,
            "{} trailing bytes after the last tensor (data is {data_len} bytes, tensors use {used})",
            data_len - used
        ));
    }
    Ok(())
}

/// `value` as JSON text.
fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| err!(Checkpoint, "cannot encode checkpoint header: {e}"))
}

fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "F32",
        DType::I32 => "I32",
    }
}

/// The dtype of a safetensors tag; other dtypes of the format are named as unsupported.
fn parse_dtype(tag: &str) -> std::result::Result<DType, String> {
    const OTHER_SAFETENSORS_DTYPES: &[&str] = &[
        "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "E8M0",
        "I16", "U16", "F16", "BF16", "U32", "I64", "U64", "F64", "C64",
    ];
    match tag {
        "F32" => Ok(DType::F32),
        "I32" => Ok(DType::I32),
        t if OTHER_SAFETENSORS_DTYPES.contains(&t) => {
            Err(format!("dtype {t} is not supported (rumus reads F32 and I32)"))
        }
        t => Err(format!("unknown dtype `{t}`")),
    }
}

fn usize_list(value: Value) -> Option<Vec<usize>> {
    let Value::Array(items) = value else {
        return None;
    };
    items.iter().map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok())).collect()
}

fn le_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_i32(b: &[u8]) -> i32 {
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The header's top-level entries in file order, duplicates kept (a JSON map would drop them).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}
