//! The invariants every error must keep, whatever the input: a kind other than `Invariant`
//! (that kind means rumus caught its own bug), a non-empty message of bounded length without raw
//! control characters, a span inside the source it points into, and a rendering (`Display`)
//! of bounded lines without raw control characters.

use rumus::{Error, ErrorKind};

/// Longest message accepted, in characters.
pub const MAX_MESSAGE_CHARS: usize = 1_000;
/// Longest rendered line (the `file:line:col: message` line or the quoted source line).
pub const MAX_LINE_CHARS: usize = 1_000;

/// A broken invariant: a short stable name (failures are grouped by it) and the details.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub invariant: String,
    pub detail: String,
}

impl Failure {
    pub fn new(invariant: &str, detail: impl Into<String>) -> Failure {
        Failure { invariant: invariant.to_string(), detail: detail.into() }
    }
}

/// Check an error that an entry point returned.
pub fn error(e: &Error) -> Result<(), Failure> {
    let short = clip(&e.message, 200);
    if e.kind == ErrorKind::Invariant {
        return Err(Failure::new("invariant-error", short));
    }
    if e.message.trim().is_empty() {
        return Err(Failure::new("empty-message", format!("{:?} error", e.kind)));
    }
    let n = e.message.chars().count();
    if n > MAX_MESSAGE_CHARS {
        return Err(Failure::new("message-too-long", format!("{n} characters: {short}")));
    }
    if let Some(c) = e.message.chars().find(|&c| is_raw_control(c)) {
        return Err(Failure::new("control-char-in-message", format!("{c:?} in: {short}")));
    }
    if let Some(span) = e.span.filter(|s| !s.is_none()) {
        let Some(src) = &e.source else {
            return Err(Failure::new("span-without-source", short));
        };
        let (a, b) = (span.start as usize, span.end as usize);
        if a > b || b > src.text.len() || !src.text.is_char_boundary(a) {
            return Err(Failure::new(
                "span-outside-source",
                format!("{a}..{b} in {} bytes: {short}", src.text.len()),
            ));
        }
    }
    let rendered = e.to_string();
    for line in rendered.split('\n') {
        let n = line.chars().count();
        if n > MAX_LINE_CHARS {
            return Err(Failure::new("rendered-line-too-long", format!("{n} characters: {short}")));
        }
        if let Some(c) = line.chars().find(|&c| is_raw_control(c)) {
            return Err(Failure::new("control-char-in-rendering", format!("{c:?} in: {short}")));
        }
    }
    Ok(())
}

/// A control character (Unicode category Cc) other than tab and line feed.
pub fn is_raw_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// The first `n` characters of `s`, with `...` when clipped, control characters escaped.
pub fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).flat_map(char::escape_debug).collect();
    if s.chars().nth(n).is_some() {
        out.push_str("...");
    }
    out
}
