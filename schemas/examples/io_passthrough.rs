//! Benchmark helper: pass any table through the IO layer (read, sniffed; write, IPC stream zstd
//! unless the output path says otherwise). `bench/io_bench.py` times it against pyarrow.
//!
//! usage: io_passthrough [-i INPUT] [-o OUTPUT]

use std::path::PathBuf;

use anyhow::Result;
use coa_schemas::io::{self, Provenance};

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut input, mut output): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-i" => input = args.next().map(PathBuf::from),
            "-o" => output = args.next().map(PathBuf::from),
            other => anyhow::bail!("unknown argument {other}; usage: io_passthrough [-i INPUT] [-o OUTPUT]"),
        }
    }
    let reader = io::open_any(input.as_deref())?;
    let schema = reader.schema();
    let mut writer = io::create(output.as_deref(), None, &schema, &Provenance::default())?;
    for batch in reader {
        writer.write(&batch?)?;
    }
    let rows = writer.finish()?;
    eprintln!("{{\"rows\": {rows}}}");
    Ok(())
}
