//! The command line's grammar: every command and flag of `rumus`, declared once with clap's
//! derive (which gives per-command `--help`, `--version` and suggestions for mistyped names),
//! and clap's errors rendered in rumus' own style ([`parse`]).
//!
//! Every number goes through one range-checked parser ([`whole`], [`seconds`]) whose error
//! names the flag and the range; every usage error is an [`ErrorKind::Usage`] (exit code 2).

use crate::codegen::MatmulPrecision;
use crate::runtime::DeviceChoice;
use crate::{err, Error, ErrorKind, Result};
use clap::error::{ContextKind, ContextValue, ErrorKind as ClapKind};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// What the command line asks for: a command to run, or text (help, version) to print.
pub enum Parsed {
    /// Run this command.
    Command(Command),
    /// Print this text to stdout and exit 0.
    Print(String),
}

/// Parse `args` (without the program name).
pub fn parse(args: &[String]) -> Result<Parsed> {
    let argv = std::iter::once("rumus").chain(args.iter().map(String::as_str));
    match Cli::try_parse_from(argv) {
        Ok(cli) => Ok(Parsed::Command(cli.command)),
        Err(e) if matches!(e.kind(), ClapKind::DisplayVersion | ClapKind::DisplayHelp) => {
            // clap prints the help or the version at the flag and ignores what follows it:
            // anything after the flag is refused, as an argument a command does not take is
            // (`rumus help COMMAND` has no flag and prints its help).
            let flags: [&str; 2] = match e.kind() {
                ClapKind::DisplayVersion => ["--version", "-V"],
                _ => ["--help", "-h"],
            };
            let flag =
                args.iter().take_while(|a| *a != "--").position(|a| flags.contains(&a.as_str()));
            match flag.and_then(|i| Some((&args[i], args.get(i + 1)?))) {
                Some((flag, extra)) => Err(Error::new(
                    ErrorKind::Usage,
                    format!("unexpected argument `{extra}` after {flag}, which takes none"),
                )),
                None => Ok(Parsed::Print(e.render().to_string())),
            }
        }
        Err(e) => Err(usage_error(&e, args.first().map(String::as_str))),
    }
}

/// `rumus`: an embeddable machine-learning engine.
#[derive(Parser)]
#[command(
    name = "rumus",
    version,
    about = "rumus: a model language, rhai scripts, and whole-step plans of fused kernels",
    subcommand_required = true,
    after_help = "Exit codes: 0 success, 1 script or runtime error, 2 usage or I/O error, \
                  130 stopped by Ctrl-C; `exit(n)` in a script exits n.\n\
                  `rumus help COMMAND` or `rumus COMMAND --help` shows a command's options."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A command and its arguments.
#[derive(Subcommand)]
pub enum Command {
    /// Run a script
    Run(RunArgs),
    /// `rumus run` on N ranks through mpirun (a binary built with the feature `mpi`)
    Launch(LaunchArgs),
    /// An interactive session (`:help` inside lists its commands)
    Repl(ReplArgs),
    /// Print a model as Graphviz DOT, or its parameters (dimensions --set does not give are 1)
    Graph(GraphArgs),
    /// Draw a metrics log (`rumus run --metrics`): the loss and every logged metric against the step
    Plot(PlotArgs),
    /// Print a model's compiled training step: kernels, dispatches, buffer bytes
    Plan(PlanArgs),
    /// Time a model's training step, or the matmul and LayerNorm kernels, or the CPU matmul
    Bench(BenchArgs),
}

/// The options of `run` and `repl`: the session's device, seed and sandbox limits.
#[derive(Args)]
pub struct HostArgs {
    /// Where models run: auto, gpu or cpu [default: $RUMUS_DEVICE, else auto]
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceChoice>,
    /// The seed of every random draw (a script integer, as `seed(n)` takes and gives)
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, value_parser = whole(0, i64::MAX as u64))]
    pub seed: u64,
    /// Stop an evaluation after N operations [default: no limit]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole(1, u64::MAX))]
    pub max_operations: Option<u64>,
    /// Stop an evaluation after SECS seconds [default: no limit]
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = seconds)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// `--matmul-precision MODE`.
#[derive(Args)]
pub struct PrecisionArg {
    /// How a GPU computes matrix products: highest (fp32), high or medium (f16 products on
    /// cooperative matrices) [default: high where the adapter has them, else highest]
    #[arg(long = "matmul-precision", value_name = "MODE")]
    pub matmul_precision: Option<MatmulPrecision>,
}

/// `rumus run`.
#[derive(Args)]
pub struct RunArgs {
    /// The script (.rms)
    pub file: PathBuf,
    #[command(flatten)]
    pub host: HostArgs,
    /// Write every step's loss and every `log_metric` as JSON lines to FILE
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// At the end, draw the loss and every logged metric into FILE.svg
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Without a terminal, print a progress line every N steps (0: none)
    #[arg(long, value_name = "N", default_value_t = 100, allow_negative_numbers = true, value_parser = whole(0, u64::MAX))]
    pub log_every: u64,
}

/// `rumus launch`.
#[derive(Args)]
pub struct LaunchArgs {
    /// The number of ranks
    #[arg(short = 'n', value_name = "N", required = true, allow_negative_numbers = true, value_parser = whole(1, crate::cli::launch::MAX_RANKS))]
    pub ranks: u64,
    /// The script (.rms)
    pub file: String,
    /// Options of `rumus run`, passed to every rank
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "RUN OPTIONS")]
    pub run_options: Vec<String>,
}

/// `rumus repl`.
#[derive(Args)]
pub struct ReplArgs {
    /// Read inputs from stdin without a terminal (no prompt, no line editing)
    #[arg(long)]
    pub batch: bool,
    #[command(flatten)]
    pub host: HostArgs,
}

/// `rumus graph`.
#[derive(Args)]
pub struct GraphArgs {
    /// The model file (standalone or .rms)
    pub file: String,
    /// Which model of the file [default: its only one]
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    #[command(flatten)]
    pub set: SetArgs,
    /// Print the parameters (dotted name, shape, initializer) instead of the graph
    #[arg(long)]
    pub params: bool,
}

/// `rumus plot`.
#[derive(Args)]
pub struct PlotArgs {
    /// The metrics log (JSON lines)
    pub log: PathBuf,
    /// The SVG file to write
    #[arg(short = 'o', long = "output", value_name = "FILE.svg", required = true)]
    pub output: PathBuf,
}

/// `--set NAME=VALUE`, repeated: the model's hyperparameters and dimensions, for `graph`,
/// `plan` and `bench` alike.
#[derive(Args)]
pub struct SetArgs {
    /// Set a hyperparameter or dimension of the model to a number, true or false (repeat for
    /// several)
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = name_value)]
    pub sets: Vec<(String, String)>,
}

/// The model of `plan` and `bench`: `--model NAME` and `--set NAME=VALUE`, repeated.
#[derive(Args)]
pub struct ModelArgs {
    /// Which model of the file [default: its first one]
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    #[command(flatten)]
    pub set: SetArgs,
    /// Keep every forward value the backward pass reads alive instead of recomputing the cheap
    /// ones there (rematerialization, on by default)
    #[arg(long)]
    pub no_remat: bool,
    /// Also recompute all the matmuls whose result is wider than what they read (a GPT's fc
    /// and qkv projections; by default the earliest, up to 4% of the step's matmul FLOPs):
    /// one more product each in the backward pass, for less memory
    #[arg(long, conflicts_with = "no_remat")]
    pub remat_matmuls: bool,
}

/// `rumus plan`.
#[derive(Args)]
pub struct PlanArgs {
    /// The model file (standalone or .rms)
    pub file: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Plan one kernel per op
    #[arg(long)]
    pub unfused: bool,
    /// Print the report as JSON
    #[arg(long, conflicts_with = "wgsl")]
    pub json: bool,
    /// Print the WGSL of every kernel, or of kernel KERNEL (write FILE before it)
    #[arg(long, value_name = "KERNEL", num_args = 0..=1, allow_negative_numbers = true, value_parser = kernel_number)]
    pub wgsl: Option<Option<usize>>,
    /// Also draw the step's memory into OUT.svg: each value's bytes across the kernels
    #[arg(long, value_name = "OUT.svg", conflicts_with = "wgsl")]
    pub svg: Option<PathBuf>,
    /// Plan for this machine's adapter (gpu; auto: a hardware one if there is one) instead of
    /// a modelled one [default: modelled: WebGPU's default limits, or with high or medium an
    /// adapter with cooperative matrices]
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceChoice>,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// `rumus bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The model file (standalone or .rms)
    #[arg(required_unless_present_any = ["kernels", "cpu_matmul"])]
    pub file: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Timed steps
    #[arg(long, value_name = "N", default_value_t = 40, allow_negative_numbers = true, value_parser = whole(1, crate::cli::bench::MAX_STEPS))]
    pub steps: u64,
    /// Untimed steps first
    #[arg(long, value_name = "N", default_value_t = 10, allow_negative_numbers = true, value_parser = whole(0, crate::cli::bench::MAX_STEPS))]
    pub warmup: u64,
    /// Time each kind of kernel alone (each dispatch timed by itself)
    #[arg(long)]
    pub profile: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Where the step runs: auto, gpu or cpu [default: $RUMUS_DEVICE, else auto]
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceChoice>,
    #[command(flatten)]
    pub precision: PrecisionArg,
    /// Measure matmul 4096 (the mode's kernel, its error, every fp32 tile) and LayerNorm
    /// forward and backward at 32768 x 1024 instead of a model
    #[arg(long, conflicts_with_all = ["file", "model", "sets", "no_remat", "remat_matmuls", "steps", "warmup", "profile", "json", "cpu_matmul"])]
    pub kernels: bool,
    /// Measure the CPU backend's f32 matmul (GFLOP/s) instead of a model
    #[arg(long, conflicts_with_all = ["file", "model", "sets", "no_remat", "remat_matmuls", "steps", "warmup", "profile", "json"])]
    pub cpu_matmul: bool,
    /// The size N of `--cpu-matmul`'s N x N x N product [default: 512]
    // Checked again by `cli::run`: clap's `requires` counts `--cpu-matmul`'s default as given
    // once FILE is there, and `bench FILE --size 5` ran the model without a word.
    #[arg(long, value_name = "N", requires = "cpu_matmul", allow_negative_numbers = true, value_parser = whole(1, crate::cli::bench::MAX_CPU_MATMUL_SIZE))]
    pub size: Option<u64>,
}

/// A whole number from `lo` to `hi`.
fn whole(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64> + Clone + Send + Sync + 'static {
    move |v| match v.trim().parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(err!(Usage, "must be a whole number from {lo} to {hi}, got `{v}`")),
    }
}

/// A duration in seconds (a decimal number), from a millisecond to a year.
fn seconds(v: &str) -> Result<Duration> {
    const MAX: f64 = 365.0 * 86400.0;
    match v.trim().parse::<f64>() {
        Ok(s) if (0.001..=MAX).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(err!(Usage, "must be a number of seconds from 0.001 to {MAX}, got `{v}`")),
    }
}

/// `NAME=VALUE` of `--set`.
fn name_value(kv: &str) -> Result<(String, String)> {
    match kv.split_once('=') {
        // Spaces around the name and the value are not part of them (`--set 'B = 2'` named a
        // dimension `B `).
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(err!(Usage, "needs NAME=VALUE, got `{kv}`")),
    }
}

/// The kernel number of `--wgsl`.
fn kernel_number(v: &str) -> Result<usize> {
    if v.is_empty() {
        return Err(err!(Usage, "needs a kernel number (`rumus plan FILE` lists them)"));
    }
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err!(Usage, "`{v}` is not a kernel number (`rumus plan FILE` lists them); the model file goes before --wgsl"));
    }
    v.parse().map_err(|_| err!(Usage, "there is no kernel {v}"))
}

/// A clap error as one of ours: one line, lower case, naming the flag and what to do.
fn usage_error(e: &clap::Error, command: Option<&str>) -> Error {
    let get = |k| match e.get(k) {
        Some(ContextValue::String(s)) => vec![s.as_str()],
        Some(ContextValue::Strings(v)) => v.iter().map(String::as_str).collect(),
        _ => Vec::new(),
    };
    let first = |k| get(k).first().map_or(String::new(), |s| flag_name(s));
    let (arg, value) = (first(ContextKind::InvalidArg), first(ContextKind::InvalidValue));
    let help = match command {
        Some(c) if e.kind() != ClapKind::InvalidSubcommand => format!("`rumus {c} --help`"),
        _ => "`rumus help`".to_string(),
    };
    let message = match e.kind() {
        ClapKind::InvalidSubcommand => {
            let name = get(ContextKind::InvalidSubcommand).concat();
            match get(ContextKind::SuggestedSubcommand).first() {
                Some(s) => format!("unknown command `{name}`; did you mean `{s}`?"),
                None => format!("unknown command `{name}`; {help} lists the commands"),
            }
        }
        ClapKind::MissingSubcommand | ClapKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            format!("no command given; {help} lists the commands")
        }
        ClapKind::UnknownArgument => match get(ContextKind::SuggestedArg).first() {
            Some(s) => format!("unexpected argument `{arg}`; did you mean `{s}`?"),
            None => format!("unexpected argument `{arg}`; {help} lists the options"),
        },
        ClapKind::MissingRequiredArgument => {
            let names: Vec<String> =
                get(ContextKind::InvalidArg).iter().map(|a| a.replace(['<', '>'], "")).collect();
            format!("missing {}; {help} shows the usage", names.join(" and "))
        }
        ClapKind::ValueValidation => {
            let why = std::error::Error::source(e).map_or(String::new(), ToString::to_string);
            format!("{arg}: {why}")
        }
        ClapKind::InvalidValue if value.is_empty() => format!("{arg} needs a value"),
        ClapKind::ArgumentConflict => match first(ContextKind::PriorArg) {
            prior if prior == arg || prior.is_empty() => format!("{arg} can be given only once"),
            prior => {
                let (a, b) = if arg < prior { (arg, prior) } else { (prior, arg) };
                format!("{a} and {b} cannot be combined")
            }
        },
        _ => {
            // Any other kind: clap's own first line, in our style.
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or("").trim_start_matches("error: ");
            line.replace('\'', "`")
        }
    };
    Error::new(ErrorKind::Usage, message)
}

/// `--seed <N>` as `--seed`; `<FILE>` as `FILE`.
fn flag_name(display: &str) -> String {
    let name = display.split(' ').next().unwrap_or(display);
    name.trim_start_matches('<').trim_end_matches('>').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
