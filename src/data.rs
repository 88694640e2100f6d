//! Data loading for scripts: CSV files (plain or gzip) into a [`Dataset`], byte-level text
//! sequences for character models, seeded splits and shuffled mini-batches.
//!
//! A [`Dataset`] is a pair of host tensors whose first dimension counts examples: `x` (f32
//! `[n, features]` from CSV, i32 `[n, seq_len]` from text) and `y` (i32 `[n]` class labels, f32
//! `[n]` regression targets, f32 `[n, 0]` when there are none, or i32 `[n, seq_len]` next-token
//! targets). Everything here is deterministic: same file and seed, same tensors, on every
//! platform. No file content makes this module panic; a malformed line is an error that starts
//! with `file:line:`. The readers charge what they hold (lines, rows, text, sequences) to a
//! [`Charge`] before they allocate it, so a file that expands past the memory budget (a gzip
//! bomb, a FIFO) is an error, not an aborted process.

use crate::err;
use crate::error::{Error, Result};
use crate::memory::{read_file, reserve, Charge};
use crate::rng::Rng;
use crate::tensor::{checked_numel, fmt_shape, DType, Tensor, TensorData};
use flate2::read::MultiGzDecoder;
use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Examples as two tensors with the same first dimension, plus class names when the labels were
/// read as strings.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    x: Tensor,
    y: Tensor,
    classes: Vec<String>,
}

/// One mini-batch: rows of `x` and the matching rows of `y`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
}

/// Whether the first non-empty line of a CSV file is a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// Decided by the row itself: a header when none of its fields is a number (`x1,x2,label`),
    /// data when every feature field is one (the label may be a class name), and an error
    /// otherwise: a row of numbers and text is either a data row with a mistake (`x,2,0`),
    /// which must not be dropped as a header without a word, or a header with numbers in it
    /// (scikit-learn's `150,4,setosa,versicolor,virginica`), which must be named one.
    Auto,
    /// The first row is a header, skipped whatever it holds (`header: true` in scripts).
    Present,
    /// The first row is data (`header: false`).
    Absent,
}

/// How the label column is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labels {
    /// Class labels, i32 `[n]`: non-negative integers, or strings mapped to `0..k` in sorted
    /// order (the names land in [`Dataset::classes`]). The first data row decides which.
    Classes,
    /// Regression targets, f32 `[n]` (not scaled).
    Targets,
}

/// How [`read_csv`] reads a file.
#[derive(Clone, Debug)]
pub struct CsvOptions {
    /// The label field, counted from 0; `None`: every field is a feature and `y` is f32 `[n, 0]`.
    pub label_col: Option<usize>,
    pub labels: Labels,
    /// Every feature is multiplied by this (for example 1/16 for 4-bit pixels).
    pub scale: f32,
    pub header: Header,
    /// Most bytes of (decompressed) text read before giving up, a guard against gzip bombs.
    pub max_bytes: u64,
    /// A flag that stops the read when set (a script's Ctrl-C), with an `Interrupted` error;
    /// looked at every 4096 records.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Default for CsvOptions {
    /// No label column, class labels when one is set, scale 1, header auto-detected, 1 GiB cap,
    /// no stop flag.
    fn default() -> CsvOptions {
        CsvOptions {
            label_col: None,
            labels: Labels::Classes,
            scale: 1.0,
            header: Header::Auto,
            max_bytes: 1 << 30,
            stop: None,
        }
    }
}

/// Read a CSV file, plain or gzip-compressed (told apart by the gzip magic bytes, not the name).
///
/// Fields are separated by commas (split by the `csv` crate: a quoted field may hold commas,
/// line breaks and `""` for a quote; CRLF line ends are fine) and trimmed. Blank lines are
/// skipped.
/// Every data line must have as many fields as the first, and every feature must be a finite
/// number. `charge` grows before each buffer does; on return it holds at least the bytes of the
/// dataset's tensors and class names.
pub fn read_csv(path: &Path, opts: &CsvOptions, charge: &mut Charge) -> Result<Dataset> {
    let name = path.display().to_string();
    let file = crate::files::open_regular(path)?;
    let mut file = BufReader::new(file);
    let is_gzip = file.fill_buf().map_err(|e| Error::io(&name, e))?.starts_with(&[0x1f, 0x8b]);
    let text: Box<dyn Read> =
        if is_gzip { Box::new(MultiGzDecoder::new(file)) } else { Box::new(file) };
    parse_csv(&name, BufReader::new(text.take(opts.max_bytes.saturating_add(1))), opts, charge)
}

/// Windows of `seq_len` bytes, one every `stride` bytes, each paired with the same window shifted
/// by one byte (the next-token targets): x and y are i32 `[n, seq_len]` of byte values 0..=255.
/// A tail shorter than a full window (plus its one target byte) is dropped. Both tensors are
/// charged to `charge` first.
pub fn text_sequences(
    bytes: &[u8],
    seq_len: usize,
    stride: usize,
    charge: &mut Charge,
) -> Result<Dataset> {
    if seq_len == 0 || stride == 0 {
        return Err(err!(
            InvalidArgument,
            "seq_len and stride must be positive, got {seq_len} and {stride}"
        ));
    }
    let Some(room) = bytes.len().checked_sub(seq_len).and_then(|r| r.checked_sub(1)) else {
        return Err(err!(
            Shape,
            "text of {} is too short for one sequence of {seq_len} bytes plus a target: {}",
            plural(bytes.len(), "byte"),
            match bytes.len() {
                0 | 1 => "a sequence and its target need 2 bytes at least".to_string(),
                n => format!("use a shorter seq_len (at most {})", n - 1),
            }
        ));
    };
    let n = room / stride + 1;
    let numel = checked_numel(&[n, seq_len])?;
    charge.grow(
        numel as u64 * 8,
        format!("{n} sequences of {seq_len} bytes and their targets (a larger stride makes fewer)"),
    )?;
    let mut x = Vec::with_capacity(numel);
    let mut y = Vec::with_capacity(numel);
    for start in (0..n).map(|i| i * stride) {
        x.extend(bytes[start..start + seq_len].iter().map(|&b| i32::from(b)));
        y.extend(bytes[start + 1..start + seq_len + 1].iter().map(|&b| i32::from(b)));
    }
    Dataset::new(Tensor::i32(&[n, seq_len], x)?, Tensor::i32(&[n, seq_len], y)?)
}

/// The bytes of a file, or of every `.rs`, `.md` and `.txt` file under a folder, concatenated in
/// sorted path order. Hidden entries (names starting with `.`) and symbolic links inside the
/// folder are skipped. The bytes are charged to `charge` as they are read.
pub fn read_text(path: &Path, charge: &mut Charge) -> Result<Vec<u8>> {
    let meta = fs::metadata(path).map_err(|e| Error::io(path.display(), e))?;
    let files = if meta.is_dir() {
        let mut files = Vec::new();
        collect_text_files(path, &mut files)?;
        if files.is_empty() {
            return Err(err!(Data, "{}: no .rs, .md or .txt files", path.display()));
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut bytes = Vec::new();
    for file in &files {
        let f = crate::files::open_regular(file)?;
        let more = read_file(f, charge, &file.display().to_string())?;
        reserve(&mut bytes, more.len(), charge, || format!("the text of {}", path.display()))?;
        bytes.extend_from_slice(&more);
    }
    Ok(bytes)
}

impl Dataset {
    /// A dataset of `x` and `y`; both must have a first dimension, and the same one.
    pub fn new(x: Tensor, y: Tensor) -> Result<Dataset> {
        match (x.shape().first(), y.shape().first()) {
            (Some(a), Some(b)) if a == b => Ok(Dataset { x, y, classes: Vec::new() }),
            _ => Err(Error::shape(format!(
                "dataset needs x and y with the same first dimension, got {} and {}",
                fmt_shape(x.shape()),
                fmt_shape(y.shape())
            ))),
        }
    }

    /// The same data with class names (`classes[i]` is the name of label `i`).
    pub fn with_classes(mut self, classes: Vec<String>) -> Dataset {
        self.classes = classes;
        self
    }

    pub fn x(&self) -> &Tensor {
        &self.x
    }

    pub fn y(&self) -> &Tensor {
        &self.y
    }

    /// Names of the classes when labels were read as strings (sorted; label `i` is
    /// `classes[i]`), empty otherwise.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.x.shape().first().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_parts(self) -> (Tensor, Tensor, Vec<String>) {
        (self.x, self.y, self.classes)
    }

    /// The examples at `rows` (in that order; repeats allowed).
    pub fn select(&self, rows: &[usize]) -> Result<Dataset> {
        Ok(Dataset {
            x: gather_rows(&self.x, rows)?,
            y: gather_rows(&self.y, rows)?,
            classes: self.classes.clone(),
        })
    }

    /// Shuffle the examples with `seed` and cut them in two: the first `round(len × fraction)`
    /// shuffled examples, and the rest. `fraction` must lie in `[0, 1]`.
    pub fn split(&self, fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        let cut = split_point(self.len(), fraction)?;
        let order = shuffled(self.len(), seed);
        Ok((self.select(&order[..cut])?, self.select(&order[cut..])?))
    }

    /// Mini-batches of `batch_size` examples in an order shuffled by `seed` (pass the epoch
    /// number for a new order each epoch). Every example appears exactly once; the last batch
    /// holds the remainder and is smaller when `batch_size` does not divide the length.
    pub fn batches(&self, batch_size: usize, seed: u64) -> Result<Batches<'_>> {
        if batch_size == 0 {
            return Err(err!(InvalidArgument, "batch size must be positive"));
        }
        Ok(Batches { data: self, order: shuffled(self.len(), seed), next: 0, batch_size })
    }
}

/// The iterator of [`Dataset::batches`]. Building a batch only fails on an internal invariant.
#[derive(Clone, Debug)]
pub struct Batches<'a> {
    data: &'a Dataset,
    order: Vec<usize>,
    next: usize,
    batch_size: usize,
}

impl Iterator for Batches<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let rows = self.order.get(self.next..)?;
        if rows.is_empty() {
            return None;
        }
        let rows = &rows[..rows.len().min(self.batch_size)];
        self.next += rows.len();
        Some(
            gather_rows(&self.data.x, rows)
                .and_then(|x| Ok(Batch { x, y: gather_rows(&self.data.y, rows)? })),
        )
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.order.len().saturating_sub(self.next).div_ceil(self.batch_size);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches<'_> {}

/// Where [`Dataset::split`] cuts `n` shuffled rows: `round(n × fraction)`; `fraction` must lie
/// in `[0, 1]`.
pub fn split_point(n: usize, fraction: f64) -> Result<usize> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(err!(InvalidArgument, "split fraction must lie in [0, 1], got {fraction}"));
    }
    Ok(((n as f64 * fraction).round() as usize).min(n))
}

/// The rows of each batch one rank of a data-parallel job takes from `order`: the order is cut
/// into global batches of `size × ranks` rows and rank `rank` takes the `rank`-th `size` rows of
/// each, so `ranks` ranks at batch `size` together see exactly the batches one process sees at
/// batch `size × ranks`, and every rank gets as many batches. A shorter last global batch is
/// dropped, or with `keep_last` cut into `ranks` near-equal parts (a rank whose part is empty
/// gets no batch from it). One rank (`ranks` 1) takes every batch whole.
pub fn rank_batches(
    order: &[usize],
    size: usize,
    rank: usize,
    ranks: usize,
    keep_last: bool,
) -> Vec<&[usize]> {
    rank_batch_rows(order, size, rank, ranks, keep_last).collect()
}

/// The batches of [`rank_batches`] one at a time, so that a caller can count them and charge
/// what it will build from them before it builds any (the list of a large data set at batch
/// size 1 is as long as the data set).
pub fn rank_batch_rows(
    order: &[usize],
    size: usize,
    rank: usize,
    ranks: usize,
    keep_last: bool,
) -> impl Iterator<Item = &[usize]> + Clone {
    let global = size.saturating_mul(ranks).max(1);
    order.chunks(global).filter_map(move |rows| {
        let m = rows.len();
        let share = if m == global {
            &rows[rank * size..(rank + 1) * size]
        } else if keep_last {
            &rows[rank * m / ranks..(rank + 1) * m / ranks]
        } else {
            return None;
        };
        (!share.is_empty()).then_some(share)
    })
}

/// `0..n` shuffled by `seed`.
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    Rng::new(seed).shuffle(&mut order);
    order
}

/// Rows `rows` (indices into the first dimension, in that order, repeats allowed) of `t`.
pub fn gather_rows(t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let n = t.shape().first().copied().unwrap_or(0);
    if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
        return Err(Error::shape(format!("row {bad} is out of range for {n} examples")));
    }
    let row_shape = t.shape().get(1..).unwrap_or(&[]);
    let row_len = checked_numel(row_shape)?;
    let mut shape = vec![rows.len()];
    shape.extend_from_slice(row_shape);
    fn pick<T: Copy>(v: &[T], rows: &[usize], row_len: usize) -> Vec<T> {
        rows.iter().flat_map(|&r| &v[r * row_len..(r + 1) * row_len]).copied().collect()
    }
    let data = match t.data() {
        TensorData::F32(v) => TensorData::F32(pick(v, rows, row_len)),
        TensorData::I32(v) => TensorData::I32(pick(v, rows, row_len)),
    };
    Tensor::new(&shape, data)
}

/// How labels of a [`Labels::Classes`] column turned out to be written (the first label decides,
/// and every other must be written the same way), with the first label and its line.
enum ClassLabels {
    Numbers { labels: Vec<i32>, first_line: usize },
    /// Per row, the index of its name in `names` (first-seen order).
    Names {
        ids: Vec<usize>,
        names: Vec<String>,
        index: HashMap<String, usize>,
        first_line: usize,
    },
}

/// The CSV reader behind [`read_csv`]; `name` prefixes every message.
fn parse_csv(
    name: &str,
    mut reader: impl BufRead,
    opts: &CsvOptions,
    charge: &mut Charge,
) -> Result<Dataset> {
    let mut features: Vec<f32> = Vec::new();
    let mut targets: Vec<f32> = Vec::new();
    let mut classes: Option<ClassLabels> = None;
    let mut n_fields: Option<usize> = None;
    let mut n_rows = 0usize;
    let mut seen_first = false;
    let mut total = 0u64;
    let mut raw = Vec::new();
    let mut lines_read = 0usize;
    let mut records = 0usize;
    let stopped = || opts.stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
    loop {
        let line_no = lines_read + 1;
        let n = read_record(&mut reader, &mut raw, charge)
            .map_err(|e| Error::new(e.kind, format!("{name}:{line_no}: {}", e.message)))?;
        if n == 0 {
            break;
        }
        records += 1;
        if records.is_multiple_of(4096) && stopped() {
            return Err(err!(Interrupted, "interrupted while reading {name} (at line {line_no})"));
        }
        lines_read += raw.iter().filter(|&&b| b == b'\n').count().max(1);
        let offset = total;
        total += n as u64;
        if total > opts.max_bytes {
            return Err(err!(Limit, "{name}: more than {} bytes of text", opts.max_bytes));
        }
        let at = |msg: String| err!(Data, "{name}:{line_no}: {msg}");
        let line = crate::files::utf8_data(name, &raw, line_no, offset)?.trim();
        if line.is_empty() {
            continue;
        }
        // What splitting holds besides the line (the fields' text, up to twice the line as its
        // buffer doubles, and their bounds, at most one field per comma and one more, 8 bytes
        // each, up to 24 while the list doubles), charged while it is held: a line of commas
        // split into millions of empty fields took some forty times its own bytes, none of
        // them charged.
        let commas = line.bytes().filter(|&b| b == b',').count() as u64;
        let splitting = 2 * line.len() as u64 + 24 * (commas + 1);
        charge.grow(splitting, format_args!("{name}:{line_no}: splitting a line into fields"))?;
        let _splitting = charge.split_off(splitting);
        let record = split_fields(line).map_err(at)?;
        let fields = || record.iter().map(str::trim_ascii);
        if !seen_first {
            seen_first = true;
            let is_header = match opts.header {
                Header::Present => true,
                Header::Absent => false,
                Header::Auto => {
                    // The rule data rows are read by ([`is_number`]): a finite number, so
                    // `nan` and `inf` read as names, here as in a label column.
                    let mut features =
                        fields().enumerate().filter(|&(i, _)| Some(i) != opts.label_col);
                    match features.find_map(|(i, f)| parse_number(f).err().map(|m| (i, m))) {
                        None => false,
                        Some(_) if !fields().any(is_number) => true,
                        Some((i, m)) => {
                            return Err(at(format!(
                                "the first row mixes numbers and text, so it is neither a header (no field a number) nor data (every feature a number): column {}: {m}; fix the field, or give `header: true` if the row is a header",
                                i + 1
                            )))
                        }
                    }
                }
            };
            if is_header {
                continue;
            }
        }
        let expected = *n_fields.get_or_insert(record.len());
        if record.len() != expected {
            return Err(at(format!("expected {expected} fields, found {}", record.len())));
        }
        if let Some(c) = opts.label_col.filter(|&c| c >= expected) {
            return Err(at(format!(
                "label_col {c} is out of range for {expected} fields (it counts from 0)"
            )));
        }
        let rows = || format!("{name}: {} rows", n_rows + 1);
        reserve(&mut features, expected, charge, rows)?;
        for (i, field) in fields().enumerate() {
            if Some(i) == opts.label_col {
                match opts.labels {
                    Labels::Targets => {
                        reserve(&mut targets, 1, charge, rows)?;
                        targets.push(
                            parse_number(field)
                                .map_err(|m| at(format!("column {} (label_col {i}): {m}", i + 1)))?,
                        )
                    }
                    Labels::Classes => push_class(&mut classes, field, line_no, charge).map_err(|e| {
                        // Columns count from 1 in messages, `label_col` from 0: both named.
                        let msg = format!("{name}:{line_no}: column {} (label_col {i}): {}", i + 1, e.message);
                        Error::new(e.kind, msg)
                    })?,
                }
            } else {
                let v = parse_number(field).map_err(|m| at(format!("column {}: {m}", i + 1)))?;
                let scaled = v * opts.scale;
                if !scaled.is_finite() {
                    return Err(at(format!(
                        "column {}: `{field}` times the scale {} is not a finite number",
                        i + 1,
                        opts.scale
                    )));
                }
                features.push(scaled);
            }
        }
        n_rows += 1;
    }
    let Some(n_fields) = n_fields else {
        return Err(err!(Data, "{name}: no data rows"));
    };
    let n_features = n_fields - usize::from(opts.label_col.is_some());
    if n_features == 0 {
        return Err(err!(Data, "{name}: no feature columns"));
    }
    drop(raw);
    features.shrink_to_fit();
    targets.shrink_to_fit();
    let x = Tensor::f32(&[n_rows, n_features], features)?;
    let (y, names) = match (opts.label_col, opts.labels, classes) {
        (None, _, _) => (Tensor::zeros(&[n_rows, 0], DType::F32)?, Vec::new()),
        (Some(_), Labels::Targets, _) => (Tensor::f32(&[n_rows], targets)?, Vec::new()),
        (Some(_), Labels::Classes, Some(ClassLabels::Numbers { labels, .. })) => {
            (Tensor::i32(&[n_rows], labels)?, Vec::new())
        }
        (Some(_), Labels::Classes, Some(ClassLabels::Names { ids, names, .. })) => {
            let mut sorted: Vec<usize> = (0..names.len()).collect();
            sorted.sort_by(|&a, &b| names[a].cmp(&names[b]));
            let mut rank = vec![0i32; names.len()];
            for (r, &id) in sorted.iter().enumerate() {
                rank[id] = i32::try_from(r).map_err(|_| err!(Data, "{name}: too many classes"))?;
            }
            let labels = ids.iter().map(|&id| rank[id]).collect();
            let names = sorted.into_iter().map(|id| names[id].clone()).collect();
            (Tensor::i32(&[n_rows], labels)?, names)
        }
        (Some(_), Labels::Classes, None) => return Err(err!(Data, "{name}: no data rows")),
    };
    Ok(Dataset::new(x, y)?.with_classes(names))
}

/// One record into `raw`: a line, or several while a quoted field spans line breaks (an odd
/// number of `"` so far; an escaped quote `""` counts twice). Returns its length (0 at the end).
/// Each line's quotes are counted once, as it is read: counting the whole record again after
/// every line made an unclosed quote followed by many short lines quadratic (200,000 empty
/// lines took 6 s, and a gzip file of a few kilobytes could hold millions).
fn read_record(reader: &mut impl BufRead, raw: &mut Vec<u8>, charge: &mut Charge) -> Result<usize> {
    raw.clear();
    let mut quotes = 0usize;
    loop {
        let start = raw.len();
        if read_line(reader, raw, charge)? == start {
            return match quotes % 2 {
                0 => Ok(raw.len()),
                _ => Err(err!(Data, "a quoted field is not closed before the end of the file")),
            };
        }
        quotes += raw[start..].iter().filter(|&&b| b == b'"').count();
        if quotes.is_multiple_of(2) {
            return Ok(raw.len());
        }
    }
}

/// The fields of one record, split by the `csv` crate: quoted fields may hold commas, line
/// breaks and escaped quotes (`""`). The caller trims each field (ASCII white space, as the
/// crate's `Trim::All` did, but without the copy of the whole record that makes).
///
/// The record must be the whole of `record`: the crate ends a record at a line feed or at a
/// carriage return, and what came after one was dropped without a word (`1,2,0\r3,4,1`, lines
/// ended by `\r` alone as old Mac files end them, read as one row; a `"` inside a field that is
/// not quoted, which [`read_record`] takes for an open quote and so joins the next line to,
/// dropped that line).
///
/// A record without quotes or carriage returns is split at its commas here, as the crate would
/// split it: the crate's reader cost some 25 µs to build, a second for each 40,000 lines.
fn split_fields(record: &str) -> std::result::Result<csv::StringRecord, String> {
    if !record.bytes().any(|b| b == b'"' || b == b'\r' || b == b'\n') {
        // The crate drops a byte-order mark that starts its input, here the line.
        let record = record.strip_prefix('\u{feff}').unwrap_or(record);
        // What is left of a line of the mark alone is no field at all, as for the crate.
        if record.is_empty() {
            return Ok(csv::StringRecord::new());
        }
        let mut fields = csv::StringRecord::with_capacity(record.len(), 1);
        for f in record.split(',') {
            fields.push_field(f);
        }
        return Ok(fields);
    }
    split_quoted(record)
}

/// [`split_fields`] by the `csv` crate.
fn split_quoted(record: &str) -> std::result::Result<csv::StringRecord, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(record.len().clamp(64, 64 << 10))
        .from_reader(record.as_bytes());
    let mut fields = csv::StringRecord::new();
    if let Err(e) = reader.read_record(&mut fields) {
        return Err(format!("cannot split the line into fields: {e}"));
    }
    let end = usize::try_from(reader.position().byte()).unwrap_or(usize::MAX);
    let rest = record.get(end..).unwrap_or("");
    if rest.trim().is_empty() {
        return Ok(fields);
    }
    let after = fields.len();
    // A `\r\n` inside the record ends it too, but as a line end: the record took in a line.
    let bare_cr = record.as_bytes().get(end.wrapping_sub(1)) == Some(&b'\r') && !rest.starts_with('\n');
    Err(match bare_cr {
        true => format!(
            "a carriage return (\\r) without a line feed after it ends the line after field {after}, and more follows: rumus reads lines that end in \\n or \\r\\n; convert the file's line ends (a file that ends lines in \\r alone)"
        ),
        false => format!(
            "a `\"` inside field {after}, which does not start with a quote, made the line take in the next one: quote the whole field and double the quote inside (`\"a\"\"b\"`), or remove it"
        ),
    })
}

/// Append one line (with its `\n`, if any) to `raw`; returns the new length.
fn read_line(reader: &mut impl BufRead, raw: &mut Vec<u8>, charge: &mut Charge) -> Result<usize> {
    loop {
        let buf = reader.fill_buf().map_err(read_error)?;
        if buf.is_empty() {
            return Ok(raw.len());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        reserve(raw, take, charge, || "a line".to_string())?;
        raw.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            return Ok(raw.len());
        }
    }
}

/// An error reading a data file: the gzip decoder's (a damaged stream: the file's content) or
/// the operating system's (I/O).
fn read_error(e: std::io::Error) -> Error {
    use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
    match e.kind() {
        InvalidData | InvalidInput | UnexpectedEof => err!(Data, "the gzip data is damaged: {e}"),
        _ => err!(Io, "{e}"),
    }
}

/// Whether a field is a number as data rows read it ([`parse_number`]): the one rule for
/// telling numbers from names (a header's fields, class labels).
fn is_number(field: &str) -> bool {
    parse_number(field).is_ok()
}

fn parse_number(field: &str) -> std::result::Result<f32, String> {
    match field.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("`{field}` is not a finite number")),
        Err(_) => Err(format!("`{field}` is not a number")),
    }
}

/// Add one class label (of line `line`); the first label decides between numbers and names,
/// and a label written the other way is an error ([`is_number`], the rule the header and the
/// data are read by): a typo among integer labels would otherwise turn every label into a name,
/// sorted as text (`10` before `2`), and silently renumber the classes. A new name is charged
/// (its bytes and a map entry) before it is stored.
fn push_class(
    classes: &mut Option<ClassLabels>,
    field: &str,
    line: usize,
    charge: &mut Charge,
) -> Result<()> {
    if field.is_empty() {
        return Err(err!(Data, "empty label"));
    }
    let labels = classes.get_or_insert_with(|| {
        if is_number(field) {
            ClassLabels::Numbers { labels: Vec::new(), first_line: line }
        } else {
            ClassLabels::Names {
                ids: Vec::new(),
                names: Vec::new(),
                index: HashMap::new(),
                first_line: line,
            }
        }
    });
    let rows = || "class labels".to_string();
    match labels {
        ClassLabels::Numbers { labels: v, first_line } => {
            if let Some(digits) = integer_digits(field) {
                let negative = field.starts_with('-');
                // The number the label's digits write, without leading zeros ("0" for zero).
                let plain = match digits.trim_start_matches('0') {
                    "" => "0",
                    d => d,
                };
                if negative && plain != "0" {
                    return Err(err!(Data, "label {field} is negative"));
                }
                // Labels are written as digits alone: `+1`, `01` and `-0` are typos or another
                // program's numbering, refused where they would pass for 1 or 0.
                if field != plain {
                    return Err(err!(
                        Data,
                        "label `{field}` must be written as digits alone, without a sign or leading zeros: `{plain}`"
                    ));
                }
                // Digits past i32's range (even past i64's): an integer still, too large.
                let l = plain.parse::<i32>().map_err(|_| err!(Data, "label {field} is too large"))?;
                reserve(v, 1, charge, rows)?;
                v.push(l);
                Ok(())
            } else if is_number(field) {
                Err(err!(Data, "label `{field}` is not an integer"))
            } else {
                Err(err!(
                    Data,
                    "label `{field}` is a name, but the column's first label (`{}`, line {first_line}) is a number: class labels are all integers or all names; fix the one that is wrong",
                    v.first().map_or(String::new(), i32::to_string)
                ))
            }
        }
        ClassLabels::Names { ids, names, index, first_line } => {
            if is_number(field) {
                let first = names.first().map_or("", String::as_str);
                return Err(err!(
                    Data,
                    "label `{field}` is a number, but the column's first label (`{first}`, line {first_line}) is a name: class labels are all integers or all names; fix the one that is wrong"
                ));
            }
            let id = match index.get(field) {
                Some(&id) => id,
                None => {
                    // Two copies of the name (list and map) and the entries' overhead.
                    charge.grow(2 * field.len() as u64 + 96, "class names")?;
                    names.push(field.to_string());
                    index.insert(field.to_string(), names.len() - 1);
                    names.len() - 1
                }
            };
            reserve(ids, 1, charge, rows)?;
            ids.push(id);
            Ok(())
        }
    }
}

/// The digits of `field` when it is written as an integer (digits after an optional sign).
fn integer_digits(field: &str) -> Option<&str> {
    let digits = field.strip_prefix(['+', '-']).unwrap_or(field);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

/// Files with a text extension under `dir`, depth-first in sorted name order.
fn collect_text_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries = fs::read_dir(dir)
        .and_then(|rd| rd.collect::<std::io::Result<Vec<_>>>())
        .map_err(|e| Error::io(dir.display(), e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| Error::io(path.display(), e))?;
        if kind.is_dir() {
            collect_text_files(&path, out)?;
        } else if kind.is_file()
            && path.extension().is_some_and(|e| e == "rs" || e == "md" || e == "txt")
        {
            out.push(path);
        }
    }
    Ok(())
}

/// `1 byte`, `2 bytes`.
fn plural(n: usize, unit: &str) -> String {
    match n {
        1 => format!("1 {unit}"),
        n => format!("{n} {unit}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::{split_fields, split_quoted};

    /// Lines without quotes are split at their commas as the `csv` crate splits them: empty
    /// fields, a trailing comma, one field, white space kept for the caller to trim.
    #[test]
    fn commas_split_as_the_csv_crate_splits() {
        for line in ["1,2,3", "a", ",", "1,,2,", " x , y ", ",a,,", "1e5,-2.5,nan,inf", "é,ü", "\u{feff}a,b", "\u{feff}"] {
            let ours: Vec<String> = split_fields(line).unwrap().iter().map(String::from).collect();
            let crate_: Vec<String> = split_quoted(line).unwrap().iter().map(String::from).collect();
            assert_eq!(ours, crate_, "{line:?}");
        }
    }
}
