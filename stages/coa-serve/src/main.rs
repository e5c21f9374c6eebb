//! `coa-serve --checkpoint DIR|GGUF`: see `coa_serve` (the library) for what it serves.

use std::io::Write;
use std::process::ExitCode;

use coa_serve::{start, ServeArgs};

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> ExitCode {
    let args: ServeArgs = coa_schemas::flags::parse();
    let running = match start(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("coa-serve: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("coa-serve: serving `{}` on {} ({}), OpenAI API at {}/v1", running.model_name, running.url(), running.device, running.url());
    // The address on stdout, alone on its line: what a script or test reads (`--port 0`).
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", running.url()).and_then(|()| out.flush());
    drop(out);
    match running.wait() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coa-serve: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
