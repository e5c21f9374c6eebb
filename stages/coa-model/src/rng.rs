//! The model's deterministic generators: SplitMix64 and FNV-1a from [`coa_schemas::rng`] (the
//! workspace's one home for them), and random token ids for tests and benchmarks.

pub use coa_schemas::rng::{fnv1a, SplitMix64};

/// `n` pseudo-random token ids below `vocab`, from `seed` (test inputs and benchmarks).
pub fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| (r.next_u64() % vocab as u64) as u32).collect()
}
