//! Source texts and positions in them.
//!
//! A [`Source`] is a named text (a file, a REPL input, a host's `eval` string); a [`Span`] is a
//! byte range into one. An error carries both together (see [`crate::error::Error::in_source`]),
//! so a position is never rendered against the wrong text. [`Source::read`] is the one way source files (scripts, model files) are read:
//! with a size limit, so `/dev/zero` is an error and not a hang, UTF-8 checked with the line and
//! column of the first bad byte, and byte-order marks named (a UTF-8 one is skipped, as rustc
//! and Python do).

use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Largest source file read, in bytes. Data belongs in data files (`csv`, `text`).
pub const MAX_SOURCE_FILE_BYTES: u64 = 16 << 20;

/// A byte range into a source text. [`Span::NONE`] (the default) means "no position", which is
/// what graphs built from Rust carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Default for Span {
    fn default() -> Span {
        Span::NONE
    }
}

impl Span {
    /// No position.
    pub const NONE: Span = Span { start: u32::MAX, end: u32::MAX };

    /// The bytes `start..end` (offsets past `u32::MAX` saturate).
    pub fn new(start: usize, end: usize) -> Span {
        Span { start: start.min(u32::MAX as usize) as u32, end: end.min(u32::MAX as usize) as u32 }
    }

    /// Whether this is [`Span::NONE`].
    pub fn is_none(self) -> bool {
        self == Span::NONE
    }

    /// The smallest span covering both.
    pub fn join(self, other: Span) -> Span {
        if self.is_none() {
            return other;
        }
        if other.is_none() {
            return self;
        }
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// A named source text that spans point into (a model file, a script, a REPL input).
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    /// What positions are reported against: a path, `<repl:3>`, `<eval:1>`.
    pub name: String,
    pub text: String,
}

impl Source {
    /// A source named `name`.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Arc<Source> {
        Arc::new(Source { name: name.into(), text: text.into() })
    }

    /// Read a source file, named by its path as given. Refuses files over 16 MiB
    /// (`MAX_SOURCE_FILE_BYTES`, before reading more than that), text that is not UTF-8 (at the
    /// line and column of the first bad byte), and UTF-16/32 byte-order marks; skips a UTF-8
    /// byte-order mark.
    pub fn read(path: &Path) -> Result<Arc<Source>> {
        let name = path.display().to_string();
        if name.is_empty() {
            return Err(crate::err!(Io, "the file name is empty"));
        }
        let io = |e: std::io::Error| Error::io(&name, e);
        let file = std::fs::File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.is_dir() {
            return Err(crate::err!(Io, "{name}: is a folder, not a source file"));
        }
        let mut bytes = Vec::new();
        file.take(MAX_SOURCE_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
        if bytes.len() as u64 > MAX_SOURCE_FILE_BYTES {
            return Err(crate::err!(
                Io,
                "{name}: a source file may have at most {MAX_SOURCE_FILE_BYTES} bytes; this one has more"
            ));
        }
        Source::from_bytes(name, bytes)
    }

    /// A source from raw bytes (a file's contents), checked as [`Source::read`] checks them.
    pub fn from_bytes(name: String, bytes: Vec<u8>) -> Result<Arc<Source>> {
        let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
            Some(rest) => rest.to_vec(),
            None => bytes,
        };
        let bom = match bytes.as_slice() {
            [0xFF, 0xFE, 0, 0, ..] => Some("UTF-32 little-endian"),
            [0, 0, 0xFE, 0xFF, ..] => Some("UTF-32 big-endian"),
            [0xFF, 0xFE, ..] => Some("UTF-16 little-endian"),
            [0xFE, 0xFF, ..] => Some("UTF-16 big-endian"),
            _ => None,
        };
        if let Some(encoding) = bom {
            let e = crate::err!(
                Parse,
                "the file starts with a {encoding} byte-order mark; rumus reads UTF-8: save it as UTF-8"
            );
            let src = Source::new(name, String::from_utf8_lossy(&bytes).into_owned());
            return Err(e.at(Span::new(0, 0)).in_source(&src));
        }
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Source::new(name, text)),
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let byte = e.as_bytes()[at];
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                let src = Source::new(name, text);
                let e = crate::err!(
                    Parse,
                    "invalid UTF-8 (byte 0x{byte:02X}): source files must be UTF-8 text"
                );
                Err(e.at(Span::new(at, at + 1)).in_source(&src))
            }
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = self.text[line_start..offset].chars().count() + 1;
        (line, col)
    }

    /// The text of the line that holds `offset`, without its newline.
    pub fn line_text(&self, offset: usize) -> &str {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let end = self.text[offset..].find('\n').map_or(self.text.len(), |i| offset + i);
        self.text[start..end].trim_end_matches('\r')
    }
}

/// The largest char boundary of `s` at or below `i` (`i` at most `s.len()`).
pub fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` as a source file: its text, or its error rendered.
    fn check(bytes: &[u8], expected: &str) {
        let got = match Source::from_bytes("f.rms".into(), bytes.to_vec()) {
            Ok(s) => s.text.clone(),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn source_bytes_are_checked() {
        check(b"print(1);\n", "print(1);\n");
        // A UTF-8 byte-order mark is skipped; others are named.
        check(b"\xEF\xBB\xBFprint(1);", "print(1);");
        check(
            b"\xFF\xFEp\x00",
            "f.rms:1:1: the file starts with a UTF-16 little-endian byte-order mark; rumus reads UTF-8: save it as UTF-8\n    \u{FFFD}\u{FFFD}p\\0\n    ^",
        );
        check(
            b"\xFE\xFF\x00p",
            "f.rms:1:1: the file starts with a UTF-16 big-endian byte-order mark; rumus reads UTF-8: save it as UTF-8\n    \u{FFFD}\u{FFFD}\\0p\n    ^",
        );
        // The first bad byte, by line and column.
        check(
            b"print(1);\nlet a = \"\xFF\";\n",
            "f.rms:2:10: invalid UTF-8 (byte 0xFF): source files must be UTF-8 text\n    let a = \"\u{FFFD}\";\n             ^",
        );
        check(
            b"let \xC3\xA9 = \xC3;",
            "f.rms:1:9: invalid UTF-8 (byte 0xC3): source files must be UTF-8 text\n    let \u{e9} = \u{FFFD};\n            ^",
        );
    }

    #[test]
    fn reading_dev_zero_is_a_size_error() {
        let e = Source::read(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: a source file may have at most 16777216 bytes; this one has more"
        );
        let e = Source::read(Path::new("src")).unwrap_err();
        assert_eq!(e.to_string(), "src: is a folder, not a source file");
        let e = Source::read(Path::new("")).unwrap_err();
        assert_eq!(e.to_string(), "the file name is empty");
    }
}
