//! `coa-show FILE`: see `coa_show` (the library) for what it prints.

use std::io::{ErrorKind, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use coa_show::{run, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    if args.input.as_deref().is_none_or(|p| p.as_os_str() == "-") && std::io::stdin().is_terminal() {
        eprintln!("coa-show: error: no table: give FILE (e.g. coa-show runs/default/tasks.parquet) or pipe a stage's output in");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(text) => match std::io::stdout().lock().write_all(text.as_bytes()) {
            // `coa-show big.parquet | head`: the reader has what it wanted.
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("coa-show: error: writing to stdout: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("coa-show: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
