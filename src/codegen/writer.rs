//! A tiny WGSL writer: one statement a line, blocks indented by four spaces.
//!
//! Generated code is written line by line: [`Wgsl::line`] for a statement, [`Wgsl::open`] for a
//! line that opens a block (`for (...) {`) and [`Wgsl::close`] for its `}`. Text written by
//! other emitters (an expression's `let` statements, a helper function) goes through
//! [`Wgsl::lines`], which re-indents each of its lines to the current depth by its braces, so
//! every module comes out formatted the same way whoever wrote its parts.

/// WGSL text under construction, with the current block depth.
#[derive(Clone, Debug, Default)]
pub struct Wgsl {
    text: String,
    depth: usize,
}

impl Wgsl {
    /// An empty module.
    pub fn new() -> Wgsl {
        Wgsl::default()
    }

    /// One statement (or declaration) at the current depth.
    pub fn line(&mut self, s: &str) -> &mut Wgsl {
        for _ in 0..self.depth {
            self.text.push_str("    ");
        }
        self.text.push_str(s);
        self.text.push('\n');
        self
    }

    /// A line opening a block (`s` without its `{`; empty: a block of its own, a scope);
    /// what follows is one level deeper.
    pub fn open(&mut self, s: &str) -> &mut Wgsl {
        if s.is_empty() {
            self.line("{");
        } else {
            self.line(&format!("{s} {{"));
        }
        self.depth += 1;
        self
    }

    /// The `}` closing the innermost open block.
    pub fn close(&mut self) -> &mut Wgsl {
        self.depth = self.depth.saturating_sub(1);
        self.line("}")
    }

    /// `open(s)`, the statements of `body`, `close()`.
    pub fn block(&mut self, s: &str, body: &[&str]) -> &mut Wgsl {
        self.open(s);
        for b in body {
            self.line(b);
        }
        self.close()
    }

    /// Several lines of WGSL written elsewhere: each is stripped and re-indented at the current
    /// depth, one level deeper inside each `{ ... }` it opens. Empty lines are kept empty.
    pub fn lines(&mut self, text: &str) -> &mut Wgsl {
        for l in text.lines() {
            let l = l.trim();
            if l.is_empty() {
                self.text.push('\n');
                continue;
            }
            if l.starts_with('}') {
                self.depth = self.depth.saturating_sub(1);
            }
            self.line(l);
            let opens = l.matches('{').count();
            let closes = l.matches('}').count() - usize::from(l.starts_with('}'));
            self.depth = (self.depth + opens).saturating_sub(closes);
        }
        self
    }

    /// An empty line.
    pub fn blank(&mut self) -> &mut Wgsl {
        self.text.push('\n');
        self
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::Wgsl;

    #[test]
    fn blocks_are_indented_and_pasted_text_is_reindented() {
        let mut w = Wgsl::new();
        w.open("fn main()");
        w.line("let i = 0u;");
        w.lines("        let a = 1.0;\nif (a > 0.0) {\n  x[0] = a;\n}\n");
        w.block("for (var j = 0u; j < 2u; j++)", &["acc += 1.0;"]);
        w.close();
        let want = "fn main() {
    let i = 0u;
    let a = 1.0;
    if (a > 0.0) {
        x[0] = a;
    }
    for (var j = 0u; j < 2u; j++) {
        acc += 1.0;
    }
}
";
        assert_eq!(w.finish(), want);
    }
}
