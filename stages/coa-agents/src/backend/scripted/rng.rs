//! Randomness: one SplitMix64 stream per purpose of each task (module docs, "Determinism").

use coa_schemas::rng::{fnv1a, SplitMix64};

/// The teacher's generator: [`SplitMix64`] with its modulo draw for indices (the recorded
/// streams were made with it).
#[derive(Debug, Clone)]
pub(super) struct Rng(SplitMix64);

impl Rng {
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        self.0.unit()
    }

    pub(super) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        self.0.below_mod(n)
    }

    pub(super) fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

pub(super) struct Streams<'a> {
    pub(super) seed: u64,
    pub(super) task_id: &'a str,
}

impl Streams<'_> {
    /// The random stream of one purpose of one task.
    pub(super) fn rng(&self, purpose: &str) -> Rng {
        let mut r = Rng(SplitMix64::new(self.seed ^ fnv1a(self.task_id) ^ fnv1a(purpose).rotate_left(17)));
        r.next_u64();
        r
    }
}
