//! `rumus run FILE`: evaluate a `.rms` file in a fresh session, with a progress line for training
//! steps (redrawn in place on a terminal, a plain line every `log_every` steps otherwise) and an
//! optional metrics log of JSON lines. In a data-parallel job only rank 0 shows progress and
//! writes the metrics log.

use super::{Event, ExitRequest, Host, HostOptions, Interrupt};
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
    /// The script to run.
    pub file: PathBuf,
    /// The session's sandbox, default device and seed.
    pub host: HostOptions,
    /// Write every step's loss and every `log_metric` as one JSON object a line.
    pub metrics: Option<PathBuf>,
    /// Plain progress output: one line every this many steps (0: none).
    pub log_every: u64,
}

/// Run a script file to the end. Returns the exit code the script asked for with `exit`
/// (0 when it ran to its end; 1 after `exit("message")`, which is printed to stderr).
///
/// Output that cannot be written (stdout or the metrics log on a full disk) stops the script
/// with that error; stdout closed by its reader (`rumus run f | head`) stops it successfully.
pub fn run(opts: RunOptions) -> Result<u8> {
    let mut host_opts = opts.host.clone();
    let folder = opts
        .file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    host_opts.sandbox.allow_read(folder);
    let source = crate::error::Source::read(&opts.file)?;
    let rank0 = host_opts.comm.rank() == 0;
    let mut host = Host::new(host_opts);
    super::signal::install(host.interrupt());
    let progress = Rc::new(RefCell::new(Progress::new(
        opts.log_every,
        opts.metrics.as_deref().filter(|_| rank0),
        host.interrupt().clone(),
    )?));
    if rank0 {
        let p = progress.clone();
        host.on_event(move |e| p.borrow_mut().event(e));
    }
    let p = progress.clone();
    host.on_print(move |s| p.borrow_mut().print(s));
    let result = host.eval(&source);
    let mut progress = progress.borrow_mut();
    progress.finish();
    if let Some(e) = progress.failed.take() {
        return Err(e); // an output error stopped the script
    }
    if progress.broken_pipe {
        return Ok(0); // the reader went away: not a failure
    }
    result.map(drop)?;
    Ok(match host.exit_request() {
        None => 0,
        Some(ExitRequest::Code(c)) => c,
        Some(ExitRequest::Message(m)) => {
            stderr(&format!("{m}\n"));
            1
        }
    })
}

/// Write to stderr; if even that fails there is nowhere left to say so.
fn stderr(s: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(s.as_bytes()).and_then(|()| err.flush());
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
    /// Stops the script when output fails.
    interrupt: Interrupt,
    broken_pipe: bool,
    /// The first output error (stdout or the metrics log); the run fails with it.
    failed: Option<Error>,
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
            failed: None,
        })
    }

    /// Stop the script with `e` (the first such error wins).
    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
        self.interrupt.trigger();
    }

    fn event(&mut self, e: &Event) {
        if let Some((path, f)) = &mut self.metrics {
            let line = match e {
                Event::Step { step, loss } => serde_json::json!({ "step": step, "loss": loss }),
                Event::Metric { step, name, value } => {
                    serde_json::json!({ "step": step, "metric": name, "value": value })
                }
            };
            if let Err(err) = writeln!(f, "{line}") {
                let err = Error::io(path.display(), err);
                self.fail(err);
            }
        }
        let Event::Step { step, loss } = *e else {
            return;
        };
        // Steps of a second model start again from 1: rates are per model, never negative.
        let first = *self.first_step.get_or_insert(step.saturating_sub(1));
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = step.saturating_sub(first) as f64 / secs;
        if self.tty {
            // Redraw at most 10 times a second.
            if self.last_draw.is_some_and(|t| t.elapsed().as_millis() < 100) {
                return;
            }
            self.last_draw = Some(Instant::now());
            stderr(&format!("\r\x1b[2Kstep {step}  loss {loss:.4}  {rate:.1} steps/s"));
            self.drawn = true;
        } else if self.log_every > 0 && step % self.log_every == 0 {
            stderr(&format!("step {step} loss {loss:.4} ({rate:.1} steps/s)\n"));
        }
    }

    fn print(&mut self, s: &str) {
        self.clear();
        let mut out = std::io::stdout().lock();
        match writeln!(out, "{s}").and_then(|()| out.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.broken_pipe = true;
                self.interrupt.trigger();
            }
            Err(e) => self.fail(Error::io("standard output", e)),
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            stderr("\r\x1b[2K");
            self.drawn = false;
            self.last_draw = None;
        }
    }

    fn finish(&mut self) {
        self.clear();
        if let Some((path, f)) = &mut self.metrics {
            if let Err(e) = f.flush() {
                let e = Error::io(path.display(), e);
                self.failed.get_or_insert(e);
            }
        }
    }
}
