//! The lexical skeleton of code text: which bytes are code and which are comments or string
//! literals, and how deep the brackets are. One scanner serves every place that reads text
//! without parsing it: the model parser's pre-scan, the `.rms` splitter, and the REPL's "is this
//! input complete" check.
//!
//! It knows `//` and `/* */` comments (not nested, as in rhai and the model language) and
//! string literals in `"`, `'` or back-ticks with backslash escapes. The model language has no
//! strings; a quote there is a syntax error the parser reports at the quote, so skipping past it
//! here changes nothing the user sees.

/// What a [`Token`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// One byte of code.
    Code(u8),
    /// A `//` comment, up to the line break (which is code).
    LineComment,
    /// A `/* */` comment; `closed` is false when the text ends first.
    BlockComment { closed: bool },
    /// A string literal; `closed` is false when the text ends first.
    Str { quote: u8, closed: bool },
}

/// A piece of text and its byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub piece: Piece,
    pub start: usize,
    pub end: usize,
}

/// Walks a text token by token (see [`Piece`]), counting the brackets (`(`, `[`, `{` against
/// `)`, `]`, `}`, of any kind) that code bytes open and close.
pub struct Scanner<'t> {
    text: &'t [u8],
    pos: usize,
    depth: usize,
    unmatched: usize,
}

impl<'t> Scanner<'t> {
    /// A scanner at the start of `text`.
    pub fn new(text: &'t str) -> Scanner<'t> {
        Scanner { text: text.as_bytes(), pos: 0, depth: 0, unmatched: 0 }
    }

    /// Brackets open after the tokens returned so far.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Closing brackets seen so far with no bracket open to close.
    pub fn unmatched(&self) -> usize {
        self.unmatched
    }

    fn find_from(&self, from: usize, pred: impl Fn(&[u8]) -> bool) -> Option<usize> {
        (from..self.text.len()).find(|&i| pred(&self.text[i..]))
    }
}

impl Iterator for Scanner<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let b = self.text;
        let start = self.pos;
        let c = *b.get(start)?;
        let (piece, end) = match (c, b.get(start + 1)) {
            (b'/', Some(b'/')) => {
                (Piece::LineComment, self.find_from(start, |r| r[0] == b'\n').unwrap_or(b.len()))
            }
            (b'/', Some(b'*')) => match self.find_from(start + 2, |r| r.starts_with(b"*/")) {
                Some(e) => (Piece::BlockComment { closed: true }, e + 2),
                None => (Piece::BlockComment { closed: false }, b.len()),
            },
            (b'"' | b'\'' | b'`', _) => {
                let mut i = start + 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                let closed = i < b.len();
                (Piece::Str { quote: c, closed }, if closed { i + 1 } else { b.len() })
            }
            _ => {
                match c {
                    b'(' | b'[' | b'{' => self.depth += 1,
                    b')' | b']' | b'}' if self.depth == 0 => self.unmatched += 1,
                    b')' | b']' | b'}' => self.depth -= 1,
                    _ => {}
                }
                (Piece::Code(c), start + 1)
            }
        };
        self.pos = end;
        Some(Token { piece, start, end })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tokens of `text` other than single code bytes, as `kind text`, then the final depth.
    fn render(text: &str) -> String {
        let mut sc = Scanner::new(text);
        let mut out = Vec::new();
        for t in sc.by_ref() {
            let s = text.get(t.start..t.end).unwrap_or("");
            match t.piece {
                Piece::Code(_) => {}
                Piece::LineComment => out.push(format!("line {s:?}")),
                Piece::BlockComment { closed } => out.push(format!("block {closed} {s:?}")),
                Piece::Str { closed, .. } => out.push(format!("str {closed} {s:?}")),
            }
        }
        out.push(format!("depth {} unmatched {}", sc.depth(), sc.unmatched()));
        out.join("; ")
    }

    #[test]
    fn tokens_and_depth() {
        let cases: &[(&str, &str)] = &[
            ("f(x[1], {a})", "depth 0 unmatched 0"),
            ("f(x[1", "depth 2 unmatched 0"),
            (") (", "depth 1 unmatched 1"),
            ("a // ( b\nc", "line \"// ( b\"; depth 0 unmatched 0"),
            ("a /* ( */ b", "block true \"/* ( */\"; depth 0 unmatched 0"),
            ("a /* ( ", "block false \"/* ( \"; depth 0 unmatched 0"),
            ("/*/ (", "block false \"/*/ (\"; depth 0 unmatched 0"),
            (
                "\"(\" '[' `{`",
                "str true \"\\\"(\\\"\"; str true \"'['\"; str true \"`{`\"; depth 0 unmatched 0",
            ),
            ("\"a\\\"(\" (", "str true \"\\\"a\\\\\\\"(\\\"\"; depth 1 unmatched 0"),
            ("`a ( \n", "str false \"`a ( \\n\"; depth 0 unmatched 0"),
            ("\"a\\", "str false \"\\\"a\\\\\"; depth 0 unmatched 0"),
            (
                "\"// (\" /* \" */ (",
                "str true \"\\\"// (\\\"\"; block true \"/* \\\" */\"; depth 1 unmatched 0",
            ),
            ("é(", "depth 1 unmatched 0"),
        ];
        for (text, expected) in cases {
            assert_eq!(render(text), *expected, "text: {text:?}");
        }
    }
}
