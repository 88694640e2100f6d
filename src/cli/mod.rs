//! The `rumus` command line: arguments parsed (`args`: clap, every number range-checked),
//! the library called, errors mapped to exit codes (0 success, 1 script or runtime error, 2
//! usage or I/O error, 130 interrupted by Ctrl-C; `exit(n)` in a script exits `n`; a broken
//! pipe on stdout is success).
//!
//! - [`graph`]: `rumus graph`, a model's parameters or its graph as DOT;
//! - [`model`]: the model file, `--model` and `--set` of `graph`, `plan` and `bench`;
//! - `rumus plot`: a metrics log's curves as SVG (`crate::plot`);
//! - [`mod@bench`]: `rumus plan` and `rumus bench`, a model file's training step planned (its
//!   kernels, their WGSL, a picture of its memory) or timed;
//! - [`launch`]: `rumus launch -n N`, `rumus run` on N ranks through `mpirun`.
//!
//! `rumus run` joins the data-parallel job it was started in ([`crate::dist::World`]); a rank
//! whose run fails ends every rank of the job with its error, prefixed with its rank.

mod args;
pub mod bench;
pub mod graph;
pub mod launch;
pub mod model;

use crate::dist::World;
use crate::runtime::DeviceChoice;
use crate::script::runner::{self, RunOptions};
use crate::script::{HostOptions, Sandbox};
use crate::{Error, ErrorKind, Result};
use args::{Command, HostArgs, Parsed};

/// The exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: i32 = 130;

/// Run one command (`args` without the program name); `Ok` holds the exit code.
pub fn cli(args: Vec<String>) -> Result<i32> {
    let command = match args::parse(&args)? {
        Parsed::Print(text) => return print_text(&text),
        Parsed::Command(c) => c,
    };
    check_settings()?;
    match command {
        Command::Run(a) => {
            let world = World::init()?;
            crate::runtime::device::use_local_rank(world.comm().local_rank());
            let mut opts = RunOptions {
                host: host_options(a.host)?,
                metrics: a.metrics,
                plot: a.plot,
                log_every: a.log_every,
                file: a.file,
            };
            opts.host.comm = world.comm().clone();
            end_rank(&world, runner::run(opts).map(i32::from))
        }
        Command::Launch(a) => {
            // Check the run options here, once, rather than in every rank.
            let run = ["run", a.file.as_str()]
                .into_iter()
                .chain(a.run_options.iter().map(|s| s.as_str()));
            if let Parsed::Print(text) = args::parse(&run.map(String::from).collect::<Vec<_>>())? {
                return print_text(&text);
            }
            launch::launch(a.ranks, &a.file, &a.run_options)
        }
        Command::Repl(a) => {
            let host = host_options(a.host)?;
            if a.batch {
                crate::repl::run_batch(host, std::io::stdin().lock(), std::io::stdout())
            } else {
                crate::repl::run_interactive(host)
            }
            .map(i32::from)
        }
        Command::Graph(a) => {
            print_text(&graph::cli_graph(&a.file, a.model.as_deref(), &a.set.sets, a.params)?)
        }
        Command::Plot(a) => crate::plot::plot_log(&a.log, &a.output).map(|notes| {
            notes.iter().for_each(|n| eprintln!("note: {n}"));
            0
        }),
        Command::Plan(a) => {
            let spec = model_spec(a.file, a.model);
            let on = bench::plan_target(a.precision.matmul_precision, a.device)?;
            if let Some(out) = &a.svg {
                bench::plan_svg(&spec, !a.unfused, &on, out)?;
            }
            match a.wgsl {
                Some(kernel) => print_text(&bench::plan_wgsl(&spec, !a.unfused, kernel, &on)?),
                None => print_text(&bench::plan_command(&spec, !a.unfused, a.json, &on)?),
            }
        }
        Command::Bench(a) => {
            let device = device(a.device)?;
            let precision = a.precision.matmul_precision;
            if a.kernels {
                let r = bench::bench_kernels((device, precision), 4096, 32768, 1024)?;
                return print_text(&r);
            }
            if a.cpu_matmul {
                return print_text(&bench::bench_cpu_matmul(a.size.unwrap_or(512) as usize, 5)?);
            }
            // clap's `requires` counts a flag's default `false` as given.
            if a.size.is_some() {
                return Err(crate::err!(Usage, "--size sets the size of --cpu-matmul's product: add --cpu-matmul, or drop --size"));
            }
            let spec = model_spec(a.file.unwrap_or_default(), a.model);
            let (steps, warmup) = (a.steps as usize, a.warmup as usize);
            let world = World::init()?;
            crate::runtime::device::use_local_rank(world.comm().local_rank());
            let bench = || {
                let comm = world.comm();
                let r =
                    bench::bench_model(&spec, (device, precision), steps, warmup, a.profile, comm)?;
                match comm.rank() {
                    0 => print_text(&if a.json { format!("{}\n", r.json()) } else { r.text() }),
                    _ => Ok(0),
                }
            };
            end_rank(&world, bench())
        }
    }
}

/// The options of `run` and `repl`: device, seed, and the sandbox's operation and time limits
/// (none by default, as Python has none; Ctrl-C stops a script).
fn host_options(a: HostArgs) -> Result<HostOptions> {
    let mut sandbox = Sandbox::default();
    // The process is this one session, and `main` installs the counting allocator.
    sandbox.heap_limit = crate::memory::heap_counted().then_some(sandbox.memory_budget);
    if let Some(n) = a.max_operations {
        sandbox.max_operations = n;
    }
    sandbox.timeout = a.timeout;
    Ok(HostOptions {
        device: device(a.device)?.to_string(),
        seed: a.seed,
        matmul_precision: a.precision.matmul_precision,
        sandbox,
        comm: crate::dist::single(),
    })
}

/// The `RUMUS_*` settings of the GPU path, checked before any command runs: a value a setting
/// does not know is the same usage error on every machine and for every command, not only
/// where (and when) the setting is read (a CPU-only run never read `RUMUS_PIPELINE_CACHE`).
/// `RUMUS_DEVICE` is the exception: `--device` overrides it, so it is checked where no flag
/// does.
fn check_settings() -> Result<()> {
    crate::codegen::MatmulOptions::from_env()?;
    crate::runtime::pipeline_cache::enabled()?;
    crate::runtime::exchange::staged_requested()?;
    Ok(())
}

/// `--device`, else `RUMUS_DEVICE` (named in its error), else `auto`.
fn device(flag: Option<DeviceChoice>) -> Result<DeviceChoice> {
    flag.map_or_else(DeviceChoice::from_env, Ok)
}

/// The model of `plan` and `bench`.
fn model_spec(file: String, m: args::ModelArgs) -> bench::ModelSpec {
    let (no_remat, remat_matmuls) = (m.no_remat, m.remat_matmuls);
    bench::ModelSpec { file, model: m.model, sets: m.set.sets, no_remat, remat_matmuls }
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

/// The command line as text: an argument that is not UTF-8 (a file name in another encoding,
/// `$'\xff'`) is a usage error naming it, where `std::env::args` panicked.
pub fn text_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Vec<String>> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                crate::err!(
                    Usage,
                    "argument {} is not UTF-8 text: {a:?} (rumus reads its arguments as UTF-8; \
                     rename the file or give its path in UTF-8)",
                    i + 1
                )
            })
        })
        .collect()
}

/// The process exit code for a command's result, printing the error to stderr: 2 for usage and
/// I/O errors, 130 when interrupted, 1 for any other error (a script's, a model's, a data
/// file's content); a successful command's own code.
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
