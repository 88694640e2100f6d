//! Data boundary: the real files in scripts/data, gzip and plain CSV agreeing, malformed CSV
//! errors with line numbers, and split/batch determinism and coverage.

use flate2::write::GzEncoder;
use flate2::Compression;
use rumus::data::{CsvOptions, Dataset, Header, Labels};
use rumus::memory::Budget;
use rumus::{DType, ErrorKind, Tensor};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The readers with no memory limit.
fn read_csv(path: &Path, opts: &CsvOptions) -> rumus::Result<Dataset> {
    rumus::data::read_csv(path, opts, &mut Budget::unlimited().empty())
}

fn text_sequences(bytes: &[u8], seq_len: usize, stride: usize) -> rumus::Result<Dataset> {
    rumus::data::text_sequences(bytes, seq_len, stride, &mut Budget::unlimited().empty())
}

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("data").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn data_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/data").join(name)
}

fn labelled(col: usize) -> CsvOptions {
    CsvOptions { label_col: Some(col), ..CsvOptions::default() }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

#[test]
fn digits_has_1797_rows_of_64_features_and_labels_0_to_9() {
    let opts = CsvOptions { scale: 1.0 / 16.0, ..labelled(64) };
    let d = read_csv(&data_file("digits.csv.gz"), &opts).unwrap();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.x().shape(), &[1797, 64]);
    assert_eq!((d.x().dtype(), d.y().dtype()), (DType::F32, DType::I32));
    let x = d.x().as_f32().unwrap();
    assert!(x.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert_eq!(x.iter().cloned().fold(0.0, f32::max), 1.0, "16 scaled by 1/16");
    let labels: BTreeSet<i32> = d.y().as_i32().unwrap().iter().copied().collect();
    assert_eq!(labels, (0..10).collect());
    assert!(d.classes().is_empty());
}

#[test]
fn iris_has_a_header_150_rows_and_labels_0_to_2() {
    // The first line is scikit-learn's header, `150,4,setosa,versicolor,virginica`: numbers and
    // text, so it must be named a header.
    let labelled = |col| CsvOptions { header: Header::Present, ..labelled(col) };
    let d = read_csv(&data_file("iris.csv"), &labelled(4)).unwrap();
    assert_eq!(d.x().shape(), &[150, 4]);
    let y = d.y().as_i32().unwrap();
    assert_eq!(y.iter().min(), Some(&0));
    assert_eq!(y.iter().max(), Some(&2));
    assert_eq!(&d.x().as_f32().unwrap()[..4], &[5.1, 3.5, 1.4, 0.2]);
    // Read as regression targets, the same column is f32.
    let t =
        read_csv(&data_file("iris.csv"), &CsvOptions { labels: Labels::Targets, ..labelled(4) })
            .unwrap();
    assert_eq!(t.y().as_f32().unwrap()[149], 2.0);
}

#[test]
fn string_labels_map_sorted_names_to_0_to_k() {
    let dir = scratch("names");
    let path = dir.join("flowers.csv");
    std::fs::write(
        &path,
        "species,len,width\nvirginica,1,2\nsetosa,3,4\n\nversicolor,5,6\r\nsetosa,7,8\n",
    )
    .unwrap();
    let d = read_csv(&path, &labelled(0)).unwrap();
    assert_eq!(d.classes(), ["setosa", "versicolor", "virginica"]);
    assert_eq!(d.y().as_i32().unwrap(), &[2, 0, 1, 0]);
    assert_eq!(d.x().as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
}

/// A class column is all integers or all names. A typo among integer labels used to turn every
/// label into a name when it came first (`x, 0, 1, ..., 10` sorted as text put `10` before `2`
/// and silently renumbered the classes), and was an error when it came later; both are errors
/// now, naming the label and the column's first one.
#[test]
fn class_labels_mixing_integers_and_names_are_an_error() {
    let dir = scratch("mixed_labels");
    let l2 = labelled(2);
    let name_first = "label `10` is a number, but the column's first label (`x`, line 1) is a name: class labels are all integers or all names; fix the one that is wrong";
    check(
        &dir,
        "name_first",
        b"1,2,x\n3,4,10\n5,6,2\n",
        &l2,
        &format!(":2: column 3 (label_col 2): {name_first}"),
    );
    let number_first = "label `x` is a name, but the column's first label (`3`, line 2) is a number: class labels are all integers or all names; fix the one that is wrong";
    check(
        &dir,
        "number_first",
        b"a,b,c\n1,2,3\n\n3,4,x\n",
        &l2,
        &format!(":4: column 3 (label_col 2): {number_first}"),
    );
    // `nan` and `inf` are names, by the one rule, so they mix with names but not integers.
    let path = dir.join("names.csv");
    std::fs::write(&path, "1,2,nan\n3,4,b\n5,6,inf\n").unwrap();
    assert_eq!(read_csv(&path, &l2).unwrap().classes(), ["b", "inf", "nan"]);
    check(&dir, "nan_after_integers", b"1,2,0\n3,4,nan\n", &l2, ":2: column 3 (label_col 2): label `nan` is a name, but the column's first label (`0`, line 1) is a number: class labels are all integers or all names; fix the one that is wrong");
}

#[test]
fn gzip_and_plain_files_give_the_same_data() {
    let dir = scratch("gzip");
    let text = zcat(&data_file("digits.csv.gz"));
    // The names lie on purpose: detection is by magic bytes.
    let plain = dir.join("digits.gz");
    let packed = dir.join("digits.csv");
    std::fs::write(&plain, &text).unwrap();
    std::fs::write(&packed, gzip(&text)).unwrap();
    let a = read_csv(&plain, &labelled(64)).unwrap();
    let b = read_csv(&packed, &labelled(64)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, read_csv(&data_file("digits.csv.gz"), &labelled(64)).unwrap());
}

fn zcat(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()),
        &mut out,
    )
    .unwrap();
    out
}

/// Reading `text` with `opts` must fail with `<file>:<expected>`.
fn check(dir: &Path, case: &str, text: &[u8], opts: &CsvOptions, expected: &str) {
    let path = dir.join(format!("{case}.csv"));
    std::fs::write(&path, text).unwrap();
    match read_csv(&path, opts) {
        Ok(d) => panic!("{case}: accepted {} rows", d.len()),
        Err(e) => {
            assert_eq!(e.message, format!("{}{expected}", path.display()), "{case}");
            // What the file holds is wrong (exit code 1), unless it is too long to read.
            let kind = if case == "over_max_bytes" { ErrorKind::Limit } else { ErrorKind::Data };
            assert_eq!(e.kind, kind, "{case}");
        }
    }
}

#[test]
fn malformed_csv_errors_name_file_and_line() {
    let dir = scratch("malformed");
    let l2 = labelled(2);
    let cases: &[(&str, &[u8], &CsvOptions, &str)] = &[
        ("short_row", b"1,2,0\n3,4\n", &l2, ":2: expected 3 fields, found 2"),
        ("long_row", b"a,b,c\n1,2,0\n\n3,4,5,6\n", &l2, ":4: expected 3 fields, found 4"),
        ("not_a_number", b"1,2,0\n3,x,1\n", &l2, ":2: column 2: `x` is not a number"),
        ("empty_field", b"1,2,0\n3,,1\n", &l2, ":2: column 2: `` is not a number"),
        ("infinite", b"1,2,0\n3,inf,1\n", &l2, ":2: column 2: `inf` is not a finite number"),
        ("nan", b"1,2,0\n1,nan,0\n", &l2, ":2: column 2: `nan` is not a finite number"),
        (
            "fractional_label",
            b"1,2,0\n3,4,1.5\n",
            &l2,
            ":2: column 3 (label_col 2): label `1.5` is not an integer",
        ),
        ("negative_label", b"1,2,-1\n", &l2, ":1: column 3 (label_col 2): label -1 is negative"),
        ("huge_label", b"1,2,3000000000\n", &l2, ":1: column 3 (label_col 2): label 3000000000 is too large"),
        // Past i64's range: too large (or negative), not "not an integer".
        (
            "huge_label_digits",
            b"1,2,99999999999999999999\n",
            &l2,
            ":1: column 3 (label_col 2): label 99999999999999999999 is too large",
        ),
        (
            "huge_negative_label_digits",
            b"1,2,-99999999999999999999\n",
            &l2,
            ":1: column 3 (label_col 2): label -99999999999999999999 is negative",
        ),
        ("empty_label", b"1,2,0\n1,2,\n", &l2, ":2: column 3 (label_col 2): empty label"),
        (
            "invalid_utf8",
            b"1,2,0\n1,\xff,0\n",
            &l2,
            ":2:3: invalid UTF-8 (byte 0xFF at byte offset 8): rumus reads data files as UTF-8 text; save the file as UTF-8",
        ),
        (
            "label_col_out_of_range",
            b"1,2,0\n",
            &labelled(3),
            ":1: label_col 3 is out of range for 3 fields (it counts from 0)",
        ),
        (
            "unclosed_quote",
            b"1,2,0\n3,\"4,1\n5,6,1\n",
            &l2,
            ":2: a quoted field is not closed before the end of the file",
        ),
        ("header_only", b"a,b,c\n", &l2, ": no data rows"),
        ("empty", b"", &l2, ": no data rows"),
        ("only_labels", b"0\n1\n", &labelled(0), ": no feature columns"),
        (
            "forced_header_absent",
            b"a,b,c\n1,2,0\n",
            &CsvOptions { header: Header::Absent, ..labelled(2) },
            ":1: column 1: `a` is not a number",
        ),
        (
            "target_not_a_number",
            b"1,2,x\n",
            &CsvOptions { labels: Labels::Targets, ..labelled(2) },
            ":1: column 3 (label_col 2): `x` is not a number",
        ),
        (
            "over_max_bytes",
            b"1,2,0\n1,2,0\n",
            &CsvOptions { max_bytes: 8, ..labelled(2) },
            ": more than 8 bytes of text",
        ),
    ];
    for (case, text, opts, expected) in cases {
        check(&dir, case, text, opts, expected);
    }
    // A corrupt gzip stream is an error too, not a panic.
    let mut packed = gzip(b"1,2,0\n3,4,1\n");
    let mid = packed.len() / 2;
    packed[mid] ^= 0xff;
    packed.truncate(packed.len() - 3);
    let path = dir.join("corrupt.csv.gz");
    std::fs::write(&path, packed).unwrap();
    let e = read_csv(&path, &l2).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Data, "{}", e.message);
}

/// Found by the hostile-input hunt: the labels `+1` and `01` were read as 1 (and `-0` as 0),
/// though class labels are written as digits. Such a label is an error at its row and column
/// that shows how to write it; `0` and labels without leading zeros read as before.
#[test]
fn class_labels_are_written_as_digits_alone() {
    let dir = scratch("label_digits");
    let l2 = labelled(2);
    let rule = "must be written as digits alone, without a sign or leading zeros";
    let cases: &[(&str, &[u8], String)] = &[
        ("plus", b"1,2,0\n3,4,+1\n", format!(":2: column 3 (label_col 2): label `+1` {rule}: `1`")),
        (
            "leading_zero",
            b"1,2,01\n",
            format!(":1: column 3 (label_col 2): label `01` {rule}: `1`"),
        ),
        (
            "zeros",
            b"1,2,1\n1,2,00\n",
            format!(":2: column 3 (label_col 2): label `00` {rule}: `0`"),
        ),
        ("minus_zero", b"1,2,-0\n", format!(":1: column 3 (label_col 2): label `-0` {rule}: `0`")),
        (
            "plus_huge",
            b"1,2,+0099999999999999999999\n",
            format!(
                ":1: column 3 (label_col 2): label `+0099999999999999999999` {rule}: \
                 `99999999999999999999`"
            ),
        ),
    ];
    for (case, text, expected) in cases {
        check(&dir, case, text, &l2, expected);
    }
    let path = dir.join("plain.csv");
    std::fs::write(&path, "1,2,0\n3,4,10\n5,6,2147483647\n").unwrap();
    let d = read_csv(&path, &l2).unwrap();
    assert_eq!(d.y().as_i32().unwrap(), [0, 10, 2147483647]);
}

/// Found by the fuzz driver: a finite feature times a finite scale can leave f32's range, and
/// the data set then held `inf` although every feature must be finite.
#[test]
fn features_scaled_past_f32_range_are_an_error() {
    let dir = scratch("scaled");
    let scaled = |scale| CsvOptions { scale, ..labelled(2) };
    let cases: &[(&str, &[u8], &CsvOptions, &str)] = &[
        (
            "overflow",
            b"1,2,0\n3,4e30,1\n",
            &scaled(1e10),
            ":2: column 2: `4e30` times the scale 10000000000 is not a finite number",
        ),
        (
            "infinite_scale",
            b"1,2,0\n",
            &scaled(f32::INFINITY),
            ":1: column 1: `1` times the scale inf is not a finite number",
        ),
        (
            "nan_scale",
            b"0,2,0\n",
            &scaled(f32::NAN),
            ":1: column 1: `0` times the scale NaN is not a finite number",
        ),
    ];
    for (case, text, opts, expected) in cases {
        check(&dir, case, text, opts, expected);
    }
    let d = read_csv(&data_file("blobs.csv"), &scaled(1e30)).unwrap();
    assert!(d.x().to_f32_vec().iter().all(|v| v.is_finite()));
}

/// Fields are split as CSV defines them (the `csv` crate): quoted fields hold commas, line
/// breaks and escaped quotes, CRLF ends lines. Splitting on every comma used to cut
/// `"big, red"` in two.
#[test]
fn quoted_fields_and_crlf_line_ends_split_as_csv_does() {
    let dir = scratch("quoted");
    let path = dir.join("q.csv");
    let text = "\"width\",\"height, cm\",kind\r\n\
                1,\"2\",\"big, red\"\r\n\
                3,\" 4 \",\"say \"\"hi\"\"\"\r\n\
                5,6,\"two\r\nlines\"\r\n\
                7,8,\"big, red\"\r\n";
    std::fs::write(&path, text).unwrap();
    let d = read_csv(&path, &labelled(2)).unwrap();
    assert_eq!(d.x().as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    assert_eq!(d.classes(), &["big, red", "say \"hi\"", "two\r\nlines"]);
    assert_eq!(d.y().as_i32().unwrap(), &[0, 1, 2, 0]);
    // A line number after a record that spans two lines counts both.
    std::fs::write(&path, "1,\"a\nb\"\n2,x,y\n").unwrap();
    let e = read_csv(&path, &labelled(1)).unwrap_err();
    assert_eq!(e.message, format!("{}:3: expected 2 fields, found 3", path.display()));
}

/// Found by the hostile-input audit (round 7): a quote left open is followed to the end of the
/// file in time linear in its lines. Each line of the record counted the quotes of the whole
/// record again, so an open quote before 400,000 empty lines (a gzip file of under 2 KB) took
/// about 25 s, and a few million lines hours.
#[test]
fn an_open_quote_before_many_lines_is_found_in_linear_time() {
    let dir = scratch("open_quote");
    let path = dir.join("q.csv.gz");
    let mut text = b"1,\"".to_vec();
    text.resize(text.len() + 400_000, b'\n');
    let packed = gzip(&text);
    assert!(packed.len() < 2048, "{} bytes", packed.len());
    std::fs::write(&path, packed).unwrap();
    let e = read_csv(&path, &labelled(1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Data);
    assert_eq!(
        e.message,
        format!("{}:1: a quoted field is not closed before the end of the file", path.display())
    );
}

/// Found by the hostile-input audit: a first row that looked like data but held a typo
/// (`x,2,0`) was taken as a header and dropped without a word, while the same typo in the second
/// row was an error. A first row is a header when none of its fields is a number, data when
/// every feature field is one, and anything between is an error that says to name a header or
/// fix the field.
#[test]
fn a_first_row_is_a_header_only_when_none_of_its_fields_is_a_number() {
    let dir = scratch("first_row");
    let l2 = labelled(2);
    let mixed = "the first row mixes numbers and text, so it is neither a header (no field a \
                 number) nor data (every feature a number)";
    let fix = "fix the field, or give `header: true` if the row is a header";
    let cases: &[(&str, &[u8], &CsvOptions, String)] = &[
        (
            "typo_first",
            b"x,2,0\n3,4,1\n",
            &l2,
            format!(":1: {mixed}: column 1: `x` is not a number; {fix}"),
        ),
        ("typo_second", b"1,2,0\nx,4,1\n", &l2, ":2: column 1: `x` is not a number".into()),
        (
            "typo_first_no_header",
            b"x,2,0\n3,4,1\n",
            &CsvOptions { header: Header::Absent, ..labelled(2) },
            ":1: column 1: `x` is not a number".into(),
        ),
        // A numbered header, as scikit-learn writes one, says so.
        (
            "sklearn_header",
            b"2,2,a,b\n1,2,0\n",
            &l2,
            format!(":1: {mixed}: column 4: `b` is not a number; {fix}"),
        ),
        (
            "no_labels",
            b"1,2,x\n3,4,5\n",
            &CsvOptions::default(),
            format!(":1: {mixed}: column 3: `x` is not a number; {fix}"),
        ),
        // Found by review: the header check took `nan` and `inf` for numbers (f32's parser)
        // while data rows refuse them; one rule reads both, so a first row of `1,nan` is mixed.
        (
            "nan_first",
            b"1,nan,0\n",
            &l2,
            format!(":1: {mixed}: column 2: `nan` is not a finite number; {fix}"),
        ),
        (
            "inf_first",
            b"inf,2,0\n",
            &l2,
            format!(":1: {mixed}: column 1: `inf` is not a finite number; {fix}"),
        ),
    ];
    for (case, text, opts, expected) in cases {
        check(&dir, case, text, opts, expected);
    }
    // Text only: a header, whatever the label column holds; numeric features with a named
    // class: data.
    let path = dir.join("ok.csv");
    std::fs::write(&path, "x1,,label\n1,2,a\n3,4,b\n").unwrap();
    assert_eq!(read_csv(&path, &l2).unwrap().x().as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    std::fs::write(&path, "1,2,a\n3,4,b\n").unwrap();
    assert_eq!(read_csv(&path, &l2).unwrap().classes(), ["a", "b"]);
    // Fields named `nan` and `inf` are names, not numbers: a header, and class labels.
    std::fs::write(&path, "nan,inf,label\n1,2,inf\n3,4,nan\n5,6,inf\n").unwrap();
    let d = read_csv(&path, &l2).unwrap();
    assert_eq!(d.x().as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(d.classes(), ["inf", "nan"]);
    assert_eq!(d.y().as_i32().unwrap(), &[0, 1, 0]);
    // Named, a header is skipped whatever it holds.
    std::fs::write(&path, "x,2,0\n3,4,1\n").unwrap();
    let named = CsvOptions { header: Header::Present, ..labelled(2) };
    assert_eq!(read_csv(&path, &named).unwrap().x().as_f32().unwrap(), &[3.0, 4.0]);
}

#[test]
fn header_options_and_no_label_column() {
    let dir = scratch("header");
    let path = dir.join("h.csv");
    std::fs::write(&path, "1,2\n3,4\n").unwrap();
    let all = read_csv(&path, &CsvOptions::default()).unwrap();
    assert_eq!(all.x().shape(), &[2, 2]);
    assert_eq!(all.y().shape(), &[2, 0], "no label column: empty targets");
    let skipped =
        read_csv(&path, &CsvOptions { header: Header::Present, ..CsvOptions::default() }).unwrap();
    assert_eq!(skipped.x().as_f32().unwrap(), &[3.0, 4.0]);
}

fn digits() -> Dataset {
    read_csv(&data_file("digits.csv.gz"), &labelled(64)).unwrap()
}

/// The first feature and label of each example identify it well enough to compare orders; use
/// the row itself to be exact.
fn rows(d: &Dataset) -> Vec<Vec<u32>> {
    let x = d.x().as_f32().unwrap();
    let width = d.x().shape()[1];
    (0..d.len())
        .map(|i| {
            let mut r: Vec<u32> =
                x[i * width..(i + 1) * width].iter().map(|v| v.to_bits()).collect();
            r.push(d.y().as_i32().unwrap()[i] as u32);
            r
        })
        .collect()
}

#[test]
fn split_is_deterministic_and_a_partition() {
    let d = digits();
    let (train, test) = d.split(0.8, 42).unwrap();
    assert_eq!((train.len(), test.len()), (1438, 359));
    let (train2, test2) = d.split(0.8, 42).unwrap();
    assert_eq!((&train, &test), (&train2, &test2));
    assert_ne!(d.split(0.8, 43).unwrap().0, train, "another seed, another split");
    let mut all: Vec<Vec<u32>> = rows(&train).into_iter().chain(rows(&test)).collect();
    let mut original = rows(&d);
    all.sort();
    original.sort();
    assert_eq!(all, original, "every example lands in exactly one part");
    assert_eq!(d.split(0.0, 1).unwrap().0.len(), 0);
    assert_eq!(d.split(1.0, 1).unwrap().1.len(), 0);
    for bad in [-0.1, 1.5, f64::NAN] {
        assert_eq!(d.split(bad, 1).unwrap_err().kind, ErrorKind::InvalidArgument);
    }
}

#[test]
fn batches_cover_every_example_once_and_keep_the_last_partial_batch() {
    let d = digits();
    let batches: Vec<_> = d.batches(64, 3).unwrap().map(Result::unwrap).collect();
    assert_eq!(d.batches(64, 3).unwrap().len(), 29);
    assert_eq!(batches.len(), 29, "1797 = 28 × 64 + 5");
    assert!(batches[..28].iter().all(|b| b.x.shape() == [64, 64] && b.y.shape() == [64]));
    assert_eq!(batches[28].x.shape(), &[5, 64]);
    // Same seed, same batches; another seed, another order.
    let again: Vec<_> = d.batches(64, 3).unwrap().map(Result::unwrap).collect();
    assert_eq!(batches, again);
    let other = d.batches(64, 4).unwrap().next().unwrap().unwrap();
    assert_ne!(other, batches[0]);
    // Coverage: the batches hold exactly the dataset's rows.
    let xs: Vec<f32> = batches.iter().flat_map(|b| b.x.as_f32().unwrap().to_vec()).collect();
    let ys: Vec<i32> = batches.iter().flat_map(|b| b.y.as_i32().unwrap().to_vec()).collect();
    let joined =
        Dataset::new(Tensor::f32(&[1797, 64], xs).unwrap(), Tensor::i32(&[1797], ys).unwrap())
            .unwrap();
    let (mut a, mut b) = (rows(&joined), rows(&d));
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert_eq!(d.batches(0, 1).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(d.batches(5000, 1).unwrap().count(), 1);
}

#[test]
fn dataset_new_checks_the_first_dimension() {
    let x = Tensor::zeros(&[3, 2], DType::F32).unwrap();
    let e = Dataset::new(x.clone(), Tensor::zeros(&[4], DType::I32).unwrap()).unwrap_err();
    assert_eq!(
        e.message,
        "dataset needs x and y with the same first dimension, got [3, 2] and [4]"
    );
    assert!(Dataset::new(x, Tensor::scalar(1.0)).is_err());
    let d = Dataset::new(
        Tensor::zeros(&[3, 2], DType::F32).unwrap(),
        Tensor::zeros(&[3], DType::I32).unwrap(),
    )
    .unwrap();
    assert!(d.select(&[3]).is_err());
    assert_eq!(d.select(&[2, 2]).unwrap().len(), 2);
}

#[test]
fn text_sequences_pair_each_window_with_the_next_bytes() {
    let d = text_sequences(b"abcdefg", 3, 2).unwrap();
    // Windows start at 0, 2 (4 would need bytes up to index 7).
    assert_eq!(d.x().shape(), &[2, 3]);
    let b = |s: &str| s.bytes().map(i32::from).collect::<Vec<_>>();
    assert_eq!(d.x().as_i32().unwrap(), b("abccde").as_slice());
    assert_eq!(d.y().as_i32().unwrap(), b("bcddef").as_slice());
    assert_eq!(text_sequences(b"abcd", 3, 1).unwrap().len(), 1);
    let e = text_sequences(b"abc", 3, 1).unwrap_err();
    assert_eq!(
        e.message,
        "text of 3 bytes is too short for one sequence of 3 bytes plus a target: use a shorter \
         seq_len (at most 2)"
    );
    assert_eq!(
        text_sequences(b"a", 3, 1).unwrap_err().message,
        "text of 1 byte is too short for one sequence of 3 bytes plus a target: a sequence and \
         its target need 2 bytes at least"
    );
    assert_eq!(text_sequences(b"abc", 0, 1).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(text_sequences(b"abc", 1, 0).unwrap_err().kind, ErrorKind::InvalidArgument);
    let high = text_sequences(&[0, 255, 128], 2, 1).unwrap();
    assert_eq!(high.y().as_i32().unwrap(), &[255, 128]);
}

#[test]
fn read_text_reads_a_file_or_a_folder_in_sorted_order() {
    let dir = scratch("text");
    std::fs::create_dir_all(dir.join("b_sub")).unwrap();
    std::fs::create_dir_all(dir.join(".hidden")).unwrap();
    std::fs::write(dir.join("c.md"), "C").unwrap();
    std::fs::write(dir.join("a.rs"), "A").unwrap();
    std::fs::write(dir.join("b_sub/x.txt"), "B").unwrap();
    std::fs::write(dir.join("skip.csv"), "no").unwrap();
    std::fs::write(dir.join(".hidden/h.rs"), "no").unwrap();
    let text = |p: &Path| rumus::data::read_text(p, &mut Budget::new(1 << 20).empty());
    assert_eq!(text(&dir).unwrap(), b"ABC");
    assert_eq!(text(&dir.join("skip.csv")).unwrap(), b"no");
    let empty = scratch("text_empty");
    assert_eq!(text(&empty).unwrap_err().kind, ErrorKind::Data);
    assert_eq!(text(&empty.join("missing")).unwrap_err().kind, ErrorKind::Io);
}

#[test]
fn readers_stop_at_the_memory_budget() {
    let dir = scratch("budget");
    let big = dir.join("big.txt");
    std::fs::write(&big, vec![b'x'; 100_000]).unwrap();
    let budget = Budget::new(64 << 10);
    let e = rumus::data::read_text(&dir, &mut budget.empty()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit);
    assert!(e.message.starts_with(&format!("reading {} needs ", big.display())), "{e}");

    // A small gzip file that expands to 2 MB of rows, and one line of 1 MB with no newline.
    let rows = gzip(&b"1,2,3,4\n".repeat(250_000));
    assert!(rows.len() < 20_000);
    let line = gzip(&vec![b'7'; 1 << 20]);
    for (name, bytes, what) in [("rows.csv.gz", rows, "rows"), ("line.csv.gz", line, "a line")] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let e =
            rumus::data::read_csv(&path, &CsvOptions::default(), &mut budget.empty()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit, "{e}");
        assert!(e.message.contains(&format!("{what} needs ")), "{e}");
        assert!(e.message.contains("of the 64.0 KiB memory budget is free"), "{e}");
        assert_eq!(budget.used(), 0, "a failed read gives back what it held");
    }

    let e =
        rumus::data::text_sequences(&[0; 100], 10, 1, &mut Budget::new(100).empty()).unwrap_err();
    assert_eq!(
        e.message,
        "90 sequences of 10 bytes and their targets (a larger stride makes fewer) needs 7.0 KiB, \
         more than the whole 100 bytes memory budget"
    );
}

/// Found by the hostile-data audit: the `csv` crate ends a record at a carriage return as at a
/// line feed, and each line was split into one record with what followed dropped without a
/// word. A file with `\r` line ends (old Mac) read as its first row; a stray `\r` in a line
/// dropped the rest of the line; a `"` inside an unquoted field made the reader join the next
/// line (an open quote, by its count) and the crate then dropped that line. A record is now
/// the whole line, or an error at its line saying what to do.
#[test]
fn a_record_is_its_whole_line_or_an_error() {
    let dir = scratch("whole_line");
    let l2 = labelled(2);
    let cr = "a carriage return (\\r) without a line feed after it ends the line after field 3, \
              and more follows: rumus reads lines that end in \\n or \\r\\n; convert the file's \
              line ends (a file that ends lines in \\r alone)";
    let quote = "a `\"` inside field 3, which does not start with a quote, made the line take in \
                 the next one: quote the whole field and double the quote inside (`\"a\"\"b\"`), \
                 or remove it";
    let cases: &[(&str, &[u8], String)] = &[
        ("cr_line_ends", b"1,2,0\r3,4,1\r5,6,0\r", format!(":1: {cr}")),
        ("cr_in_a_line", b"1,2,0\n3,4,1\r5,6,0\n", format!(":2: {cr}")),
        ("stray_quote", b"1,2,x\"y\n3,4,z\"w\n5,6,q\n", format!(":1: {quote}")),
        ("stray_quote_crlf", b"1,2,x\"y\r\n3,4,z\"w\r\n5,6,q\r\n", format!(":1: {quote}")),
    ];
    for (case, text, expected) in cases {
        check(&dir, case, text, &l2, expected);
    }
    // CRLF line ends, a `\r\n` inside a quoted field, and a UTF-8 byte-order mark still read.
    let path = dir.join("ok.csv");
    std::fs::write(&path, b"\xEF\xBB\xBFsetosa,1,2\r\nsetosa,3,4\r\n\"a\r\nb\",5,6\r\n").unwrap();
    let d = read_csv(&path, &labelled(0)).unwrap();
    assert_eq!(d.classes(), ["a\r\nb", "setosa"], "one `setosa`, the mark not in its name");
    assert_eq!(d.y().as_i32().unwrap(), &[1, 1, 0]);
    assert_eq!(d.x().as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

/// Found by the hostile-data audit: a data file that is not UTF-8 was refused with its line
/// only ("line is not valid UTF-8"), or for `read_text` and metrics logs with no place at all;
/// a UTF-16 file (what some spreadsheet programs save) got the same message as one bad byte.
/// Every data reader now says `file:line:column`, the byte and its offset, and to save the
/// file as UTF-8 (`files::utf8_data`); a UTF-16 or UTF-32 byte-order mark is named.
#[test]
fn text_that_is_not_utf8_is_refused_at_its_line_and_column() {
    let dir = scratch("utf8");
    let l2 = labelled(2);
    let save = "rumus reads data files as UTF-8 text; save the file as UTF-8";
    let bom = "rumus reads UTF-8 text: save the file as UTF-8";
    let cases: &[(&str, &[u8], String)] = &[
        // The bad byte on the second line of a quoted field that spans two: line 3, after `é`.
        (
            "in_a_quoted_record",
            b"1,2,0\n3,\"\xC3\xA9\n\xC3\xA9\xFF\",0\n",
            format!(":3:2: invalid UTF-8 (byte 0xFF at byte offset 14): {save}"),
        ),
        (
            "utf16",
            b"\xFF\xFE1\x00,\x002\x00\n\x00",
            format!(":1:1: the file starts with a UTF-16 little-endian byte-order mark; {bom}"),
        ),
        (
            "utf32_big_endian",
            b"\x00\x00\xFE\xFF\x00\x00\x001",
            format!(":1:1: the file starts with a UTF-32 big-endian byte-order mark; {bom}"),
        ),
    ];
    for (case, text, expected) in cases {
        check(&dir, case, text, &l2, expected);
    }
    // In a gzip file the offset is the text's.
    let path = dir.join("bad.csv.gz");
    std::fs::write(&path, gzip(b"1,2,0\n3,4,\xFF\n")).unwrap();
    let e = read_csv(&path, &l2).unwrap_err();
    let at = format!("{}:2:5: invalid UTF-8 (byte 0xFF at byte offset 10): {save}", path.display());
    assert_eq!((e.kind, e.message), (ErrorKind::Data, at));
    // The whole-text readers (a script's `read_text`, a metrics log) by the same rule; a UTF-8
    // byte-order mark is skipped.
    let text = |bytes: &[u8]| rumus::files::utf8_text("t.txt", bytes.to_vec());
    let e = text(b"ab\ncd\xFFe\n").unwrap_err();
    let at = format!("t.txt:2:3: invalid UTF-8 (byte 0xFF at byte offset 5): {save}");
    assert_eq!((e.kind, e.message), (ErrorKind::Data, at));
    let e = text(b"\xFE\xFF\x00a").unwrap_err();
    assert_eq!(
        e.message,
        "t.txt:1:1: the file starts with a UTF-16 big-endian byte-order mark; rumus reads UTF-8 text: save the file as UTF-8"
    );
    assert_eq!(text(b"\xEF\xBB\xBFab").unwrap(), "ab");
}

/// Found by the hostile-data audit: splitting a line into fields held what no charge counted,
/// about forty times the line for a line of commas (each empty field's bounds, a trimmed copy
/// of the whole record, the list of fields): 50 MB of commas took 2 GB. The split is charged
/// (twice the line and 24 bytes a field) while it is held, so such a line stops at the budget.
#[test]
fn splitting_a_line_into_fields_is_charged() {
    let dir = scratch("split_charge");
    let path = dir.join("commas.csv");
    std::fs::write(&path, vec![b','; 1 << 20]).unwrap();
    let budget = Budget::new(16 << 20);
    let e = rumus::data::read_csv(&path, &CsvOptions::default(), &mut budget.empty()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit, "{e}");
    let what = format!("{}:1: splitting a line into fields needs 26.0 MiB", path.display());
    assert!(e.message.starts_with(&what), "{e}");
    assert_eq!(budget.used(), 0, "a failed read gives back what it held");
    // A wide row the budget holds reads, and the split's charge is given back after it.
    let row = vec!["1"; 100_000].join(",");
    std::fs::write(&path, format!("{row}\n{row}\n")).unwrap();
    let mut charge = budget.empty();
    let d = rumus::data::read_csv(&path, &CsvOptions::default(), &mut charge).unwrap();
    assert_eq!(d.x().shape(), &[2, 100_000]);
    assert!(charge.bytes() < 4 << 20, "{} bytes held after the read", charge.bytes());
}

/// Found by the hostile-data audit: `rumus plot` read a metrics log's first gigabyte and drew
/// it, dropping the rest without a word. A longer log is refused (a sparse file: nothing is
/// read), and a log that is not UTF-8 is refused at its line and column.
#[test]
fn a_metrics_log_past_its_limit_or_not_utf8_is_refused() {
    let dir = scratch("plot_log");
    let log = dir.join("metrics.jsonl");
    let file = std::fs::File::create(&log).unwrap();
    file.set_len(rumus::plot::MAX_LOG_BYTES + 1).unwrap();
    drop(file);
    let e = rumus::plot::plot_log(&log, &dir.join("out.svg")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Limit);
    assert_eq!(
        e.message,
        format!(
            "{}: a metrics log may have at most 1073741824 bytes; this one has more: plot a part of it (`tail -c`, or `grep` a metric's lines)",
            log.display()
        )
    );
    std::fs::write(&log, b"{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"lo\xFFss\": 1.0}\n")
        .unwrap();
    let e = rumus::plot::plot_log(&log, &dir.join("out.svg")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Data);
    assert!(
        e.message.starts_with(&format!("{}:2:16: invalid UTF-8 (byte 0xFF", log.display())),
        "{e}"
    );
}

/// A set stop flag (a script's Ctrl-C) ends a long read with an `Interrupted` error at the
/// 4096th record: reading a 135 MB file went on for seconds after Ctrl-C.
#[test]
fn a_stop_flag_ends_a_read() {
    let dir = scratch("stop_flag");
    let path = dir.join("rows.csv");
    std::fs::write(&path, "1,2,0\n".repeat(5000)).unwrap();
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opts = CsvOptions { stop: Some(flag.clone()), ..labelled(2) };
    assert_eq!(read_csv(&path, &opts).unwrap().len(), 5000);
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = read_csv(&path, &opts).unwrap_err();
    assert_eq!(e.kind, rumus::ErrorKind::Interrupted);
    assert_eq!(e.message, format!("interrupted while reading {} (at line 4096)", path.display()));
}
