//! Target `csv`: files through `data::read_csv` under four option sets (no labels; class labels
//! in column 2 with a scale; regression targets in column 0 under a header; class labels in
//! column 4 without a header), each data set split and batched; the same bytes through
//! `data::text_sequences`. A quarter of the inputs are gzip-compressed after mutation (some then
//! damaged), one in a hundred is a gzip bomb that expands past the read limit.
//!
//! Invariants: every error passes [`check::error`]; a data set has x f32 `[n, f]` of finite
//! numbers and y i32 `[n]` (non-negative, below the class count when classes are named),
//! f32 `[n]` or f32 `[n, 0]` as the options ask; a split keeps every row; batches cover the
//! data set; text sequences are `[n, seq_len]` byte values.

use super::check::{self, Failure};
use super::mutate::Mutator;
use super::{repo_file, Fuzz};
use flate2::write::GzEncoder;
use flate2::Compression;
use rumus::data::{self, CsvOptions, Dataset, Header, Labels};
use rumus::memory::Budget;
use rumus::rng::Rng;
use rumus::tensor::{DType, TensorData};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Most decompressed bytes read per file.
const MAX_BYTES: u64 = 1 << 18;

const DICT: &[&str] = &[
    ",", ",,", "\n", "\r\n", "\n\n", " ", "\t", "\"", "\"a,b\"", "#", "label", "x1", "setosa", "-",
    "+", "e", "E", ".", "1", "0", "-0", "nan", "NaN", "inf", "-inf", "1e39", "3e38", "\u{feff}",
    "é", "\0",
];

pub struct Csv {
    corpus: Vec<Vec<u8>>,
    path: PathBuf,
    /// A gzip file whose text is far over [`MAX_BYTES`].
    bomb: Vec<u8>,
}

impl Csv {
    pub fn new(scratch: &Path) -> Csv {
        let mut digits = String::new();
        flate2::read::GzDecoder::new(&repo_file("scripts/data/digits.csv.gz")[..])
            .read_to_string(&mut digits)
            .expect("scripts/data/digits.csv.gz is gzip text");
        let head: Vec<&str> = digits.lines().take(40).collect();
        let corpus = vec![
            repo_file("scripts/data/blobs.csv"),
            repo_file("scripts/data/iris.csv"),
            format!("{}\n", head.join("\n")).into_bytes(),
            repo_file("scripts/data/digits.csv.gz"),
            b"a,b,label\n1,2,cat\n3,4,dog\n5,6,cat\n-1,0.5,bird\n".to_vec(),
            b"1.5,2,0\r\n\r\n3,4.25,1\r\n5,6,2\r\n".to_vec(),
        ];
        let line = b"1,2,3,4,5,6,7,8,9,0\n".repeat(1 << 16);
        Csv { corpus, path: scratch.join("input.csv"), bomb: gzip(&line) }
    }

    fn read(&self, opts: &CsvOptions) -> Result<(), Failure> {
        let d = match data::read_csv(&self.path, opts, &mut budget().empty()) {
            Ok(d) => {
                super::accepted();
                d
            }
            Err(e) => return check::error(&e),
        };
        dataset(&d, opts).map_err(|m| Failure::new("bad-dataset", m))?;
        let (a, b) = match d.split(0.75, 3) {
            Ok(ab) => ab,
            Err(e) => return check::error(&e),
        };
        if a.len() + b.len() != d.len() {
            return Err(Failure::new(
                "split-loses-rows",
                format!("{} + {} != {}", a.len(), b.len(), d.len()),
            ));
        }
        let mut rows = 0;
        for batch in d.batches(3, 1).map_err(|e| Failure::new("batches", e.message))? {
            match batch {
                Ok(b) => rows += b.x.shape()[0],
                Err(e) => return Err(Failure::new("batches", e.message)),
            }
        }
        if rows != d.len() {
            return Err(Failure::new("batches-lose-rows", format!("{rows} of {}", d.len())));
        }
        Ok(())
    }
}

impl Fuzz for Csv {
    fn corpus(&self) -> &[Vec<u8>] {
        &self.corpus
    }

    fn mutate(&self, rng: &mut Rng) -> Vec<u8> {
        let m = Mutator { corpus: &self.corpus, dict: DICT };
        match rng.below(100) {
            0 => {
                let mut b = self.bomb.clone();
                if rng.below(2) == 0 {
                    m.bytes_once(rng, &mut b);
                }
                b
            }
            1..=10 => m.bytes(rng),
            11..=35 => {
                let mut z = gzip(&m.text(rng));
                match rng.below(4) {
                    0 => m.bytes_once(rng, &mut z),
                    1 => {
                        let more = gzip(&m.text(rng));
                        z.extend_from_slice(&more);
                    }
                    _ => {}
                }
                z
            }
            _ => m.text(rng),
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<(), Failure> {
        std::fs::write(&self.path, input).expect("write the input to the scratch folder");
        let options = [
            CsvOptions { max_bytes: MAX_BYTES, ..CsvOptions::default() },
            CsvOptions {
                label_col: Some(2),
                scale: 1.0 / 16.0,
                max_bytes: MAX_BYTES,
                ..CsvOptions::default()
            },
            CsvOptions {
                label_col: Some(0),
                labels: Labels::Targets,
                header: Header::Present,
                scale: 3.0e38,
                max_bytes: MAX_BYTES,
                ..CsvOptions::default()
            },
            CsvOptions {
                label_col: Some(4),
                header: Header::Absent,
                max_bytes: MAX_BYTES,
                ..CsvOptions::default()
            },
        ];
        for opts in &options {
            self.read(opts)?;
        }
        match data::text_sequences(input, 5, 3, &mut budget().empty()) {
            Ok(d) => {
                let ok = d.x().shape().get(1) == Some(&5)
                    && d.x().shape() == d.y().shape()
                    && d.x().as_i32().is_some_and(|v| v.iter().all(|b| (0..=255).contains(b)));
                if !ok {
                    return Err(Failure::new("bad-text-sequences", format!("{:?}", d.x().shape())));
                }
            }
            Err(e) => check::error(&e)?,
        }
        Ok(())
    }
}

/// The shape, dtype and value promises of a data set read with `opts`.
fn dataset(d: &Dataset, opts: &CsvOptions) -> Result<(), String> {
    let (x, y, n) = (d.x(), d.y(), d.len());
    if x.dtype() != DType::F32 || x.shape().len() != 2 || x.shape()[0] != n {
        return Err(format!("x is {}{:?} for {n} rows", x.dtype(), x.shape()));
    }
    if let Some(v) = x.as_f32().and_then(|v| v.iter().find(|v| !v.is_finite())) {
        return Err(format!("feature {v} is not finite"));
    }
    let want: (DType, Vec<usize>) = match (opts.label_col, opts.labels) {
        (None, _) => (DType::F32, vec![n, 0]),
        (Some(_), Labels::Classes) => (DType::I32, vec![n]),
        (Some(_), Labels::Targets) => (DType::F32, vec![n]),
    };
    if (y.dtype(), y.shape().to_vec()) != want {
        return Err(format!("y is {}{:?}, expected {}{:?}", y.dtype(), y.shape(), want.0, want.1));
    }
    if let TensorData::I32(labels) = y.data() {
        let k = d.classes().len();
        if let Some(bad) = labels.iter().find(|&&l| l < 0 || (k > 0 && l as usize >= k)) {
            return Err(format!("label {bad} with {k} class names"));
        }
    }
    Ok(())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut z = GzEncoder::new(Vec::new(), Compression::fast());
    z.write_all(bytes).expect("gzip into memory");
    z.finish().expect("gzip into memory")
}

/// The memory budget each read runs under: the one a script's 64 MiB sandbox would give, so a
/// gzip bomb or a huge text stops at it.
fn budget() -> Budget {
    Budget::new(64 << 20)
}
