//! A guard on the width of calls: script text with more than [`MAX_CALL_ARGS`] items in one
//! parenthesised list (a call's arguments, a function's parameters) is refused before rhai sees
//! it. When no function matches a call, rhai retries it with every subset of up to 16 arguments
//! replaced by `Dynamic`, hashing the whole list each time: 65,536 passes over the arguments,
//! in native code that no operation limit or interrupt reaches. A call with 35,000 arguments (a
//! 70 kB script, found by the fuzz driver) ran for 10 to 20 seconds.

use crate::err;
use crate::error::{Result, Span};

/// Most items in one parenthesised list.
pub const MAX_CALL_ARGS: usize = 64;

/// Check every parenthesised list of rhai `text` (strings, characters and comments skipped,
/// code inside template-string interpolations checked).
pub fn check_width(text: &str) -> Result<()> {
    let b = text.as_bytes();
    // Open brackets: (byte, offset, commas so far); a template string is '`'.
    let mut stack: Vec<(u8, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let in_template = stack.last().is_some_and(|&(c, _, _)| c == b'`');
        let c = b[i];
        if in_template {
            match c {
                b'\\' => i += 1,
                b'`' => {
                    stack.pop();
                }
                b'$' if b.get(i + 1) == Some(&b'{') => {
                    stack.push((b'$', i, 0));
                    i += 1;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(b.len(), |n| i + n);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = skip_block_comment(b, i);
                continue;
            }
            b'"' | b'\'' => {
                i = skip_quoted(b, i);
                continue;
            }
            b'`' => stack.push((b'`', i, 0)),
            b'(' | b'[' | b'{' => stack.push((c, i, 0)),
            b')' | b']' | b'}' => {
                stack.pop();
            }
            b',' => {
                if let Some((b'(', at, commas)) = stack.last_mut() {
                    *commas += 1;
                    if *commas >= MAX_CALL_ARGS {
                        let at = *at;
                        return Err(err!(
                            Limit,
                            "more than {MAX_CALL_ARGS} arguments in one call or parameter list: pass an array instead"
                        )
                        .at(Span::new(at, at + 1)));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The offset after the string or character literal starting at `i`.
fn skip_quoted(b: &[u8], i: usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() && b[j] != quote {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    j + 1
}

/// The offset after the (nestable) block comment starting at `i`.
fn skip_block_comment(b: &[u8], i: usize) -> usize {
    let (mut depth, mut j) = (0usize, i);
    while j + 1 < b.len() {
        match (b[j], b[j + 1]) {
            (b'/', b'*') => {
                depth += 1;
                j += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return j;
                }
            }
            _ => j += 1,
        }
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(n: usize) -> String {
        vec!["1"; n].join(", ")
    }

    #[test]
    fn wide_lists_are_refused_where_they_open() {
        let ok = [
            format!("f({})", args(MAX_CALL_ARGS)),
            format!("fn g({}) {{}}", args(MAX_CALL_ARGS)),
            format!("let a = [{}];", args(10_000)),
            format!("let m = #{{{}}};", vec!["a: 1"; 1000].join(", ")),
            format!("let s = \"({})\";", args(1000)),
            format!("// f({})\n/* f({}) /* nested */ */ 1", args(1000), args(1000)),
            format!("`text ({}) ${{f(1, 2)}}`", args(1000)),
            format!("f('(', ')', {})", args(MAX_CALL_ARGS - 2)),
        ];
        for text in &ok {
            assert!(check_width(text).is_ok(), "{text}");
        }
        let bad = [
            (format!("f({})", args(MAX_CALL_ARGS + 1)), 1),
            (format!("let x = [g(h({}))];", args(35_000)), 12),
            (format!("`a ${{f({})}}`", args(100)), 6),
            (format!("fn g({}) {{}}", args(100)), 4),
        ];
        for (text, at) in &bad {
            let e = check_width(text).unwrap_err();
            assert_eq!(
                e.message,
                "more than 64 arguments in one call or parameter list: pass an array instead"
            );
            assert_eq!(e.span, Some(Span::new(*at, at + 1)), "{}", &text[..20]);
        }
    }
}
