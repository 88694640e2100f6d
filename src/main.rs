//! The `rumus` command: parse arguments, call the library, map errors to exit codes
//! (0 success, 1 script or runtime error, 2 usage or I/O error; a broken pipe is success).

use rumus::script::runner::{self, RunOptions};
use rumus::script::HostOptions;
use rumus::{err, Error, ErrorKind, Result};
use std::path::PathBuf;

const USAGE: &str = "usage:
  rumus run FILE [--device auto|gpu|cpu] [--seed N] [--metrics FILE] [--log-every N]
  rumus repl [--batch] [--device auto|gpu|cpu] [--seed N]
  rumus graph FILE [--model NAME] [--params]
  rumus plan FILE [--model NAME] [--set NAME=VALUE]... [--unfused] [--json]
  rumus bench FILE [--model NAME] [--set NAME=VALUE]... [--steps N] [--warmup N] [--device D] [--profile] [--json]
  rumus bench --kernels [--device D]      fp32 matmul 4096 and LayerNorm fwd+bwd 32768 x 1024
  rumus bench --cpu-matmul [--size N]     the CPU backend's f32 matmul, GFLOP/s";

fn main() {
    // Scripts recurse (rhai evaluates by recursion); give them room beyond the limits they get.
    let code = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| exit_code(cli(std::env::args().skip(1).collect())))
        .map(|t| t.join().unwrap_or(1))
        .unwrap_or(1);
    std::process::exit(code);
}

fn cli(args: Vec<String>) -> Result<()> {
    let Some((command, rest)) = args.split_first() else {
        return Err(err!(Usage, "no command given"));
    };
    let mut flags = Flags::parse(rest)?;
    let host = HostOptions {
        device: flags.take("--device")?.unwrap_or_else(|| HostOptions::default().device),
        seed: flags.number("--seed")?.unwrap_or(0),
        ..HostOptions::default()
    };
    if !matches!(host.device.as_str(), "auto" | "gpu" | "cpu") {
        return Err(err!(Usage, "--device must be auto, gpu or cpu, got `{}`", host.device));
    }
    match command.as_str() {
        "run" => {
            let opts = RunOptions {
                metrics: flags.take("--metrics")?.map(PathBuf::from),
                log_every: flags.number("--log-every")?.unwrap_or(100),
                file: PathBuf::from(flags.positional()?),
                host,
            };
            flags.done()?;
            runner::run(opts)
        }
        "repl" => {
            let batch = flags.switch("--batch");
            flags.done()?;
            if batch {
                rumus::repl::run_batch(host, std::io::stdin().lock(), std::io::stdout())
            } else {
                rumus::repl::run_interactive(host)
            }
        }
        "graph" => {
            let model = flags.take("--model")?;
            let params = flags.switch("--params");
            let file = flags.positional()?;
            flags.done()?;
            let text = rumus::dsl::cli_graph(&file, model.as_deref(), params)?;
            print_text(&text)
        }
        "plan" => {
            let spec = model_spec(&mut flags)?;
            let (unfused, json) = (flags.switch("--unfused"), flags.switch("--json"));
            flags.done()?;
            print_text(&rumus::bench::plan_command(&spec, !unfused, json)?)
        }
        "bench" => {
            let device: rumus::runtime::DeviceChoice = host.device.parse()?;
            if flags.switch("--kernels") {
                flags.done()?;
                return print_text(&rumus::bench::bench_kernels(device, 4096, 32768, 1024)?);
            }
            if flags.switch("--cpu-matmul") {
                let n = flags.number("--size")?.unwrap_or(512);
                flags.done()?;
                return print_text(&rumus::bench::bench_cpu_matmul(n, 5));
            }
            let steps = flags.number("--steps")?.unwrap_or(40);
            let warmup = flags.number("--warmup")?.unwrap_or(10);
            let json = flags.switch("--json");
            let profile = flags.switch("--profile");
            let spec = model_spec(&mut flags)?;
            flags.done()?;
            let r = rumus::bench::bench_model(&spec, device, steps, warmup, profile)?;
            print_text(&if json { format!("{}\n", r.json()) } else { r.text() })
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(err!(Usage, "unknown command `{other}`")),
    }
}

/// `FILE [--model NAME] [--set NAME=VALUE]...` of `plan` and `bench`.
fn model_spec(flags: &mut Flags) -> Result<rumus::bench::ModelSpec> {
    let model = flags.take("--model")?;
    let mut sets = Vec::new();
    while let Some(kv) = flags.take("--set")? {
        let (k, v) =
            kv.split_once('=').ok_or_else(|| err!(Usage, "--set needs NAME=VALUE, got `{kv}`"))?;
        sets.push((k.to_string(), v.to_string()));
    }
    Ok(rumus::bench::ModelSpec { file: flags.positional()?, model, sets })
}

/// Write to stdout; a closed pipe (`rumus graph m.rms | head`) is not an error.
fn print_text(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::io("<stdout>", e)),
        _ => Ok(()),
    }
}

fn exit_code(r: Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) if e.message.contains("Broken pipe") => 0,
        Err(e) => {
            eprintln!("{e}");
            if e.kind == ErrorKind::Usage {
                eprintln!("{USAGE}");
            }
            match e.kind {
                ErrorKind::Usage | ErrorKind::Io => 2,
                _ => 1,
            }
        }
    }
}

/// `--name value` options, `--switch`es and positional arguments, in any order.
struct Flags {
    args: Vec<Option<String>>,
}

impl Flags {
    fn parse(args: &[String]) -> Result<Flags> {
        Ok(Flags { args: args.iter().cloned().map(Some).collect() })
    }

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

    fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>> {
        match self.take(name)? {
            None => Ok(None),
            Some(v) => {
                v.parse().map(Some).map_err(|_| err!(Usage, "{name}: `{v}` is not a number"))
            }
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
            .ok_or_else(|| err!(Usage, "missing FILE"))
    }

    fn done(&self) -> Result<()> {
        match self.args.iter().flatten().next() {
            Some(a) => Err(Error::new(ErrorKind::Usage, format!("unexpected argument `{a}`"))),
            None => Ok(()),
        }
    }
}
