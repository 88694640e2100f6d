//! Checkpoint boundary: bit-exact round trips, atomic saves, and a corpus of malformed files,
//! each with the message it must produce.

use rumus::checkpoint::{check_against, from_bytes, save, to_bytes, Checkpoint, MAX_HEADER_LEN};
use rumus::memory::Budget;
use rumus::{DType, ErrorKind, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Load with no memory limit.
fn load(path: &std::path::Path) -> rumus::Result<Checkpoint> {
    rumus::checkpoint::load(path, &mut Budget::unlimited().empty())
}

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("checkpoint").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A file with header text `header` (unpadded) and data `data`.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// Each file of `cases` must be rejected with exactly its message; every case that is not is
/// reported, all at once.
fn check(cases: &[(&str, Vec<u8>, &str)]) {
    let mut wrong = Vec::new();
    for (case, bytes, expected) in cases {
        match from_bytes(bytes) {
            Ok(c) => wrong.push(format!("{case}: accepted, got {} tensors", c.tensors.len())),
            Err(e) if e.kind != ErrorKind::Checkpoint || e.message != *expected => wrong
                .push(format!("{case}: {:?} {:?}\n    expected {expected:?}", e.kind, e.message)),
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn sample() -> Vec<(String, Tensor)> {
    let nan_payload = f32::from_bits(0x7fc0_1234);
    let signalling = f32::from_bits(0xff80_0001);
    vec![
        (
            "layer.0.weight".into(),
            Tensor::f32(
                &[2, 4],
                vec![
                    -0.0,
                    0.0,
                    nan_payload,
                    signalling,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    f32::from_bits(1),
                    f32::MAX,
                ],
            )
            .unwrap(),
        ),
        ("a.bias".into(), Tensor::f32(&[3], vec![1.5, -2.25, 1e-30]).unwrap()),
        ("tokens".into(), Tensor::i32(&[1, 3], vec![i32::MIN, -1, i32::MAX]).unwrap()),
        ("step".into(), Tensor::i32(&[], vec![7]).unwrap()),
        ("empty".into(), Tensor::zeros(&[0, 5], DType::F32).unwrap()),
    ]
}

fn refs(tensors: &[(String, Tensor)]) -> Vec<(&str, &Tensor)> {
    tensors.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// Same names (in name order), shapes, dtypes and bits.
fn assert_bit_exact(loaded: &Checkpoint, saved: &[(String, Tensor)]) {
    let mut saved: Vec<&(String, Tensor)> = saved.iter().collect();
    saved.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(loaded.tensors.len(), saved.len());
    for ((ln, lt), (sn, st)) in loaded.tensors.iter().zip(saved) {
        assert_eq!(ln, sn);
        assert_eq!(lt.shape(), st.shape(), "{ln}");
        assert_eq!(lt.dtype(), st.dtype(), "{ln}");
        assert_eq!(lt.to_le_bytes(), st.to_le_bytes(), "{ln}");
    }
}

#[test]
fn save_then_load_is_bit_exact() {
    let dir = scratch("round_trip");
    let path = dir.join("model.safetensors");
    let tensors = sample();
    let metadata = meta(&[("step", "1200"), ("format", "pt"), ("note", "quote \" and ünïcode")]);
    save(&path, &refs(&tensors), &metadata).unwrap();
    let loaded = load(&path).unwrap();
    assert_bit_exact(&loaded, &tensors);
    assert_eq!(loaded.metadata, metadata);
    assert!(loaded.get("tokens").is_some() && loaded.get("nope").is_none());
}

#[test]
fn bytes_round_trip_and_layout_matches_the_reference_writer() {
    let tensors = sample();
    let bytes = to_bytes(&refs(&tensors), &BTreeMap::new()).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(header_len % 8, 0, "data must start 8-byte aligned");
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    assert!(!header.contains("__metadata__"), "no metadata key when there is none: {header}");
    assert_bit_exact(&from_bytes(&bytes).unwrap(), &tensors);
    // Deterministic: the input order does not matter.
    let mut reversed = refs(&tensors);
    reversed.reverse();
    assert_eq!(to_bytes(&reversed, &BTreeMap::new()).unwrap(), bytes);
}

#[test]
fn one_tensor_file_is_byte_identical_to_the_reference_format() {
    // What `safetensors.torch.save_file({"w": torch.tensor([1.0, 2.0])})` writes.
    let w = Tensor::f32(&[2], vec![1.0, 2.0]).unwrap();
    let bytes = to_bytes(&[("w", &w)], &BTreeMap::new()).unwrap();
    let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut expected = file(&format!("{header:<56}"), &[]);
    expected.extend_from_slice(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
    assert_eq!(bytes, expected);
}

#[test]
fn atomic_save_leaves_no_temporary_files() {
    let dir = scratch("atomic");
    let path = dir.join("m.safetensors");
    let tensors = sample();
    save(&path, &refs(&tensors), &BTreeMap::new()).unwrap();
    // Overwriting an existing checkpoint also goes through a rename.
    let small = Tensor::scalar(3.0);
    save(&path, &[("x", &small)], &BTreeMap::new()).unwrap();
    assert_eq!(load(&path).unwrap().tensors, vec![("x".to_string(), small.clone())]);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec!["m.safetensors"]);

    // A failed rename (the target is a folder) removes the temporary file.
    let blocked = dir.join("blocked.safetensors");
    std::fs::create_dir(&blocked).unwrap();
    let e = save(&blocked, &[("x", &small)], &BTreeMap::new()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec!["blocked.safetensors", "m.safetensors"]);
}

#[test]
fn saving_rejects_duplicate_and_reserved_names() {
    let t = Tensor::scalar(1.0);
    let e = to_bytes(&[("a", &t), ("b", &t), ("a", &t)], &BTreeMap::new()).unwrap_err();
    assert_eq!(e.message, "duplicate tensor name `a`");
    let e = to_bytes(&[("__metadata__", &t)], &BTreeMap::new()).unwrap_err();
    assert_eq!(e.message, "`__metadata__` is reserved and cannot name a tensor");
}

#[test]
fn load_errors_name_the_file() {
    let dir = scratch("load_errors");
    let path = dir.join("bad.safetensors");
    std::fs::write(&path, [1, 2, 3]).unwrap();
    let e = load(&path).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Checkpoint);
    assert_eq!(
        e.message,
        format!("{}: file is 3 bytes, too short for the 8-byte header length", path.display())
    );
    let e = load(&dir.join("missing.safetensors")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let tensors = sample();
    let bytes = to_bytes(&refs(&tensors), &meta(&[("k", "v")])).unwrap();
    for len in 0..bytes.len() {
        assert!(from_bytes(&bytes[..len]).is_err(), "truncated to {len} of {} bytes", bytes.len());
    }
    assert!(from_bytes(&bytes).is_ok());
}

/// Found by the hostile-input audit: a PyTorch `.pt` file (a zip archive) given to `load` was
/// "header length 85966670672 is over the limit of 100000000 bytes", nothing more: the message
/// now names the format and what to do.
#[test]
fn a_file_of_another_format_is_named_as_such() {
    let torch = "the file is not a safetensors file but a PyTorch file (`torch.save` writes a zip archive or a pickle); convert it with scripts/tools/export_torch.py and load it with `from: \"pytorch\"`";
    let zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl";
    let pickle = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.";
    let gzip = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03";
    let hdf5 = b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x00\x08\x08\x00";
    let npy = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}";
    let cases: [(&[u8], String); 6] = [
        (zip, format!("header length 85966670672 is over the limit of 100000000 bytes: {torch}")),
        (pickle, format!("header length 5088219219985302144 is over the limit of 100000000 bytes: {torch}")),
        (gzip, "header length 559903 runs past the end of the file (2 bytes after the length): the file is not a safetensors file but gzip-compressed: decompress it first".into()),
        (hdf5, "header length 727905341903489161 is over the limit of 100000000 bytes: the file is not a safetensors file but HDF5 (a Keras `.h5` file?)".into()),
        (npy, "header length 379676406402707 is over the limit of 100000000 bytes: the file is not a safetensors file but a NumPy `.npy` array".into()),
        (b"GGUF\x03\x00\x00\x00\x00", "header length 14064895815 is over the limit of 100000000 bytes: the file is not a safetensors file but GGUF".into()),
    ];
    for (bytes, want) in cases {
        let Err(e) = from_bytes(bytes) else { panic!("{bytes:?} loaded") };
        assert_eq!(e.message, want, "{bytes:?}");
    }
}

#[test]
fn flipping_any_byte_never_panics() {
    let t = Tensor::f32(&[2], vec![1.0, 2.0]).unwrap();
    let bytes = to_bytes(&[("w", &t)], &meta(&[("k", "v")])).unwrap();
    for i in 0..bytes.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            let _ = from_bytes(&b);
        }
    }
}

#[test]
fn malformed_files_each_get_their_own_message() {
    assert_eq!(MAX_HEADER_LEN, 100_000_000, "the reference implementation's cap");
    let f8 = [0u8; 8];
    let a8 = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty file", vec![], "file is 0 bytes, too short for the 8-byte header length"),
        ("short length", vec![8, 0, 0], "file is 3 bytes, too short for the 8-byte header length"),
        (
            "oversized header length",
            [100_000_001u64.to_le_bytes().as_slice(), b"{}"].concat(),
            "header length 100000001 is over the limit of 100000000 bytes: the file is not a safetensors file, or it is damaged",
        ),
        (
            "header length u64::MAX",
            u64::MAX.to_le_bytes().to_vec(),
            "header length 18446744073709551615 is over the limit of 100000000 bytes: the file is not a safetensors file, or it is damaged",
        ),
        (
            "header length past the file end",
            [64u64.to_le_bytes().as_slice(), b"{}"].concat(),
            "header length 64 runs past the end of the file (2 bytes after the length): the file is not a safetensors file, or it is damaged",
        ),
        (
            "header not UTF-8",
            [4u64.to_le_bytes().as_slice(), b"{\"\xff\"".as_slice()].concat(),
            "header is not valid UTF-8 (at byte 2)",
        ),
        ("empty header", file("", &[]), "header is not a JSON object"),
        ("array header", file("[1, 2]", &[]), "header is not a JSON object"),
        ("string header", file("\"{}\"", &[]), "header is not a JSON object"),
        ("broken JSON", file("{\"a\":", &[]), "header is not valid JSON: EOF while parsing a value at line 1 column 5"),
        ("JSON with trailing text", file("{} {}", &[]), "header is not valid JSON: trailing characters at line 1 column 4"),
        (
            "duplicate key",
            file(&format!("{{{a8},{a8}}}"), &f8),
            "duplicate key `a` in header",
        ),
        (
            "duplicate metadata",
            file(r#"{"__metadata__":{},"__metadata__":{}}"#, &[]),
            "duplicate key `__metadata__` in header",
        ),
        (
            "metadata not an object",
            file(r#"{"__metadata__":[]}"#, &[]),
            "`__metadata__`: invalid type: sequence, expected a map",
        ),
        (
            "metadata value not a string",
            file(r#"{"__metadata__":{"step":3}}"#, &[]),
            "`__metadata__`: invalid type: integer `3`, expected a string",
        ),
        ("entry not an object", file(r#"{"a":3}"#, &[]), "tensor `a`: entry is not a JSON object"),
        (
            "missing dtype",
            file(r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: missing field `dtype`",
        ),
        (
            "missing data_offsets",
            file(r#"{"a":{"dtype":"F32","shape":[2]}}"#, &f8),
            "tensor `a`: missing field `data_offsets`",
        ),
        (
            "dtype not a string",
            file(r#"{"a":{"dtype":1,"shape":[2],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: invalid type: integer `1`, expected string or map",
        ),
        (
            "unknown dtype",
            file(r#"{"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: unknown variant `Q7`, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_E5M2`, `F8_E4M3`, `F8_E8M0`, `F8_E4M3FNUZ`, `F8_E5M2FNUZ`, `I16`, `U16`, `F16`, `BF16`, `I32`, `U32`, `F32`, `C64`, `F64`, `I64`, `U64`",
        ),
        (
            "unsupported dtype",
            file(r#"{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: dtype C64 is not supported (rumus reads F32, I32, F16, BF16 and F64 (as f32), and I8, U8, I16, U16, U32, I64, U64 and BOOL (as i32))",
        ),
        (
            "dtype too wide for its bytes",
            file(r#"{"a":{"dtype":"I32","shape":[3],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: shape [3] of I32 needs 12 bytes, data_offsets [0, 8] hold 8",
        ),
        (
            "offsets chained towards u64::MAX",
            file(
                &format!(
                    r#"{{{a8},"b":{{"dtype":"F32","shape":[2],"data_offsets":[8,18446744073709551615]}}}}"#
                ),
                &[0; 16],
            ),
            "tensor `b`: shape [2] of F32 needs 8 bytes, data_offsets [8, 18446744073709551615] hold 18446744073709551607",
        ),
        (
            "negative dimension",
            file(r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: invalid value: integer `-2`, expected usize",
        ),
        (
            "fractional dimension",
            file(r#"{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: invalid type: floating point `2.0`, expected usize",
        ),
        (
            "three offsets",
            file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}"#, &f8),
            "tensor `a`: invalid length 3, expected fewer elements in array",
        ),
        (
            "reversed offsets",
            file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#, &f8),
            "tensor `a`: data_offsets [8, 0] are reversed",
        ),
        (
            "offsets past the end",
            file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 4]),
            "the tensors use 8 bytes of data but the file holds 4 (truncated or padded: the file is damaged)",
        ),
        (
            "huge offsets",
            file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}"#,
                &f8,
            ),
            "tensor `a`: shape [2] of F32 needs 8 bytes, data_offsets [0, 18446744073709551615] hold 18446744073709551615",
        ),
        (
            "shape not matching the byte length",
            file(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8",
        ),
        (
            "element count overflows",
            file(
                r#"{"a":{"dtype":"I32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
                &f8,
            ),
            "tensor `a`: shape [4294967296, 4294967296] has more than 2^40 elements, the most one value may hold",
        ),
        (
            "byte count overflows",
            file(r#"{"a":{"dtype":"I32","shape":[4611686018427387904],"data_offsets":[0,8]}}"#, &f8),
            "tensor `a`: shape [4611686018427387904] has more than 2^40 elements, the most one value may hold",
        ),
        (
            "first tensor not at 0",
            file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, &[0; 12]),
            "tensor `a`: data_offsets [4, 12] leave a gap or overlap another tensor (tensors must fill the data back to back from byte 0)",
        ),
        (
            "gapped offsets",
            file(
                &format!(r#"{{{a8},"b":{{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}}}"#),
                &[0; 20],
            ),
            "tensor `b`: data_offsets [12, 20] leave a gap or overlap another tensor (tensors must fill the data back to back from byte 0)",
        ),
        (
            "overlapping offsets",
            file(
                &format!(r#"{{"b":{{"dtype":"I32","shape":[2],"data_offsets":[4,12]}},{a8}}}"#),
                &[0; 12],
            ),
            "tensor `b`: data_offsets [4, 12] leave a gap or overlap another tensor (tensors must fill the data back to back from byte 0)",
        ),
        (
            "empty tensor inside another",
            file(
                &format!(r#"{{{a8},"e":{{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}}}"#),
                &f8,
            ),
            "tensor `e`: data_offsets [4, 4] leave a gap or overlap another tensor (tensors must fill the data back to back from byte 0)",
        ),
        (
            "trailing bytes",
            file(&format!("{{{a8}}}"), &[0; 12]),
            "the tensors use 8 bytes of data but the file holds 12 (truncated or padded: the file is damaged)",
        ),
        (
            "data with no tensors",
            file("{}", &[1]),
            "the tensors use 0 bytes of data but the file holds 1 (truncated or padded: the file is damaged)",
        ),
    ];
    check(&cases);
}

#[test]
fn a_header_that_overflows_the_crates_own_reader_is_an_error() {
    // safetensors 0.8.0's `SafeTensors::deserialize` panics on this file in a debug build
    // ("attempt to add with overflow" in `read_metadata`: the tensors end at 2^64 - 8, plus
    // the 8-byte length), which is why this module frames the bytes itself.
    let s: u64 = (1 << 61) - 1;
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"F8_E4M3","shape":[{s}],"data_offsets":[{},{}]}}"#,
                i * s,
                (i + 1) * s
            )
        })
        .collect();
    check(&[(
        "eight one-byte tensors ending at 2^64 - 8",
        file(&format!("{{{}}}", entries.join(",")), &[]),
        "tensor `t0`: dtype F8_E4M3 is not supported (rumus reads F32, I32, F16, BF16 and F64 (as f32), and I8, U8, I16, U16, U32, I64, U64 and BOOL (as i32))",
    )]);
}

#[test]
fn valid_hand_written_files_load() {
    // Header order differs from data order; whitespace padding; empty tensors at shared offsets.
    let bytes = file(
        r#"{"b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},
            "z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},
            "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
            "__metadata__":{"format":"pt"}}     "#,
        &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 5, 0, 0, 0],
    );
    let c = from_bytes(&bytes).unwrap();
    let names: Vec<&str> = c.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "z", "b"], "file order: by offset, then name");
    assert_eq!(c.get("a").unwrap().as_f32().unwrap(), &[1.0, 2.0]);
    assert_eq!(c.get("b").unwrap().as_i32().unwrap(), &[5]);
    assert_eq!(c.metadata, meta(&[("format", "pt")]));
    assert!(from_bytes(&file("{}", &[])).unwrap().tensors.is_empty());
    // Fields the format does not define are ignored, as the reference implementation does.
    let extra = file(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#, &[0; 4]);
    assert_eq!(from_bytes(&extra).unwrap().get("a").unwrap().as_f32().unwrap(), &[0.0]);
}

/// PyTorch files carry integer and boolean buffers (`num_batches_tracked` as I64, masks as
/// BOOL or U8): every integer type and BOOL read as i32, exactly, where they used to fail the
/// whole file; a value beyond i32's range and a BOOL byte other than 0 or 1 are errors naming
/// the tensor and the element.
#[test]
fn integer_and_boolean_tensors_read_as_i32() {
    let le = |v: &[i128], width: usize| -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()[..width].to_vec()).collect()
    };
    let values: [i128; 3] = [-3, 0, 7];
    for (dtype, width, want) in [
        ("I8", 1, vec![-3, 0, 7]),
        ("I16", 2, vec![-3, 0, 7]),
        ("I64", 8, vec![-3, 0, 7]),
        ("U8", 1, vec![253, 0, 7]),
        ("U16", 2, vec![65533, 0, 7]),
    ] {
        let data = le(&values, width);
        let h = format!(
            r#"{{"a":{{"dtype":"{dtype}","shape":[3],"data_offsets":[0,{}]}}}}"#,
            data.len()
        );
        let c = from_bytes(&file(&h, &data)).unwrap();
        assert_eq!(c.get("a").unwrap().as_i32().unwrap(), &want[..], "{dtype}");
    }
    let unsigned =
        |dtype: &str, v: &[u64], width: usize| from_bytes(&unsigned_bytes(v, width, dtype));
    let ok = unsigned("U32", &[5, 2147483647], 4).unwrap();
    assert_eq!(ok.get("a").unwrap().as_i32().unwrap(), &[5, i32::MAX]);
    let ok = unsigned("U64", &[9], 8).unwrap();
    assert_eq!(ok.get("a").unwrap().as_i32().unwrap(), &[9]);
    let bools = file(r#"{"m":{"dtype":"BOOL","shape":[2,2],"data_offsets":[0,4]}}"#, &[1, 0, 0, 1]);
    assert_eq!(from_bytes(&bools).unwrap().get("m").unwrap().as_i32().unwrap(), &[1, 0, 0, 1]);
    let big = le(&[1, 3_000_000_000], 8);
    check(&[
        (
            "I64 beyond i32",
            file(r#"{"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#, &big),
            "tensor `a`: element 1: 3000000000 is outside the i32 range",
        ),
        (
            "U32 beyond i32",
            unsigned_bytes(&[4294967295], 4, "U32"),
            "tensor `a`: element 0: 4294967295 is outside the i32 range",
        ),
        (
            "U64 beyond i64",
            unsigned_bytes(&[u64::MAX], 8, "U64"),
            "tensor `a`: element 0: 18446744073709551615 is outside the i32 range",
        ),
        (
            "BOOL byte 2",
            file(r#"{"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#, &[0, 1, 2]),
            "tensor `m`: element 2: byte 2 is not a boolean (0 or 1)",
        ),
    ]);
}

/// A one-tensor file `a` of unsigned `values`, `width` bytes each, as `dtype`.
fn unsigned_bytes(values: &[u64], width: usize, dtype: &str) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()[..width].to_vec()).collect();
    let h = format!(
        r#"{{"a":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[0,{}]}}}}"#,
        values.len(),
        data.len()
    );
    file(&h, &data)
}

#[test]
fn files_written_before_rumus_used_the_safetensors_crate_still_load() {
    // `net.save` of rumus 16fb9e2 (its own writer: tensors in name order): a `linear(x, 1)`
    // model after one Adam step. The format did not change, so nothing needs converting.
    let bytes = include_bytes!("../fixtures/rumus_before_safetensors_crate.safetensors");
    let c = from_bytes(bytes).unwrap();
    let names: Vec<&str> = c.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "optim.m.out.bias",
            "optim.m.out.weight",
            "optim.step",
            "optim.v.out.bias",
            "optim.v.out.weight",
            "out.bias",
            "out.weight"
        ]
    );
    assert_eq!(c.metadata, meta(&[("format", "rumus"), ("step", "1")]));
    assert_eq!(c.get("optim.step").unwrap().as_f32().unwrap(), &[1.0]);
    // Written again by the crate, it reads back the same.
    let again = to_bytes(&refs(&c.tensors), &c.metadata).unwrap();
    assert_eq!(from_bytes(&again).unwrap(), c);
}

#[test]
fn check_against_reports_every_difference_by_name() {
    let w = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let idx = Tensor::zeros(&[4], DType::I32).unwrap();
    let extra = Tensor::scalar(0.0);
    let bytes = to_bytes(&[("w", &w), ("idx", &idx), ("extra", &extra)], &BTreeMap::new()).unwrap();
    let c = from_bytes(&bytes).unwrap();
    check_against(
        &c,
        &[("w", &[2, 3], DType::F32), ("idx", &[4], DType::I32), ("extra", &[], DType::F32)],
    )
    .unwrap();
    let e = check_against(
        &c,
        &[
            ("w", &[3, 2], DType::F32),
            ("idx", &[4], DType::F32),
            ("b", &[3], DType::F32),
            ("c", &[1], DType::F32),
        ],
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Checkpoint);
    assert_eq!(
        e.message,
        "checkpoint does not match the model: missing `b`, `c`; unexpected `extra`; \
         `w` is f32 [2, 3], expected f32 [3, 2]; `idx` is i32 [4], expected f32 [4]"
    );
}

#[test]
fn loads_a_file_written_by_the_reference_implementation() {
    // safetensors 0.8.0: `save({"b": int32 [5, -1], "a": float32 [1, -0], "z": float32 zeros
    // (0, 3)}, metadata={"format": "pt"})`. It orders tensors by dtype, then name.
    let hex = "c8000000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c\
               2261223a7b226474797065223a22463332222c227368617065223a5b325d2c22646174615f6f6666\
               73657473223a5b302c385d7d2c227a223a7b226474797065223a22463332222c227368617065223a\
               5b302c335d2c22646174615f6f666673657473223a5b382c385d7d2c2262223a7b22647479706522\
               3a22493332222c227368617065223a5b325d2c22646174615f6f666673657473223a5b382c31365d\
               7d7d2020202020200000803f0000008005000000ffffffff";
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let c = from_bytes(&bytes).unwrap();
    let names: Vec<&str> = c.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "z", "b"]);
    assert_eq!(c.get("a").unwrap().to_le_bytes(), [0, 0, 0x80, 0x3f, 0, 0, 0, 0x80]);
    assert_eq!(c.get("z").unwrap().shape(), &[0, 3]);
    assert_eq!(c.get("b").unwrap().as_i32().unwrap(), &[5, -1]);
    assert_eq!(c.metadata, meta(&[("format", "pt")]));
}

/// A one-tensor file of `dtype` holding `raw` as a tensor of shape `[n]`.
fn one(dtype: &str, n: usize, raw: &[u8]) -> Vec<u8> {
    let header =
        format!(r#"{{"t":{{"dtype":"{dtype}","shape":[{n}],"data_offsets":[0,{}]}}}}"#, raw.len());
    file(&header, raw)
}

#[test]
fn f16_bf16_and_f64_tensors_load_as_f32() {
    let f16 = |bits: &[u16]| bits.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
    let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let cases: Vec<(&str, Vec<u8>, Vec<f32>)> = vec![
        (
            // 1, -2, 0.5, the smallest subnormal (2^-24), the largest (65504), -0, infinity.
            "F16",
            f16(&[0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff, 0x8000, 0x7c00]),
            vec![1.0, -2.0, 0.5, 5.960_464_5e-8, 65504.0, -0.0, f32::INFINITY],
        ),
        (
            // 1, -2, 3.140625, the largest (about 3.39e38), the smallest subnormal (2^-133).
            "BF16",
            f16(&[0x3f80, 0xc000, 0x4049, 0x7f7f, 0x0001]),
            vec![1.0, -2.0, 3.140_625, f32::from_bits(0x7f7f_0000), f32::from_bits(0x0001_0000)],
        ),
        (
            // Rounded to the nearest f32; below f32's range rounds to zero, as every float does.
            "F64",
            f64s(&[1.0, -2.5, 0.1, 1e-50, f64::NEG_INFINITY, f32::MAX as f64]),
            vec![1.0, -2.5, 0.1, 0.0, f32::NEG_INFINITY, f32::MAX],
        ),
    ];
    for (dtype, raw, expected) in cases {
        let width = if dtype == "F64" { 8 } else { 2 };
        let c = from_bytes(&one(dtype, raw.len() / width, &raw)).unwrap();
        let t = c.get("t").unwrap();
        assert_eq!(t.dtype(), DType::F32, "{dtype}");
        let bits: Vec<u32> = t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect();
        let want: Vec<u32> = expected.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, want, "{dtype}");
    }
    // NaN stays NaN (a checkpoint is data; a model decides what it accepts).
    for (dtype, raw) in [("F16", vec![0x00, 0x7e]), ("BF16", vec![0xc0, 0x7f])] {
        assert!(from_bytes(&one(dtype, 1, &raw)).unwrap().get("t").unwrap().as_f32().unwrap()[0]
            .is_nan());
    }
    assert!(from_bytes(&one("F64", 1, &f64s(&[f64::NAN])))
        .unwrap()
        .get("t")
        .unwrap()
        .as_f32()
        .unwrap()[0]
        .is_nan());
}

#[test]
fn converted_dtypes_are_checked_like_the_others() {
    let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    check(&[
        (
            "an F64 value beyond f32's range",
            one("F64", 3, &f64s(&[0.0, 1.0, -1e300])),
            "tensor `t`: element 2: -1e300 is outside the range of f32 (about ±3.4e38)",
        ),
        (
            "F16 data one byte short",
            file(r#"{"t":{"dtype":"F16","shape":[2],"data_offsets":[0,3]}}"#, &[0; 3]),
            "tensor `t`: shape [2] of F16 needs 4 bytes, data_offsets [0, 3] hold 3",
        ),
        (
            "BF16 read as if 4 bytes wide",
            file(r#"{"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]),
            "tensor `t`: shape [2] of BF16 needs 4 bytes, data_offsets [0, 8] hold 8",
        ),
        (
            "F64 with the element count of an F32",
            file(r#"{"t":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]),
            "tensor `t`: shape [2] of F64 needs 16 bytes, data_offsets [0, 8] hold 8",
        ),
        (
            "F64 with 2^40 elements",
            file(r#"{"t":{"dtype":"F64","shape":[1099511627777],"data_offsets":[0,8]}}"#, &[0; 8]),
            "tensor `t`: shape [1099511627777] has more than 2^40 elements, the most one value may hold",
        ),
    ]);
}
