//! Files, metrics and session defaults: `read_text`/`write_text` under the sandbox's file
//! policy, `log_metric` for the metrics log, `seed` and `device` for the defaults of `compile`.

use super::super::convert::{script_err, to_u64, IntoScript, ScriptResult};
use super::super::{Ctx, Event};
use crate::err;
use crate::error::Error;
use rhai::{Engine, FLOAT, INT};
use std::rc::Rc;

/// Register the file, metric and default functions.
pub fn register(engine: &mut Engine, ctx: &Rc<Ctx>) {
    let c = ctx.clone();
    engine.register_fn("read_text", move |path: &str| -> ScriptResult<String> {
        let p = c.sandbox.check_read(path).script()?;
        let meta = std::fs::metadata(&p).map_err(|e| Error::io(path, e)).script()?;
        if meta.len() > c.sandbox.max_string_size as u64 {
            return Err(err!(Limit, "{path}: {} bytes is over the string limit", meta.len()))
                .script();
        }
        std::fs::read_to_string(&p).map_err(|e| Error::io(path, e)).script()
    });
    let c = ctx.clone();
    engine.register_fn("write_text", move |path: &str, text: &str| -> ScriptResult<()> {
        let p = c.sandbox.check_write(path).script()?;
        write_atomic(&p, text.as_bytes()).map_err(|e| Error::io(path, e)).script()
    });
    let c = ctx.clone();
    engine.register_fn("log_metric", move |name: &str, value: FLOAT| {
        c.emit(Event::Metric { step: c.last_step.get(), name: name.to_string(), value });
    });
    let c = ctx.clone();
    engine.register_fn("log_metric", move |name: &str, value: INT| {
        c.emit(Event::Metric {
            step: c.last_step.get(),
            name: name.to_string(),
            value: value as FLOAT,
        });
    });
    let c = ctx.clone();
    engine.register_fn("seed", move || -> ScriptResult<INT> {
        let s = c.seed.get();
        INT::try_from(s).map_err(|_| script_err(format!("seed {s} does not fit a script integer")))
    });
    let c = ctx.clone();
    engine.register_fn("seed", move |s: INT| -> ScriptResult<()> {
        c.seed.set(to_u64(s, "seed")?);
        Ok(())
    });
    let c = ctx.clone();
    engine.register_fn("device", move || c.device.borrow().clone());
    let c = ctx.clone();
    engine.register_fn("device", move |d: &str| -> ScriptResult<()> {
        match d {
            "auto" | "gpu" | "cpu" => {
                *c.device.borrow_mut() = d.to_string();
                Ok(())
            }
            _ => Err(err!(Usage, "unknown device `{d}`: expected \"auto\", \"gpu\" or \"cpu\""))
                .script(),
        }
    });
}

/// Write `bytes` to a temporary file next to `path`, then rename it into place.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
