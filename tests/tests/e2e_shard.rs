//! Sharding end to end: every stage that works row by row, run on the real binaries unsharded and
//! as 3 shards (`--shard I/3`); the shards merged by `coa-filter --rules none --task-order` (a glob
//! of Parquet files read as one table) equal the unsharded output row for row. Also: bad
//! `--shard` values, the cross-row modes that refuse it, empty shards, directory and glob inputs;
//! `make distill` on a real Slurm; `make eval` and `make rl` as local shards against unsharded runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use arrow::compute::concat_batches;
use arrow::record_batch::RecordBatch;
use coa_schemas::io;

const SHARDS: u32 = 3;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn run(dir: &Path, args: &[&str]) -> Output {
    let bin = bin_dir().join(args[0]);
    assert!(bin.exists(), "{} is missing: run `make test` (it builds the stage binaries before the tests)", bin.display());
    Command::new(bin).args(&args[1..]).current_dir(dir).stdin(Stdio::null()).output().expect("the stage runs")
}

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = run(dir, args);
    assert!(out.status.success(), "{args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The valid inputs of every stage, made once (12 tasks: 4 per suite).
fn fixtures() -> &'static Path {
    static F: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &F.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let steps = coa_e2e::fixture_steps("4");
        for args in &steps {
            ok(&d, args);
        }
        (tmp, d)
    })
    .1
}

/// A table's data: its column names and types and the concatenated rows (metadata, which holds
/// the provenance and so the `--shard` argument, left out).
fn data(path: &Path) -> (Vec<(String, String)>, RecordBatch) {
    let reader = io::open_any(Some(path)).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.collect::<anyhow::Result<_>>().unwrap();
    let all = concat_batches(&schema, &batches).unwrap();
    let fields = schema.fields().iter().map(|f| (f.name().clone(), format!("{}", f.data_type()))).collect();
    let bare = std::sync::Arc::new(arrow::datatypes::Schema::new(schema.fields().clone()));
    (fields, RecordBatch::try_new(bare, all.columns().to_vec()).unwrap())
}

/// Runs `args` (with `{IN}`/`{OUT}` placeholders) unsharded and as `SHARDS` shards, merges the
/// shards in the tasks' order and checks the merge equals the unsharded output row for row.
/// Returns the unsharded row count and the shard row counts.
fn assert_shards_add_up(name: &str, input: &str, args: &[&str]) -> (usize, Vec<usize>) {
    let fx = fixtures();
    let work = tempfile::tempdir_in(fx).unwrap();
    let w = work.path();
    std::fs::create_dir(w.join("shards")).unwrap();
    let with = |out: &str, shard: Option<String>| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.replace("{IN}", &fx.join(input).display().to_string()).replace("{OUT}", out)).collect();
        if let Some(s) = shard {
            v.extend(["--shard".to_string(), s]);
        }
        v
    };
    let whole = with("whole.parquet", None);
    ok(w, &whole.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let mut sizes = Vec::new();
    for i in 0..SHARDS {
        let out = format!("shards/part-{i:05}-of-{SHARDS:05}.parquet");
        let a = with(&out, Some(format!("{i}/{SHARDS}")));
        let o = ok(w, &a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        let summary = String::from_utf8_lossy(&o.stderr);
        assert!(summary.contains(&format!("\"shard\":\"{i}/{SHARDS}\"")), "{name}: the summary names the shard:\n{summary}");
        sizes.push(data(&w.join(&out)).1.num_rows());
    }
    let tasks = fx.join("tasks.parquet").display().to_string();
    ok(w, &["coa-filter", "--rules", "none", "-i", "shards/*.parquet", "--task-order", &tasks, "-o", "merged.parquet"]);
    let (whole_fields, whole_rows) = data(&w.join("whole.parquet"));
    let (merged_fields, merged_rows) = data(&w.join("merged.parquet"));
    assert_eq!(merged_fields, whole_fields, "{name}: the shards' columns");
    assert_eq!(merged_rows.num_rows(), whole_rows.num_rows(), "{name}: rows (shards {sizes:?})");
    for (i, (a, b)) in merged_rows.columns().iter().zip(whole_rows.columns()).enumerate() {
        assert_eq!(a, b, "{name}: column `{}` of the merged shards differs from the unsharded output", whole_fields[i].0);
    }
    assert!(whole_rows.num_rows() > 0, "{name}: the fixture gives this stage rows to shard");
    assert_eq!(sizes.iter().sum::<usize>(), whole_rows.num_rows());
    (whole_rows.num_rows(), sizes)
}

#[test]
fn shards_of_coa_generate_mas_merge_to_the_unsharded_runs() {
    let corpus = fixtures().join("corpus.parquet").display().to_string();
    let (rows, sizes) = assert_shards_add_up("mas", "tasks.parquet", &["coa-generate", "mas", "-i", "{IN}", "--corpus", &corpus, "--seed", "1", "-o", "{OUT}"]);
    assert_eq!(rows, 12);
    // 12 tasks over 3 shards: no shard holds them all.
    assert!(sizes.iter().all(|&n| n < 12), "{sizes:?}");
}

#[test]
fn shards_of_coa_extract_merge_to_the_unsharded_trajectories() {
    assert_shards_add_up("extract", "mas_runs.parquet", &["coa-extract", "-i", "{IN}", "-o", "{OUT}"]);
}

#[test]
fn shards_of_coa_filter_with_the_distillation_rules_merge_to_the_unsharded_output() {
    // dedup (keyed by task_id + steps), reflection down-sampling (per task and seed), error-correction copies.
    assert_shards_add_up("filter", "trajectories.parquet", &["coa-filter", "-i", "{IN}", "--seed", "3", "--min-hops", "2", "--no-reflection-keep", "0.5", "-o", "{OUT}"]);
    assert_shards_add_up("filter --where", "tasks.parquet", &["coa-filter", "-i", "{IN}", "--rules", "none", "--where", "suite <> 'code'", "-o", "{OUT}"]);
}

#[test]
fn shards_of_coa_convert_merge_to_the_unsharded_coa_text() {
    assert_shards_add_up("convert", "trajectories.parquet", &["coa-convert", "-i", "{IN}", "--skip-bad", "bad.parquet", "-o", "{OUT}"]);
}

#[test]
fn shards_of_coa_tokenize_merge_to_the_unsharded_tokens() {
    let tok = fixtures().join("tok.json").display().to_string();
    assert_shards_add_up("tokenize", "coa_text.parquet", &["coa-tokenize", "-i", "{IN}", "--tokenizer", &tok, "--max-len", "1024", "--overlong", "truncate", "-o", "{OUT}"]);
}

#[test]
fn shards_of_coa_generate_policy_merge_to_the_unsharded_rollouts() {
    let fx = fixtures();
    let (ckpt, corpus) = (fx.join("ckpt").display().to_string(), fx.join("corpus.parquet").display().to_string());
    let (rows, _) = assert_shards_add_up(
        "policy",
        "tasks.parquet",
        &["coa-generate", "policy", "--checkpoint", &ckpt, "-i", "{IN}", "--corpus", &corpus, "--n", "2", "--max-response-tokens", "12", "--seed", "5", "-o", "{OUT}"],
    );
    assert_eq!(rows, 24, "2 samples of each of 12 tasks");
}

#[test]
fn shards_of_coa_score_merge_to_the_unsharded_scores() {
    let tasks = fixtures().join("tasks.parquet").display().to_string();
    // GRPO advantages are per task group: every sample of a task is in one shard.
    assert_shards_add_up("score", "rollouts.parquet", &["coa-score", "-i", "{IN}", "--tasks", &tasks, "-o", "{OUT}"]);
}

fn refused(args: &[&str], wanted: &[&str]) {
    let fx = fixtures();
    let out = run(fx, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    for w in wanted {
        assert!(stderr.contains(w), "{args:?}: stderr should name `{w}`:\n{stderr}");
    }
    assert!(!fx.join("refused.parquet").exists(), "{args:?} left an output behind");
}

#[test]
fn bad_shard_values_are_refused_naming_the_flag() {
    for bad in ["4/4", "5/4", "0/0", "-1/4", "2", "a/b", "1/2/3"] {
        // `--shard=-1/4`: clap reads a separate `-1/4` as a flag.
        refused(&["coa-extract", "-i", "mas_runs.parquet", &format!("--shard={bad}"), "-o", "refused.parquet"], &["--shard", "expected I/N with 0 <= I < N"]);
    }
    refused(&["coa-generate", "mas", "-i", "tasks.parquet", "--corpus", "corpus.parquet", "--shard", "3/3", "-o", "refused.parquet"], &["--shard", "`3/3`"]);
}

#[test]
fn cross_row_modes_refuse_shard_and_say_what_they_need() {
    refused(&["coa-filter", "-i", "tasks.parquet", "--rules", "none", "--dedup-key", "question", "--shard", "0/2", "-o", "refused.parquet"], &["--dedup-key question", "add task_id to the key"]);
    refused(&["coa-filter", "-i", "scores.parquet", "--dynamic-sampling", "--group-by", "model", "--shard", "0/2", "-o", "refused.parquet"], &["--group-by model", "--group-by task_id"]);
    refused(&["coa-tokenize", "-i", "coa_text.parquet", "--train-bpe", "--save-tokenizer", "t.json", "--shard", "0/2", "-o", "refused.parquet"], &["--train-bpe", "train it once"]);
    refused(&["coa-tokenize", "-i", "coa_text.parquet", "--tokenizer", "tok.json", "--max-len", "1024", "--pack", "--shard", "0/2", "-o", "refused.parquet"], &["--pack", "pack the merged tokens"]);
    refused(&["coa-score", "-i", "rollouts.parquet", "--tasks", "tasks.parquet", "--report", "r.md", "--shard", "0/2", "-o", "refused.parquet"], &["--report", "score them unsharded"]);
    refused(&["coa-convert", "-i", "trajectories.parquet", "--to", "sharegpt", "--shard", "0/2", "-o", "refused.json"], &["--to sharegpt", "whole dataset"]);
    refused(&["coa-convert", "-i", "trajectories.parquet", "--to", "verl", "--shard", "0/2", "-o", "refused.parquet"], &["--to verl", "whole dataset"]);
    // A table without task ids cannot be split by task.
    refused(&["coa-filter", "-i", "metrics.parquet", "--rules", "none", "--shard", "0/2", "-o", "refused.parquet"], &["metrics.parquet", "needs a `task_id` column"]);
    // Merging rows whose task is not in the order file.
    let one = run(fixtures(), &["coa-filter", "-i", "tasks.parquet", "--rules", "none", "--where", "suite = 'math'", "-o", "math_tasks.parquet"]);
    assert!(one.status.success());
    refused(&["coa-filter", "-i", "tasks.parquet", "--rules", "none", "--task-order", "math_tasks.parquet", "-o", "refused.parquet"], &["not in --task-order math_tasks.parquet"]);
}

#[test]
fn an_empty_shard_writes_a_valid_empty_table() {
    let fx = fixtures();
    let work = tempfile::tempdir_in(fx).unwrap();
    let w = work.path();
    // One task, 8 shards: 7 of them hold nothing.
    ok(w, &["coa-filter", "-i", &fx.join("tasks.parquet").display().to_string(), "--rules", "none", "--where", "task_id = 'math-train-000000'", "-o", "one.parquet"]);
    assert_eq!(data(&w.join("one.parquet")).1.num_rows(), 1, "the fixture has task math-train-000000");
    let mut rows = Vec::new();
    for i in 0..8 {
        let out = format!("runs-{i}.parquet");
        ok(w, &["coa-generate", "mas", "-i", "one.parquet", "--shard", &format!("{i}/8"), "-o", &out]);
        let (fields, batch) = data(&w.join(&out));
        assert!(fields.iter().any(|(n, _)| n == "events"), "an empty shard keeps the mas_runs schema: {fields:?}");
        rows.push(batch.num_rows());
        // ... and the next stage reads it.
        ok(w, &["coa-extract", "-i", &out, "-o", &format!("traj-{i}.parquet")]);
    }
    assert_eq!(rows.iter().sum::<usize>(), 1);
    assert_eq!(rows.iter().filter(|&&n| n == 0).count(), 7, "{rows:?}");
}

#[test]
fn a_directory_or_glob_of_parquet_files_reads_as_one_table() {
    let fx = fixtures();
    let work = tempfile::tempdir_in(fx).unwrap();
    let w = work.path();
    std::fs::create_dir(w.join("parts")).unwrap();
    for i in 0..2 {
        ok(w, &["coa-filter", "-i", &fx.join("tasks.parquet").display().to_string(), "--rules", "none", "--shard", &format!("{i}/2"), "-o", &format!("parts/p{i}.parquet")]);
    }
    // A writer's temporary file and a marker file in the directory are not part of the table.
    std::fs::write(w.join("parts/.p2.parquet.123.tmp"), b"partial").unwrap();
    std::fs::write(w.join("parts/_SUCCESS"), b"").unwrap();
    let tasks = data(&fx.join("tasks.parquet")).1.num_rows();
    for input in ["parts", "parts/p*.parquet"] {
        let o = ok(w, &["coa-filter", "-i", input, "--rules", "none", "-o", "all.parquet"]);
        assert_eq!(data(&w.join("all.parquet")).1.num_rows(), tasks, "{input}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // Any stage reads it: the teacher on the directory of task shards.
    ok(w, &["coa-generate", "mas", "-i", "parts", "--corpus", &fx.join("corpus.parquet").display().to_string(), "-o", "runs.parquet"]);
    assert_eq!(data(&w.join("runs.parquet")).1.num_rows(), tasks);

    let fails = |args: &[&str], wanted: &str| {
        let out = run(w, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(wanted), "{args:?}: expected `{wanted}`:\n{stderr}");
    };
    fails(&["coa-filter", "-i", "parts/q*.parquet", "--rules", "none", "-o", "x.parquet"], "no file matches this pattern");
    std::fs::create_dir(w.join("empty")).unwrap();
    fails(&["coa-filter", "-i", "empty", "--rules", "none", "-o", "x.parquet"], "holds no *.parquet file");
    // Two different tables in one directory.
    std::fs::copy(fx.join("corpus.parquet"), w.join("parts/p9.parquet")).unwrap();
    fails(&["coa-filter", "-i", "parts", "--rules", "none", "-o", "x.parquet"], "differ from those of");
    assert!(!w.join("x.parquet").exists());
}

// ---------------------------------------------------------------------------------------------
// On a real Slurm: `make distill EXECUTOR=slurm SHARDS=4` against the local unsharded run, and a
// killed array task rerun. The cluster is started by tests/slurm/start_cluster.sh (one node,
// root, Debian's slurm-wlm and munge); where it cannot start, the test says why and skips.

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A running one-node cluster, stopped (daemons and jobs) when dropped, even on a failed assert.
struct Cluster {
    dir: tempfile::TempDir,
    conf: String,
}

impl Cluster {
    fn start() -> Result<Cluster, String> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("bash").arg(repo_root().join("tests/slurm/start_cluster.sh")).arg(dir.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let cluster = Cluster { conf: dir.path().join("slurm.conf").display().to_string(), dir };
        match out.status.code() {
            Some(0) => Ok(cluster),
            Some(3) => Err(stderr.trim().to_string()),
            _ => panic!("tests/slurm/start_cluster.sh failed:\n{stderr}"),
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf).env("PATH", format!("{}:/usr/sbin", std::env::var("PATH").unwrap_or_default()));
        // shards.sh asks squeue every second here (every 5 s by default).
        c.env("SHARDS_POLL_SECONDS", "1");
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(repo_root().join("tests/slurm/stop_cluster.sh")).arg(self.dir.path()).status();
    }
}

/// A directory where `make` runs this checkout's Makefile into its own runs/, with the test
/// build's binaries (`CARGO=true`: nothing is rebuilt).
fn make_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["Makefile", "pipelines"] {
        std::os::unix::fs::symlink(repo_root().join(name), dir.path().join(name)).unwrap();
    }
    dir
}

/// `make` (the command `c`, run in `dir`) with the test build's binaries; its output, or a panic
/// with it when make fails.
fn run_make(mut c: Command, dir: &Path, settings: &[&str], args: &[&str]) -> String {
    let bin = bin_dir().display().to_string();
    c.current_dir(dir).args(["--no-print-directory", "CARGO=true", &format!("BIN={bin}")]).args(settings).args(args).stdin(Stdio::null());
    let out = c.output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "make {args:?} failed:\n{log}");
    log
}

fn make(cluster: &Cluster, dir: &Path, args: &[&str]) -> String {
    run_make(cluster.command("make"), dir, &["-j3", "SIZE=smoke", "N_MULTIHOP=8", "N_MATH=8", "N_CODE=8"], args)
}

/// Two tables hold the same columns and rows.
fn same_table(a: &Path, b: &Path, what: &str) {
    let ((fa, ra), (fb, rb)) = (data(a), data(b));
    assert_eq!(fa, fb, "{what}: columns");
    assert_eq!(ra.num_rows(), rb.num_rows(), "{what}: rows");
    for (i, (x, y)) in ra.columns().iter().zip(rb.columns()).enumerate() {
        assert_eq!(x, y, "{what}: column `{}` differs", fa[i].0);
    }
}

/// `pipelines/shards.sh --executor slurm ARGS -- COMMAND` on the cluster, in `dir`, with the test
/// build's binaries, its output piped.
fn shards_sh(cluster: &Cluster, dir: &Path, args: &[&str], command: &str) -> Command {
    let mut c = cluster.command("bash");
    c.current_dir(dir).arg(repo_root().join("pipelines/shards.sh")).args(["--executor", "slurm", "--bin", &bin_dir().display().to_string()]);
    c.args(args).args(["--", command]).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits (up to `tries` tenths of a second) for a running array task and does `act` to it until
/// `act` says it took; the task's id.
fn on_a_running_task(cluster: &Cluster, tries: usize, act: impl Fn(&str) -> bool) -> String {
    for _ in 0..tries {
        let q = cluster.command("squeue").args(["-h", "-t", "R", "-o", "%i"]).output().unwrap();
        if let Some(id) = String::from_utf8_lossy(&q.stdout).lines().map(|s| s.trim().to_string()).find(|s| s.contains('_')) {
            if act(&id) {
                return id;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("no array task was seen running within {} s", tries / 10);
}

#[test]
fn make_distill_and_eval_on_slurm_equal_the_local_unsharded_runs_and_a_killed_task_reruns() {
    let started = std::time::Instant::now();
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED make_distill_and_eval_on_slurm...: {why}");
            return;
        }
    };
    let work = make_dir();
    let w = work.path();
    make(&cluster, w, &["distill", "RUN=local"]);
    let log = make(&cluster, w, &["distill", "RUN=slurm", "EXECUTOR=slurm", "SHARDS=4", "SLURM_CPUS=1", "SLURM_MEM=512M"]);
    assert!(log.contains("4 shard(s) merged (slurm)"), "{log}");
    for suite in ["multihop", "math", "code"] {
        for table in ["mas_runs", "trajectories", "kept", "dropped", "coa_text", "verl"] {
            let (a, b) = (w.join(format!("runs/local/distill/{suite}/{table}.parquet")), w.join(format!("runs/slurm/distill/{suite}/{table}.parquet")));
            same_table(&a, &b, &format!("{suite}/{table} of the Slurm run against the local run"));
        }
        let shards: Vec<_> = std::fs::read_dir(w.join(format!("runs/slurm/distill/{suite}/mas_runs.parquet.shards"))).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).filter(|n| n.ends_with(".parquet")).collect();
        assert_eq!(shards.len(), 4, "{shards:?}");
    }
    // The summary table (teacher success, tokens per task from the merged shard summaries) is the same.
    let table = |run: &str| -> Vec<String> {
        std::fs::read_to_string(w.join(format!("runs/{run}/distill/report.md"))).unwrap().lines().filter(|l| l.starts_with('|')).map(String::from).collect()
    };
    assert_eq!(table("slurm"), table("local"));

    // make eval on Slurm: the teacher's and both students' rollouts as arrays of 2, against the
    // unsharded small run.
    let small = small_run();
    copy_run(small, "a", "slurm_eval", &["eval"]);
    let log = run_make(cluster.command("make"), small, SMALL_RUN, &["eval", "RUN=slurm_eval", "EXECUTOR=slurm", "SHARDS=2", "SLURM_CPUS=1", "SLURM_MEM=512M"]);
    for student in ["sft", "rl"] {
        assert!(log.contains(&format!("runs/slurm_eval/eval/{student}/rollouts.parquet: 2 shard(s) merged (slurm)")), "{log}");
        let scores = format!("eval/{student}/scores.parquet");
        same_table(&small.join(format!("runs/a/{scores}")), &small.join(format!("runs/slurm_eval/{scores}")), &format!("{student}'s scores on Slurm"));
    }

    // A killed array task: shard commands slow enough to be caught running, one killed with
    // scancel; its output is missing when the array ends, so it alone is resubmitted.
    let tasks = w.join("runs/local/tasks.parquet").display().to_string();
    let out = w.join("killed/tasks.parquet").display().to_string();
    let command = format!("sleep 6; {}/coa-filter -i {tasks} --rules none $SHARD -o $OUT", bin_dir().display());
    let child = shards_sh(&cluster, w, &["--shards", "3", "--retries", "1", "--cpus", "1", "--mem", "256M", "--out", &out, "--order", &tasks], &command).spawn().unwrap();
    let killed = on_a_running_task(&cluster, 200, |id| {
        let s = cluster.command("scancel").args(["--signal=KILL", "--full", id]).status().unwrap();
        assert!(s.success(), "scancel {id}");
        true
    });
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "shards.sh failed after killing {killed}:\n{stderr}");
    let shard = killed.rsplit('_').next().unwrap();
    assert!(stderr.contains(&format!("rerunning shard(s) {shard} (retry 1 of 1)")), "killed {killed}:\n{stderr}");
    // The retry runs with twice the time limit, and the index names the job that ran each shard.
    let retry = stderr.lines().filter_map(|l| l.split("submitted job ").nth(1)).last().unwrap().split(':').next().unwrap().to_string();
    assert!(stderr.contains(&format!("submitted job {retry}: shards 0+({shard}), time limit 0-02:00:00")), "{stderr}");
    let limit = cluster.command("scontrol").args(["show", "job", &retry]).output().unwrap();
    assert!(String::from_utf8_lossy(&limit.stdout).contains("TimeLimit=02:00:00"), "{}", String::from_utf8_lossy(&limit.stdout));
    let index = std::fs::read_to_string(w.join("killed/tasks.parquet.shards/logs/index.tsv")).unwrap();
    let rows: Vec<Vec<&str>> = index.lines().skip(1).map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 3, "{index}");
    assert!(rows.iter().all(|r| r[3] == "done" && r[5].ends_with(".log") && Path::new(r[5]).exists()), "{index}");
    assert_eq!(rows[shard.parse::<usize>().unwrap()][1], format!("{retry}_{shard}"), "{index}");
    assert_eq!(data(Path::new(&out)).1.columns(), data(Path::new(&tasks)).1.columns(), "the merged shards are the tasks table");

    // At most 3 tasks of an array at once; a task requeued while running (as after a preemption)
    // is waited for and not rerun as missing.
    let out = w.join("many/tasks.parquet").display().to_string();
    let command = format!("sleep 2; {}/coa-filter -i {tasks} --rules none $SHARD -o $OUT", bin_dir().display());
    let args = ["--shards", "12", "--retries", "0", "--cpus", "1", "--mem", "256M", "--array-limit", "3", "--out", &out, "--order", &tasks];
    let child = shards_sh(&cluster, w, &args, &command).spawn().unwrap();
    let requeued = on_a_running_task(&cluster, 300, |id| cluster.command("scontrol").args(["requeue", id]).status().unwrap().success());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "shards.sh failed after requeueing {requeued}:\n{stderr}");
    assert!(stderr.contains("shards 0+(0-11)"), "one array:\n{stderr}");
    let job = stderr.split("submitted job ").nth(1).unwrap().split(':').next().unwrap();
    let spec = cluster.command("scontrol").args(["show", "job", job]).output().unwrap();
    let spec = String::from_utf8_lossy(&spec.stdout);
    assert!(spec.contains("ArrayTaskThrottle=3"), "{spec}");
    assert!(!stderr.contains("rerunning"), "the requeued task {requeued} ran again by Slurm, not as a retry:\n{stderr}");
    assert_eq!(data(Path::new(&out)).1.columns(), data(Path::new(&tasks)).1.columns(), "12 shards merged are the tasks table");

    // 1,100 shards of a fast stage: more than the cluster's MaxArraySize (Slurm's 1001), so two
    // arrays, the second with an offset; merged, they are the tasks table.
    let t_many = std::time::Instant::now();
    let out = w.join("1100/tasks.parquet").display().to_string();
    let command = format!("{}/coa-filter -i {tasks} --rules none $SHARD -o $OUT", bin_dir().display());
    let args = ["--shards", "1100", "--retries", "0", "--cpus", "1", "--mem", "128M", "--out", &out, "--order", &tasks];
    let done = shards_sh(&cluster, w, &args, &command).output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "1,100 shards:\n{stderr}");
    assert!(stderr.contains("shards 0+(0-1000)") && stderr.contains("shards 1001+(0-98)"), "two arrays under MaxArraySize 1001:\n{stderr}");
    assert_eq!(data(Path::new(&out)).1.columns(), data(Path::new(&tasks)).1.columns(), "1,100 shards merged are the tasks table");
    let many_secs = t_many.elapsed().as_secs_f64();

    // A submission sbatch refuses is an error at once, not retried.
    let refused_out = w.join("refused/t.parquet").display().to_string();
    let args = ["--shards", "2", "--retries", "2", "--partition", "no_such_partition", "--out", &refused_out, "--order", &tasks];
    let refused = shards_sh(&cluster, w, &args, "true").output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("sbatch refused the array of shards 0+(0-1)") && !stderr.contains("rerunning"), "{stderr}");

    // A task told to stop (SIGTERM, what Slurm sends at a preemption or a time limit) while its
    // stage writes: the stage removes its temporary output and the shard is missing, not torn.
    // The stage reads the head of a table stream and then waits, so it is caught mid-write.
    let out = w.join("term/tasks.parquet").display().to_string();
    let b = bin_dir().display().to_string();
    let command = format!("{b}/coa-filter -i {tasks} --rules none $SHARD -o - | {{ head -c 3000; sleep 60; }} | {b}/coa-filter --rules none -o $OUT");
    let child = shards_sh(&cluster, w, &["--shards", "1", "--retries", "0", "--cpus", "1", "--mem", "256M", "--out", &out, "--order", &tasks], &command).spawn().unwrap();
    let shards_dir = w.join("term/tasks.parquet.shards");
    let temps = || -> Vec<String> {
        std::fs::read_dir(&shards_dir).map(|d| d.flatten().map(|e| e.file_name().into_string().unwrap()).filter(|n| n.starts_with(".part-")).collect()).unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while temps().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the stage never started writing its part");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let stopped = on_a_running_task(&cluster, 100, |id| cluster.command("scancel").args(["--signal=TERM", "--full", id]).status().unwrap().success());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success() && stderr.contains("shard(s) 0 still have no output after 0 retries"), "{stderr}");
    assert_eq!(temps(), Vec::<String>::new(), "task {stopped} stopped by SIGTERM left its temporary output");

    // A rerun while the arrays of an earlier run are still queued or running attaches to them:
    // a detached submission (as a driver job makes it) returns at once with status 3, the same
    // command run again waits for those arrays and merges, submitting nothing.
    let out = w.join("attach/tasks.parquet").display().to_string();
    let command = format!("sleep 3; {b}/coa-filter -i {tasks} --rules none $SHARD -o $OUT");
    let args = ["--shards", "3", "--cpus", "1", "--mem", "256M", "--out", &out, "--order", &tasks];
    let pending = w.join("attach.pending");
    let detached = shards_sh(&cluster, w, &args, &command).env("COA_SLURM_DETACH", &pending).env("COA_SLURM_CHAIN", "test").output().unwrap();
    let stderr = String::from_utf8_lossy(&detached.stderr);
    assert_eq!(detached.status.code(), Some(3), "{stderr}");
    let job = std::fs::read_to_string(&pending).unwrap().trim().to_string();
    assert!(stderr.contains(&format!("submitted job {job}: shards 0+(0-2)")), "{stderr}");
    let attached = shards_sh(&cluster, w, &args, &command).output().unwrap();
    let stderr = String::from_utf8_lossy(&attached.stderr);
    assert!(attached.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("attaching to job(s) {job}")) && !stderr.contains("submitted job"), "{stderr}");
    assert_eq!(data(Path::new(&out)).1.columns(), data(Path::new(&tasks)).1.columns());

    // Submit and return: `make submit` queues a driver job and returns; the chain of drivers runs
    // make, each sharded stage submits its arrays and the next driver waits for them; a second
    // submit attaches; the tables equal the local run's, and each extraction shard read its own
    // part of the teacher's runs.
    let t0 = std::time::Instant::now();
    let submit = ["submit", "GOALS=distill", "RUN=detached", "SHARDS=4", "SLURM_CPUS=1", "SLURM_MEM=512M", "SLURM_DRIVER_CPUS=1", "SLURM_DRIVER_MEM=1G"];
    let log = make(&cluster, w, &submit);
    assert!(log.contains("driver job") && log.contains("submitted") && t0.elapsed().as_secs() < 20, "{log}");
    let again = make(&cluster, w, &submit);
    assert!(again.contains("is already being run by driver job"), "{again}");
    let status = make(&cluster, w, &["-s", "status", "RUN=detached"]);
    assert!(status.contains("driver: job"), "{status}");
    // The driver killed once it has submitted arrays and its successor (cancelled: it waits on
    // them), and submitted again: the new driver finds those arrays and submits none twice.
    let slurm_dir = w.join("runs/detached/slurm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(slurm_dir.join("drivers.tsv")).unwrap().lines().count() < 2 {
        assert!(std::time::Instant::now() < deadline, "the first driver never submitted a second one");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let killed_driver = std::fs::read_to_string(slurm_dir.join("driver.jobid")).unwrap().trim().to_string();
    assert!(cluster.command("scancel").arg(&killed_driver).status().unwrap().success());
    while !String::from_utf8_lossy(&cluster.command("squeue").args(["-h", "-j", &killed_driver, "-o", "%T"]).output().unwrap().stdout).trim().is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let restarted = make(&cluster, w, &submit);
    assert!(restarted.contains("submitted") && !restarted.contains("already"), "{restarted}");
    let result = w.join("runs/detached/slurm/result");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !result.exists() {
        assert!(std::time::Instant::now() < deadline, "the driver chain did not end within 300 s:\n{}", make(&cluster, w, &["-s", "status", "RUN=detached"]));
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let status = make(&cluster, w, &["-s", "status", "RUN=detached"]);
    assert!(std::fs::read_to_string(&result).unwrap().starts_with("done"), "{status}");
    assert_eq!(status.lines().filter(|l| l.ends_with("  merged")).count(), 6, "{status}");
    let drivers = std::fs::read_to_string(w.join("runs/detached/slurm/drivers.tsv")).unwrap();
    assert!(drivers.lines().count() >= 3 && drivers.lines().nth(1).unwrap().contains("\tafter "), "{drivers}");
    for suite in ["multihop", "math", "code"] {
        for stage in ["mas_runs", "trajectories"] {
            let jobs = std::fs::read_to_string(w.join(format!("runs/detached/distill/{suite}/{stage}.parquet.shards/logs/jobs.tsv"))).unwrap();
            assert_eq!(jobs.lines().count(), 1, "{suite}/{stage}: one submission, after the driver {killed_driver} was killed:\n{jobs}");
        }
        for table in ["mas_runs", "trajectories", "kept", "coa_text"] {
            let (a, b) = (w.join(format!("runs/local/distill/{suite}/{table}.parquet")), w.join(format!("runs/detached/distill/{suite}/{table}.parquet")));
            same_table(&a, &b, &format!("{suite}/{table} of the detached run against the local run"));
        }
        let shard_log = std::fs::read_dir(w.join(format!("runs/detached/distill/{suite}/trajectories.parquet.shards/logs"))).unwrap().flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("slurm-")).unwrap().path();
        let text = std::fs::read_to_string(&shard_log).unwrap();
        assert!(text.contains("from ") && text.contains("mas_runs.parquet.shards/part-"), "{}: {text}", shard_log.display());
    }
    eprintln!(
        "slurm test: {:.1} s (killed array task {killed}, rerun; requeued {requeued}; stopped {stopped}; 1,100 shards {many_secs:.1} s; \
         detached chain {:.1} s, driver {killed_driver} killed and resubmitted)",
        started.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// `make rl` and `make eval` as local shards against the unsharded run, on a tiny smoke run: one
// run (`a`) makes everything unsharded; copies of it (timestamps kept, so make redoes only what
// was deleted) redo eval or rl with SHARDS=2.

/// The smoke run's settings, cut to what exercises rl and eval: 40 math tasks (4 in RL iteration
/// 1: task ids ending in 1) and 4 multihop ones (the test split's corpus needs the suite), 9 test
/// tasks, 12 SFT steps (enough for one RL group of 4 with unequal rewards, through the overlong
/// term), short budgets (eval's 512: coa-score's default Lcache).
const SMALL_RUN: &[&str] = &[
    "SIZE=smoke", "SUITES=multihop math", "N_MULTIHOP=4", "N_MATH=40", "TEST_N_MULTIHOP=3", "TEST_N_MATH=6",
    "SFT_STEPS=12", "SFT_WARMUP=2", "SFT_BATCH_TOKENS=4096", "SFT_SAVE_EVERY=12", "SFT_VOCAB=600",
    "RL_ITERS=1", "RL_SUITE=math", "RL_N=3", "RL_GROUPS=2", "RL_MAX_RESPONSE=48", "RL_OVERLONG=40", "RL_MAX_TURNS=3",
    "RL_BATCH_TOKENS=4096", "EVAL_MAX_RESPONSE=512", "EVAL_MAX_TURNS=3",
];

fn make_local(dir: &Path, args: &[&str]) -> String {
    run_make(Command::new("make"), dir, SMALL_RUN, args)
}

/// runs/<from> copied to runs/<to> with its timestamps, less `drop` (paths inside the run).
fn copy_run(dir: &Path, from: &str, to: &str, drop: &[&str]) {
    let s = Command::new("cp").args(["-a", &format!("runs/{from}"), &format!("runs/{to}")]).current_dir(dir).status().unwrap();
    assert!(s.success());
    for d in drop {
        std::fs::remove_dir_all(dir.join(format!("runs/{to}/{d}"))).unwrap();
    }
}

/// The (task_id, sample_idx) of each row and the row itself, for comparing rows across tables.
fn rows_by_sample(path: &Path) -> Vec<((String, i32), RecordBatch)> {
    let (_, all) = data(path);
    let ids = all.column_by_name("task_id").unwrap().as_any().downcast_ref::<arrow::array::StringArray>().unwrap().clone();
    let idx = all.column_by_name("sample_idx").unwrap().as_any().downcast_ref::<arrow::array::Int32Array>().unwrap().clone();
    (0..all.num_rows()).map(|i| ((ids.value(i).to_string(), idx.value(i)), all.slice(i, 1))).collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The directory of the unsharded run `a` (`make eval`: tasks, distill, sft, rl, eval), made once.
fn small_run() -> &'static Path {
    static RUN: OnceLock<tempfile::TempDir> = OnceLock::new();
    RUN.get_or_init(|| {
        let started = std::time::Instant::now();
        let work = make_dir();
        make_local(work.path(), &["eval", "RUN=a"]);
        eprintln!("the unsharded small run (make eval RUN=a): {:.1} s", started.elapsed().as_secs_f64());
        work
    })
    .path()
}

#[test]
fn make_eval_in_local_shards_equals_the_unsharded_run() {
    let w = small_run();
    let started = std::time::Instant::now();
    let run = |name: &str, path: &str| w.join(format!("runs/{name}/{path}"));
    // The teacher and both students' greedy rollouts as 2 shards; the rollouts merged, then scored
    // once: the scores, the students' reports and the comparison table are the unsharded ones.
    copy_run(w, "a", "eval2", &["eval"]);
    let log = make_local(w, &["eval", "RUN=eval2", "SHARDS=2"]);
    for student in ["sft", "rl"] {
        assert!(log.contains(&format!("runs/eval2/eval/{student}/rollouts.parquet: 2 shard(s) merged (local)")), "{log}");
        same_table(&run("a", &format!("eval/{student}/scores.parquet")), &run("eval2", &format!("eval/{student}/scores.parquet")), student);
        assert_eq!(json(&run("a", &format!("eval/{student}/report.json"))), json(&run("eval2", &format!("eval/{student}/report.json"))), "{student}");
        let parts = std::fs::read_dir(run("eval2", &format!("eval/{student}/rollouts.parquet.shards"))).unwrap().flatten();
        assert_eq!(parts.filter(|e| e.file_name().to_string_lossy().ends_with(".parquet")).count(), 2);
    }
    // The comparison table (the lines after it name the run's directory).
    let table = |name: &str| -> Vec<String> {
        std::fs::read_to_string(run(name, "eval/report.md")).unwrap().lines().filter(|l| l.starts_with('|')).map(String::from).collect()
    };
    assert_eq!(table("eval2"), table("a"));
    eprintln!("make eval SHARDS=2: {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn make_rl_in_local_shards_keeps_groups_whole_and_each_tasks_samples() {
    let w = small_run();
    let started = std::time::Instant::now();
    let run = |name: &str, path: &str| w.join(format!("runs/{name}/{path}"));
    // rl without oversampling: every task of the iteration, unsharded and as 2 shards, gives the
    // same rollouts, scores and (CPU, deterministic) DAPO step.
    copy_run(w, "a", "all1", &["rl", "eval", "tensorboard/rl"]);
    copy_run(w, "a", "all2", &["rl", "eval", "tensorboard/rl"]);
    make_local(w, &["rl", "RUN=all1", "RL_OVERSAMPLE=0"]);
    let log = make_local(w, &["rl", "RUN=all2", "RL_OVERSAMPLE=0", "SHARDS=2"]);
    assert!(log.contains("runs/all2/rl/iter1/rollouts.parquet: 2 shard(s) merged (local)"), "{log}");
    let all = run("all1", "rl/iter1/scores.arrows");
    same_table(&all, &run("all2", "rl/iter1/scores.arrows"), "rl scores without oversampling");
    let tasks: std::collections::BTreeSet<String> = rows_by_sample(&all).into_iter().map(|((t, _), _)| t).collect();
    assert_eq!(tasks.len(), 4, "the iteration's 4 tasks: {tasks:?}");
    let weights = |name: &str| std::fs::read(run(name, "rl/checkpoint/model.safetensors")).unwrap();
    assert!(weights("all1") == weights("all2"), "the DAPO step on equal rollouts gives equal weights");

    // rl with oversampling (the default): each shard draws its share of RL_GROUPS from its own
    // tasks; every group is whole, and every sample equals the one the task draws unsharded.
    copy_run(w, "a", "over2", &["rl", "eval", "tensorboard/rl"]);
    make_local(w, &["rl", "RUN=over2", "SHARDS=2"]);
    let policy = json(&run("over2", "rl/iter1/policy.json"));
    assert_eq!(policy["shards"], 2, "{policy}");
    assert_eq!(policy["groups_wanted"], 2, "the shards' shares add up to RL_GROUPS: {policy}");
    let reference: std::collections::HashMap<(String, i32), RecordBatch> = rows_by_sample(&all).into_iter().collect();
    let over = rows_by_sample(&run("over2", "rl/iter1/scores.arrows"));
    assert_eq!(over.len() as u64, policy["rows_out"].as_u64().unwrap());
    let mut per_task = std::collections::BTreeMap::<String, usize>::new();
    for ((task, k), row) in &over {
        *per_task.entry(task.clone()).or_default() += 1;
        let same = &reference[&(task.clone(), *k)];
        // The rollout columns (rewards and advantages too: a group's are computed within it).
        assert_eq!(row.columns(), same.columns(), "task {task} sample {k}: sharded oversampling drew other samples");
    }
    assert!(per_task.values().all(|&n| n == 3), "whole groups of RL_N=3 only: {per_task:?}");
    assert!(json(&run("over2", "rl/iter1/train.json"))["steps"].as_u64().unwrap() >= 1);

    // Resume: a lost shard is redone alone; the other part, made from the same starting
    // checkpoint bytes, is reused although the loop redoes the DAPO step.
    let parts = run("over2", "rl/iter1/rollouts.parquet.shards");
    let kept = parts.join("part-00000-of-00002.parquet");
    let before = std::fs::metadata(&kept).unwrap().modified().unwrap();
    std::fs::remove_file(parts.join("part-00001-of-00002.parquet")).unwrap();
    std::fs::remove_dir_all(run("over2", "rl/checkpoint")).unwrap();
    make_local(w, &["rl", "RUN=over2", "SHARDS=2"]);
    assert_eq!(std::fs::metadata(&kept).unwrap().modified().unwrap(), before, "shard 0 was not rerun");
    assert!(parts.join("part-00001-of-00002.parquet").exists(), "shard 1 was rerun");
    eprintln!("make rl, unsharded and SHARDS=2, with and without oversampling, and a resume: {:.1} s", started.elapsed().as_secs_f64());
}
