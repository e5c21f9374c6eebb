//! Sampling one token from the logits ([`sample_token`], with temperature and top-p), each
//! sample's own random stream ([`sample_seed`]) and the settings a sample is drawn with
//! ([`SampleConfig`]).

use anyhow::{anyhow, bail, Result};
use coa_schemas::rng::fnv1a;

/// The sampler's generator (per-sample streams from [`sample_seed`]).
pub use coa_schemas::rng::SplitMix64 as Rng;

/// The random stream of one sample.
pub fn sample_seed(seed: u64, task_id: &str, sample_idx: usize) -> u64 {
    let mut r = Rng::new(seed ^ fnv1a(task_id).rotate_left(21) ^ (sample_idx as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    r.next_u64()
}

/// Samples one token from `logits` and returns it with its log-prob under softmax(logits / T)
/// (T = 0: greedy, log-prob at T = 1). Top-p keeps the most likely tokens (ties by id) whose
/// probabilities reach `top_p`.
pub fn sample_token(logits: &[f32], temperature: f32, top_p: f32, rng: &mut Rng) -> Result<(u32, f32)> {
    // -inf marks a token that is never sampled (weight 0); NaN and +inf are a broken model.
    if let Some(i) = logits.iter().position(|x| x.is_nan() || *x == f32::INFINITY) {
        bail!("the model produced a non-finite logit ({}) for token {i}", logits[i]);
    }
    let t = if temperature > 0.0 { temperature as f64 } else { 1.0 };
    let mx = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    if mx == f64::NEG_INFINITY {
        bail!("every token of the vocabulary is excluded from sampling");
    }
    let w: Vec<f64> = logits.iter().map(|&z| ((z as f64 - mx) / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    let logp = |i: usize| ((logits[i] as f64 - mx) / t - sum.ln()) as f32;
    if temperature == 0.0 {
        let best = logits.iter().enumerate().fold(0, |b, (i, &z)| if z > logits[b] { i } else { b });
        return Ok((best as u32, logp(best)));
    }
    let pick = |order: &mut dyn Iterator<Item = usize>, total: f64, rng: &mut Rng| -> Option<usize> {
        let u = rng.unit() * total;
        let mut acc = 0.0;
        let mut last = None;
        for i in order {
            acc += w[i];
            last = Some(i);
            if acc > u {
                return Some(i);
            }
        }
        last
    };
    let tok = if top_p >= 1.0 {
        pick(&mut (0..w.len()), sum, rng)
    } else {
        let mut idx: Vec<usize> = (0..w.len()).collect();
        idx.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
        let target = top_p as f64 * sum;
        let mut acc = 0.0;
        let mut keep = 0;
        for &i in &idx {
            acc += w[i];
            keep += 1;
            if acc >= target {
                break;
            }
        }
        pick(&mut idx[..keep].iter().copied(), acc, rng)
    };
    let tok = tok.ok_or_else(|| anyhow!("empty vocabulary"))?;
    Ok((tok as u32, logp(tok)))
}

/// Sampling settings.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub max_response_tokens: usize,
    pub max_turns: usize,
    pub max_observation_tokens: Option<usize>,
}
