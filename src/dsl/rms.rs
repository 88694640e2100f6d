//! Splitting a `.rms` script into model text and script text, in place.
//!
//! A `.rms` file is rhai code in which `model NAME(` and `block NAME(` definitions may stand at
//! top level. [`split`] returns two texts of the same length as the input: the model text keeps
//! the definitions and blanks everything else, the script text keeps everything else and blanks
//! the definitions (blanking replaces every character but line breaks with spaces). So a byte
//! offset, a line and a column mean the same place in the file, in both.

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

/// Byte ranges of the top-level `model`/`block` definitions, skipping rhai strings and comments.
fn definitions(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let mut at_stmt_start = true;
    while i < b.len() {
        let c = b[i];
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = skip_line(b, i);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                continue;
            }
            b'"' | b'`' | b'\'' => {
                i = skip_string(b, i);
                at_stmt_start = false;
                continue;
            }
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 && at_stmt_start && (c.is_ascii_alphabetic() || c == b'_') {
            if let Some(end) = definition_at(text, i) {
                out.push((i, end));
                i = end;
                continue;
            }
        }
        if c.is_ascii_alphanumeric() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            at_stmt_start = false;
            continue;
        }
        if !c.is_ascii_whitespace() {
            at_stmt_start = matches!(c, b';' | b'}' | b'{');
        }
        i += 1;
    }
    out
}

fn skip_line(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' {
        i += 1;
    }
    i
}

fn skip_string(b: &[u8], start: usize) -> usize {
    let quote = b[start];
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// When a `model NAME(` or `block NAME(` definition starts at `i`, the end of its body.
fn definition_at(text: &str, i: usize) -> Option<usize> {
    let rest = &text[i..];
    let kw = ["model", "block"].into_iter().find(|k| rest.starts_with(k))?;
    let after = &rest[kw.len()..];
    if !after.starts_with(|c: char| c.is_ascii_whitespace()) {
        return None;
    }
    let name = after.trim_start();
    let name_len =
        name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
    if name_len == 0 || !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        return None;
    }
    if !name[name_len..].trim_start().starts_with('(') {
        return None;
    }
    // Find the body's closing brace: the first `{` after the signature, then brace matching,
    // skipping comments.
    let b = text.as_bytes();
    let mut j = i + kw.len();
    let mut depth = 0usize;
    let mut opened = false;
    while j < b.len() {
        match b[j] {
            b'/' if b.get(j + 1) == Some(&b'/') => {
                j = skip_line(b, j);
                continue;
            }
            b'/' if b.get(j + 1) == Some(&b'*') => {
                j = text[j + 2..].find("*/").map_or(b.len(), |e| j + 2 + e + 2);
                continue;
            }
            b'{' => {
                depth += 1;
                opened = true;
            }
            b'}' if opened => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Some(b.len())
}
