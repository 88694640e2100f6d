//! docs/script-api.md inside the binary: the reference's entries by name, for the REPL's
//! `:help NAME` and completion, so neither needs the docs folder at run time. An entry is a
//! `### name` heading and the text up to the next heading.

/// The reference, docs/script-api.md, as compiled in.
pub const REFERENCE: &str = include_str!("../../../docs/script-api.md");

/// The names of the reference's entries, in its order.
pub fn names() -> impl Iterator<Item = &'static str> {
    REFERENCE.lines().filter_map(|l| l.strip_prefix("### ")).map(str::trim)
}

/// The entry for `name`: its heading line and text, trailing blank lines dropped.
pub fn entry(name: &str) -> Option<&'static str> {
    let heading = format!("### {name}\n");
    let start = REFERENCE
        .match_indices(&heading)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || REFERENCE.as_bytes()[i - 1] == b'\n')?;
    let body = &REFERENCE[start + heading.len()..];
    let end = body.find("\n#").map_or(body.len(), |i| i + 1);
    Some(REFERENCE[start..start + heading.len() + end].trim_end())
}

/// The entry's name nearest to `name` (fewest single-character edits; the first in the
/// reference's order among equals); none for a name longer than [`MAX_SUGGESTED`] characters,
/// which is no misspelling of a function's name (the edit distance costs time in proportion to
/// the length: a 16 MiB `:help` line took seconds).
pub fn nearest(name: &str) -> Option<&'static str> {
    if name.chars().nth(MAX_SUGGESTED).is_some() {
        return None;
    }
    names().min_by_key(|n| strsim::levenshtein(n, name))
}

/// Longest name [`nearest`] finds a suggestion for.
pub const MAX_SUGGESTED: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the hostile-input audit.
    #[test]
    fn long_names_get_no_suggestion() {
        assert_eq!(nearest("tensr"), Some("tensor"));
        assert!(nearest(&"x".repeat(MAX_SUGGESTED)).is_some());
        assert_eq!(nearest(&"x".repeat(16 << 20)), None);
    }
}
