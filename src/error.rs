//! The one error type of rumus.
//!
//! Every fallible stage returns [`Error`]. An error carries a kind (which maps to the CLI's exit
//! code), a lower-case message, and, where the mistake has a place in source text, a [`Span`]
//! and the [`Source`] it points into. `Display` renders such an error as
//!
//! ```text
//! model.rms:3:9: unknown op `relux`
//!     h = relux(x)
//!         ^^^^^
//! ```

use std::fmt;
use std::sync::Arc;

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

    pub fn new(start: usize, end: usize) -> Span {
        Span { start: start.min(u32::MAX as usize) as u32, end: end.min(u32::MAX as usize) as u32 }
    }

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

/// A named source text that spans point into (a model file, a script, a REPL line).
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    pub name: String,
    pub text: String,
}

impl Source {
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Arc<Source> {
        Arc::new(Source { name: name.into(), text: text.into() })
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

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// What went wrong, coarsely; decides the CLI exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Syntax errors in the model language.
    Parse,
    /// Unknown names, duplicates, recursion, wrong arguments: everything the resolver rejects.
    Name,
    /// Shapes or dtypes that do not fit an op.
    Shape,
    /// A graph or plan that breaks an internal invariant (a bug in rumus, reported, not panicked).
    Invariant,
    /// An error raised while a script runs.
    Script,
    /// A sandbox or memory limit was hit.
    Limit,
    /// The GPU device refused something (out of memory, limits, lost device).
    Device,
    /// A checkpoint file is malformed or does not match the model.
    Checkpoint,
    /// Reading or writing a file failed.
    Io,
    /// Bad command-line usage.
    Usage,
}

/// The error type of every rumus API.
#[derive(Clone, Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub span: Option<Span>,
    pub source: Option<Arc<Source>>,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), span: None, source: None }
    }

    pub fn shape(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Shape, message)
    }

    pub fn invariant(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invariant, message)
    }

    pub fn io(path: impl fmt::Display, err: impl fmt::Display) -> Error {
        Error::new(ErrorKind::Io, format!("{path}: {err}"))
    }

    /// Attach a position, unless the error already has one (the innermost position wins).
    pub fn at(mut self, span: Span) -> Error {
        if self.span.is_none_or(|s| s.is_none()) && !span.is_none() {
            self.span = Some(span);
        }
        self
    }

    /// Attach the source text the span points into, unless one is already attached.
    pub fn in_source(mut self, source: &Arc<Source>) -> Error {
        if self.source.is_none() {
            self.source = Some(source.clone());
        }
        self
    }

    /// `file:line:col` of this error, when it has a position in a source.
    pub fn location(&self) -> Option<(String, usize, usize)> {
        let (span, source) = (self.span?, self.source.as_ref()?);
        let (line, col) = source.line_col(span.start as usize);
        Some((source.name.clone(), line, col))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Some(span), Some(source)) = (self.span, self.source.as_ref()) else {
            return write!(f, "{}", self.message);
        };
        let start = span.start as usize;
        let (line, col) = source.line_col(start);
        let text = source.line_text(start);
        writeln!(f, "{}:{}:{}: {}", source.name, line, col, self.message)?;
        // Caret under the culprit, clipped to the line it starts on; tabs kept so it lines up.
        let pad: String =
            text.chars().take(col - 1).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
        let span_chars = source
            .text
            .get(start..(span.end as usize).min(source.text.len()))
            .map_or(1, |s| s.split('\n').next().unwrap_or("").chars().count());
        let room = text.chars().count().saturating_sub(col - 1);
        let width = span_chars.min(room).max(1);
        write!(f, "    {}\n    {}{}", text, pad, "^".repeat(width))
    }
}

impl std::error::Error for Error {}

/// Build an [`Error`] of the given kind with `format!` arguments.
#[macro_export]
macro_rules! err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_file_line_col_and_caret() {
        let src = Source::new("m.rms", "model m(x: f32[2]) {\n    h = relux(x)\n}\n");
        let start = src.text.find("relux").unwrap();
        let e = err!(Name, "unknown op `relux`").at(Span::new(start, start + 5)).in_source(&src);
        assert_eq!(
            e.to_string(),
            "m.rms:2:9: unknown op `relux`\n        h = relux(x)\n            ^^^^^"
        );
    }

    #[test]
    fn span_at_end_of_text_renders() {
        let src = Source::new("s", "abc");
        let e = err!(Parse, "unexpected end of input").at(Span::new(3, 3)).in_source(&src);
        assert_eq!(e.to_string(), "s:1:4: unexpected end of input\n    abc\n       ^");
    }

    #[test]
    fn without_position_is_just_the_message() {
        assert_eq!(err!(Shape, "add: shapes [2] and [3]").to_string(), "add: shapes [2] and [3]");
    }
}
