//! Checkpoints: named tensors in the safetensors format, read and written through the
//! `safetensors` crate (Hugging Face's reference implementation), saved atomically.
//!
//! A file is
//!
//! ```text
//! [8 bytes: header length N, little-endian u64]
//! [N bytes: JSON object, UTF-8, padded with spaces to a multiple of 8]
//! [data: the tensors' raw little-endian bytes, back to back]
//! ```
//!
//! and the header maps each tensor name to `{"dtype": ..., "shape": [...], "data_offsets":
//! [begin, end]}` (offsets relative to the start of the data), plus an optional
//! `"__metadata__"` object of string to string.
//!
//! The crate's types parse each header entry (`TensorInfo`, `Dtype`) and its `Metadata`
//! validation checks that the tensors fill the data back to back; its `serialize` writes the
//! files. This module frames the bytes itself (header length cap, bounds, UTF-8: the crate's
//! own `read_metadata` adds offsets without an overflow check, which panics in a debug build on
//! a hostile file), reads the header entry by entry, charging each to the memory budget as it
//! comes (no JSON tree of the whole header), refuses duplicate header keys (which the crate
//! would silently collapse),
//! names the tensor in each message, and converts elements: F32 and I32 are kept bit for bit,
//! F16, BF16 and F64 are converted to f32 (F64 values outside f32's range are an error, not an
//! infinity; NaN and infinities stay what they are), and the other integer types and BOOL to
//! i32 (a value outside i32's range is an error naming it; PyTorch files carry such buffers:
//! `num_batches_tracked` as I64, attention masks as BOOL or U8). Files written before rumus used the crate are the same format and load as they
//! are.
//!
//! This module owns the byte format only. Which names a model expects is the model's business;
//! it states them to [`check_against`] or [`crate::session::Trainer::load_checkpoint`]. Loading
//! never panics on any file content: every malformed case is an
//! [`ErrorKind::Checkpoint`](crate::ErrorKind::Checkpoint) error with its own message.

use crate::err;
use crate::error::{Error, Result};
use crate::memory::{read_file, Charge};
use crate::tensor::{checked_numel, fmt_shape, DType, Tensor, TensorData};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensorError, View};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::Path;

pub mod torch;


/// Largest header accepted, as in the reference implementation (100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The header key that holds free-form string metadata.
pub const METADATA_KEY: &str = "__metadata__";

/// Bytes a tensor's header entry is charged while the file is read, beside four times its
/// name: the entry parsed (with its shape of at most `MAX_RANK` dimensions) and the copy the
/// `safetensors` crate checks, its places in the duplicate check, the crate's index and the
/// list of entries (grown by doubling).
const ENTRY_BYTES: u64 = 1024;

/// Bytes a tensor's entry keeps once the file is read, beside its name and its shape: the
/// name's and the tensor's bookkeeping.
const TENSOR_BYTES: u64 = 128;

/// Bytes of JSON text a tensor's header entry may take: a dtype, at most `MAX_RANK`
/// dimensions and two offsets take a few hundred. Each entry is parsed into a JSON value of
/// its own (its messages name it), which this bounds.
const MAX_ENTRY_JSON: usize = 4096;

/// Bytes `__metadata__` (a map of strings) takes once parsed, at most, per byte of its text:
/// an entry of two empty strings is 6 bytes of text and about 130 in the map's B-tree.
const METADATA_EXPANSION: u64 = 32;

/// The file dtypes rumus reads, as a message lists them.
const READABLE: &str =
    "F32, I32, F16, BF16 and F64 (as f32), and I8, U8, I16, U16, U32, I64, U64 and BOOL (as i32)";

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The tensors in file order: sorted by their data offsets (ties, which only zero-sized
    /// tensors can have, broken by name). F16, BF16 and F64 tensors are converted to f32.
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

/// The bytes of a checkpoint file holding `tensors` and `metadata`, laid out by the
/// `safetensors` crate (tensors sorted by dtype, then name; `__metadata__` entries in the
/// order of a hash map). Errors on duplicate or reserved names.
pub fn to_bytes(
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut names = BTreeSet::new();
    for &(name, _) in tensors {
        if name == METADATA_KEY {
            return Err(err!(Checkpoint, "`{METADATA_KEY}` is reserved and cannot name a tensor"));
        }
        if !names.insert(name) {
            return Err(err!(Checkpoint, "duplicate tensor name `{name}`"));
        }
    }
    let views = tensors.iter().map(|&(name, t)| (name, HostView(t)));
    let info: Option<HashMap<String, String>> =
        (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    safetensors::serialize(views, info)
        .map_err(|e| err!(Checkpoint, "cannot write the checkpoint: {e}"))
}

/// Read and validate the checkpoint at `path`. Messages of malformed files start with the path.
/// The file's bytes, its header's entries as they are parsed, and then its tensors (as f32 or
/// i32) are charged to `charge` before they are held; on return it holds the tensors' bytes
/// and what their names, shapes and the metadata keep, for as long as the caller keeps them.
pub fn load(path: &Path, charge: &mut Charge) -> Result<Checkpoint> {
    let name = path.display().to_string();
    // The kind kept: a file too large for the memory budget is a Limit error.
    let at_path = |e: Error| Error::new(e.kind, format!("{name}: {}", e.message));
    let file = crate::files::open_regular(path)?;
    let bytes = read_file(file, charge, &name)?;
    let layout = Layout::parse(&bytes, charge).map_err(at_path)?;
    let kept = layout.kept_bytes();
    charge.grow(layout.host_bytes(), format!("the tensors of {name}"))?;
    let ckpt = layout.tensors().map_err(at_path)?;
    drop(bytes);
    charge.resize(ckpt.tensors.iter().map(|(_, t)| t.bytes()).sum::<u64>() + kept, &name)?;
    Ok(ckpt)
}

/// Parse and validate the bytes of a checkpoint file (nothing charged).
pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint> {
    Layout::parse(bytes, &mut crate::memory::Budget::unlimited().empty())?.tensors()
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
        problems.push(format!("missing {}", crate::error::name_list(&missing)));
    }
    let unexpected: Vec<String> = ckpt
        .tensors
        .iter()
        .filter(|(name, _)| !expected.iter().any(|(e, _, _)| e == name))
        .map(|(name, _)| name.clone())
        .collect();
    if !unexpected.is_empty() {
        problems.push(format!("unexpected {}", crate::error::name_list(&unexpected)));
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

/// What a file whose header length does not fit is, said after the length's error: the
/// format its first bytes show (a PyTorch `.pt` file is the usual mistake), else that it is
/// not a safetensors file or is damaged.
fn other_format(bytes: &[u8]) -> &'static str {
    const TORCH: &str = ": the file is not a safetensors file but a PyTorch file (`torch.save` \
        writes a zip archive or a pickle); convert it with scripts/tools/export_torch.py and load \
        it with `from: \"pytorch\"`";
    if bytes.starts_with(b"PK\x03\x04") || matches!(bytes, [0x80, 2..=5, ..]) {
        TORCH
    } else if bytes.starts_with(&[0x1f, 0x8b]) {
        ": the file is not a safetensors file but gzip-compressed: decompress it first"
    } else if bytes.starts_with(b"\x89HDF\r\n\x1a\n") {
        ": the file is not a safetensors file but HDF5 (a Keras `.h5` file?)"
    } else if bytes.starts_with(b"\x93NUMPY") {
        ": the file is not a safetensors file but a NumPy `.npy` array"
    } else if bytes.starts_with(b"GGUF") {
        ": the file is not a safetensors file but GGUF"
    } else {
        ": the file is not a safetensors file, or it is damaged"
    }
}

/// A checked file: its tensors' header entries in data order, its metadata and its data.
struct Layout<'a> {
    infos: Vec<(String, TensorInfo)>,
    metadata: BTreeMap<String, String>,
    /// Bytes of the metadata's JSON text.
    metadata_text: usize,
    data: &'a [u8],
}

impl<'a> Layout<'a> {
    /// Frame the bytes, parse the header and check every entry against the data. Each entry
    /// is parsed, checked and charged to `charge` as it is read: no JSON tree of the whole
    /// header is built (in `serde_json::Value`s a header takes 17 times its text, and a
    /// hostile one of nested objects nearer 60: for a header of 100 MB, the most one may be,
    /// gigabytes outside the budget).
    fn parse(bytes: &'a [u8], charge: &mut Charge) -> Result<Layout<'a>> {
        let (len_bytes, rest) = bytes.split_first_chunk::<8>().ok_or_else(|| {
            err!(
                Checkpoint,
                "file is {} bytes, too short for the 8-byte header length",
                bytes.len()
            )
        })?;
        let header_len = u64::from_le_bytes(*len_bytes);
        if header_len > MAX_HEADER_LEN {
            return Err(err!(
                Checkpoint,
                "header length {header_len} is over the limit of {MAX_HEADER_LEN} bytes{}",
                other_format(bytes)
            ));
        }
        // At most 100 MB, so it fits in usize.
        let header_len = header_len as usize;
        let (header, data) = rest.split_at_checked(header_len).ok_or_else(|| {
            err!(
                Checkpoint,
                "header length {header_len} runs past the end of the file ({} bytes after the length){}",
                rest.len(),
                other_format(bytes)
            )
        })?;
        let header = std::str::from_utf8(header).map_err(|e| {
            err!(Checkpoint, "header is not valid UTF-8 (at byte {})", e.valid_up_to())
        })?;
        if !header.trim_start().starts_with('{') {
            return Err(err!(Checkpoint, "header is not a JSON object"));
        }
        let mut refused = None;
        let mut json = serde_json::Deserializer::from_str(header);
        let read = Entries { charge, refused: &mut refused }.deserialize(&mut json);
        let Header { mut infos, metadata, metadata_text } =
            match read.and_then(|h| json.end().map(|()| h)) {
                Ok(h) => h,
                Err(e) => {
                    return Err(refused
                        .unwrap_or_else(|| err!(Checkpoint, "header is not valid JSON: {e}")))
                }
            };
        // Unstable: the names are distinct, so the order is the same, and nothing is allocated.
        infos.sort_unstable_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));
        // The crate's check that the tensors fill the data back to back from byte 0.
        let checked = Metadata::new(None, infos.clone()).map_err(|e| match e {
            SafeTensorError::InvalidOffset(name) => {
                let (begin, end) = infos
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or((0, 0), |(_, i)| i.data_offsets);
                err!(
                    Checkpoint,
                    "tensor `{name}`: data_offsets [{begin}, {end}] leave a gap or overlap \
                     another tensor (tensors must fill the data back to back from byte 0)"
                )
            }
            other => err!(Checkpoint, "not a valid safetensors file: {other}"),
        })?;
        let used = checked.data_len();
        if used != data.len() {
            return Err(err!(
                Checkpoint,
                "the tensors use {used} bytes of data but the file holds {} (truncated or \
                 padded: the file is damaged)",
                data.len()
            ));
        }
        Ok(Layout { infos, metadata, metadata_text, data })
    }

    /// Bytes the checkpoint keeps once read beside its elements: each tensor's name, shape
    /// and bookkeeping, and the metadata.
    fn kept_bytes(&self) -> u64 {
        let per_tensor = |(name, info): &(String, TensorInfo)| {
            TENSOR_BYTES + name.len() as u64 + 8 * info.shape.len() as u64
        };
        let tensors: u64 = self.infos.iter().map(per_tensor).sum();
        tensors + METADATA_EXPANSION * self.metadata_text as u64
    }

    /// Bytes the tensors take once read (every element as 4 bytes).
    fn host_bytes(&self) -> u64 {
        self.infos.iter().map(|(_, i)| i.shape.iter().product::<usize>() as u64 * 4).sum()
    }

    /// The tensors, converted.
    fn tensors(self) -> Result<Checkpoint> {
        let data = self.data;
        let tensors = self
            .infos
            .into_iter()
            .map(|(name, info)| {
                let (begin, end) = info.data_offsets;
                let raw = data.get(begin..end).ok_or_else(|| {
                    err!(Checkpoint, "tensor `{name}`: data_offsets [{begin}, {end}] out of range")
                })?;
                let elements = elements(info.dtype, raw)
                    .map_err(|m| err!(Checkpoint, "tensor `{name}`: {m}"))?;
                let tensor = Tensor::new(&info.shape, elements)
                    .map_err(|e| err!(Checkpoint, "tensor `{name}`: {}", e.message))?;
                Ok((name, tensor))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Checkpoint { tensors, metadata: self.metadata })
    }
}

/// Values no run makes in a parameter or state, refused where a checkpoint's tensor is loaded
/// into a model (they made the next step's loss NaN without a word): a NaN or an infinity, a
/// negative variance (Adam's second moment, batch norm's running variance). The file itself may hold them (a tensor the model does not
/// load, a mask of -inf), and a host or script may still set such a value itself.
pub fn check_state_values(name: &str, t: &Tensor) -> Result<()> {
    let Some(v) = t.as_f32() else { return Ok(()) };
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(err!(
            Checkpoint,
            "tensor `{name}` holds {} at element {i}: a model takes finite values only (was it saved after a step whose loss was NaN?)",
            v[i]
        ));
    }
    // Variances: Adam's second moments and batch norm's running variances.
    let second_moments = format!("optim.{}.", crate::graph::optim::SECOND_MOMENT);
    let what = if name.starts_with(&second_moments) {
        "an Adam second moment"
    } else if name.rsplit('.').next() == Some(crate::graph::conv::RUNNING_VAR) {
        "a batch norm running variance"
    } else {
        return Ok(());
    };
    match v.iter().position(|&x| x < 0.0) {
        Some(i) => Err(err!(
            Checkpoint,
            "tensor `{name}` is {what}, which is never negative, but element {i} is {}",
            v[i]
        )),
        None => Ok(()),
    }
}

/// One header entry, parsed by the crate's `TensorInfo` and checked on its own: at most
/// [`MAX_ENTRY_JSON`] bytes of JSON, a dtype rumus reads, at most `MAX_ELEMENTS` elements,
/// offsets in order and as many bytes as the shape needs.
fn entry(name: &str, raw: &RawValue) -> Result<TensorInfo> {
    let text = raw.get();
    if text.len() > MAX_ENTRY_JSON {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: entry is {} bytes of JSON, more than a tensor's entry takes (at most \
             {MAX_ENTRY_JSON})",
            text.len()
        ));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| err!(Checkpoint, "tensor `{name}`: {}", without_position(&e)))?;
    if !value.is_object() {
        return Err(err!(Checkpoint, "tensor `{name}`: entry is not a JSON object"));
    }
    let info: TensorInfo =
        serde_json::from_value(value).map_err(|e| err!(Checkpoint, "tensor `{name}`: {e}"))?;
    let dtype = info.dtype;
    let width = element_bytes(dtype).ok_or_else(|| {
        err!(Checkpoint, "tensor `{name}`: dtype {dtype} is not supported (rumus reads {READABLE})")
    })?;
    let numel = checked_numel(&info.shape)
        .map_err(|e| err!(Checkpoint, "tensor `{name}`: {}", e.message))?;
    let n_bytes = numel * width; // at most 8 × MAX_ELEMENTS
    let (begin, end) = info.data_offsets;
    if begin > end {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: data_offsets [{begin}, {end}] are reversed"
        ));
    }
    if n_bytes != end - begin {
        return Err(err!(
            Checkpoint,
            "tensor `{name}`: shape {} of {dtype} needs {n_bytes} bytes, data_offsets [{begin}, {end}] hold {}",
            fmt_shape(&info.shape),
            end - begin
        ));
    }
    Ok(info)
}

/// Bytes per element of the file dtypes rumus reads.
fn element_bytes(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::BOOL | Dtype::I8 | Dtype::U8 => Some(1),
        Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => Some(2),
        Dtype::F32 | Dtype::I32 | Dtype::U32 => Some(4),
        Dtype::F64 | Dtype::I64 | Dtype::U64 => Some(8),
        _ => None,
    }
}

/// The elements of `raw` (little-endian, its length a multiple of the dtype's width) as f32
/// or i32. F32 and I32 keep their bits; F16 and BF16 widen exactly; F64 rounds, and a finite
/// value beyond f32's range is an error naming its index; the other integers convert exactly,
/// a value beyond i32's range an error naming its index; BOOL is 0 or 1, any other byte an
/// error. The result is allocated once at its final size and nothing else is: the caller
/// charged 4 bytes an element, and a wider copy on the way (an i128 per element, a vector
/// grown by doubling) would hold several times that outside the budget.
fn elements(dtype: Dtype, raw: &[u8]) -> std::result::Result<TensorData, String> {
    fn bytes<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        a
    }
    /// Each element through `f` (exact-size iteration: one allocation).
    fn each<const N: usize, T>(raw: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N).map(|b| f(bytes(b))).collect()
    }
    /// Each element, with its index, through `f`, which may refuse it.
    fn each_checked<const N: usize, T>(
        raw: &[u8],
        f: impl Fn(usize, [u8; N]) -> std::result::Result<T, String>,
    ) -> std::result::Result<Vec<T>, String> {
        let mut out = Vec::with_capacity(raw.len() / N);
        for (i, b) in raw.chunks_exact(N).enumerate() {
            out.push(f(i, bytes(b))?);
        }
        Ok(out)
    }
    fn narrow(i: usize, v: i128) -> std::result::Result<i32, String> {
        i32::try_from(v).map_err(|_| format!("element {i}: {v} is outside the i32 range"))
    }
    Ok(match dtype {
        Dtype::F32 => TensorData::F32(each(raw, f32::from_le_bytes)),
        Dtype::I32 => TensorData::I32(each(raw, i32::from_le_bytes)),
        Dtype::F16 => TensorData::F32(each(raw, |b| half::f16::from_le_bytes(b).to_f32())),
        Dtype::BF16 => TensorData::F32(each(raw, |b| half::bf16::from_le_bytes(b).to_f32())),
        Dtype::F64 => TensorData::F32(each_checked(raw, |i, b| {
            crate::num::f32_of(f64::from_le_bytes(b)).map_err(|m| format!("element {i}: {m}"))
        })?),
        Dtype::I8 => TensorData::I32(each(raw, |b| i32::from(i8::from_le_bytes(b)))),
        Dtype::U8 => TensorData::I32(each(raw, |b| i32::from(u8::from_le_bytes(b)))),
        Dtype::I16 => TensorData::I32(each(raw, |b| i32::from(i16::from_le_bytes(b)))),
        Dtype::U16 => TensorData::I32(each(raw, |b| i32::from(u16::from_le_bytes(b)))),
        Dtype::U32 => {
            TensorData::I32(each_checked(raw, |i, b| narrow(i, u32::from_le_bytes(b).into()))?)
        }
        Dtype::I64 => {
            TensorData::I32(each_checked(raw, |i, b| narrow(i, i64::from_le_bytes(b).into()))?)
        }
        Dtype::U64 => {
            TensorData::I32(each_checked(raw, |i, b| narrow(i, u64::from_le_bytes(b).into()))?)
        }
        Dtype::BOOL => TensorData::I32(each_checked(raw, |i, [b]: [u8; 1]| match b {
            0 | 1 => Ok(i32::from(b)),
            _ => Err(format!("element {i}: byte {b} is not a boolean (0 or 1)")),
        })?),
        other => return Err(format!("dtype {other} is not supported (rumus reads {READABLE})")),
    })
}

/// A host tensor as the crate's writer sees it.
struct HostView<'a>(&'a Tensor);

impl View for HostView<'_> {
    fn dtype(&self) -> Dtype {
        match self.0.dtype() {
            DType::F32 => Dtype::F32,
            DType::I32 => Dtype::I32,
        }
    }

    fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.0.to_le_bytes())
    }

    fn data_len(&self) -> usize {
        self.0.numel() * self.0.dtype().size()
    }
}

/// A JSON error's message without serde_json's ` at line L column C`: a position in one
/// entry's text, not in the file's, would mislead.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&at).map_or_else(|| text.clone(), str::to_string)
}

/// The header's entries, read by [`Entries`].
struct Header {
    /// The tensors' entries in file order.
    infos: Vec<(String, TensorInfo)>,
    metadata: BTreeMap<String, String>,
    /// Bytes of the metadata's JSON text.
    metadata_text: usize,
}

impl Header {
    /// Take the entry `key` (duplicates refused: a JSON map would keep one silently), its
    /// value's text `raw`, charging what it will hold to `charge` first.
    fn add(
        &mut self,
        key: Cow<'_, str>,
        raw: &RawValue,
        keys: &mut HashSet<String>,
        charge: &mut Charge,
    ) -> Result<()> {
        charge.grow(ENTRY_BYTES + 4 * key.len() as u64, "the entries of the checkpoint's header")?;
        let name = key.into_owned();
        if !keys.insert(name.clone()) {
            return Err(err!(Checkpoint, "duplicate key `{name}` in header"));
        }
        if name == METADATA_KEY {
            let text = raw.get();
            let bytes = METADATA_EXPANSION * text.len() as u64;
            charge.grow(bytes, format!("the checkpoint's `{METADATA_KEY}`"))?;
            self.metadata = serde_json::from_str(text)
                .map_err(|e| err!(Checkpoint, "`{METADATA_KEY}`: {}", without_position(&e)))?;
            self.metadata_text = text.len();
        } else {
            let info = entry(&name, raw)?;
            self.infos.push((name, info));
        }
        Ok(())
    }
}

/// Reads the header's top-level entries in file order, each taken by [`Header::add`] as it
/// comes: a name borrowed from the text (copied once charged), a value as its text. An entry
/// refused goes to `refused` (serde's error then only stops the parse).
struct Entries<'c> {
    charge: &'c mut Charge,
    refused: &'c mut Option<Error>,
}

impl<'de> DeserializeSeed<'de> for Entries<'_> {
    type Value = Header;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Header, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = Header;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Header, A::Error> {
        let mut header = Header { infos: Vec::new(), metadata: BTreeMap::new(), metadata_text: 0 };
        let mut keys = HashSet::new();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let raw = map.next_value::<&'de RawValue>()?;
            if let Err(e) = header.add(key, raw, &mut keys, self.charge) {
                *self.refused = Some(e);
                return Err(serde::de::Error::custom("an entry was refused"));
            }
        }
        Ok(header)
    }
}

/// A key of the header, borrowed from its text where it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::per_thread::peak;
    use crate::memory::Budget;

    /// A file of the header `json` (padded) and no data.
    fn file(json: &str) -> Vec<u8> {
        let mut header = json.to_string();
        while !header.len().is_multiple_of(8) {
            header.push(' ');
        }
        [(header.len() as u64).to_le_bytes().as_slice(), header.as_bytes()].concat()
    }

    /// A header of `n` entries `"t{i}": <value>`, and `extra` entries after them.
    fn header(n: usize, value: &str, extra: &str) -> String {
        let entries: Vec<String> = (0..n).map(|i| format!("\"t{i}\":{value}")).collect();
        format!("{{{}{extra}}}", entries.join(","))
    }

    /// Found by the review of the charged readers: the header was parsed into a JSON tree
    /// (`serde_json::Value`) of the whole of it before any entry was looked at, and nothing of
    /// it was charged: 17 times the header's text for well-formed entries, 57 times for
    /// entries of nested objects, so a header of 100 MB (the most one may be, read within a
    /// budget of a little more) held gigabytes outside the budget. Each entry is now parsed,
    /// checked and charged as it is read, the first bad one stops the parse, and what the
    /// parse allocates stays within what it charged.
    #[test]
    fn parsing_a_header_allocates_only_what_it_charged() {
        let empty = r#"{"dtype":"F32","shape":[0],"data_offsets":[0,0]}"#;
        let bytes = file(&header(100_000, empty, ""));
        let mut charge = Budget::unlimited().empty();
        let (layout, most) = peak(|| Layout::parse(&bytes, &mut charge).map(|l| l.infos.len()));
        assert_eq!(layout.ok(), Some(100_000));
        assert!(most <= charge.bytes(), "{most} bytes allocated, {} charged", charge.bytes());
        // A budget without room for the entries: refused as they come, not after.
        let budget = Budget::new(10 << 20);
        let e = Layout::parse(&bytes, &mut budget.empty()).err().map(|e| (e.kind, e.message));
        let expected = "the entries of the checkpoint's header needs 1.0 KiB but only";
        let refused = |(kind, m): &(crate::ErrorKind, String)| {
            *kind == crate::ErrorKind::Limit && m.starts_with(expected)
        };
        assert!(e.as_ref().is_some_and(refused), "{e:?}");
        // Entries of nested objects: the first one is refused, nothing else is parsed.
        let bytes = file(&header(100_000, r#"{"a":{"b":{"c":0}}}"#, ""));
        let mut charge = Budget::unlimited().empty();
        let (e, most) = peak(|| Layout::parse(&bytes, &mut charge).err().map(|e| e.message));
        assert_eq!(e.as_deref(), Some("tensor `t0`: missing field `dtype`"));
        assert!(most <= 64 << 10, "{most}");
        // Metadata of many entries: charged at its bound before it is parsed.
        let entries: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\":\"\"")).collect();
        let metadata = format!(",\"{METADATA_KEY}\":{{{}}}", entries.join(","));
        let bytes = file(&header(1, empty, &metadata));
        let mut charge = Budget::unlimited().empty();
        let (layout, most) = peak(|| Layout::parse(&bytes, &mut charge).map(|l| l.metadata.len()));
        assert_eq!(layout.ok(), Some(100_000));
        assert!(most <= charge.bytes(), "{most} bytes allocated, {} charged", charge.bytes());
        // An entry longer than any tensor's needs.
        let dims = ",1".repeat(3000);
        let long = format!(r#"{{"dtype":"F32","shape":[0{dims}],"data_offsets":[0,0]}}"#);
        let e = Layout::parse(&file(&header(1, &long, "")), &mut charge).err().map(|e| e.message);
        let expected = format!(
            "tensor `t0`: entry is {} bytes of JSON, more than a tensor's entry takes (at most \
             4096)",
            long.len()
        );
        assert_eq!(e, Some(expected));
    }

    /// Found by the review of the charged readers: U32, I64 and U64 elements went through an
    /// i128 copy of the tensor (16 bytes an element, four times the 4 that `load` charges
    /// before reading), and F64 and BOOL elements into a vector grown by doubling (up to twice
    /// its size, and both blocks at each move), none of it charged. Every dtype's tensor is now
    /// one allocation of exactly 4 bytes an element, and an element refused part-way leaves
    /// nothing else behind.
    #[test]
    fn converting_elements_allocates_only_the_tensor_charged() {
        let n = 1 << 16;
        let dtypes = [
            Dtype::F32,
            Dtype::I32,
            Dtype::F16,
            Dtype::BF16,
            Dtype::F64,
            Dtype::I8,
            Dtype::U8,
            Dtype::I16,
            Dtype::U16,
            Dtype::U32,
            Dtype::I64,
            Dtype::U64,
            Dtype::BOOL,
        ];
        for dtype in dtypes {
            let width = element_bytes(dtype).unwrap_or(0);
            // Each element 1 in its lowest byte: a value every dtype takes.
            let raw: Vec<u8> = (0..n * width).map(|b| u8::from(b % width == 0)).collect();
            let (data, bytes) = peak(|| elements(dtype, &raw));
            assert!(data.is_ok(), "{dtype}: {:?}", data.err());
            assert_eq!(bytes, 4 * n as u64, "{dtype}");
        }
        let mut raw = vec![0u8; n * 8];
        raw[n * 8 - 1] = 0x80; // the last element -2^63
        let (data, bytes) = peak(|| elements(Dtype::I64, &raw).err());
        let expected = format!("element {}: -9223372036854775808 is outside the i32 range", n - 1);
        assert_eq!(data, Some(expected));
        assert!(bytes <= 4 * n as u64 + 1024, "{bytes}");
    }
}
