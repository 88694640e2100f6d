//! `rumus run FILE`: evaluate a `.rms` file in a fresh session, with a progress line for training
//! steps (redrawn in place on a terminal, a plain line every `log_every` steps otherwise) and an
//! optional metrics log of JSON lines. Output or metrics that cannot be written (a full disk)
//! stop the script with that error; a closed pipe on standard output stops it quietly.

use super::{Event, Host, HostOptions, Interrupt};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
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
    run_status(opts).map(drop)
}

/// Run a script file to the end, or to its `exit(n)`; returns the status it asked to exit with
/// (0 when it ran to the end).
pub fn run_status(opts: RunOptions) -> Result<i32> {
    let mut host_opts = opts.host.clone();
    let folder = opts
        .file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    host_opts.sandbox.allow_read(folder);
    let source = super::rms::read_source(&opts.file)?;
    let mut host = Host::new(host_opts);
    super::signal::install(host.interrupt());
    let progress = Rc::new(RefCell::new(Progress::new(
        opts.log_every,
        opts.metrics.as_deref(),
        host.interrupt().clone(),
    )?));
    let (p, ctx) = (progress.clone(), Rc::downgrade(host.ctx()));
    host.on_event(move |e| fail_on(&ctx, p.borrow_mut().event(e)));
    let (p, ctx) = (progress.clone(), Rc::downgrade(host.ctx()));
    host.on_print(move |s| fail_on(&ctx, p.borrow_mut().print(s)));
    let result = host.eval(&source);
    let mut progress = progress.borrow_mut();
    let finished = progress.finish();
    if progress.broken_pipe {
        return Ok(0); // the reader went away (`rumus run f | head`): not a failure
    }
    result.map(drop)?;
    finished?;
    Ok(host.exit_code().unwrap_or(0))
}

/// Stop the script with `r`'s error, if it is one.
fn fail_on(ctx: &Weak<super::Ctx>, r: Result<()>) {
    if let (Err(e), Some(ctx)) = (r, ctx.upgrade()) {
        ctx.fail_output(e);
    }
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

    fn event(&mut self, e: &Event) -> Result<()> {
        if let Some((path, f)) = &mut self.metrics {
            let line = match e {
                Event::Step { step, loss } => serde_json::json!({ "step": step, "loss": loss }),
                Event::Metric { step, name, value } => {
                    serde_json::json!({ "step": step, "metric": name, "value": value })
                }
            };
            writeln!(f, "{line}").map_err(|e| Error::io(path.display(), e))?;
        }
        let Event::Step { step, loss } = *e else {
            return Ok(());
        };
        let first = *self.first_step.get_or_insert(step.saturating_sub(1));
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = (step - first) as f64 / secs;
        if self.tty {
            // Redraw at most 10 times a second.
            if self.last_draw.is_some_and(|t| t.elapsed().as_millis() < 100) {
                return Ok(());
            }
            self.last_draw = Some(Instant::now());
            eprint!("\r\x1b[2Kstep {step}  loss {loss:.4}  {rate:.1} steps/s");
            self.drawn = true;
        } else if self.log_every > 0 && step % self.log_every == 0 {
            eprintln!("step {step} loss {loss:.4} ({rate:.1} steps/s)");
        }
        Ok(())
    }

    fn print(&mut self, s: &str) -> Result<()> {
        self.clear();
        let mut out = std::io::stdout().lock();
        match writeln!(out, "{s}").and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.broken_pipe = true;
                self.interrupt.trigger();
                Ok(())
            }
            r => r.map_err(|e| Error::io("standard output", e)),
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[2K");
            self.drawn = false;
            self.last_draw = None;
        }
    }

    fn finish(&mut self) -> Result<()> {
        self.clear();
        if let Some((path, f)) = &mut self.metrics {
            f.flush().map_err(|e| Error::io(path.display(), e))?;
        }
        Ok(())
    }
}
