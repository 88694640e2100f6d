//! The `rumus` command line: arguments parsed (every number through one range-checked helper,
//! `Flags::int` or `Flags::seconds`), the library called, errors mapped to exit codes (0
//! success, 1 script or runtime error, 2 usage or I/O error, 130 interrupted by Ctrl-C;
//! `exit(n)` in a script exits `n`; a broken pipe on stdout is success).
//!
//! - [`graph`]: `rumus graph`, a model's parameters or its graph as DOT;
//! - `rumus plot`: a metrics log's curves as SVG (`crate::plot`);
//! - [`mod@bench`]: `rumus plan` and `rumus bench`, a model file's training step planned or timed;
//! - [`launch`]: `rumus launch -n N`, `rumus run` on N ranks through `mpirun`.
//!
//! `rumus run` joins the data-parallel job it was started in ([`crate::dist::World`]); a rank
//! whose run fails ends every rank of the job with its error, prefixed with its rank.

pub mod bench;
pub mod graph;
pub mod launch;

use crate::codegen::MatmulPrecision;
use crate::dist::World;
use crate::runtime::DeviceChoice;
use crate::script::runner::{self, RunOptions};
use crate::script::{HostOptions, Sandbox};
use crate::{err, Error, ErrorKind, Result};
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage:
  rumus run FILE [--device auto|gpu|cpu] [--seed N] [--metrics FILE] [--plot FILE.svg]
                 [--log-every N] [--max-operations N] [--timeout SECS]
                 [--matmul-precision highest|high|medium]
  rumus launch -n N FILE [run options]    `rumus run` on N ranks through mpirun (feature mpi)
  rumus repl [--batch] [--device auto|gpu|cpu] [--seed N] [--max-operations N] [--timeout SECS]
  rumus graph FILE [--model NAME] [--params]
  rumus plot METRICS.jsonl -o FILE.svg    the loss and every logged metric against the step
  rumus plan FILE [--model NAME] [--set NAME=VALUE]... [--unfused] [--json | --wgsl [KERNEL]]
                  [--matmul-precision MODE]  (high, medium: as on an adapter with cooperative matrices)
  rumus bench FILE [--model NAME] [--set NAME=VALUE]... [--steps N] [--warmup N] [--device D]
                   [--matmul-precision MODE] [--profile] [--json]
  rumus bench --kernels [--device D] [--matmul-precision MODE]
                                          matmul 4096 (the mode's kernel, its error, every
                                          fp32 tile) and LayerNorm fwd+bwd 32768 x 1024
  rumus bench --cpu-matmul [--size N]     the CPU backend's f32 matmul, GFLOP/s";

/// The exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: i32 = 130;

/// Run one command (`args` without the program name); `Ok` holds the exit code.
pub fn cli(args: Vec<String>) -> Result<i32> {
    let Some((command, rest)) = args.split_first() else {
        return Err(err!(Usage, "no command given; `rumus help` lists the commands"));
    };
    let mut flags = Flags { args: rest.iter().cloned().map(Some).collect() };
    match command.as_str() {
        "run" => {
            let world = World::init()?;
            crate::runtime::device::use_local_rank(world.comm().local_rank());
            let mut run = || {
                let mut opts = RunOptions {
                    host: host_options(&mut flags)?,
                    metrics: flags.take("--metrics")?.map(PathBuf::from),
                    plot: flags.take("--plot")?.map(PathBuf::from),
                    log_every: flags.int("--log-every", 0, u64::MAX)?.unwrap_or(100),
                    file: PathBuf::from(flags.positional()?),
                };
                flags.done()?;
                opts.host.comm = world.comm().clone();
                runner::run(opts).map(i32::from)
            };
            end_rank(&world, run())
        }
        "launch" => {
            let n = flags.int("-n", 1, launch::MAX_RANKS)?;
            let n = n.ok_or_else(|| err!(Usage, "launch needs -n N, the number of ranks"))?;
            let file = flags.positional()?;
            let rest: Vec<String> = flags.args.iter().flatten().cloned().collect();
            launch::launch(n, &file, &rest)
        }
        "repl" => {
            let batch = flags.switch("--batch");
            let host = host_options(&mut flags)?;
            flags.done()?;
            if batch {
                crate::repl::run_batch(host, std::io::stdin().lock(), std::io::stdout())
            } else {
                crate::repl::run_interactive(host)
            }
            .map(i32::from)
        }
        "graph" => {
            let model = flags.take("--model")?;
            let params = flags.switch("--params");
            let file = flags.positional()?;
            flags.done()?;
            print_text(&graph::cli_graph(&file, model.as_deref(), params)?)
        }
        "plot" => {
            let out = match (flags.take("-o")?, flags.take("--output")?) {
                (Some(o), None) | (None, Some(o)) => PathBuf::from(o),
                _ => return Err(err!(Usage, "plot needs one output file: -o FILE.svg")),
            };
            let log = flags.positional()?;
            flags.done()?;
            crate::plot::plot_log(std::path::Path::new(&log), &out).map(|()| 0)
        }
        "plan" => {
            let wgsl = wgsl_flag(&mut flags)?;
            let precision = matmul_precision(&mut flags)?;
            let spec = model_spec(&mut flags)?;
            let (unfused, json) = (flags.switch("--unfused"), flags.switch("--json"));
            flags.done()?;
            match wgsl {
                Some(_) if json => Err(err!(Usage, "--json and --wgsl cannot be combined")),
                Some(kernel) => print_text(&bench::plan_wgsl(&spec, !unfused, kernel, precision)?),
                None => print_text(&bench::plan_command(&spec, !unfused, json, precision)?),
            }
        }
        "bench" => {
            let device = device(&mut flags)?;
            let precision = matmul_precision(&mut flags)?;
            if flags.switch("--kernels") {
                flags.done()?;
                let r = bench::bench_kernels((device, precision), 4096, 32768, 1024)?;
                return print_text(&r);
            }
            if flags.switch("--cpu-matmul") {
                let n = flags.int("--size", 1, bench::MAX_CPU_MATMUL_SIZE)?.unwrap_or(512);
                flags.done()?;
                return print_text(&bench::bench_cpu_matmul(n as usize, 5)?);
            }
            let steps = flags.int("--steps", 1, bench::MAX_STEPS)?.unwrap_or(40);
            let warmup = flags.int("--warmup", 0, bench::MAX_STEPS)?.unwrap_or(10);
            let json = flags.switch("--json");
            let profile = flags.switch("--profile");
            let spec = model_spec(&mut flags)?;
            flags.done()?;
            let (steps, warmup) = (steps as usize, warmup as usize);
            let world = World::init()?;
            crate::runtime::device::use_local_rank(world.comm().local_rank());
            let bench = || {
                let r = bench::bench_model(
                    &spec,
                    (device, precision),
                    steps,
                    warmup,
                    profile,
                    world.comm(),
                )?;
                match world.comm().rank() {
                    0 => print_text(&if json { format!("{}\n", r.json()) } else { r.text() }),
                    _ => Ok(0),
                }
            };
            end_rank(&world, bench())
        }
        "help" | "--help" | "-h" => print_text(&format!("{USAGE}\n")),
        other => Err(err!(Usage, "unknown command `{other}`; `rumus help` lists the commands")),
    }
}

/// The options of `run` and `repl`: device, seed, and the sandbox's operation and time limits
/// (none by default, as Python has none; Ctrl-C stops a script).
fn host_options(flags: &mut Flags) -> Result<HostOptions> {
    let mut sandbox = Sandbox::default();
    if let Some(n) = flags.int("--max-operations", 1, u64::MAX)? {
        sandbox.max_operations = n;
    }
    sandbox.timeout = flags.seconds("--timeout")?;
    Ok(HostOptions {
        device: device(flags)?.to_string(),
        seed: flags.int("--seed", 0, u64::MAX)?.unwrap_or(0),
        matmul_precision: matmul_precision(flags)?,
        sandbox,
        comm: crate::dist::single(),
    })
}

/// `--device`, else `RUMUS_DEVICE`, else `auto`; each named in its error.
fn device(flags: &mut Flags) -> Result<DeviceChoice> {
    match flags.take("--device")? {
        Some(d) => d.parse().map_err(|e: Error| err!(Usage, "--device: {}", e.message)),
        None => DeviceChoice::from_env(),
    }
}

/// `--matmul-precision MODE`, named in its error; `None` without it (the device's default).
fn matmul_precision(flags: &mut Flags) -> Result<Option<MatmulPrecision>> {
    let parse =
        |m: String| m.parse().map_err(|e: Error| err!(Usage, "--matmul-precision: {}", e.message));
    flags.take("--matmul-precision")?.map(parse).transpose()
}

/// `--wgsl [KERNEL]` of `plan`: `None` without it, else the kernel number that follows it, if
/// one does (an argument of digits).
fn wgsl_flag(flags: &mut Flags) -> Result<Option<Option<usize>>> {
    let Some(i) = flags.args.iter().position(|a| a.as_deref() == Some("--wgsl")) else {
        return Ok(None);
    };
    flags.args[i] = None;
    let next = flags.args.get_mut(i + 1);
    let Some(v) =
        next.filter(|a| a.as_deref().is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit())))
    else {
        return Ok(Some(None));
    };
    let v = v.take().unwrap_or_default();
    match v.parse() {
        Ok(k) => Ok(Some(Some(k))),
        Err(_) => Err(err!(Usage, "--wgsl: there is no kernel {v}")),
    }
}

/// `FILE [--model NAME] [--set NAME=VALUE]...` of `plan` and `bench`.
fn model_spec(flags: &mut Flags) -> Result<bench::ModelSpec> {
    let model = flags.take("--model")?;
    let mut sets = Vec::new();
    while let Some(kv) = flags.take("--set")? {
        let (k, v) =
            kv.split_once('=').ok_or_else(|| err!(Usage, "--set needs NAME=VALUE, got `{kv}`"))?;
        sets.push((k.to_string(), v.to_string()));
    }
    Ok(bench::ModelSpec { file: flags.positional()?, model, sets })
}

/// Write to stdout. A closed pipe (`rumus graph m.rms | head`) is not an error; any other
/// failure (a full disk) is.
fn print_text(text: &str) -> Result<i32> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::io("standard output", e))
        }
        _ => Ok(0),
    }
}

/// The process exit code for a command's result, printing the error to stderr: 2 for usage and
/// I/O errors, 130 when interrupted, 1 for any other error; a successful command's own code.
pub fn exit_code(r: Result<i32>) -> i32 {
    use std::io::Write;
    let e = match r {
        Ok(code) => return code,
        Err(e) => e,
    };
    // If stderr fails too there is nowhere left to report it; the exit code still tells.
    let _ = writeln!(std::io::stderr().lock(), "{e}");
    error_code(&e)
}

/// The exit code of an error: 2 for usage and I/O errors, 130 when interrupted, else 1.
fn error_code(e: &Error) -> i32 {
    match e.kind {
        ErrorKind::Usage | ErrorKind::Io => 2,
        ErrorKind::Interrupted => EXIT_INTERRUPTED,
        _ => 1,
    }
}

/// In a job of several ranks, a rank that fails (an error, or a script's nonzero `exit`) ends
/// every rank at once with its message prefixed by `rank R: `, instead of leaving the others
/// waiting for it in a collective. A job of one returns `r` as it is.
fn end_rank(world: &World, r: Result<i32>) -> Result<i32> {
    let comm = world.comm();
    if comm.world_size() == 1 {
        return r;
    }
    let rank = comm.rank();
    match r {
        Ok(0) => Ok(0),
        Ok(code) => comm.abort(&format!("rank {rank}: the script exited with code {code}"), code),
        Err(e) => comm.abort(&format!("rank {rank}: {e}"), error_code(&e)),
    }
}

/// `--name value` options, `--switch`es and positional arguments, in any order.
struct Flags {
    args: Vec<Option<String>>,
}

impl Flags {
    fn take(&mut self, name: &str) -> Result<Option<String>> {
        let Some(i) = self.args.iter().position(|a| a.as_deref() == Some(name)) else {
            return Ok(None);
        };
        self.args[i] = None;
        match self.args.get_mut(i + 1).and_then(Option::take) {
            Some(v) => Ok(Some(v)),
            None => Err(err!(Usage, "{name} needs a value")),
        }
    }

    /// `--name N`: a whole number from `lo` to `hi`.
    fn int(&mut self, name: &str, lo: u64, hi: u64) -> Result<Option<u64>> {
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        match v.trim().parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(err!(Usage, "{name} must be a whole number from {lo} to {hi}, got `{v}`")),
        }
    }

    /// `--name SECS`: a duration in seconds (a decimal number), from a millisecond to a year.
    fn seconds(&mut self, name: &str) -> Result<Option<Duration>> {
        const MAX: f64 = 365.0 * 86400.0;
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        match v.trim().parse::<f64>() {
            Ok(s) if (0.001..=MAX).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
            _ => Err(err!(
                Usage,
                "{name} must be a number of seconds from 0.001 to {MAX}, got `{v}`"
            )),
        }
    }

    fn switch(&mut self, name: &str) -> bool {
        match self.args.iter().position(|a| a.as_deref() == Some(name)) {
            Some(i) => {
                self.args[i] = None;
                true
            }
            None => false,
        }
    }

    fn positional(&mut self) -> Result<String> {
        self.args
            .iter_mut()
            .find(|a| a.as_deref().is_some_and(|s| !s.starts_with("--")))
            .and_then(Option::take)
            .ok_or_else(|| err!(Usage, "missing FILE; `rumus help` shows the usage"))
    }

    fn done(&self) -> Result<()> {
        match self.args.iter().flatten().next() {
            Some(a) => Err(err!(Usage, "unexpected argument `{a}`")),
            None => Ok(()),
        }
    }
}
