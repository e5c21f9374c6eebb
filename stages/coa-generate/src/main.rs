//! `coa-generate`: the stage that makes data from nothing but flags and files. The logic lives in
//! the `coa_generate` library; this binary parses flags.
//!
//! `coa-generate tasks` synthesizes an offline task suite (with its document corpus for
//! multihop) or imports a real task file, and writes the `tasks` table.
//! `coa-generate mas` runs the teacher multi-agent system (`coa-agents`) on a `tasks` table and
//! writes `mas_runs`.
//! `coa-generate policy` samples a checkpoint G times per task with real tool calls and writes
//! `rollouts`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use coa_generate::{mas, policy, tasks};
use coa_schemas::stage;

#[global_allocator]
static ALLOC: coa_schemas::stage::Allocator = coa_schemas::stage::Allocator;

#[derive(Parser)]
#[command(name = "coa-generate", version, about = "Generate Chain-of-Agents data: task suites (tasks), teacher multi-agent runs (mas), policy rollouts (policy)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
enum Command {
    /// Synthesize an offline task suite, or import a real task file, into the `tasks` table.
    Tasks(tasks::TasksArgs),
    /// Run the teacher multi-agent system on a `tasks` table (stdin or -i) into `mas_runs`.
    Mas(mas::MasArgs),
    /// Sample a checkpoint G times per task, with real tool calls, into `rollouts`.
    Policy(policy::PolicyArgs),
}

fn main() -> ExitCode {
    let cli: Cli = coa_schemas::flags::parse();
    match cli.command {
        Command::Tasks(args) => {
            stage::main("coa-generate tasks", env!("CARGO_PKG_VERSION"), args.io.stats.clone(), |s| tasks::run(s, &args))
        }
        Command::Mas(args) => {
            stage::main("coa-generate mas", env!("CARGO_PKG_VERSION"), args.io.stats.clone(), |s| {
                s.outputs(&args.io.outputs())?;
                // The output does not depend on how many tasks run at once, nor on where
                // replies are cached or which variable holds the key.
                s.not_recorded(&["--concurrency", "--max-inflight", "--cache-dir", "--api-key-env"]);
                s.not_recorded_switches(&["--no-api-key"]);
                mas::run(s, &args)
            })
        }
        Command::Policy(args) => {
            stage::main("coa-generate policy", env!("CARGO_PKG_VERSION"), args.io.stats.clone(), |s| {
                s.outputs(&args.io.outputs())?;
                s.not_recorded(&["--threads"]);
                policy::run(s, &args)
            })
        }
    }
}
