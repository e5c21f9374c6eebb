//! End-to-end tests live in `tests/tests/`; what several of them share is here.

/// The commands (run in one directory, in order) that make a valid input for every stage:
/// `per_suite` tasks of each suite with their corpus, the teacher's runs, trajectories, CoA text,
/// a trained BPE (`tok.json`) and its tokens, a one-step checkpoint (`ckpt`), two rollouts per
/// task and their scores.
pub fn fixture_steps(per_suite: &'static str) -> [Vec<&'static str>; 8] {
    [
        vec!["coa-generate", "tasks", "--suite", "multihop", "--n", per_suite, "--suite", "math", "--n", per_suite, "--suite", "code", "--n", per_suite, "--seed", "1", "--corpus-out", "corpus.parquet", "-o", "tasks.parquet"],
        vec!["coa-generate", "mas", "-i", "tasks.parquet", "--corpus", "corpus.parquet", "-o", "mas_runs.parquet"],
        vec!["coa-extract", "-i", "mas_runs.parquet", "-o", "trajectories.parquet"],
        vec!["coa-convert", "-i", "trajectories.parquet", "--skip-bad", "rejected.parquet", "-o", "coa_text.parquet"],
        vec!["coa-tokenize", "-i", "coa_text.parquet", "--train-bpe", "--vocab-size", "400", "--max-len", "1024", "--overlong", "truncate", "--save-tokenizer", "tok.json", "-o", "tokens.parquet"],
        vec!["coa-train-step", "-i", "tokens.parquet", "--init-config", "tiny", "--tokenizer", "tok.json", "--steps", "1", "--save", "ckpt", "-o", "metrics.parquet"],
        vec!["coa-generate", "policy", "--checkpoint", "ckpt", "-i", "tasks.parquet", "--corpus", "corpus.parquet", "--n", "2", "--max-response-tokens", "12", "-o", "rollouts.parquet"],
        vec!["coa-score", "-i", "rollouts.parquet", "--tasks", "tasks.parquet", "-o", "scores.parquet"],
    ]
}
