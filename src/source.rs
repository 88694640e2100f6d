//! Source texts and positions in them.
//!
//! A [`Source`] is a named text (a file, a REPL input, a host's `eval` string); a [`Span`] is a
//! byte range into one. An error carries both together (see [`crate::error::Error::in_source`]),
//! so a position is never rendered against the wrong text. Source files are read, checked, by
//! [`crate::files::read_source`]. This module imports nothing from the crate: the error type
//! builds on it.

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
