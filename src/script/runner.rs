//! `rumus run FILE`: evaluate a `.rms` file in a fresh session, with progress for training
//! steps (an `indicatif` bar on a terminal, with the total and an estimate of the time left once
//! the script declares its length with `progress(#{ steps | epochs })`; a plain line every
//! `log_every` steps otherwise) and an optional metrics log of JSON lines, each with the
//! seconds since the run started (`time`), the step's `lr` and the script's `epoch`.
//! In a data-parallel job only rank 0 shows progress and writes the metrics log.

use super::{lock, Event, ExitRequest, Host, HostOptions, Interrupt, Total};
use crate::error::{Error, Result};
use crate::plot::Curves;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
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
    /// At the end, draw the loss and every logged metric against the step into this SVG file.
    pub plot: Option<PathBuf>,
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
    host_opts.sandbox.protect(&opts.file, "the running script");
    let source = crate::files::read_source(&opts.file)?;
    use crate::files::Output;
    for (flag, out, kind) in
        [("--metrics", &opts.metrics, Output::Log), ("--plot", &opts.plot, Output::File)]
    {
        if let Some(out) = out {
            crate::files::check_output(flag, out, "the script", &opts.file, kind)?;
        }
    }
    if let (Some(log), Some(plot)) = (&opts.metrics, &opts.plot) {
        crate::files::check_apart("--plot", plot, "the metrics log", log)?;
    }
    // The script writes neither (the plot is drawn over whatever it wrote there at the end).
    if let Some(log) = &opts.metrics {
        host_opts.sandbox.protect(log, "the metrics log (--metrics)");
    }
    if let Some(plot) = &opts.plot {
        host_opts.sandbox.protect(plot, "the plot (--plot)");
    }
    let rank0 = host_opts.comm.rank() == 0;
    let mut host = Host::new(host_opts);
    super::signal::install(host.interrupt());
    let mut progress = Progress::new(
        opts.log_every,
        opts.metrics.as_deref().filter(|_| rank0),
        host.interrupt().clone(),
    )?;
    progress.curves = opts.plot.as_ref().filter(|_| rank0).map(|_| Curves::default());
    let progress = Arc::new(Mutex::new(progress));
    if rank0 {
        let p = progress.clone();
        host.on_event(move |e| lock(&p).event(e));
    }
    let p = progress.clone();
    host.on_print(move |s| lock(&p).print(s));
    let result = host.eval(&source);
    let mut progress = lock(&progress);
    progress.finish();
    if let Some(e) = progress.failed.take() {
        return Err(e); // an output error stopped the script
    }
    if progress.broken_pipe {
        return Ok(0); // the reader went away: not a failure
    }
    if let (Some(path), Some(curves)) = (&opts.plot, &progress.curves) {
        // A failed run still draws what it logged; its own error is what it reports. A run
        // that succeeded keeps its exit code when there is nothing to draw (no steps, or
        // every loss NaN): the plot's absence is a note, as what it leaves out is.
        if result.is_ok() || !curves.names().is_empty() {
            match curves.nothing_to_draw() {
                Some(why) => stderr(&format!("note: {} is not written: {why}\n", path.display())),
                None => {
                    curves.write_svg(path)?;
                    curves.notes().iter().for_each(|n| stderr(&format!("note: {n}\n")));
                }
            }
        }
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
    log_every: u64,
    metrics: Option<(PathBuf, File)>,
    start: Instant,
    first_step: Option<u64>,
    /// Drawn on a terminal only (hidden otherwise).
    bar: ProgressBar,
    total: Option<Total>,
    /// The points for `--plot`, when it was given.
    curves: Option<Curves>,
    /// Stops the script when output fails.
    interrupt: Interrupt,
    broken_pipe: bool,
    /// The first output error (stdout or the metrics log); the run fails with it.
    failed: Option<Error>,
}

impl Progress {
    fn new(log_every: u64, metrics: Option<&Path>, interrupt: Interrupt) -> Result<Progress> {
        let metrics = match metrics {
            Some(p) => Some((p.to_path_buf(), crate::files::create_log(p)?)),
            None => None,
        };
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr_with_hz(10)
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(ProgressStyle::with_template("step {pos}  {msg}").expect("a valid template"));
        Ok(Progress {
            log_every,
            metrics,
            start: Instant::now(),
            first_step: None,
            bar,
            total: None,
            curves: None,
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
        let time = self.start.elapsed().as_secs_f64();
        match (e, &mut self.curves) {
            (Event::Step { step, loss, .. }, Some(c)) => c.push("loss", *step as f64, *loss as f64),
            (Event::Metric { step, name, value, .. }, Some(c)) => {
                c.push(name, *step as f64, *value)
            }
            _ => {}
        }
        if let Some((path, f)) = &mut self.metrics {
            let line = match e {
                Event::Step { step, loss, lr, epoch } => Some(serde_json::json!({
                    "step": step, "loss": loss, "lr": lr, "epoch": epoch, "time": time
                })),
                Event::Metric { step, name, value, epoch } => Some(serde_json::json!({
                    "step": step, "metric": name, "value": value, "epoch": epoch, "time": time
                })),
                Event::Total(_) | Event::Epoch(_) => None,
            };
            if let Some(Err(err)) = line.map(|l| writeln!(f, "{l}")) {
                let err = Error::io(path.display(), err);
                self.fail(err);
            }
        }
        match *e {
            Event::Total(total) => {
                self.total = Some(total);
                let (len, what) = match total {
                    Total::Steps(n) => (n, "step"),
                    Total::Epochs(n) => (n, "epoch"),
                };
                self.bar.set_length(len);
                let template = format!("{what} {{pos}}/{{len}} {{wide_bar}} {{msg}} eta {{eta}}");
                self.bar
                    .set_style(ProgressStyle::with_template(&template).expect("a valid template"));
                self.bar.reset_eta();
            }
            Event::Epoch(n) => {
                if let Some(Total::Epochs(_)) = self.total {
                    self.bar.set_position(n);
                }
            }
            Event::Step { step, loss, .. } => self.step(step, loss),
            Event::Metric { .. } => {}
        }
    }

    fn step(&mut self, step: u64, loss: f32) {
        // Steps of a second model start again from 1: rates are per model, never negative.
        let first = *self.first_step.get_or_insert(step.saturating_sub(1));
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = step.saturating_sub(first) as f64 / secs;
        if !matches!(self.total, Some(Total::Epochs(_))) {
            self.bar.set_position(step);
        }
        self.bar.set_message(format!("loss {loss:.4}  {rate:.1} steps/s"));
        if self.bar.is_hidden() && self.log_every > 0 && step.is_multiple_of(self.log_every) {
            stderr(&format!("step {step} loss {loss:.4} ({rate:.1} steps/s)\n"));
        }
    }

    fn print(&mut self, s: &str) {
        let result = self.bar.suspend(|| {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{s}").and_then(|()| out.flush())
        });
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.broken_pipe = true;
                self.interrupt.trigger();
            }
            Err(e) => self.fail(Error::io("standard output", e)),
        }
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
        if let Some((path, f)) = &mut self.metrics {
            if let Err(e) = f.flush() {
                let e = Error::io(path.display(), e);
                self.failed.get_or_insert(e);
            }
        }
    }
}
