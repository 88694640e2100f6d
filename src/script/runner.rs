//! `rumus run FILE`: evaluate a `.rms` file in a fresh session, with a progress line for training
//! steps (redrawn in place on a terminal, a plain line every `log_every` steps otherwise) and an
//! optional metrics log of JSON lines.

use super::{Event, Host, HostOptions, Interrupt};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

/// What `rumus run` was asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub file: PathBuf,
    pub host: HostOptions,
    /// Write every step's loss and every `log_metric` as one JSON object a line.
    pub metrics: Option<PathBuf>,
    /// Plain progress output: one line every this many steps (0: none).
    pub log_every: u64,
}

/// Run a script file to the end.
pub fn run(opts: RunOptions) -> Result<()> {
    let mut host_opts = opts.host.clone();
    let folder = opts
        .file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    host_opts.sandbox.allow_read(folder);
    let source = crate::error::Source::read(&opts.file)?;
    let mut host = Host::new(host_opts);
    super::signal::install(host.interrupt());
    let progress = Rc::new(RefCell::new(Progress::new(
        opts.log_every,
        opts.metrics.as_deref(),
        host.interrupt().clone(),
    )?));
    let p = progress.clone();
    host.on_event(move |e| p.borrow_mut().event(e));
    let p = progress.clone();
    host.on_print(move |s| p.borrow_mut().print(s));
    let result = host.eval(&source).map(|_| ());
    let mut progress = progress.borrow_mut();
    progress.finish();
    if progress.broken_pipe {
        return Ok(()); // the reader went away (`rumus run f | head`): not a failure
    }
    result
}

/// Progress display and metrics log.
struct Progress {
    tty: bool,
    log_every: u64,
    metrics: Option<(PathBuf, File)>,
    start: Instant,
    first_step: Option<u64>,
    /// A progress line is drawn and must be cleared before other output.
    drawn: bool,
    last_draw: Option<Instant>,
    /// Stops the script when stdout is closed.
    interrupt: Interrupt,
    broken_pipe: bool,
}

impl Progress {
    fn new(log_every: u64, metrics: Option<&Path>, interrupt: Interrupt) -> Result<Progress> {
        let metrics = match metrics {
            Some(p) => {
                Some((p.to_path_buf(), File::create(p).map_err(|e| Error::io(p.display(), e))?))
            }
            None => None,
        };
        Ok(Progress {
            tty: std::io::stderr().is_terminal(),
            log_every,
            metrics,
            start: Instant::now(),
            first_step: None,
            drawn: false,
            last_draw: None,
            interrupt,
            broken_pipe: false,
        })
    }

    fn event(&mut self, e: &Event) {
        if let Some((_, f)) = &mut self.metrics {
            let line = match e {
                Event::Step { step, loss } => serde_json::json!({ "step": step, "loss": loss }),
                Event::Metric { step, name, value } => {
                    serde_json::json!({ "step": step, "metric": name, "value": value })
                }
            };
            let _ = writeln!(f, "{line}");
        }
        let Event::Step { step, loss } = *e else {
            return;
        };
        let first = *self.first_step.get_or_insert(step.saturating_sub(1));
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = (step - first) as f64 / secs;
        if self.tty {
            // Redraw at most 10 times a second.
            if self.last_draw.is_some_and(|t| t.elapsed().as_millis() < 100) {
                return;
            }
            self.last_draw = Some(Instant::now());
            eprint!("\r\x1b[2Kstep {step}  loss {loss:.4}  {rate:.1} steps/s");
            self.drawn = true;
        } else if self.log_every > 0 && step % self.log_every == 0 {
            eprintln!("step {step} loss {loss:.4} ({rate:.1} steps/s)");
        }
    }

    fn print(&mut self, s: &str) {
        self.clear();
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{s}").and_then(|()| out.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                self.broken_pipe = true;
                self.interrupt.trigger();
            }
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[2K");
            self.drawn = false;
            self.last_draw = None;
        }
    }

    fn finish(&mut self) {
        self.clear();
        if let Some((_, f)) = &mut self.metrics {
            let _ = f.flush();
        }
    }
}
