//! The tool flags of the stages that run the tools (`coa-generate mas` and `policy`, and
//! `coa-score`'s `--code-timeout`), declared once so that their names, defaults and help agree.

use std::time::Duration;

use coa_schemas::flags::at_least_one;

use crate::SandboxLimits;

/// Hits per `web_search` by default: three one-sentence snippets find the page a hop needs
/// (the scripted teacher succeeds as often as with five) at half the observation.
pub const SEARCH_K: usize = 3;
/// Characters per crawled page by default: a summary of that size keeps the fact a hop looks
/// for (the scripted teacher succeeds as often as with whole pages, 68.2% of 1,000 training
/// tasks either way) at 60% of the page.
pub const CRAWL_CHARS: usize = 250;

/// `--search-k`, `--crawl-chars` and `--code-timeout`: the settings of the agents' tools.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ToolFlags {
    /// Hits per web_search.
    #[arg(long, value_parser = at_least_one::<usize>, default_value_t = SEARCH_K, value_name = "K")]
    pub search_k: usize,
    /// Characters kept per crawled page: its sentences most relevant to the crawl's goal (the
    /// agent's last think and web_search query, what AFM's crawl summarizer reads), in page
    /// order; with no goal, its first N characters.
    #[arg(long, value_parser = at_least_one::<usize>, default_value_t = CRAWL_CHARS, value_name = "N")]
    pub crawl_chars: usize,
    #[command(flatten)]
    pub code: CodeTimeout,
}

/// `--code-timeout`: the one tool flag of a stage that only judges code (`coa-score`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct CodeTimeout {
    /// Wall-clock limit of one code run (and of the unit tests that check code answers).
    #[arg(long, value_parser = seconds, default_value = "10", value_name = "SECS")]
    pub code_timeout: f64,
}

impl CodeTimeout {
    /// The sandbox limits of a code run: `--code-timeout` seconds of wall clock and as many CPU
    /// seconds, rounded up (at least 1); the other limits are the sandbox's defaults.
    pub fn limits(&self) -> SandboxLimits {
        SandboxLimits {
            wall: Duration::from_secs_f64(self.code_timeout),
            cpu_secs: (self.code_timeout.ceil() as u64).max(1),
            ..SandboxLimits::default()
        }
    }
}

/// The longest time limit a flag takes: a day. A larger one is a typo, and one past
/// `Duration`'s range (`1e300`) would overflow where it becomes a deadline.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Flag parser: a positive number of seconds, at most [`MAX_SECONDS`].
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= MAX_SECONDS => Ok(v),
        _ => Err(format!("`{s}`: expected a positive number of seconds, at most {MAX_SECONDS} (a day)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        tools: ToolFlags,
    }

    fn parse(args: &[&str]) -> Result<ToolFlags, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).map(|c| c.tools)
    }

    #[test]
    fn defaults_and_limits() {
        let f = parse(&[]).unwrap();
        assert_eq!((f.search_k, f.crawl_chars, f.code.code_timeout), (3, 250, 10.0));
        let l = f.code.limits();
        assert_eq!((l.wall, l.cpu_secs), (Duration::from_secs(10), 10));
        assert_eq!(l.mem_bytes, SandboxLimits::default().mem_bytes);
    }

    #[test]
    fn whole_seconds_give_that_wall_and_cpu_time_and_fractions_round_the_cpu_time_up() {
        for (arg, wall, cpu) in [("1", Duration::from_secs(1), 1), ("3", Duration::from_secs(3), 3), ("60", Duration::from_secs(60), 60), ("0.5", Duration::from_millis(500), 1), ("2.5", Duration::from_millis(2500), 3)] {
            let l = parse(&["--code-timeout", arg]).unwrap().code.limits();
            assert_eq!((l.wall, l.cpu_secs), (wall, cpu), "--code-timeout {arg}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in ["0", "-1", "nan", "inf", "x", "1e300", "86401"] {
            assert!(seconds(bad).unwrap_err().contains("expected a positive number of seconds"), "{bad}");
        }
        assert!(parse(&["--search-k", "0"]).is_err());
        assert!(parse(&["--crawl-chars", "0"]).is_err());
    }
}
