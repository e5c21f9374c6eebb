//! Library-level checks: AdamW against PyTorch's numbers, the schedule, clipping, batching.

use coa_train_step::data::{micro_batches, steps_for_epochs, Cursor, Example};
use coa_train_step::optim::{adamw_update, clip_factor, decays, global_norm, AdamWConfig, Moments};
use coa_train_step::schedule::Schedule;

fn close(a: &[f32], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((*x as f64 - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: got {x}, expected {y}");
    }
}

/// Two AdamW steps on a matrix (decayed) and a bias (not decayed). The expected values are
/// torch.optim.AdamW (float64) with lr 0.01, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on the
/// matrix group and 0 on the bias group, fed the same gradients.
#[test]
fn adamw_matches_torch_two_steps() {
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    let mut w = vec![0.5f32, -1.0, 2.0, 0.25];
    let mut b = vec![0.3f32, -0.7];
    assert!(decays(&[2, 2]));
    assert!(!decays(&[2]));
    let mut mw = Moments::zeros(4);
    let mut mb = Moments::zeros(2);
    let grads = [([0.1f32, -0.2, 0.05, 0.0], [1.0f32, -0.5]), ([-0.3, 0.4, 0.02, 0.7], [0.2, 0.1])];
    for (t, (gw, gb)) in grads.iter().enumerate() {
        adamw_update(&cfg, 0.01, t as u64 + 1, decays(&[2, 2]), &mut w, gw, &mut mw);
        adamw_update(&cfg, 0.01, t as u64 + 1, decays(&[2]), &mut b, gb, &mut mb);
        if t == 0 {
            close(&w, &[0.4895000009999999, -0.9890000004999999, 1.9880000019999997, 0.24975], 1e-6, "w after step 1");
            close(&b, &[0.2900000001, -0.6900000002], 1e-6, "b after step 1");
        }
    }
    close(&w, &[0.49390345845786243, -0.9916447398902383, 1.9769432932863, 0.24215065012358025], 1e-6, "w after step 2");
    close(&b, &[0.2818747116688355, -0.6848293621800086], 1e-6, "b after step 2");
    close(&mw.exp_avg, &[-0.020999999999999994, 0.022, 0.006499999999999999, 0.06999999999999998], 1e-6, "exp_avg");
    close(&mw.exp_avg_sq, &[0.004975000000000005, 0.00990000000000001, 0.00013875000000000012, 0.024500000000000022], 1e-6, "exp_avg_sq");
}

#[test]
fn weight_decay_is_decoupled_from_the_gradient() {
    // A zero gradient still shrinks a decayed tensor by exactly lr * wd, and leaves a 1-D one.
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.5 };
    let mut p = vec![2.0f32; 3];
    let mut m = Moments::zeros(3);
    adamw_update(&cfg, 0.1, 1, true, &mut p, &[0.0; 3], &mut m);
    close(&p, &[2.0 * (1.0 - 0.1 * 0.5); 3], 1e-7, "decayed");
    let mut q = vec![2.0f32; 3];
    let mut m = Moments::zeros(3);
    adamw_update(&cfg, 0.1, 1, false, &mut q, &[0.0; 3], &mut m);
    assert_eq!(q, vec![2.0; 3]);
}

#[test]
fn schedule_warmup_then_cosine() {
    let s = Schedule::new(1e-3, 1e-4, 10, 110).unwrap();
    let expect = [(1, 1e-4), (5, 5e-4), (10, 1e-3), (60, 5.5e-4), (35, 1e-4 + 9e-4 * 0.5 * (1.0 + (std::f64::consts::PI * 0.25).cos())), (110, 1e-4), (500, 1e-4)];
    for (step, lr) in expect {
        assert!((s.lr_at(step) - lr).abs() < 1e-12, "step {step}: {} vs {lr}", s.lr_at(step));
    }
    // Monotone decay after warmup.
    for step in 10..110 {
        assert!(s.lr_at(step + 1) <= s.lr_at(step));
    }
    // No warmup: the first step is at (almost) the peak; constant when min_lr == lr.
    let c = Schedule::new(2e-3, 2e-3, 0, 50).unwrap();
    assert!((1..=60).all(|t| (c.lr_at(t) - 2e-3).abs() < 1e-15));
    assert!(Schedule::new(1e-3, 2e-3, 0, 10).is_err(), "min_lr above lr");
    assert!(Schedule::new(0.0, 0.0, 0, 10).is_err());
    assert!(Schedule::new(1e-3, 0.0, 0, 0).is_err());
}

#[test]
fn clipping_follows_torch() {
    let g = [vec![3.0f32, 0.0], vec![4.0f32]];
    let n = global_norm(g.iter().map(|v| v.as_slice()));
    assert!((n - 5.0).abs() < 1e-12);
    assert_eq!(clip_factor(n, 10.0), 1.0);
    assert!((clip_factor(n, 1.0) as f64 - 1.0 / (5.0 + 1e-6)).abs() < 1e-7);
    assert_eq!(clip_factor(n, 0.0), 1.0, "0 disables clipping");
}

fn ex(row: usize, len: usize) -> Example {
    let mut e = Example { source: 0, row, task_id: format!("t{row}"), input_ids: vec![1; len], loss_mask: vec![1; len], segment_ids: None, n_targets: 0, rl: None };
    e.n_targets = e.target_mask().iter().filter(|&&m| m == 1).count();
    e
}

#[test]
fn steps_fill_batches_and_never_straddle_epochs() {
    let examples: Vec<Example> = (0..7).map(|i| ex(i, 10 + i)).collect();
    let mut c = Cursor::start(3, examples.len());
    let mut seen = Vec::new();
    let mut steps = 0;
    while c.epoch == 0 && (c.position < 7) {
        let rows = c.next_step(&examples, 30);
        let tokens: usize = rows.iter().map(|&r| examples[r].input_ids.len()).sum();
        assert!(tokens <= 30 || rows.len() == 1, "batch of {tokens} tokens");
        seen.extend(rows);
        steps += 1;
    }
    seen.sort();
    assert_eq!(seen, (0..7).collect::<Vec<_>>(), "one epoch visits every row once");
    assert_eq!(steps_for_epochs(&examples, 3, 30, 1.0), steps);
    // The next epoch is a different order from the saved RNG state, and restorable.
    let first_order = c.order.clone();
    let _ = c.next_step(&examples, 30);
    assert_eq!(c.epoch, 1);
    assert_ne!(c.order, first_order);
    let restored = Cursor { order: Vec::new(), ..c.clone() }.restore(examples.len()).unwrap();
    assert_eq!(restored.order, c.order);
    // A row longer than the batch goes alone.
    let mut c = Cursor::start(0, 2);
    let big = vec![ex(0, 100), ex(1, 5)];
    let a = c.next_step(&big, 50);
    let b = c.next_step(&big, 50);
    assert_eq!(a.len() + b.len(), 2);
}

#[test]
fn micro_batches_cover_the_step_in_order() {
    let examples: Vec<Example> = (0..5).map(|i| ex(i, 8)).collect();
    let rows = vec![4, 2, 0, 1, 3];
    assert_eq!(micro_batches(&examples, &rows, 16), vec![vec![4, 2], vec![0, 1], vec![3]]);
    assert_eq!(micro_batches(&examples, &rows, 1), rows.iter().map(|&r| vec![r]).collect::<Vec<_>>());
    assert_eq!(micro_batches(&examples, &rows, 1000), vec![rows.clone()]);
}

#[test]
fn segment_starts_are_never_targets() {
    let e = Example { source: 0, row: 0, task_id: "t".into(), input_ids: vec![5; 6], loss_mask: vec![1; 6], segment_ids: Some(vec![0, 0, 0, 1, 1, 1]), n_targets: 0, rl: None };
    assert_eq!(e.target_mask(), vec![0, 1, 1, 0, 1, 1]);
}

#[test]
fn only_the_new_vocabulary_rows_get_the_factor_and_frozen_tensors_no_update() {
    use coa_train_step::optim::{NewRows, Trainable};
    let t = Trainable { new_rows: Some(NewRows { first: 5, lr_mult: 10.0 }), ..Default::default() };
    assert_eq!(t.lr_spans("model.embed_tokens.weight", &[8, 4]), vec![(0..20, 1.0), (20..32, 10.0)]);
    assert_eq!(t.lr_spans("lm_head.weight", &[8, 4]), vec![(0..20, 1.0), (20..32, 10.0)]);
    assert_eq!(t.lr_spans("model.layers.0.mlp.up_proj.weight", &[8, 4]), vec![(0..32, 1.0)]);
    assert_eq!(Trainable::default().lr_spans("model.embed_tokens.weight", &[8, 4]), vec![(0..32, 1.0)]);
    let plain = Trainable { new_rows: Some(NewRows { first: 5, lr_mult: 1.0 }), ..Default::default() };
    assert_eq!(plain.lr_spans("model.embed_tokens.weight", &[8, 4]), vec![(0..32, 1.0)]);
    // Bottom 12 layers frozen: layers 0..=11 and (untied) the input embedding get no update.
    let f = Trainable { frozen_layers: 12, tied_head: false, ..Default::default() };
    assert!(f.lr_spans("model.layers.11.self_attn.q_proj.weight", &[4, 4]).is_empty());
    assert!(f.lr_spans("model.layers.1.input_layernorm.weight", &[4]).is_empty());
    assert_eq!(f.lr_spans("model.layers.12.self_attn.q_proj.weight", &[4, 4]), vec![(0..16, 1.0)]);
    assert!(f.lr_spans("model.embed_tokens.weight", &[8, 4]).is_empty());
    assert_eq!(f.lr_spans("lm_head.weight", &[8, 4]), vec![(0..32, 1.0)]);
    assert_eq!(f.lr_spans("model.norm.weight", &[4]), vec![(0..4, 1.0)]);
    // A tied embedding is the head: it keeps training.
    let tied = Trainable { tied_head: true, ..f };
    assert_eq!(tied.lr_spans("model.embed_tokens.weight", &[8, 4]), vec![(0..32, 1.0)]);
}
