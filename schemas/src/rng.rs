//! The workspace's deterministic randomness, in one place: the SplitMix64 generator and its
//! finaliser, and the FNV-1a hash that turns names (a task id, a tensor name, a purpose) into
//! seed components. Portable (the same numbers on every machine and thread count) and
//! dependency-free; every stream recorded in a run (teacher noise, model init, sampling, the
//! trainer's shuffles, shard assignment) is built from these, so their outputs are fixed.
//!
//! Other generators live where their users need them: the task synthesisers draw from
//! `rand_chacha::ChaCha8Rng` (coa-tasks), the GPU tests from xoshiro256** (kernels).

use serde::{Deserialize, Serialize};

/// SplitMix64 (Steele, Lea, Flood 2014): a small, well-known 64-bit generator whose whole state
/// is one u64 (saved as such in a trainer state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitMix64 {
    pub state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64_mix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in (0, 1] (safe under `ln`).
    pub fn unit_nonzero(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the tiny bias is irrelevant for shuffling).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// In `0..n` as `next_u64() % n` (0 when `n` is 0): the modulo draw, slightly biased, kept
    /// where recorded streams were made with it (the scripted teacher).
    pub fn below_mod(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A Fisher-Yates permutation of `0..n`, drawn with [`SplitMix64::below`].
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i + 1);
            p.swap(i, j);
        }
        p
    }
}

/// SplitMix64's finaliser alone: a bijective mix of one u64, for a single draw from a key.
pub fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of a string's bytes: the stable hash behind shards and per-task random streams.
pub fn fnv1a(s: &str) -> u64 {
    let mut h = Fnv1a::new();
    h.write(s.as_bytes());
    h.finish()
}

/// MurmurHash3's 64-bit finalizer: every input bit moves every output bit.
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// 64-bit FNV-1a fed in pieces (the trainer's data fingerprint).
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a::new()
    }
}

impl Fnv1a {
    pub fn new() -> Fnv1a {
        Fnv1a(FNV_OFFSET)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // The reference C implementation seeded with 1234567.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of the FNV reference (Fowler, Noll, Vo).
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        let mut h = Fnv1a::new();
        h.write(b"foo");
        h.write(b"bar");
        assert_eq!(h.finish(), fnv1a("foobar"));
    }

    #[test]
    fn draws_stay_in_range() {
        let mut r = SplitMix64::new(9);
        for n in 1..50 {
            assert!(r.below(n) < n && r.below_mod(n) < n);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let v = r.unit_nonzero();
            assert!(v > 0.0 && v <= 1.0);
        }
        assert_eq!(r.below_mod(0), 0);
        let mut p = r.permutation(20);
        p.sort();
        assert_eq!(p, (0..20).collect::<Vec<_>>());
    }
}
