//! The `rumus` command line: parse arguments, call the library, map errors to exit codes
//! (1: a mistake in the user's source or model, 2: usage or I/O).

use rumus::{Error, ErrorKind};
use std::io::Write;
use std::process::ExitCode;

const USAGE: &str = "usage: rumus graph FILE [--model NAME] [--params]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(text) => {
            // A closed pipe (`rumus graph m.rms | head`) is not an error.
            let _ = std::io::stdout().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e.kind {
                ErrorKind::Usage | ErrorKind::Io => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

fn run(args: &[String]) -> Result<String, Error> {
    let usage = || Error::new(ErrorKind::Usage, USAGE);
    match args.first().map(String::as_str) {
        Some("graph") => {
            let (mut file, mut model, mut params) = (None, None, false);
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--params" => params = true,
                    "--model" => model = Some(it.next().ok_or_else(usage)?.as_str()),
                    f if !f.starts_with("--") && file.is_none() => file = Some(f),
                    _ => return Err(usage()),
                }
            }
            rumus::dsl::cli_graph(file.ok_or_else(usage)?, model, params)
        }
        _ => Err(usage()),
    }
}
