//! Command-line parsing shared by the stage binaries: negative numbers reach the value checks
//! (clap would otherwise read `--n -5` as an unknown flag `-5`), and value parsers whose errors
//! say what was expected (`--lr -1: expected a positive number`).
//!
//! ```ignore
//! #[arg(long, value_parser = flags::at_least_one::<usize>)]
//! n: usize,
//! ...
//! let cli: Cli = coa_schemas::flags::parse();
//! ```

use std::str::FromStr;

use clap::{Command, Parser};

/// Parses the process's arguments into `C`, with negative numbers accepted as values of every
/// flag (and subcommand flag) that takes one, so the flag's own check can refuse them clearly.
pub fn parse<C: Parser>() -> C {
    let matches = allow_negative_numbers(C::command()).get_matches();
    C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// [`parse`] from an explicit argument list (tests).
pub fn try_parse_from<C: Parser>(args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>) -> Result<C, clap::Error> {
    let matches = allow_negative_numbers(C::command()).try_get_matches_from(args)?;
    C::from_arg_matches(&matches)
}

fn allow_negative_numbers(cmd: Command) -> Command {
    // Command-wide: applies to every argument that takes a value.
    #[allow(deprecated)]
    cmd.allow_negative_numbers(true).mut_subcommands(allow_negative_numbers)
}

fn parse_number<T: FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse::<T>().map_err(|_| format!("`{s}`: expected {what}"))
}

/// A whole number of at least 1.
pub fn at_least_one<T: FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    const WHAT: &str = "a whole number of at least 1";
    match parse_number::<T>(s, WHAT) {
        Ok(v) if v >= T::from(1) => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// A whole number, 0 or more.
pub fn whole<T: FromStr + PartialOrd + Default>(s: &str) -> Result<T, String> {
    const WHAT: &str = "a whole number (0 or more)";
    match parse_number::<T>(s, WHAT) {
        Ok(v) if v >= T::default() => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// A finite number greater than 0.
pub fn positive<T: FromStr + PartialOrd + Default + Copy + Finite>(s: &str) -> Result<T, String> {
    const WHAT: &str = "a number greater than 0";
    match parse_number::<T>(s, WHAT) {
        Ok(v) if v.is_finite_value() && v > T::default() => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// A finite number, 0 or more.
pub fn non_negative<T: FromStr + PartialOrd + Default + Copy + Finite>(s: &str) -> Result<T, String> {
    const WHAT: &str = "a number, 0 or more";
    match parse_number::<T>(s, WHAT) {
        Ok(v) if v.is_finite_value() && v >= T::default() => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// Any finite number (no NaN, no infinity).
pub fn finite<T: FromStr + Copy + Finite>(s: &str) -> Result<T, String> {
    const WHAT: &str = "a finite number";
    match parse_number::<T>(s, WHAT) {
        Ok(v) if v.is_finite_value() => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// A fraction between 0 and 1 (both included).
pub fn fraction(s: &str) -> Result<f64, String> {
    const WHAT: &str = "a fraction between 0 and 1";
    match parse_number::<f64>(s, WHAT) {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}`: expected {WHAT}")),
    }
}

/// `--threads N`, defined once for every stage that has it (coa-tokenize, coa-generate policy,
/// coa-train-step, coa-serve).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ThreadsArg {
    /// Worker threads (default: all cores). The results do not depend on it.
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub threads: Option<usize>,
}

impl ThreadsArg {
    /// Sizes the process's thread pool (rayon's global pool, which every stage's parallel work
    /// uses), when `--threads` is given. Call it before any parallel work: the pool is built once.
    pub fn install(&self) -> anyhow::Result<()> {
        match self.threads {
            Some(n) => rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|e| anyhow::anyhow!("--threads {n}: {e}")),
            None => Ok(()),
        }
    }
}

/// Numbers that can be NaN or infinite (floats) or not (integers).
pub trait Finite {
    fn is_finite_value(&self) -> bool;
}

macro_rules! finite_impl {
    (float: $($t:ty),*) => { $(impl Finite for $t { fn is_finite_value(&self) -> bool { self.is_finite() } })* };
    (int: $($t:ty),*) => { $(impl Finite for $t { fn is_finite_value(&self) -> bool { true } })* };
}
finite_impl!(float: f32, f64);
finite_impl!(int: u8, u16, u32, u64, usize, i32, i64);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[arg(long, value_parser = at_least_one::<usize>)]
        n: Option<usize>,
        #[arg(long, value_parser = positive::<f64>)]
        lr: Option<f64>,
        #[arg(long, value_parser = finite::<f32>)]
        penalty: Option<f32>,
        #[arg(long, value_parser = whole::<i64>)]
        min_hops: Option<i64>,
        #[command(flatten)]
        threads: ThreadsArg,
        #[command(subcommand)]
        sub: Option<Sub>,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Run {
            #[arg(long, value_parser = whole::<u64>)]
            steps: Option<u64>,
        },
    }

    fn error(args: &[&str]) -> String {
        let mut all = vec!["prog"];
        all.extend(args);
        try_parse_from::<Cli>(all).unwrap_err().to_string()
    }

    #[test]
    fn negative_numbers_get_a_message_about_the_value() {
        let e = error(&["--n", "-5"]);
        assert!(e.contains("--n") && e.contains("`-5`: expected a whole number of at least 1"), "{e}");
        let e = error(&["--lr", "-1"]);
        assert!(e.contains("`-1`: expected a number greater than 0"), "{e}");
        let e = error(&["run", "--steps", "-3"]);
        assert!(e.contains("--steps") && e.contains("expected a whole number (0 or more)"), "{e}");
        assert!(!e.contains("unexpected argument"), "{e}");
        let e = error(&["--min-hops", "-2"]);
        assert!(e.contains("`-2`: expected a whole number (0 or more)"), "{e}");
    }

    #[test]
    fn nan_and_zero_are_refused_where_meaningless() {
        assert!(error(&["--penalty", "NaN"]).contains("expected a finite number"));
        assert!(error(&["--penalty", "inf"]).contains("expected a finite number"));
        assert!(error(&["--n", "0"]).contains("at least 1"));
        assert!(error(&["--lr", "0"]).contains("greater than 0"));
        let ok: Cli = try_parse_from(["prog", "--penalty", "-1.5", "--n", "3", "--lr", "1e-3"]).unwrap();
        assert_eq!((ok.penalty, ok.n, ok.lr), (Some(-1.5), Some(3), Some(1e-3)));
        assert_eq!(fraction("0.3"), Ok(0.3));
        assert!(error(&["--threads", "0"]).contains("`0`: expected a whole number of at least 1"));
        let two: Cli = try_parse_from(["prog", "--threads", "2"]).unwrap();
        assert_eq!(two.threads.threads, Some(2));
        assert!(fraction("1.5").is_err());
    }
}
