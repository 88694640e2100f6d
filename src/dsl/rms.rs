//! Splitting a `.rms` script into model text and script text, in place.
//!
//! A `.rms` file is rhai code in which `model NAME(` and `block NAME(` definitions may stand at
//! top level. [`split`] returns two texts of the same length as the input: the model text keeps
//! the definitions and blanks everything else, the script text keeps everything else and blanks
//! the definitions (blanking replaces every character but line breaks with spaces). So a byte
//! offset, a line and a column mean the same place in the file, in both.

use super::scan::{Piece, Scanner};

/// The two halves of a `.rms` file, each as long as the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub model_text: String,
    pub script_text: String,
}

/// Split a `.rms` file into model text and script text. Never fails: an unterminated
/// definition runs to the end of the file, where the model parser reports it.
pub fn split(text: &str) -> Split {
    let ranges = definitions(text);
    let mut model = String::with_capacity(text.len());
    let mut script = String::with_capacity(text.len());
    let mut pos = 0;
    for (start, end) in ranges.iter().copied().chain(std::iter::once((text.len(), text.len()))) {
        script.push_str(&text[pos..start]);
        blank(&text[pos..start], &mut model);
        model.push_str(&text[start..end]);
        blank(&text[start..end], &mut script);
        pos = end;
    }
    Split { model_text: model, script_text: script }
}

fn blank(s: &str, out: &mut String) {
    // Keep byte offsets: a multi-byte character becomes as many spaces as it has bytes.
    for c in s.chars() {
        if c == '\n' {
            out.push('\n');
        } else {
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        }
    }
}

/// Byte ranges of the top-level `model`/`block` definitions: a definition starts where a
/// statement may start, outside any bracket, and ends at the brace that closes its body.
fn definitions(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut sc = Scanner::new(text);
    let mut at_stmt_start = true;
    // The start of the definition being read, and whether its body's `{` has been seen.
    let mut inside: Option<(usize, bool)> = None;
    // The end of the word being skipped.
    let mut word_end = 0;
    while let Some(t) = sc.next() {
        let c = match t.piece {
            Piece::Code(c) => c,
            Piece::Str { .. } => {
                at_stmt_start = false;
                continue;
            }
            Piece::LineComment | Piece::BlockComment { .. } => continue,
        };
        if let Some((start, opened)) = &mut inside {
            match c {
                b'{' => *opened = true,
                b'}' if *opened && sc.depth() == 0 => {
                    out.push((*start, t.end));
                    inside = None;
                }
                _ => {}
            }
            continue;
        }
        if t.start < word_end {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == b'_' {
            if sc.depth() == 0 && at_stmt_start && is_definition(&text[t.start..]) {
                inside = Some((t.start, false));
                continue;
            }
            word_end = text[t.start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(text.len(), |n| t.start + n);
            at_stmt_start = false;
        } else if !c.is_ascii_whitespace() {
            at_stmt_start = matches!(c, b';' | b'}' | b'{');
        }
    }
    if let Some((start, _)) = inside {
        out.push((start, text.len()));
    }
    out
}

/// Whether `rest` starts with a definition header, `model NAME(` or `block NAME(`.
fn is_definition(rest: &str) -> bool {
    let Some(kw) = ["model", "block"].into_iter().find(|k| rest.starts_with(k)) else {
        return false;
    };
    let after = &rest[kw.len()..];
    if !after.starts_with(|c: char| c.is_ascii_whitespace()) {
        return false;
    }
    let name = after.trim_start();
    let name_len =
        name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
    name_len > 0
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name[name_len..].trim_start().starts_with('(')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_found() {
        let cases: &[(&str, &[&str])] = &[
            (
                "let a = 1;\nmodel m(x: f32[2]) { return x }\nprint(a);",
                &["model m(x: f32[2]) { return x }"],
            ),
            (
                "model a() { return 1 }\nblock b(x) {\n    return x\n}\n",
                &["model a() { return 1 }", "block b(x) {\n    return x\n}"],
            ),
            ("block b(x) { // }\n return x }", &["block b(x) { // }\n return x }"]),
            ("block b(x) { /* } */ return x }", &["block b(x) { /* } */ return x }"]),
            ("model m(x) { return x", &["model m(x) { return x"]),
            ("\"x\"; model m() { }", &["model m() { }"]),
            ("} model m() { }", &["model m() { }"]),
            ("let s = \"model m() { }\";", &[]),
            ("let s = `\nmodel m() { }`;", &[]),
            ("// model m() { }", &[]),
            ("/* model m() { } */", &[]),
            ("fn f() { model m() { } }", &[]),
            ("f(\nmodel m() { })", &[]),
            ("let x = model m() { };", &[]),
            ("remodel m() { }", &[]),
            ("model_x m() { }", &[]),
            ("model m { }", &[]),
            ("model() { }", &[]),
        ];
        for (text, expected) in cases {
            let found: Vec<&str> =
                definitions(text).into_iter().map(|(s, e)| &text[s..e]).collect();
            assert_eq!(found, *expected, "text: {text:?}");
        }
    }

    #[test]
    fn halves_keep_positions() {
        let text = "let é = 1;\nmodel m() { return 1 }\n";
        let split = split(text);
        assert_eq!(split.model_text, "           \nmodel m() { return 1 }\n");
        assert_eq!(split.script_text, "let é = 1;\n                      \n");
    }
}
