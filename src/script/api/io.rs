//! Files, metrics and session defaults: `read_text`/`write_text` under the sandbox's file
//! policy (writes through [`crate::files::write_atomic`]), `log_metric` for the metrics log,
//! `progress(#{ steps | epochs })` and `epoch(n)` for the progress bar and the metrics' epoch,
//! `seed` and `device` for the defaults of `compile`, `rank()` and `world_size()` of a
//! data-parallel job.

use super::super::convert::{script_err, to_u64, IntoScript, Opts, ScriptResult};
use super::super::{lock, Ctx, Event, Total};
use crate::err;
use crate::memory::read_all;
use rhai::{Engine, Map, FLOAT, INT};
use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Register the file, metric and default functions.
pub fn register(engine: &mut Engine, ctx: &Arc<Ctx>) {
    let c = ctx.clone();
    engine.register_fn("read_text", move |path: &str| -> ScriptResult<String> {
        let p = c.sandbox.check_read(path).script()?;
        let file = crate::files::open_regular(&p).script()?;
        // Read at most one byte past the limit: a file that grows, or a FIFO, cannot run on.
        let limit = c.sandbox.max_string_size as u64;
        let mut charge = c.budget.empty();
        let bytes = read_all(file.take(limit + 1), &mut charge, path).script()?;
        if bytes.len() as u64 > limit {
            return Err(err!(Limit, "{path}: more than {limit} bytes is over the string limit"))
                .script();
        }
        crate::files::utf8_text(path, bytes).script()
    });
    let c = ctx.clone();
    engine.register_fn("write_text", move |path: &str, text: &str| -> ScriptResult<()> {
        let p = c.sandbox.check_write(path).script()?;
        crate::files::write_atomic(&p, text.as_bytes()).script()
    });
    let c = ctx.clone();
    engine.register_fn("log_metric", move |name: &str, value: FLOAT| metric(&c, name, value));
    let c = ctx.clone();
    engine
        .register_fn("log_metric", move |name: &str, value: INT| metric(&c, name, value as FLOAT));
    let c = ctx.clone();
    engine.register_fn("progress", move |opts: Map| -> ScriptResult<()> {
        let o = Opts::new(&opts, "progress", &["steps", "epochs"])?;
        let total = match (o.u64("steps", 1)?, o.u64("epochs", 1)?) {
            (Some(n), None) => Total::Steps(n),
            (None, Some(n)) => Total::Epochs(n),
            _ => return Err(script_err("progress needs one of `steps` or `epochs`")),
        };
        c.emit(Event::Total(total));
        Ok(())
    });
    let c = ctx.clone();
    engine.register_fn("epoch", move |n: INT| -> ScriptResult<()> {
        let n = to_u64(n, "epoch")?;
        *lock(&c.epoch) = Some(n);
        c.emit(Event::Epoch(n));
        Ok(())
    });
    let c = ctx.clone();
    engine.register_fn("seed", move || -> ScriptResult<INT> {
        let s = c.seed.load(Ordering::Relaxed);
        INT::try_from(s).map_err(|_| script_err(format!("seed {s} does not fit a script integer")))
    });
    let c = ctx.clone();
    engine.register_fn("seed", move |s: INT| -> ScriptResult<()> {
        c.seed.store(to_u64(s, "seed")?, Ordering::Relaxed);
        Ok(())
    });
    let c = ctx.clone();
    engine.register_fn("rank", move || c.comm.rank() as INT);
    let c = ctx.clone();
    engine.register_fn("world_size", move || c.comm.world_size() as INT);
    let c = ctx.clone();
    engine.register_fn("device", move || lock(&c.device).clone());
    let c = ctx.clone();
    engine.register_fn("device", move |d: &str| -> ScriptResult<()> {
        match d {
            "auto" | "gpu" | "cpu" => {
                *lock(&c.device) = d.to_string();
                Ok(())
            }
            _ => Err(err!(
                InvalidArgument,
                "unknown device `{d}`: expected \"auto\", \"gpu\" or \"cpu\""
            ))
            .script(),
        }
    });
}

/// `log_metric(name, value)`: an event at the last trainer's step and the current epoch.
///
/// The name is a curve's: `loss` is the training loss's own curve (a metric of that name was
/// drawn into it, its points among the steps' losses), and a name with nothing to read in it
/// (empty or spaces) draws a panel without a title.
fn metric(ctx: &Ctx, name: &str, value: FLOAT) -> ScriptResult<()> {
    if name.trim().is_empty() {
        return Err(script_err(
            "log_metric: the metric's name is empty; give it a name, as in log_metric(\"val_loss\", v)",
        ));
    }
    if name == "loss" {
        return Err(script_err(
            "log_metric: `loss` is the training loss's curve, which every step logs; give the metric another name, such as \"val_loss\"",
        ));
    }
    let (step, epoch) = (ctx.last_step.load(Ordering::Relaxed), *lock(&ctx.epoch));
    ctx.emit(Event::Metric { step, name: name.to_string(), value, epoch });
    Ok(())
}
