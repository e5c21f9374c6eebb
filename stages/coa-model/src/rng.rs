//! Small deterministic generators shared by the model's init and the policy's sampler: portable
//! (the same numbers on every machine and thread count) and dependency-free.

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in (0, 1] (safe under `ln`).
    pub fn unit_nonzero(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// 64-bit FNV-1a of a string: a stable seed component from a name.
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// `n` pseudo-random token ids below `vocab`, from `seed` (test inputs and benchmarks).
pub fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| (r.next_u64() % vocab as u64) as u32).collect()
}
