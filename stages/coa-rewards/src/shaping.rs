//! From verified outcomes to the scalar an RL step optimises (docs/ARCHITECTURE.md, "RL"), defined
//! once: the total reward of a rollout, DAPO's overlong shaping, GRPO group advantages, and the
//! unbiased pass@k estimator the eval report uses.

/// How a rollout's outcome, format and length combine into its reward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardConfig {
    /// Lmax: responses longer than this many tokens get the full −1 length penalty.
    pub max_len: usize,
    /// Lcache: the soft band before Lmax where the penalty grows linearly from 0 to −1
    /// (0 disables the band: only responses beyond Lmax are penalised).
    pub cache_len: usize,
    /// Subtracted when the response breaks the CoA grammar; such a response earns no outcome
    /// credit even if its answer happens to be right.
    pub format_penalty: f32,
}

impl Default for RewardConfig {
    fn default() -> Self {
        let max_len = 4096;
        RewardConfig { max_len, cache_len: default_cache_len(max_len), format_penalty: 1.0 }
    }
}

/// Lcache when `--overlong-cache` is not given: an eighth of Lmax (DAPO's 4k band of 32k; 512 of
/// the default 4096).
pub fn default_cache_len(max_len: usize) -> usize {
    max_len / 8
}

/// `--overlong-cache`, the length-shaping flag of every command that computes rewards
/// (`coa-score`, `coa-generate policy --oversample`): one validator, one help text, one default.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct OverlongCacheArg {
    /// Lcache of the overlong shaping (in `coa-generate policy`, of the rewards --oversample
    /// judges groups with): the band before Lmax where the length penalty grows from 0 to -1
    /// (0: none) [default: an eighth of Lmax].
    #[arg(long, value_name = "N", value_parser = coa_schemas::flags::whole::<usize>)]
    pub overlong_cache: Option<usize>,
}

impl OverlongCacheArg {
    /// Lcache for a response budget of `max_len` tokens, given on the command line as
    /// `max_len_flag`: the flag's value, or [`default_cache_len`]; an error when it exceeds Lmax.
    pub fn cache_len(&self, max_len: usize, max_len_flag: &str) -> anyhow::Result<usize> {
        let cache_len = self.overlong_cache.unwrap_or_else(|| default_cache_len(max_len));
        if cache_len > max_len {
            anyhow::bail!("--overlong-cache {cache_len} is larger than {max_len_flag} {max_len}");
        }
        Ok(cache_len)
    }
}

/// DAPO overlong shaping of a response of `len` tokens:
/// 0 if len ≤ Lmax − Lcache; ((Lmax − Lcache) − len) / Lcache in the band; −1 beyond Lmax.
pub fn overlong_penalty(len: usize, max_len: usize, cache_len: usize) -> f32 {
    let soft = max_len.saturating_sub(cache_len);
    if len <= soft {
        0.0
    } else if len > max_len {
        -1.0
    } else {
        (soft as f64 - len as f64) as f32 / cache_len as f32
    }
}

/// The total reward: outcome (1 correct, 0 wrong) when the format is valid, −format_penalty when
/// it is not, plus the overlong term.
pub fn total_reward(correct: bool, format_ok: bool, overlong: f32, config: &RewardConfig) -> f32 {
    let outcome = if !format_ok {
        -config.format_penalty
    } else if correct {
        1.0
    } else {
        0.0
    };
    outcome + overlong
}

/// GRPO advantages of one group (the G samples of one task): (R − mean) / (std + 1e-6) with the
/// *sample* standard deviation (n − 1 in the denominator, as verl's `torch.std`). A group of one
/// has no spread: its advantage is 0. A group whose rewards are all equal gets 0 everywhere (and
/// dynamic sampling drops it).
pub fn group_advantages(rewards: &[f32]) -> Vec<f32> {
    let n = rewards.len();
    if n < 2 {
        return vec![0.0; n];
    }
    let mean = rewards.iter().map(|&r| r as f64).sum::<f64>() / n as f64;
    let var = rewards.iter().map(|&r| (r as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let std = var.sqrt();
    rewards.iter().map(|&r| ((r as f64 - mean) / (std + 1e-6)) as f32).collect()
}

/// The unbiased pass@k estimate from `n` samples of which `c` are correct:
/// 1 − C(n−c, k) / C(n, k) (Chen et al., 2021), computed as a stable product.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(k >= 1 && k <= n, "pass@k needs 1 <= k <= n (k = {k}, n = {n})");
    if n - c < k {
        return 1.0;
    }
    // C(n−c, k) / C(n, k) = Π_{i = n−c+1}^{n} (1 − k / i)
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlong_cache_defaults_to_an_eighth_of_lmax_and_never_exceeds_it() {
        let unset = OverlongCacheArg::default();
        assert_eq!(unset.cache_len(4096, "--max-response-len").unwrap(), RewardConfig::default().cache_len);
        assert_eq!(unset.cache_len(1536, "--max-response-tokens").unwrap(), 192);
        let given = OverlongCacheArg { overlong_cache: Some(0) };
        assert_eq!(given.cache_len(100, "--max-response-len").unwrap(), 0);
        let e = OverlongCacheArg { overlong_cache: Some(101) }.cache_len(100, "--max-response-tokens").unwrap_err();
        assert_eq!(e.to_string(), "--overlong-cache 101 is larger than --max-response-tokens 100");
    }

    #[test]
    fn overlong_band_matches_the_dapo_formula() {
        // Lmax 100, Lcache 20: free up to 80, linear to -1 at 100, -1 beyond.
        assert_eq!(overlong_penalty(0, 100, 20), 0.0);
        assert_eq!(overlong_penalty(80, 100, 20), 0.0);
        assert!((overlong_penalty(90, 100, 20) + 0.5).abs() < 1e-6);
        assert!((overlong_penalty(100, 100, 20) + 1.0).abs() < 1e-6);
        assert_eq!(overlong_penalty(101, 100, 20), -1.0);
        // No band: only beyond Lmax.
        assert_eq!(overlong_penalty(100, 100, 0), 0.0);
        assert_eq!(overlong_penalty(101, 100, 0), -1.0);
    }

    #[test]
    fn reward_combines_outcome_format_and_length() {
        let c = RewardConfig::default();
        assert_eq!(total_reward(true, true, 0.0, &c), 1.0);
        assert_eq!(total_reward(false, true, 0.0, &c), 0.0);
        assert_eq!(total_reward(true, false, 0.0, &c), -1.0);
        assert_eq!(total_reward(true, true, -0.25, &c), 0.75);
    }

    #[test]
    fn advantages_use_the_sample_std() {
        let a = group_advantages(&[1.0, 0.0, 0.0, 0.0]);
        // mean 0.25, sample std sqrt(0.75/3) = 0.5
        assert!((a[0] - 1.5).abs() < 1e-4, "{a:?}");
        assert!((a[1] + 0.5).abs() < 1e-4, "{a:?}");
        assert!((a.iter().sum::<f32>()).abs() < 1e-5);
        assert_eq!(group_advantages(&[1.0, 1.0, 1.0]), vec![0.0; 3]);
        assert_eq!(group_advantages(&[0.7]), vec![0.0]);
    }

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        assert_eq!(pass_at_k(4, 0, 1), 0.0);
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-12);
        // n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
        assert!((pass_at_k(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 3, 2), 1.0);
        assert_eq!(pass_at_k(4, 4, 4), 1.0);
    }
}
