//! The DAPO policy loss of one sequence (docs/ARCHITECTURE.md, "RL"), separate from the trainer so
//! it can be checked by hand: per target token t with ratio r = exp(logp − logp_old) and
//! advantage A,
//!
//!   loss_t = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)   (+ β·KL_t with a reference model)
//!
//! summed over the target tokens of the whole optimizer step and divided by their count N (a
//! token-level mean: long responses weigh by their tokens, not per sample, and not per
//! micro-batch). KL_t is the k3 estimator exp(ref − logp) − (ref − logp) − 1 (≥ 0, unbiased).
//!
//! Gradient with respect to logp_t (the model backpropagates from there): the unclipped branch
//! gives −A·r (dr/dlogp = r); a clipped branch is constant in logp, so 0. The KL term gives
//! β·(1 − exp(ref − logp)).

/// Clip range and KL weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DapoConfig {
    pub clip_low: f32,
    pub clip_high: f32,
    /// β of the KL term; 0 disables it (DAPO's default: no KL).
    pub kl_coef: f32,
}

impl Default for DapoConfig {
    fn default() -> Self {
        DapoConfig { clip_low: 0.2, clip_high: 0.28, kl_coef: 0.0 }
    }
}

/// One sequence's share of the step: its loss (divided by N) and statistics summed over its
/// target tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DapoTerms {
    /// The sequence's share of the step loss (already divided by N).
    pub loss: f64,
    /// Σ KL_t over its target tokens (not divided).
    pub kl: f64,
    /// Target tokens whose clipped branch was active (the gradient is cut).
    pub clipped: usize,
    pub targets: usize,
    /// `dloss / dlogp[t]` for every position (0 off the targets).
    pub dlogp: Vec<f32>,
}

/// DAPO terms of one sequence. `mask[t] = 1` marks a target (a token the policy wrote);
/// `logp_old`, `ref_logp` and `logp` are per position; `n_step` is the target count of the step.
pub fn dapo_terms(
    logp: &[f32],
    logp_old: &[f32],
    ref_logp: Option<&[f32]>,
    mask: &[u8],
    advantage: f32,
    n_step: usize,
    config: &DapoConfig,
) -> DapoTerms {
    let inv_n = 1.0 / n_step.max(1) as f64;
    let a = advantage as f64;
    let mut out = DapoTerms { dlogp: vec![0.0; logp.len()], ..Default::default() };
    for t in 0..logp.len() {
        if mask[t] == 0 {
            continue;
        }
        out.targets += 1;
        let r = (logp[t] as f64 - logp_old[t] as f64).exp();
        let unclipped = r * a;
        let clipped = r.clamp(1.0 - config.clip_low as f64, 1.0 + config.clip_high as f64) * a;
        let mut g = if clipped < unclipped {
            out.clipped += 1;
            out.loss -= clipped * inv_n;
            0.0
        } else {
            out.loss -= unclipped * inv_n;
            -a * r
        };
        if let (Some(rl), true) = (ref_logp, config.kl_coef != 0.0) {
            let d = rl[t] as f64 - logp[t] as f64;
            let kl = d.exp() - d - 1.0;
            out.kl += kl;
            out.loss += config.kl_coef as f64 * kl * inv_n;
            g += config.kl_coef as f64 * (1.0 - d.exp());
        }
        out.dlogp[t] = (g * inv_n) as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn ratio_one_is_the_plain_policy_gradient() {
        let c = DapoConfig::default();
        let t = dapo_terms(&[-1.0, -2.0, -0.5], &[-1.0, -2.0, -0.5], None, &[0, 1, 1], 2.0, 4, &c);
        // two targets, r = 1: loss = -(2 + 2) / 4, dlogp = -A / N
        assert!(close(t.loss, -1.0), "{t:?}");
        assert_eq!(t.dlogp, vec![0.0, -0.5, -0.5]);
        assert_eq!((t.clipped, t.targets), (0, 2));
    }

    #[test]
    fn clip_higher_cuts_positive_advantages_above_1_28_and_negative_below_0_8() {
        let c = DapoConfig::default();
        let ln = |x: f64| x.ln() as f32;
        // A > 0: r = 1.5 is clipped to 1.28 (no gradient); r = 1.2 is not.
        let t = dapo_terms(&[ln(1.5), ln(1.2)], &[0.0, 0.0], None, &[1, 1], 1.0, 2, &c);
        assert!(close(t.loss, -(1.28 + 1.2) / 2.0), "{t:?}");
        assert_eq!(t.clipped, 1);
        assert_eq!(t.dlogp[0], 0.0);
        assert!((t.dlogp[1] as f64 + 1.2 / 2.0).abs() < 1e-6);
        // A < 0: r = 0.5 is clipped to 0.8 (loss -(0.8 * -1)); r = 1.5 is unclipped (min picks r·A).
        let t = dapo_terms(&[ln(0.5), ln(1.5)], &[0.0, 0.0], None, &[1, 1], -1.0, 2, &c);
        assert!(close(t.loss, (0.8 + 1.5) / 2.0), "{t:?}");
        assert_eq!(t.clipped, 1);
        assert_eq!(t.dlogp[0], 0.0);
        assert!((t.dlogp[1] as f64 - 1.5 / 2.0).abs() < 1e-6);
    }

    #[test]
    fn kl_term_and_its_gradient() {
        let c = DapoConfig { kl_coef: 0.1, ..Default::default() };
        // logp = -1, ref = -2: d = -1, kl = e^-1 + 1 - 1 = e^-1
        let t = dapo_terms(&[-1.0], &[-1.0], Some(&[-2.0]), &[1], 0.0, 1, &c);
        let e = (-1.0f64).exp();
        assert!(close(t.kl, e));
        assert!(close(t.loss, 0.1 * e));
        assert!((t.dlogp[0] as f64 - 0.1 * (1.0 - e)).abs() < 1e-6);
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let c = DapoConfig { kl_coef: 0.05, ..Default::default() };
        let old = [-1.0f32, -0.7, -2.0, -0.3];
        let refl = [-1.2f32, -0.5, -1.0, -0.4];
        let mask = [1u8, 1, 0, 1];
        for adv in [1.3f32, -0.8] {
            let logp = [-0.9f32, -0.75, -1.5, -0.1];
            let t = dapo_terms(&logp, &old, Some(&refl), &mask, adv, 5, &c);
            for i in 0..logp.len() {
                let h = 1e-3f32;
                let mut p = logp;
                p[i] += h;
                let up = dapo_terms(&p, &old, Some(&refl), &mask, adv, 5, &c).loss;
                p[i] -= 2.0 * h;
                let down = dapo_terms(&p, &old, Some(&refl), &mask, adv, 5, &c).loss;
                let fd = (up - down) / (2.0 * h as f64);
                assert!((fd - t.dlogp[i] as f64).abs() < 1e-3, "adv {adv} t {i}: fd {fd} vs {}", t.dlogp[i]);
            }
        }
    }
}
