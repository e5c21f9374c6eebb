//! The Makefile's rules on the test build's binaries (`CARGO=true`: nothing is rebuilt), for runs
//! the smoke end-to-end test does not cover.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Runs this checkout's Makefile in `dir` (which links to it) and returns its log.
fn make(dir: &Path, args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for name in ["Makefile", "pipelines"] {
        if !dir.join(name).exists() {
            std::os::unix::fs::symlink(root.join(name), dir.join(name)).unwrap();
        }
    }
    let bin = format!("BIN={}", bin_dir().display());
    let out = Command::new("make").current_dir(dir).args(["--no-print-directory", "CARGO=true", &bin]).args(args).output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "make {args:?} failed:\n{log}");
    log
}

/// Only multihop tasks search a corpus: the default size (math only) once failed at its first
/// stage asking `coa-generate tasks` for a corpus of math tasks.
#[test]
fn a_run_without_multihop_writes_no_corpus_and_distills() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    make(w, &["tasks", "distill", "SIZE=smoke", "SUITES=math", "N_MATH=8", "TEST_N_MATH=4", "RUN=math"]);
    let run = w.join("runs/math");
    for file in ["tasks.parquet", "test/tasks.parquet", "distill/math/kept.parquet", "distill/math/coa_text.parquet"] {
        assert!(run.join(file).is_file(), "{file} is missing");
    }
    for file in ["corpus.parquet", "test/corpus.parquet"] {
        assert!(!run.join(file).exists(), "{file} written for a run without multihop");
    }
    assert!(!run.join("distill/multihop").exists());
}

/// `PRECISION=bf16` reaches every CPU product: SFT's and each DAPO step's training, RL's rollouts
/// and both students' evaluation; f32 and the GPU (which multiplies in bf16 anyway) add nothing,
/// and any other value is refused by name before anything runs. The default size runs in bf16,
/// smoke in f32.
#[test]
fn precision_bf16_reaches_every_cpu_training_and_decoding_command() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    // (training commands with --matmul bf16, decoding commands with the bf16 decoder's flags)
    let counts = |size: &str, extra: &[&str]| {
        let size = format!("SIZE={size}");
        let mut args = vec!["-n", "sft", "rl", "eval", size.as_str()];
        args.extend_from_slice(extra);
        let log = make(w, &args);
        (log.matches("--matmul bf16").count(), log.matches("--decode-weights bf16-matmul --kv-cache bf16").count())
    };
    let (train, decode) = counts("smoke", &["PRECISION=bf16"]);
    assert_eq!(train, 2, "SFT and the DAPO step");
    assert_eq!(decode, 3, "RL's rollouts and the two students' evaluation");
    assert_eq!(counts("default", &[]), (2, 3), "the default size's precision is bf16");
    for extra in [&["PRECISION=f32"][..], &[], &["PRECISION=bf16", "DEVICE=cuda"]] {
        assert_eq!(counts("smoke", extra), (0, 0), "{extra:?}");
    }
    assert_eq!(counts("default", &["PRECISION=f32"]), (0, 0));
    let out = Command::new("make").current_dir(w).args(["-n", "--no-print-directory", "CARGO=true", "sft", "PRECISION=fp8"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("PRECISION=fp8: expected f32 or bf16"), "{err}");
}

/// A DAPO step of multihop answers (rows up to ~6,000 tokens) in 16,384 tokens needed more than a
/// 24 GB machine: the default size takes steps of 8,192 when RL trains on multihop, 16,384 on math.
#[test]
fn multihop_rl_takes_smaller_dapo_steps_at_the_default_size() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let dapo = |extra: &[&str]| {
        let mut args = vec!["-n", "rl", "SIZE=default"];
        args.extend_from_slice(extra);
        let log = make(w, &args);
        log.lines().find(|l| l.contains("--objective dapo")).expect("a DAPO command").to_string()
    };
    let (math, multihop) = (dapo(&[]), dapo(&["RL_SUITE=multihop"]));
    assert!(math.contains("--batch-tokens 16384"), "{math}");
    assert!(multihop.contains("--batch-tokens 8192"), "{multihop}");
    assert!(dapo(&["RL_SUITE=multihop", "RL_BATCH_TOKENS=4096"]).contains("--batch-tokens 4096"));
}

/// `make config` (the first thing `make pipeline` does) records every setting of the run with its
/// value and where it came from.
#[test]
fn a_run_records_its_settings_and_where_each_came_from() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    make(w, &["config", "RUN=cfg", "SFT_EPOCHS=1"]);
    let text = std::fs::read_to_string(w.join("runs/cfg/config.txt")).unwrap();
    for line in ["SFT_EPOCHS = 1  [command line]", "RUN = cfg  [command line]", "SEED = 1  [default]", "N_MULTIHOP = 1000  [SIZE=default]", "PRECISION = bf16  [SIZE=default]"] {
        assert!(text.lines().any(|l| l == line), "config.txt has no line `{line}`:\n{text}");
    }
    // One line per ?= setting of the Makefile and pipelines/*.mk, none missing.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut settings = 0;
    for mk in std::iter::once(root.join("Makefile")).chain(std::fs::read_dir(root.join("pipelines")).unwrap().map(|e| e.unwrap().path())) {
        for l in std::fs::read_to_string(&mk).unwrap().lines() {
            if let Some((name, _)) = l.split_once("?=") {
                let name = name.trim();
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
                    settings += 1;
                    assert!(text.lines().any(|t| t.starts_with(&format!("{name} = "))), "{name} ({}) is not in config.txt", mk.display());
                }
            }
        }
    }
    assert!(settings > 50, "{settings} settings found");
    assert!(!w.join("runs/cfg/.config.txt.tmp").exists());
    // A bare `make` (no option: MAKEFLAGS then starts with the Makefile's own long option, whose
    // letters once read as -n) writes it too; `make pipeline` on a fresh clone stopped there.
    let bare = Command::new("make").current_dir(w).args(["CARGO=true", "config", "RUN=bare"]).output().unwrap();
    assert!(bare.status.success() && w.join("runs/bare/config.txt").exists(), "a bare `make config`:\n{}", String::from_utf8_lossy(&bare.stderr));
    // `make -n pipeline` prints every phase's commands and writes nothing.
    let log = make(w, &["-n", "pipeline", "RUN=dry"]);
    for command in ["coa-generate tasks", "coa-generate mas", "coa-train-step", "coa-generate policy", "coa-score"] {
        assert!(log.contains(command), "`make -n pipeline` does not print {command}:\n{log}");
    }
    assert!(!w.join("runs/dry").exists(), "`make -n pipeline` wrote runs/dry");
}
