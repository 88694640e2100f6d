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
//!
//! Rendering escapes control and invisible characters and clips long messages and lines, since
//! messages quote names and fields read from files; a span and its source are attached together
//! (see [`Error::in_source`]), so a position is never shown against the wrong text.

pub use crate::source::{Source, Span};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use unicode_width::UnicodeWidthStr;

/// Longest message shown, in characters; the rest is cut (messages may quote file contents).
pub const MAX_MESSAGE_CHARS: usize = 500;
/// Longest quoted fragment (text between backquotes) kept in a message, in characters: a name
/// or field quoted from a hostile file is cut there, so the rest of the message survives.
pub const MAX_QUOTE_CHARS: usize = 100;
/// Widest context line shown under a message, in columns; longer lines show a window around
/// the position.
pub const MAX_CONTEXT_COLUMNS: usize = 200;

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
    /// The evaluation was stopped from outside: Ctrl-C, or the host's [`Interrupt`].
    ///
    /// [`Interrupt`]: crate::script::Interrupt
    Interrupted,
    /// The GPU device refused something (out of memory, limits, lost device).
    Device,
    /// A checkpoint file is malformed or does not match the model.
    Checkpoint,
    /// A data file's content is not what its reader takes (a CSV field that is not a number, a
    /// bad class label, a row of the wrong length, no rows, a damaged gzip stream, text that is
    /// not UTF-8, a metrics log line that is not JSON): the run's input is wrong, as a model's
    /// or a checkpoint's can be, not the command line (exit code 1, where I/O is 2).
    Data,
    /// Reading or writing a file failed.
    Io,
    /// Bad command-line usage.
    Usage,
    /// A value given to a function or option is outside what it accepts (a learning rate, a
    /// probability, a batch size, a device name): the call is well-formed, the value is not.
    InvalidArgument,
}

/// The error type of every rumus API.
#[derive(Clone, Debug)]
pub struct Error {
    /// What went wrong, coarsely (decides the CLI exit code).
    pub kind: ErrorKind,
    /// The message: lower case, no trailing period, stored escaped and clipped (see
    /// [`Error::new`]).
    pub message: String,
    /// Where in `source` the mistake is, when it has a place in source text.
    pub span: Option<Span>,
    /// The source text `span` points into (only ever set together with `span`).
    pub source: Option<Arc<Source>>,
    /// The operating system's error behind an `Io` error, kept so a caller can tell a closed
    /// pipe from a full disk by [`std::io::ErrorKind`] rather than by the message's words.
    pub cause: Option<Arc<std::io::Error>>,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` without a position. The message is stored clean: control and
    /// invisible characters escaped ([`escape`]), each quoted fragment cut to
    /// [`MAX_QUOTE_CHARS`] and the whole to [`MAX_MESSAGE_CHARS`], so a host that prints
    /// `message` itself is as safe as one that prints the error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: tidy(&message.into()), span: None, source: None, cause: None }
    }

    /// A `Shape` error.
    pub fn shape(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Shape, message)
    }

    /// An `Invariant` error (a bug in rumus, reported instead of panicking).
    pub fn invariant(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invariant, message)
    }

    /// An `Io` error: `path: err`, keeping `err` as its [`cause`](Error::cause).
    pub fn io(path: impl fmt::Display, err: std::io::Error) -> Error {
        let mut e = Error::new(ErrorKind::Io, format!("{path}: {err}"));
        e.cause = Some(Arc::new(err));
        e
    }

    /// The kind of the operating system's error behind this one, if there is one.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        self.cause.as_ref().map(|c| c.kind())
    }

    /// Attach a position, unless the error already has one (the innermost position wins). The
    /// span means nothing until [`Error::in_source`] names the text it points into.
    pub fn at(mut self, span: Span) -> Error {
        if self.span.is_none_or(|s| s.is_none()) && !span.is_none() {
            self.span = Some(span);
            self.source = None;
        }
        self
    }

    /// Name the source text that this error's span points into. Only a span without a source
    /// takes one: a source never comes without its span, so a position found in one text is
    /// never shown against another.
    pub fn in_source(mut self, source: &Arc<Source>) -> Error {
        if self.source.is_none() && self.span.is_some_and(|s| !s.is_none()) {
            self.source = Some(source.clone());
        }
        self
    }

    /// The span and the source it points into, when the error has a position.
    pub fn position(&self) -> Option<(Span, &Arc<Source>)> {
        match (self.span, &self.source) {
            (Some(span), Some(source)) if !span.is_none() => Some((span, source)),
            _ => None,
        }
    }

    /// Drop the position (a span whose source is unknown is no position at all).
    pub fn without_position(mut self) -> Error {
        self.span = None;
        self.source = None;
        self
    }

    /// `file:line:col` of this error, when it has a position in a source.
    pub fn location(&self) -> Option<(String, usize, usize)> {
        let (span, source) = self.position()?;
        let (line, col) = source.line_col(span.start as usize);
        Some((source.name.clone(), line, col))
    }
}

/// Renders `message`, or `file:line:col: message` followed by the line and a caret under the
/// culprit. Everything printed is escaped ([`escape`]) and clipped ([`MAX_MESSAGE_CHARS`],
/// [`MAX_CONTEXT_COLUMNS`]): names, fields and lines may come from hostile files.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = clean(&self.message, MAX_MESSAGE_CHARS);
        let Some((span, source)) = self.position() else {
            return write!(f, "{message}");
        };
        let start = span.start as usize;
        let (line, col) = source.line_col(start);
        let name = clean(&source.name, MAX_CONTEXT_COLUMNS);
        writeln!(f, "{name}:{line}:{col}: {message}")?;
        let span_chars = source
            .text
            .get(start..(span.end as usize).min(source.text.len()))
            .map_or(1, |s| s.split('\n').next().unwrap_or("").chars().count());
        let (text, pad, width) = context(source.line_text(start), col - 1, span_chars);
        write!(f, "    {text}\n    {pad}{}", "^".repeat(width))
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn std::error::Error + 'static))
    }
}

/// Whether `c` is shown escaped: control characters, and the invisible ones that can make text
/// read differently from what it is (zero-width, bidirectional overrides, byte-order mark).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}')
        || matches!(c, '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// The environment variable `name`: `None` when unset, an error naming it when its value is
/// not UTF-8 text (`std::env::var` would make that look unset).
pub fn env_text(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(crate::err!(Usage, "{name}: {v:?} is not UTF-8 text"))
        }
    }
}

/// The value the environment variable `name` chooses among `choices` (each a word and its
/// value, at least one; the first is the default, taken when the variable is unset or blank).
/// Any other value is a usage error that lists the words, so a mistyped one never passes for
/// the default.
pub fn env_choice<T: Copy>(name: &str, choices: &[(&str, T)]) -> Result<T> {
    choose(name, env_text(name)?.as_deref(), choices)
}

/// [`env_choice`] of the value `value`.
pub(crate) fn choose<T: Copy>(name: &str, value: Option<&str>, choices: &[(&str, T)]) -> Result<T> {
    let v = value.map_or("", str::trim);
    if v.is_empty() {
        return Ok(choices[0].1);
    }
    if let Some(&(_, t)) = choices.iter().find(|&&(word, _)| word == v) {
        return Ok(t);
    }
    let mut words: Vec<String> = choices.iter().map(|(word, _)| format!("`{word}`")).collect();
    words[0].push_str(" (the default)");
    let list = match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => words.concat(),
    };
    Err(crate::err!(Usage, "{name}: `{}` is not {list}", escape(v)))
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

/// `s` with every control or invisible character written as a Rust escape (`\n`, `\u{1b}`), so
/// that text from a file cannot move the cursor, recolour the terminal or forge a line.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| if needs_escape(c) { c.escape_debug().to_string() } else { c.to_string() })
            .collect(),
    )
}

/// `s` escaped and cut to at most `max` characters in all, saying how many more there were.
/// Cleaning a clean string changes nothing.
fn clean(s: &str, max: usize) -> String {
    let s = escape(s);
    let n = s.chars().count();
    if n <= max {
        return s.into_owned();
    }
    let keep = max.saturating_sub(format!("… ({n} more characters)").chars().count());
    let cut = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
    format!("{}… ({} more characters)", &s[..cut], n - keep)
}

/// A message as stored: escaped, quoted fragments and then the whole clipped.
fn tidy(message: &str) -> String {
    let parts: Vec<String> = message
        .split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { clean(part, MAX_QUOTE_CHARS) } else { part.to_string() })
        .collect();
    clean(&parts.join("`"), MAX_MESSAGE_CHARS)
}

/// Columns a tab in a context line advances to: the next multiple of this, from the line's
/// start (as rustc shows a tab: four columns).
const TAB_STOP: usize = 4;

/// The context line as shown (escaped, tabs expanded to spaces, a window of at most
/// [`MAX_CONTEXT_COLUMNS`] columns around the culprit), the padding that puts the caret under
/// character `col0`, and the caret's width for `span_chars` characters. Padding and carets
/// follow the terminal columns the text takes (`unicode-width`: an East Asian wide character
/// or an emoji takes two, a combining mark none), so the caret sits under the culprit
/// whatever comes before it.
fn context(line: &str, col0: usize, span_chars: usize) -> (String, String, usize) {
    let mut pieces: Vec<String> = Vec::new();
    let mut column = 0;
    for c in line.chars() {
        let piece = if c == '\t' {
            " ".repeat(TAB_STOP - column % TAB_STOP)
        } else if needs_escape(c) {
            c.escape_debug().to_string()
        } else {
            c.into()
        };
        column += piece.width();
        pieces.push(piece);
    }
    let width = |p: &String| p.width();
    let col0 = col0.min(pieces.len());
    // Up to a third of the window before the culprit, then as much as fits after it.
    let mut lo = col0;
    let mut before = 0;
    while lo > 0 && before + width(&pieces[lo - 1]) <= MAX_CONTEXT_COLUMNS / 3 {
        lo -= 1;
        before += width(&pieces[lo]);
    }
    let mut hi = lo;
    let mut used = 0;
    while hi < pieces.len() && used + width(&pieces[hi]) <= MAX_CONTEXT_COLUMNS {
        used += width(&pieces[hi]);
        hi += 1;
    }
    let hi = hi.max((col0 + 1).min(pieces.len()));
    let mut shown = String::new();
    if lo > 0 {
        shown.push('…');
    }
    shown.extend(pieces[lo..col0].iter().map(String::as_str));
    // The columns before the culprit, and those of the text up to its end (a string's width,
    // so an emoji sequence counts as the terminal shows it).
    let pad = shown.width();
    let mut text = shown.clone();
    text.extend(pieces[col0..hi].iter().take(span_chars).map(String::as_str));
    let carets = text.width().saturating_sub(pad);
    text.extend(pieces[col0..hi].iter().skip(span_chars).map(String::as_str));
    if hi < pieces.len() {
        text.push('…');
    }
    (text, " ".repeat(pad), carets.max(1))
}

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

    /// `text` as source `s`, an error at bytes `start..end` of it, rendered.
    fn check(text: &str, start: usize, end: usize, expected: &str) {
        let src = Source::new("s", text);
        let e = err!(Parse, "bad").at(Span::new(start, end)).in_source(&src);
        assert_eq!(e.to_string(), expected, "{text:?}");
    }

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
    fn context_lines_are_escaped_and_clipped() {
        check("abc", 3, 3, "s:1:4: bad\n    abc\n       ^");
        // A tab shows as the spaces to the next stop of 4 columns, the caret under what follows.
        check("a\tb", 2, 3, "s:1:3: bad\n    a   b\n        ^");
        // A terminal escape before the culprit widens the padding by its escaped width.
        check("\u{1b}[2Jx", 4, 5, "s:1:5: bad\n    \\u{1b}[2Jx\n             ^");
        check("\u{202e}ab\r\n", 3, 5, "s:1:2: bad\n    \\u{202e}ab\n            ^^");
        check("é→x y", 5, 6, "s:1:3: bad\n    é→x y\n      ^");
        // A long line shows a window around the culprit.
        let long = format!("{}X{}", "a".repeat(1000), "b".repeat(1000));
        let expected = format!(
            "s:1:1001: bad\n    …{}X{}…\n     {}^",
            "a".repeat(66),
            "b".repeat(133),
            " ".repeat(66)
        );
        check(&long, 1000, 1001, &expected);
        let short_tail = format!("{}X", "a".repeat(1000));
        let expected = format!("s:1:1001: bad\n    …{}X\n     {}^", "a".repeat(66), " ".repeat(66));
        check(&short_tail, 1000, 1001, &expected);
    }

    /// The caret follows the columns a terminal gives the text before it: two for an East
    /// Asian wide character or an emoji, none for a combining mark, a tab to its next stop;
    /// a wide culprit gets two carets. It sat one column left per wide character before it.
    #[test]
    fn carets_follow_display_width() {
        check("日本x", 6, 7, "s:1:3: bad\n    日本x\n        ^");
        check("😀 x", 5, 6, "s:1:3: bad\n    😀 x\n       ^");
        check("e\u{301}x", 3, 4, "s:1:3: bad\n    e\u{301}x\n     ^");
        check("ab本c", 2, 5, "s:1:3: bad\n    ab本c\n      ^^");
        check("\t日\tx", 5, 6, "s:1:4: bad\n        日  x\n            ^");
        // A line of wide characters is windowed by its columns: 66 before the culprit, 200 in
        // all (the ellipses aside).
        let wide = format!("{}X{}", "本".repeat(500), "字".repeat(500));
        let expected = format!(
            "s:1:501: bad\n    …{}X{}…\n     {}^",
            "本".repeat(33),
            "字".repeat(66),
            " ".repeat(66)
        );
        check(&wide, 1500, 1501, &expected);
    }

    #[test]
    fn messages_and_names_are_escaped_and_clipped() {
        let e = err!(Checkpoint, "unknown tensor `a\u{1b}]0;owned\u{7}\nfake.rms:1:1: b`");
        assert_eq!(e.to_string(), "unknown tensor `a\\u{1b}]0;owned\\u{7}\\nfake.rms:1:1: b`");
        let e = err!(Script, "{}", "x".repeat(600));
        assert_eq!(e.to_string(), format!("{}… (123 more characters)", "x".repeat(477)));
        // Stored clean, so `message` itself is safe to print; a long quote is cut, not the rest.
        let e = err!(Io, "f.csv:3: column 2: `{}\0` is not a number", "9".repeat(5000));
        let quote = format!("{}… (4926 more characters)", "9".repeat(76));
        assert_eq!(e.message, format!("f.csv:3: column 2: `{quote}` is not a number"));
        let src = Source::new("a\rb.rms", "x");
        let e = err!(Parse, "bad").at(Span::new(0, 1)).in_source(&src);
        assert_eq!(e.to_string(), "a\\rb.rms:1:1: bad\n    x\n    ^");
    }

    #[test]
    fn io_errors_keep_their_cause() {
        let e = Error::io("out.txt", std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(e.io_kind(), Some(std::io::ErrorKind::BrokenPipe));
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(err!(Io, "no cause").io_kind(), None);
    }

    #[test]
    fn a_source_comes_only_with_its_span() {
        let (a, b) = (Source::new("a", "first text"), Source::new("b", "second"));
        // No span yet: the source is not taken, so a later span cannot be paired with it.
        let e = err!(Name, "no such hyperparameter").in_source(&a);
        assert!(e.position().is_none());
        let e = e.at(Span::new(1, 2)).in_source(&b);
        assert_eq!(e.location(), Some(("b".to_string(), 1, 2)));
        // The innermost position wins.
        let e = e.at(Span::new(0, 1)).in_source(&a);
        assert_eq!(e.location(), Some(("b".to_string(), 1, 2)));
    }

    #[test]
    fn without_position_is_just_the_message() {
        assert_eq!(err!(Shape, "add: shapes [2] and [3]").to_string(), "add: shapes [2] and [3]");
    }
}
