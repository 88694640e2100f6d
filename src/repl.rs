//! `rumus repl`: an interactive session over one persistent script [`Host`].
//!
//! [`Repl`] holds the session and turns each input into output text; it is what both the
//! interactive loop (rustyline: history, multi-line input while brackets are open, tab
//! completion) and the batch mode (`rumus repl --batch < file`, and the tests) drive. An error
//! or Ctrl-C returns to the prompt with the session intact; Ctrl-D (or `:quit`) ends it, and so
//! does `exit(code)` in a script, with that exit code.
//!
//! Ctrl-C while an input runs stops it at its next script operation (a native call running at
//! that moment finishes first; a second Ctrl-C before then ends the process). rustyline installs
//! its own SIGINT handler when the editor is created, so ours is installed after it.

use crate::dsl::scan::{Piece, Scanner};
use crate::error::{escape, Result, Source};
use crate::script::{api, lock, ExitRequest, Host, HostOptions};
use std::cell::RefCell;
use std::io::{BufRead, Write};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// The REPL's commands, for `:help` and completion.
pub const COMMANDS: &[(&str, &str)] = &[
    (":help", "this list"),
    (":help NAME", "the script API reference's entry for a function"),
    (":load FILE", "run a .rms file in this session (FILE may be quoted)"),
    (":plan NAME", "the compiled plan of a trainer"),
    (":graph NAME", "a model or trainer's graph in Graphviz DOT"),
    (":params NAME", "parameter names and shapes of a model or trainer"),
    (":quit", "leave (or Ctrl-D)"),
];

/// Most lines one input may continue over while brackets are open (see [`Repl::feed`]).
pub const MAX_INPUT_LINES: usize = 1000;
/// Most bytes of an input continued over several lines.
pub const MAX_INPUT_BYTES: usize = 256 << 10;

/// What became of one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Evaluated (or failed); the text to show.
    Done(String),
    /// Brackets are still open: more lines are needed.
    More,
    /// The user asked to leave (`:quit`, or `exit(code)` in a script): the text to show, and
    /// the exit code.
    Quit {
        /// The text to show.
        output: String,
        /// The process exit code.
        code: u8,
    },
}

/// A REPL session.
pub struct Repl {
    host: Host,
    out: Arc<Mutex<String>>,
    pending: String,
    /// Lines in `pending`.
    pending_lines: usize,
    n_inputs: usize,
    /// The last input was stopped by Ctrl-C (the terminal has echoed `^C` mid-line).
    interrupted: bool,
}

impl Repl {
    /// A session whose `print` output is collected into each input's output text.
    pub fn new(opts: HostOptions) -> Repl {
        let mut host = Host::new(opts);
        let out = Arc::new(Mutex::new(String::new()));
        let o = out.clone();
        host.on_print(move |s| {
            let mut o = lock(&o);
            o.push_str(s);
            o.push('\n');
        });
        Repl {
            host,
            out,
            pending: String::new(),
            pending_lines: 0,
            n_inputs: 0,
            interrupted: false,
        }
    }

    /// The session, for hosts that add functions or inspect variables.
    pub fn host_mut(&mut self) -> &mut Host {
        &mut self.host
    }

    /// Feed one line of input. An input continued over more than [`MAX_INPUT_LINES`] lines
    /// or [`MAX_INPUT_BYTES`] bytes is dropped with an error: each line scans the input so
    /// far again.
    pub fn feed(&mut self, line: &str) -> Outcome {
        if !self.pending.is_empty() {
            if self.pending_lines >= MAX_INPUT_LINES
                || self.pending.len() + 1 + line.len() > MAX_INPUT_BYTES
            {
                self.cancel();
                let e = crate::err!(
                    Limit,
                    "an input may continue over at most {MAX_INPUT_LINES} lines and {MAX_INPUT_BYTES} bytes (brackets were still open); put longer code in a file and `:load` it"
                );
                return Outcome::Done(format!("{e}\n"));
            }
            self.pending.push('\n');
        }
        self.pending.push_str(line);
        self.pending_lines += 1;
        if !self.pending.trim_start().starts_with(':') && open_brackets(&self.pending) {
            return Outcome::More;
        }
        self.pending_lines = 0;
        let input = std::mem::take(&mut self.pending);
        self.run(&input)
    }

    /// Drop a half-entered multi-line input (Ctrl-C at a continuation prompt).
    pub fn cancel(&mut self) {
        self.pending.clear();
        self.pending_lines = 0;
    }

    /// Evaluate one line (or several, as one input) and return what it printed, its value, or
    /// its error. Open brackets at the end are an error here; see [`Repl::feed`].
    pub fn eval_line(&mut self, line: &str) -> String {
        match self.run(line) {
            Outcome::Done(s) | Outcome::Quit { output: s, .. } => s,
            Outcome::More => String::new(),
        }
    }

    fn run(&mut self, input: &str) -> Outcome {
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Outcome::Done(String::new());
        }
        let result = if let Some(cmd) = trimmed.strip_prefix(':') {
            match self.command(cmd) {
                Ok(None) => return Outcome::Quit { output: String::new(), code: 0 },
                Ok(Some(s)) => Ok(s),
                Err(e) => Err(e),
            }
        } else {
            self.n_inputs += 1;
            let source = Source::new(format!("<repl:{}>", self.n_inputs), input.to_string());
            self.host.eval(&source).map(|v| {
                if v.is_unit() || self.host.exit_request().is_some() {
                    String::new()
                } else {
                    // Values may hold text read from files: shown escaped, lines kept.
                    let shown = api::display(&v);
                    let lines: Vec<_> = shown.split('\n').map(escape).collect();
                    format!("{}\n", lines.join("\n"))
                }
            })
        };
        self.host.interrupt().reset();
        self.interrupted = matches!(&result, Err(e) if e.kind == crate::ErrorKind::Interrupted);
        let mut out = std::mem::take(&mut *lock(&self.out));
        match result {
            Ok(s) => out.push_str(&s),
            Err(e) => {
                out.push_str(&e.to_string());
                out.push('\n');
            }
        }
        match self.host.exit_request() {
            None => Outcome::Done(out),
            Some(ExitRequest::Code(code)) => Outcome::Quit { output: out, code },
            Some(ExitRequest::Message(m)) => {
                out.push_str(&m);
                out.push('\n');
                Outcome::Quit { output: out, code: 1 }
            }
        }
    }

    /// A `:command`; `Ok(None)` means quit.
    fn command(&mut self, cmd: &str) -> Result<Option<String>> {
        let (name, arg) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
        let arg = arg.trim();
        // What each command takes: nothing, or one argument it cannot do without.
        let usage = |form: &str| crate::err!(Usage, "usage: {form}; try :help");
        let text = match name {
            "q" | "quit" | "exit" if arg.is_empty() => return Ok(None),
            "q" | "quit" | "exit" => return Err(usage(&format!(":{name} (it takes nothing)"))),
            "help" | "h" if arg.is_empty() => help(),
            "help" | "h" => help_on(arg)?,
            "load" if arg.is_empty() => return Err(usage(":load FILE")),
            "load" => {
                let path = path_arg(name, arg)?;
                let _ = self.host.eval_file(std::path::Path::new(path))?;
                String::new()
            }
            "plan" if arg.is_empty() => {
                return Err(usage(":plan NAME (a variable holding a trainer: a compiled model)"))
            }
            "graph" | "params" if arg.is_empty() => {
                return Err(usage(&format!(":{name} NAME (a variable holding a model or trainer)")))
            }
            "plan" | "graph" | "params" => {
                let value =
                    self.host.get(arg).ok_or_else(|| crate::err!(Usage, "no variable `{arg}`"))?;
                api::describe(name, &value)?
            }
            _ => return Err(crate::err!(Usage, "unknown command `:{name}`; try :help")),
        };
        Ok(Some(text))
    }

    /// Completions for the word that ends at byte `pos` in `line` (a position inside a
    /// character, or past the end, counts as the character boundary before it): (start of the
    /// word, candidates).
    pub fn complete(&self, line: &str, pos: usize) -> (usize, Vec<String>) {
        let pos = crate::source::floor_char_boundary(line, pos);
        let before = &line[..pos];
        let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        let start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| !word_char(c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &before[start..];
        if word.is_empty() {
            return (pos, Vec::new());
        }
        let mut names: Vec<String> = api::doc::names().map(str::to_string).collect();
        names.extend(COMMANDS.iter().map(|(c, _)| c.split(' ').next().unwrap_or(c).to_string()));
        names.extend(self.host.names());
        names.retain(|n| n.starts_with(word));
        names.sort();
        names.dedup();
        (start, names)
    }
}

/// The path a `:command` was given: `arg` as written, or what lies between a pair of double or
/// single quotes that open it (a path with leading or trailing spaces, or one quoted from habit: a
/// `:load "s1.rms"` opened a file named with the quotes). Nothing may follow the closing quote,
/// and a quote left open is an error saying so. Every command that takes a path reads it here.
fn path_arg<'a>(name: &str, arg: &'a str) -> Result<&'a str> {
    let Some(quote) = arg.chars().next().filter(|&c| c == '"' || c == '\'') else {
        return Ok(arg);
    };
    let inner = &arg[1..];
    let Some(end) = inner.find(quote) else {
        return Err(crate::err!(
            Usage,
            "unterminated quote: the path after :{name} opens with {quote} and never closes it; end the path with {quote}"
        ));
    };
    let (path, after) = (&inner[..end], inner[end + 1..].trim());
    if !after.is_empty() {
        return Err(crate::err!(
            Usage,
            ":{name} takes one path, and `{after}` follows its closing quote {quote}"
        ));
    }
    if path.is_empty() {
        return Err(crate::err!(Usage, ":{name}: the quoted path is empty"));
    }
    Ok(path)
}

fn help() -> String {
    let mut s = String::from("commands:\n");
    for (c, what) in COMMANDS {
        s.push_str(&format!("  {c:<14} {what}\n"));
    }
    s.push_str("script functions:\n  ");
    s.push_str(&api::doc::names().collect::<Vec<_>>().join(", "));
    s.push_str("\n:help NAME shows a function's entry in the script API reference\n");
    s
}

/// `:help NAME`: the script API reference's entry for `NAME` (docs/script-api.md).
fn help_on(name: &str) -> Result<String> {
    if let Some(entry) = api::doc::entry(name) {
        return Ok(format!("{entry}\n"));
    }
    let name = escape(name);
    if name.starts_with(':') {
        return Err(crate::err!(
            Usage,
            "`{name}` is a REPL command, not a script function: :help lists both"
        ));
    }
    Err(match api::doc::nearest(&name) {
        Some(near) => crate::err!(
            Usage,
            "no script function `{name}`; did you mean `{near}`? (:help lists them)"
        ),
        None => crate::err!(Usage, "no script function `{name}`; :help lists them"),
    })
}

/// Whether `text` needs more lines: a bracket (`(`, `[`, `{`), a block comment or a back-tick
/// string is still open at its end, and no closing bracket went unmatched (more lines cannot
/// fix that; running the input shows the error).
pub fn open_brackets(text: &str) -> bool {
    let mut sc = Scanner::new(text);
    let open_token = sc.by_ref().fold(false, |_, t| {
        matches!(
            t.piece,
            Piece::BlockComment { closed: false } | Piece::Str { quote: b'`', closed: false }
        )
    });
    sc.unmatched() == 0 && (open_token || sc.depth() > 0)
}

/// Read inputs from `input` (no prompts), write each one's output to `out`; stops at the end of
/// the input, at `:quit` or at `exit(code)`, and returns the exit code. Errors are shown and the
/// session goes on, as at the prompt. Output that cannot be written is an error, except a
/// closed pipe, which ends the session successfully.
pub fn run_batch(opts: HostOptions, mut input: impl BufRead, mut out: impl Write) -> Result<u8> {
    let mut repl = Repl::new(opts);
    let mut bytes = Vec::new();
    for n in 1.. {
        let line = match read_line(&mut input, &mut bytes, n)? {
            None => break,
            Some(Ok(line)) => line,
            Some(Err(e)) => {
                repl.cancel();
                if !write_out(&mut out, &format!("{e}\n"))? {
                    return Ok(0);
                }
                continue;
            }
        };
        let (text, quit) = match repl.feed(line) {
            Outcome::Done(s) => (s, None),
            Outcome::More => continue,
            Outcome::Quit { output, code } => (output, Some(code)),
        };
        if !write_out(&mut out, &text)? {
            return Ok(0);
        }
        if let Some(code) = quit {
            return Ok(code);
        }
    }
    if !repl.pending.is_empty() {
        let rest = std::mem::take(&mut repl.pending);
        let (text, code) = match repl.run(&rest) {
            Outcome::Done(s) => (s, 0),
            Outcome::Quit { output, code } => (output, code),
            Outcome::More => (String::new(), 0),
        };
        write_out(&mut out, &text)?;
        return Ok(code);
    }
    Ok(0)
}

/// Longest input line the batch mode reads, in bytes (as long as a source file may be).
pub const MAX_LINE_BYTES: u64 = crate::files::MAX_SOURCE_FILE_BYTES;

/// Line `n` of `input` into `buf`, without its line end: `None` at the end of the input,
/// `Some(Err(..))` for a line that is not UTF-8 or is longer than [`MAX_LINE_BYTES`] (the rest
/// of it is skipped unread), so that the session can go on after it.
fn read_line<'b>(
    input: &mut impl BufRead,
    buf: &'b mut Vec<u8>,
    n: usize,
) -> Result<Option<Result<&'b str>>> {
    let io = |e| crate::Error::io("<stdin>", e);
    buf.clear();
    let mut limited = std::io::Read::take(&mut *input, MAX_LINE_BYTES + 1);
    if limited.read_until(b'\n', buf).map_err(io)? == 0 {
        return Ok(None);
    }
    if buf.len() as u64 > MAX_LINE_BYTES {
        input.skip_until(b'\n').map_err(io)?;
        let e = crate::err!(Limit, "<stdin>:{n}: a line may have at most {MAX_LINE_BYTES} bytes; this one has more (skipped)");
        return Ok(Some(Err(e)));
    }
    let line = buf.strip_suffix(b"\n").unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    Ok(Some(std::str::from_utf8(line).map_err(|e| {
        let at = e.valid_up_to();
        crate::err!(
            Parse,
            "<stdin>:{n}:{}: invalid UTF-8 (byte 0x{:02X}): input must be UTF-8 text (skipped)",
            at + 1,
            line[at]
        )
    })))
}

/// Write and flush; `Ok(false)` when the reader has gone (a broken pipe).
fn write_out(out: &mut impl Write, s: &str) -> Result<bool> {
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(crate::Error::io("standard output", e)),
    }
}

/// The interactive loop on a terminal; returns the exit code (`exit(code)` in a script).
/// Scripts' `print` output appears as it is printed.
pub fn run_interactive(opts: HostOptions) -> Result<u8> {
    use rustyline::error::ReadlineError;
    let mut repl = Repl::new(opts);
    repl.host.on_print(|s| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}").and_then(|()| out.flush());
    });
    let repl = Rc::new(RefCell::new(repl));
    let mut editor = rustyline::Editor::<Helper, rustyline::history::DefaultHistory>::new()
        .map_err(|e| crate::err!(Io, "cannot start the line editor: {e}"))?;
    // After the editor: creating it replaces the SIGINT handler with rustyline's own.
    crate::script::signal::install(repl.borrow().host.interrupt());
    editor.set_helper(Some(Helper(repl.clone())));
    // The history is a convenience: one that is not a regular file (a FIFO would block the
    // start, `/dev/zero` never end) or is larger than a source file is neither read nor written.
    let history = std::env::var_os("HOME")
        .map(|h| std::path::Path::new(&h).join(".rumus_history"))
        .filter(|h| match std::fs::metadata(h) {
            Ok(m) => m.is_file() && m.len() <= crate::files::MAX_SOURCE_FILE_BYTES,
            Err(_) => true,
        });
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let show = |s: &str| -> Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(s.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| crate::Error::io("standard output", e))
    };
    show("rumus repl: :help for commands, Ctrl-D to leave\n")?;
    let mut prompt = "rumus> ";
    let mut code = 0;
    loop {
        match editor.readline(prompt) {
            Ok(line) => {
                let _ = editor.add_history_entry(line.as_str());
                let outcome = repl.borrow_mut().feed(&line);
                if repl.borrow().interrupted {
                    show("\n")?; // after the `^C` the terminal echoed
                }
                match outcome {
                    Outcome::Done(s) => {
                        show(&s)?;
                        prompt = "rumus> ";
                    }
                    Outcome::More => prompt = "   ... ",
                    Outcome::Quit { output, code: c } => {
                        show(&output)?;
                        code = c;
                        break;
                    }
                }
            }
            Err(ReadlineError::Interrupted) => {
                repl.borrow_mut().cancel();
                prompt = "rumus> ";
            }
            Err(ReadlineError::Eof) => break,
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                repl.borrow_mut().cancel();
                show("invalid UTF-8 from the terminal: the line is dropped; input must be UTF-8 text\n")?;
                prompt = "rumus> ";
            }
            Err(e) => return Err(crate::err!(Io, "line editor: {e}")),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(code)
}

/// rustyline's view of the session: tab completion of API names, commands and variables.
struct Helper(Rc<RefCell<Repl>>);

impl rustyline::completion::Completer for Helper {
    type Candidate = String;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _: &rustyline::Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        Ok(match self.0.try_borrow() {
            Ok(r) => r.complete(line, pos),
            Err(_) => (pos, Vec::new()),
        })
    }
}

impl rustyline::hint::Hinter for Helper {
    type Hint = String;
}
impl rustyline::highlight::Highlighter for Helper {}
impl rustyline::validate::Validator for Helper {}
impl rustyline::Helper for Helper {}
