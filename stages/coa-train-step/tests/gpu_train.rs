//! `--device`: the trainer on the GPU against the trainer on the CPU, checkpoints moving between
//! them, and the device choice itself.
//!
//! Runs everywhere: `--device cuda` without a usable GPU is a clear error (never a panic),
//! `--device cuda` on a model the GPU path cannot train names the feature, and `--device auto`
//! falls back to the CPU with one note, giving the CPU's exact results.
//!
//! On the GPU, or where there is none on the emulated CUDA device (`coa_kernels::emu`: the same
//! kernels and host code on the CPU, slowly; then 20 steps in windows of 5 instead of 200 in 25):
//! - 200 steps of a tiny model on the GPU track the same run on the CPU. The GPU computes in bf16
//!   (weights and activations; fp32 masters, gradients, moments), so the two runs drift apart the
//!   way two f32 runs with different summation orders do, only more: a few tenths of a percent
//!   per step at first. Tolerance: every 25-step window's mean loss within 5% (+0.02 absolute) of
//!   the CPU's, the last 10 steps' mean likewise (the CPU's falls from ~3.8 to ~0.6), and the GPU
//!   curve falling like the CPU's (last window below 0.7 x the first, no window 10% above the one
//!   before).
//! - The first step's loss and gradient norm agree within 2% (one bf16 forward/backward).
//! - A CPU checkpoint uploaded to the GPU and saved again is byte-identical (masters and moments
//!   go up and come back exactly); a run continues CPU -> GPU -> CPU with losses close to the
//!   uninterrupted CPU run's.
//! - DAPO: old log-probs, the first step's loss and entropy agree with the CPU's, and the first
//!   three steps' losses and entropies track the CPU run's.
//! - LoRA (`--lora-rank`), SFT and DAPO, dropout on: the GPU's steps track the CPU's (loss, grad
//!   norm, the adapter's A and B after the steps), the base weights stay bit for bit, and LoRA
//!   checkpoints move between the devices like full ones.
//!
//! On a GPU machine without Cargo, `COA_TRAIN_STEP_BIN` names the binary (bench/gpu/run.sh).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Int32Array, ListArray, StringArray, UInt8Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;
use coa_kernels::Gpu;
use coa_model::{Model, ModelConfig};
use coa_schemas::io::{self, Provenance};
use coa_schemas::tables::{METRICS, TOKENS};
use coa_train_step::checkpoint::{self, TrainerState};
use coa_train_step::dapo::DapoConfig;
use coa_train_step::data::{Dataset, Example, RlRow};
use coa_train_step::objective::Objective;
use coa_train_step::optim::{AdamWConfig, NewRows};
use coa_train_step::schedule::Schedule;
use coa_train_step::train::{Settings, StepReport, Trainer};

const VOCAB: usize = 64;

fn test_gpu(test: &str) -> Arc<Gpu> {
    let gpu = coa_kernels::testing::test_gpu(test);
    gpu.warm_up().unwrap_or_else(|e| panic!("{test}: compiling the kernels: {e}"));
    Arc::new(gpu)
}

// ---- data --------------------------------------------------------------------------------------

/// A row of the `tokens` table: ids, loss mask, segment ids.
type Row = (Vec<u32>, Vec<u8>, Option<Vec<i32>>);

/// Rows: a prompt (mask 0) then an answer (mask 1) that is a
/// fixed function of the prompt's last token, so there is something to learn; every third row
/// packs two such examples as segments.
fn rows(n: usize, seed: u64) -> Vec<Row> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut example = || {
        let p = 4 + (next() % 12) as usize;
        let a = 3 + (next() % 10) as usize;
        let mut ids: Vec<u32> = (0..p).map(|_| 2 + (next() % (VOCAB as u64 - 2)) as u32).collect();
        let start = ids[p - 1] as usize;
        ids.extend((0..a).map(|k| 2 + ((start + 3 * k) % (VOCAB - 2)) as u32));
        let mut mask = vec![0u8; p];
        mask.extend(vec![1u8; a]);
        (ids, mask)
    };
    (0..n)
        .map(|i| {
            let (mut ids, mut mask) = example();
            if i % 3 != 2 {
                return (ids, mask, None);
            }
            let mut seg = vec![0i32; ids.len()];
            let (ids2, mask2) = example();
            seg.extend(vec![1i32; ids2.len()]);
            ids.extend(ids2);
            mask.extend(mask2);
            (ids, mask, Some(seg))
        })
        .collect()
}

/// The `tokens` table of `rows`.
fn tokens_batch(rows: &[Row]) -> RecordBatch {
    let list_i32 = |v: Vec<Option<Vec<i32>>>| -> ArrayRef {
        let lens: Vec<usize> = v.iter().map(|r| r.as_ref().map_or(0, |x| x.len())).collect();
        let nulls = v.iter().any(|r| r.is_none()).then(|| v.iter().map(|r| r.is_some()).collect::<Vec<_>>().into());
        let values: Vec<i32> = v.into_iter().flat_map(|r| r.unwrap_or_default()).collect();
        Arc::new(ListArray::new(Arc::new(Field::new("item", DataType::Int32, true)), OffsetBuffer::from_lengths(lens), Arc::new(Int32Array::from(values)), nulls))
    };
    let masks: Vec<&Vec<u8>> = rows.iter().map(|r| &r.1).collect();
    let mask: ArrayRef = Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::UInt8, true)),
        OffsetBuffer::from_lengths(masks.iter().map(|m| m.len())),
        Arc::new(UInt8Array::from(masks.iter().flat_map(|m| m.iter().copied()).collect::<Vec<_>>())),
        None,
    ));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from((0..rows.len()).map(|i| format!("task{i}")).collect::<Vec<_>>())),
        list_i32(rows.iter().map(|r| Some(r.0.iter().map(|&x| x as i32).collect())).collect()),
        mask,
        list_i32(rows.iter().map(|r| r.2.clone()).collect()),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.0.len() as i32).collect::<Vec<_>>())),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.1.iter().filter(|&&m| m == 1).count() as i32).collect::<Vec<_>>())),
    ];
    RecordBatch::try_new(TOKENS.schema(), columns).unwrap()
}

fn dataset(n: usize, seed: u64) -> Dataset {
    let mut d = Dataset::default();
    d.add_batch(&tokens_batch(&rows(n, seed)), "test").unwrap();
    d
}

/// A llama config of `head_dim` 64 (the GPU's smallest), GQA, tied head, small enough for the CPU.
fn config() -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", VOCAB).unwrap();
    c.hidden_size = 128;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.max_position_embeddings = 128;
    c
}

fn settings(steps: u64, lr: f64) -> Settings {
    Settings {
        seed: 3,
        schedule: Schedule::new(lr, lr / 10.0, 10, steps).unwrap(),
        adamw: AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
        grad_clip: 1.0,
        batch_tokens: 200,
        micro_batch_tokens: 200,
        new_rows: None,
        frozen_layers: 0,
        matmul: Default::default(),
        lora: None,
    }
}

fn run(t: &mut Trainer, data: &Dataset, steps: usize) -> Vec<StepReport> {
    (0..steps).map(|_| t.step(data).unwrap()).collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

// ---- GPU vs CPU ----------------------------------------------------------------------------------

/// The GPU's AdamW (`adamw_step` with the scalars `AdamWArgs::new` computes on the host, as this
/// crate's GPU trainer passes them) against the CPU trainer's own `optim::adamw_update`: the first
/// steps, where the bias corrections are far from 1, and a late one; with and without weight
/// decay; with a clipping factor (the CPU gets the clipped gradient). A slip in the kernel or in the
/// host scalars (bias correction, decay, step size) shows here, which the kernel test cannot see:
/// it builds its expectation from the same `AdamWArgs`.
#[test]
fn gpu_adamw_matches_the_cpu_optimizer() {
    use coa_kernels::ops::adamw::AdamWArgs;
    use coa_train_step::optim::{adamw_update, Moments};
    let gpu = test_gpu("gpu_adamw_matches_the_cpu_optimizer");
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    let (n, lr) = (4099usize, 3e-4f64);
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut normal = move |scale: f32| {
        // a sum of 4 uniforms: close enough to normal for parameters and gradients
        let mut acc = 0f32;
        for _ in 0..4 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            acc += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        acc * scale
    };
    for (t, decay, clip) in [(1u64, true, 1.0f32), (2, false, 0.5), (3, true, 0.25), (1000, true, 1.0)] {
        let p: Vec<f32> = (0..n).map(|_| normal(0.05)).collect();
        let g: Vec<f32> = (0..n).map(|_| normal(0.02)).collect();
        // the moments of t - 1 earlier steps (none at the first)
        let m: Vec<f32> = (0..n).map(|_| if t == 1 { 0.0 } else { normal(2e-3) }).collect();
        let v: Vec<f32> = (0..n).map(|_| if t == 1 { 0.0 } else { normal(2e-2).powi(2) }).collect();
        let (mut p_cpu, mut mom) = (p.clone(), Moments { exp_avg: m.clone(), exp_avg_sq: v.clone() });
        let clipped: Vec<f32> = g.iter().map(|x| x * clip).collect();
        adamw_update(&cfg, lr, t, decay, &mut p_cpu, &clipped, &mut mom);
        let (mut pd, gd, mut md, mut vd) = (gpu.upload(&p).unwrap(), gpu.upload(&g).unwrap(), gpu.upload(&m).unwrap(), gpu.upload(&v).unwrap());
        let args = AdamWArgs::new(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, t, decay, clip);
        gpu.adamw(&mut pd, &gd, &mut md, &mut vd, None, n, &args).unwrap();
        // fp32 on both sides, the same order of operations: only FMA contraction may differ.
        for (what, got, want) in [("p", gpu.download(&pd).unwrap(), p_cpu), ("m", gpu.download(&md).unwrap(), mom.exp_avg), ("v", gpu.download(&vd).unwrap(), mom.exp_avg_sq)] {
            for i in 0..n {
                let tol = 1e-12 + 1e-5 * want[i].abs();
                assert!((got[i] - want[i]).abs() <= tol, "step {t}, decay {decay}, clip {clip}: {what}[{i}] = {} on the GPU, {} on the CPU", got[i], want[i]);
            }
        }
    }
}

#[test]
fn gpu_tracks_the_cpu_loss_curve_for_200_steps() {
    let test = "gpu_tracks_the_cpu_loss_curve_for_200_steps";
    let gpu = test_gpu(test);
    // lr 3e-4: the CPU loss falls from ~3.8 to ~0.6 over the 200 steps, all in the range where
    // a relative tolerance means something. On the emulated device (what CI runs: the same code,
    // slowly) 20 steps at lr 3e-3, in windows of 5.
    let (steps, lr, window) = if gpu.is_emulated() { (20, 3e-3, 5) } else { (200, 3e-4, 25) };
    let data = dataset(60, 11);
    let st = settings(steps as u64, lr);
    let model = Model::init(config(), 1).unwrap();
    let mut cpu = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    let mut gpu_t = Trainer::new(model, Objective::Sft, &st, &data).unwrap();
    gpu_t.to_cuda(gpu, &data).unwrap();
    let c: Vec<StepReport> = run(&mut cpu, &data, steps);
    let g: Vec<StepReport> = run(&mut gpu_t, &data, steps);

    // Same data stream and schedule on both.
    for (a, b) in c.iter().zip(&g) {
        assert_eq!((a.step, a.rows, a.tokens, a.targets), (b.step, b.rows, b.tokens, b.targets));
        assert_eq!(a.lr, b.lr);
    }
    let (l0c, l0g) = (c[0].loss, g[0].loss);
    assert!((l0g - l0c).abs() <= 2e-2 * l0c, "first loss: gpu {l0g} cpu {l0c}");
    assert!((g[0].grad_norm - c[0].grad_norm).abs() <= 2e-2 * c[0].grad_norm, "first grad norm: gpu {} cpu {}", g[0].grad_norm, c[0].grad_norm);
    let lc: Vec<f64> = c.iter().map(|r| r.loss).collect();
    let lg: Vec<f64> = g.iter().map(|r| r.loss).collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 0.05 * b.abs() + 0.02;
    let (wc, wg): (Vec<f64>, Vec<f64>) = (lc.chunks(window).map(mean).collect(), lg.chunks(window).map(mean).collect());
    for (i, (a, b)) in wg.iter().zip(&wc).enumerate() {
        eprintln!("  steps {:3}..{:3}: gpu {a:.4}  cpu {b:.4}", window * i + 1, window * (i + 1));
        assert!(close(*a, *b), "steps {}..{}: mean loss gpu {a} vs cpu {b}", window * i + 1, window * (i + 1));
    }
    let (fg, fc) = (mean(&lg[steps - 10..]), mean(&lc[steps - 10..]));
    assert!(close(fg, fc), "final loss (mean of the last 10 steps): gpu {fg} vs cpu {fc}");
    assert!(wc[wc.len() - 1] < 0.7 * wc[0], "the CPU run must learn (test data): {wc:?}");
    assert!(wg[wg.len() - 1] < 0.7 * wg[0], "the GPU run did not learn: {wg:?}");
    for w in wg.windows(2) {
        assert!(w[1] <= 1.1 * w[0] + 0.02, "the GPU loss went up between windows: {wg:?}");
    }
}

/// Rows `first..` of the tied embedding step `mult` times as far (Adam's first step is about
/// `lr` per element), the others exactly as without new rows; the GPU path splits the update the same way.
#[test]
fn new_token_rows_take_larger_steps_on_cpu_and_gpu() {
    let test = "new_token_rows_take_larger_steps_on_cpu_and_gpu";
    let gpu = test_gpu(test);
    let data = dataset(20, 5);
    let model = Model::init(config(), 4).unwrap();
    let first = VOCAB - 8;
    let with_mult = |mult: f64| Settings { new_rows: Some(NewRows { first, lr_mult: mult }), ..settings(5, 1e-2) };
    let embed = |t: &Trainer| t.model.params.tensors.iter().find(|p| p.name == "model.embed_tokens.weight").unwrap().data.clone();
    let before = embed(&Trainer::new(model.clone(), Objective::Sft, &with_mult(1.0), &data).unwrap());
    let d = config().hidden_size;
    // (sum of |change| over the base rows, over the new rows)
    let moved = |after: &[f32]| {
        let abs: Vec<f64> = after.iter().zip(&before).map(|(a, b)| (a - b).abs() as f64).collect();
        (abs[..first * d].iter().sum::<f64>(), abs[first * d..].iter().sum::<f64>())
    };
    let step = |st: &Settings, on_gpu: bool| {
        let mut t = Trainer::new(model.clone(), Objective::Sft, st, &data).unwrap();
        if on_gpu {
            t.to_cuda(gpu.clone(), &data).unwrap();
        }
        run(&mut t, &data, 1);
        t.sync_from_cuda().unwrap();
        embed(&t)
    };
    let (plain, fast) = (step(&with_mult(1.0), false), step(&with_mult(20.0), false));
    assert!(plain[..first * d] == fast[..first * d], "the base rows must step exactly as without the factor");
    let ((_, new1), (_, new20)) = (moved(&plain), moved(&fast));
    assert!(new1 > 0.0 && (new20 / new1 - 20.0).abs() < 0.5, "new rows moved {new20} with x20 and {new1} with x1");
    let on_gpu = step(&with_mult(20.0), true);
    let ((base_c, new_c), (base_g, new_g)) = (moved(&fast), moved(&on_gpu));
    eprintln!("  |change| base rows: cpu {base_c:.4} gpu {base_g:.4}; new rows: cpu {new_c:.4} gpu {new_g:.4}");
    assert!((base_g - base_c).abs() <= 0.05 * base_c && (new_g - new_c).abs() <= 0.05 * new_c, "the GPU's update of the embedding differs from the CPU's");
}

/// Frozen layers keep their weights bit for bit, stay frozen across a resume, and the GPU path
/// (which trains every layer) refuses them.
#[test]
fn frozen_layers_stay_put_and_resume_frozen() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(20, 5);
    let st = Settings { frozen_layers: 1, ..settings(6, 3e-3) };
    let model = Model::init(config(), 6).unwrap();
    let layer = |m: &Model, l: usize| m.params.tensors.iter().filter(|t| t.name.starts_with(&format!("model.layers.{l}."))).map(|t| t.data.clone()).collect::<Vec<_>>();
    let mut t = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    run(&mut t, &data, 3);
    t.save(tmp.path(), None, coa_model::SaveDtype::F32).unwrap();
    let mut t = Trainer::load(tmp.path(), &data).unwrap();
    assert_eq!(t.model.frozen_layers, 1);
    run(&mut t, &data, 3);
    assert!(layer(&t.model, 0) == layer(&model, 0), "a frozen layer changed");
    assert!(layer(&t.model, 1) != layer(&model, 1), "the layer above the frozen one did not train");
    let err = Trainer::new(model.clone(), Objective::Sft, &Settings { frozen_layers: 3, ..st.clone() }, &data).err().unwrap().to_string();
    assert!(err.contains("--freeze-layers 3: the model has 2 layers"), "{err}");
    let mut t = Trainer::new(model, Objective::Sft, &st, &data).unwrap();
    let err = t.to_cuda(test_gpu("frozen_layers_stay_put_and_resume_frozen"), &data).err().unwrap().to_string();
    assert!(err.contains("--freeze-layers"), "{err}");
}

#[test]
fn bf16_matmuls_train_resume_exactly_and_stay_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(20, 5);
    let st = Settings { matmul: coa_model::MatmulDtype::Bf16, ..settings(6, 3e-3) };
    let model = Model::init(config(), 6).unwrap();
    let mut straight = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    let losses: Vec<f64> = run(&mut straight, &data, 6).iter().map(|r| r.loss).collect();
    let mut t = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    run(&mut t, &data, 3);
    t.save(tmp.path(), None, coa_model::SaveDtype::F32).unwrap();
    let mut t = Trainer::load(tmp.path(), &data).unwrap();
    assert_eq!(t.model.matmul, coa_model::MatmulDtype::Bf16, "the checkpoint keeps the run's matmul type");
    run(&mut t, &data, 3);
    assert!(t.model.params == straight.model.params, "a resumed bf16 run differs from the uninterrupted one");
    // Near the f32 run, not equal to it.
    let mut f32_run = Trainer::new(model.clone(), Objective::Sft, &settings(6, 3e-3), &data).unwrap();
    let f32_losses: Vec<f64> = run(&mut f32_run, &data, 6).iter().map(|r| r.loss).collect();
    assert_ne!(losses, f32_losses);
    for (a, b) in losses.iter().zip(&f32_losses) {
        assert!((a - b).abs() < 0.01 * b, "loss {a} with bf16 products against {b} in f32");
    }
    let mut t = Trainer::new(model, Objective::Sft, &st, &data).unwrap();
    let err = t.to_cuda(test_gpu("bf16_matmuls_train_resume_exactly_and_stay_on_the_cpu"), &data).err().unwrap().to_string();
    assert!(err.contains("--matmul bf16"), "{err}");
}

/// Every file of a checkpoint directory, by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn checkpoints_move_between_cpu_and_gpu() {
    let test = "checkpoints_move_between_cpu_and_gpu";
    let gpu = test_gpu(test);
    let tmp = tempfile::tempdir().unwrap();
    let dir = |n: &str| tmp.path().join(n);
    let data = dataset(20, 5);
    let st = settings(12, 3e-3);
    let model = Model::init(config(), 2).unwrap();
    // The reference: 12 CPU steps in one go.
    let mut full = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    let lf: Vec<f64> = run(&mut full, &data, 12).iter().map(|r| r.loss).collect();

    // 4 steps on the CPU, saved.
    let mut t = Trainer::new(model, Objective::Sft, &st, &data).unwrap();
    run(&mut t, &data, 4);
    t.save(&dir("cpu4"), None, coa_model::SaveDtype::Bf16).unwrap();
    // Up to the GPU and straight back: the same bytes (exact masters and moments).
    let mut t = Trainer::load(&dir("cpu4"), &data).unwrap();
    t.to_cuda(gpu.clone(), &data).unwrap();
    t.save(&dir("roundtrip"), None, coa_model::SaveDtype::Bf16).unwrap();
    assert!(files(&dir("cpu4")) == files(&dir("roundtrip")), "a checkpoint must survive the trip to the GPU unchanged");
    // 4 steps on the GPU from the CPU checkpoint, saved; then 4 on the CPU from the GPU's.
    let mut lg: Vec<f64> = run(&mut t, &data, 4).iter().map(|r| r.loss).collect();
    t.save(&dir("gpu8"), None, coa_model::SaveDtype::F32).unwrap();
    let state = TrainerState::read(&dir("gpu8")).unwrap();
    assert_eq!(state.step, 8);
    assert_eq!(state.history.len(), 8);
    let mut t = Trainer::load(&dir("gpu8"), &data).unwrap();
    assert!(t.cuda.is_none());
    lg.extend(run(&mut t, &data, 4).iter().map(|r| r.loss));
    for (i, (a, b)) in lg.iter().zip(&lf[4..]).enumerate() {
        eprintln!("  step {}: cpu->gpu->cpu {a:.4}  cpu {b:.4}", i + 5);
        assert!((a - b).abs() <= 0.05 * b + 0.02, "step {}: loss {a} after moving between devices vs {b} on the CPU", i + 5);
    }
    assert!(dir("gpu8").join(checkpoint::OPTIMIZER_FILE).exists());
}

/// DAPO rows: prompt + response ids with the response as targets, a reward and an advantage.
fn dapo_dataset(n: usize) -> Dataset {
    let mut d = Dataset::default();
    for (i, (ids, mask, seg)) in rows(n, 9).into_iter().enumerate() {
        if seg.is_some() {
            continue; // rollouts are single sequences
        }
        let reward = if i % 2 == 0 { 1.0 } else { 0.0 };
        let response_len = mask.iter().filter(|&&m| m == 1).count();
        let sample_logp: Vec<f32> = mask.iter().map(|&m| if m == 1 { -1.5 } else { 0.0 }).collect();
        let rl = RlRow { reward, advantage: 2.0 * reward - 1.0, sample_logp, response_len, old_logp: None, ref_logp: None };
        d.rows += 1;
        d.push(Example { source: 0, row: i, task_id: format!("task{}", i / 2), input_ids: ids, loss_mask: mask, segment_ids: None, n_targets: 0, rl: Some(rl) });
    }
    d
}

#[test]
fn dapo_on_the_gpu_matches_the_cpu() {
    let test = "dapo_on_the_gpu_matches_the_cpu";
    let gpu = test_gpu(test);
    let dapo = Objective::Dapo(DapoConfig::default());
    let st = settings(6, 1e-3);
    let model = Model::init(config(), 4).unwrap();
    let (mut dc, mut dg) = (dapo_dataset(24), dapo_dataset(24));
    let mut cpu = Trainer::new(model.clone(), dapo, &st, &dc).unwrap();
    let mut gpu_t = Trainer::new(model, dapo, &st, &dg).unwrap();
    gpu_t.to_cuda(gpu, &dg).unwrap();
    cpu.prepare_rl(&mut dc, None).unwrap();
    gpu_t.prepare_rl(&mut dg, None).unwrap();
    // π_old: the same log-probs up to bf16 (relative L2 over all targets).
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in dc.examples.iter().zip(&dg.examples) {
        let (oa, ob) = (a.rl.as_ref().unwrap().old_logp.as_ref().unwrap(), b.rl.as_ref().unwrap().old_logp.as_ref().unwrap());
        for (t, &m) in a.target_mask().iter().enumerate() {
            if m == 1 {
                num += ((oa[t] - ob[t]) as f64).powi(2);
                den += (oa[t] as f64).powi(2);
            }
        }
    }
    assert!((num / den).sqrt() <= 2e-2, "old log-probs: relative L2 error {}", (num / den).sqrt());
    let c = run(&mut cpu, &dc, 6);
    let g = run(&mut gpu_t, &dg, 6);
    // Step 1: the ratio is 1 on the CPU (π_old recomputed by the same code) and 1 up to bf16
    // noise on the GPU (π_old from passes packed differently), so the loss is −mean advantage.
    assert!((g[0].loss - c[0].loss).abs() <= 1e-2 * (1.0 + c[0].loss.abs()), "first DAPO loss: gpu {} cpu {}", g[0].loss, c[0].loss);
    let (rc, rg) = (c[0].rl.unwrap(), g[0].rl.unwrap());
    assert!((rg.entropy - rc.entropy).abs() <= 2e-2 * rc.entropy, "entropy: gpu {} cpu {}", rg.entropy, rc.entropy);
    assert_eq!(rg.clip_frac, 0.0);
    assert!((g[0].grad_norm - c[0].grad_norm).abs() <= 5e-2 * c[0].grad_norm, "first grad norm: gpu {} cpu {}", g[0].grad_norm, c[0].grad_norm);
    assert!(g.iter().all(|r| r.loss.is_finite() && r.rl.unwrap().entropy > 0.0));
    // The first three steps track the CPU's (the weights differ by bf16 noise only).
    for (i, (a, b)) in g.iter().zip(&c).take(3).enumerate() {
        let (ea, eb) = (a.rl.unwrap().entropy, b.rl.unwrap().entropy);
        eprintln!("  DAPO step {}: gpu loss {:.5} entropy {ea:.4}, cpu loss {:.5} entropy {eb:.4}", i + 1, a.loss, b.loss);
        assert!((a.loss - b.loss).abs() <= 2e-2 * (1.0 + b.loss.abs()), "DAPO step {}: loss gpu {} cpu {}", i + 1, a.loss, b.loss);
        assert!((ea - eb).abs() <= 2e-2 * eb, "DAPO step {}: entropy gpu {ea} cpu {eb}", i + 1);
    }
}

// ---- LoRA ----------------------------------------------------------------------------------------

/// An adapter on every linear layer with dropout (the GPU must draw the CPU's masks).
fn lora_settings(steps: u64, lr: f64) -> Settings {
    use coa_model::lora::{LoraConfig, Target};
    Settings { lora: Some(LoraConfig { rank: 4, alpha: 16.0, dropout: 0.1, targets: Target::ALL.to_vec() }), ..settings(steps, lr) }
}

/// The adapter's tensors as they are now (from the GPU when it trains there).
fn adapter(t: &mut Trainer) -> coa_model::Params {
    t.sync_from_cuda().unwrap();
    t.model.lora.as_ref().unwrap().params.clone()
}

/// Each adapter tensor's change from `start` on the GPU against the CPU's: the summed |change|
/// within 5% (as the embedding's in `new_token_rows_take_larger_steps_on_cpu_and_gpu`) and the
/// changes' cosine >= 0.95. (Not each element: AdamW's early steps are about lr · sign(g), so an
/// element whose gradient is near zero may step the other way on the other device.)
#[track_caller]
fn check_adapter_moved_alike(label: &str, start: &coa_model::Params, gpu: &coa_model::Params, cpu: &coa_model::Params) {
    for ((s, g), c) in start.tensors.iter().zip(&gpu.tensors).zip(&cpu.tensors) {
        let (mut ag, mut ac, mut dot, mut gg, mut cc) = (0f64, 0f64, 0f64, 0f64, 0f64);
        for ((&s0, &g1), &c1) in s.data.iter().zip(&g.data).zip(&c.data) {
            let (dg, dc) = ((g1 - s0) as f64, (c1 - s0) as f64);
            (ag, ac) = (ag + dg.abs(), ac + dc.abs());
            (dot, gg, cc) = (dot + dg * dc, gg + dg * dg, cc + dc * dc);
        }
        assert!(ac > 0.0, "{label}: {} did not move on the CPU", s.name);
        let cos = dot / (gg.sqrt() * cc.sqrt());
        eprintln!("  {label}: {}: sum |change| gpu {ag:.4e} cpu {ac:.4e}, cos {cos:.4}", s.name);
        assert!((ag - ac).abs() <= 0.05 * ac && cos >= 0.95, "{label}: the GPU moved {} by {ag} (the CPU by {ac}), cosine of the changes {cos}", s.name);
    }
}

/// SFT with LoRA: three steps on the GPU against the CPU from the same adapter (B = 0, so step 1
/// trains B alone and step 2 A too): each step's loss and grad norm within 2% (one bf16
/// forward/backward of the adapted model, as for full fine-tuning), the adapter's changes alike
/// ([`check_adapter_moved_alike`]), and the base weights exactly as they were.
#[test]
fn lora_on_the_gpu_matches_the_cpu() {
    let test = "lora_on_the_gpu_matches_the_cpu";
    let gpu = test_gpu(test);
    let data = dataset(20, 5);
    let st = lora_settings(6, 3e-3);
    let model = Model::init(config(), 2).unwrap();
    let mut cpu = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    cpu.share_prompts = false; // one row per sequence, as on the GPU: the same dropout masks
    let mut gpu_t = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    let start = adapter(&mut cpu);
    assert!(adapter(&mut gpu_t) == start);
    gpu_t.to_cuda(gpu, &data).unwrap();
    let c = run(&mut cpu, &data, 3);
    let g = run(&mut gpu_t, &data, 3);
    for (a, b) in g.iter().zip(&c) {
        eprintln!("  LoRA step {}: gpu loss {:.5} grad norm {:.5}, cpu loss {:.5} grad norm {:.5}", a.step, a.loss, a.grad_norm, b.loss, b.grad_norm);
        assert_eq!((a.rows, a.tokens, a.targets), (b.rows, b.tokens, b.targets));
        assert!((a.loss - b.loss).abs() <= 2e-2 * b.loss, "LoRA step {}: loss gpu {} cpu {}", a.step, a.loss, b.loss);
        assert!((a.grad_norm - b.grad_norm).abs() <= 2e-2 * b.grad_norm, "LoRA step {}: grad norm gpu {} cpu {}", a.step, a.grad_norm, b.grad_norm);
    }
    check_adapter_moved_alike("LoRA SFT", &start, &adapter(&mut gpu_t), &adapter(&mut cpu));
    assert!(gpu_t.model.params == model.params, "the GPU's LoRA steps changed the base weights");
}

/// DAPO with LoRA: π_old, and the first three steps' losses and entropies, as for full fine-tuning.
#[test]
fn lora_dapo_on_the_gpu_matches_the_cpu() {
    let test = "lora_dapo_on_the_gpu_matches_the_cpu";
    let gpu = test_gpu(test);
    let dapo = Objective::Dapo(DapoConfig::default());
    let st = lora_settings(6, 1e-2);
    let model = Model::init(config(), 4).unwrap();
    let (mut dc, mut dg) = (dapo_dataset(24), dapo_dataset(24));
    let mut cpu = Trainer::new(model.clone(), dapo, &st, &dc).unwrap();
    cpu.share_prompts = false;
    let mut gpu_t = Trainer::new(model.clone(), dapo, &st, &dg).unwrap();
    let start = adapter(&mut cpu);
    gpu_t.to_cuda(gpu, &dg).unwrap();
    cpu.prepare_rl(&mut dc, None).unwrap();
    gpu_t.prepare_rl(&mut dg, None).unwrap();
    let c = run(&mut cpu, &dc, 3);
    let g = run(&mut gpu_t, &dg, 3);
    for (a, b) in g.iter().zip(&c) {
        let (ea, eb) = (a.rl.unwrap().entropy, b.rl.unwrap().entropy);
        eprintln!("  LoRA DAPO step {}: gpu loss {:.5} entropy {ea:.4} grad norm {:.4}, cpu loss {:.5} entropy {eb:.4} grad norm {:.4}", a.step, a.loss, a.grad_norm, b.loss, b.grad_norm);
        assert!((a.loss - b.loss).abs() <= 2e-2 * (1.0 + b.loss.abs()), "LoRA DAPO step {}: loss gpu {} cpu {}", a.step, a.loss, b.loss);
        assert!((ea - eb).abs() <= 2e-2 * eb, "LoRA DAPO step {}: entropy gpu {ea} cpu {eb}", a.step);
        assert!((a.grad_norm - b.grad_norm).abs() <= 5e-2 * b.grad_norm, "LoRA DAPO step {}: grad norm gpu {} cpu {}", a.step, a.grad_norm, b.grad_norm);
    }
    check_adapter_moved_alike("LoRA DAPO", &start, &adapter(&mut gpu_t), &adapter(&mut cpu));
    assert!(gpu_t.model.params == model.params, "the GPU's LoRA steps changed the base weights");
}

/// A LoRA checkpoint (base + PEFT adapter + the adapter's moments) goes up to the GPU and back
/// byte for byte; a run continues CPU -> GPU -> CPU close to the uninterrupted CPU run.
#[test]
fn lora_checkpoints_move_between_cpu_and_gpu() {
    let test = "lora_checkpoints_move_between_cpu_and_gpu";
    let gpu = test_gpu(test);
    let tmp = tempfile::tempdir().unwrap();
    let dir = |n: &str| tmp.path().join(n);
    let data = dataset(20, 5);
    let st = lora_settings(9, 3e-3);
    let model = Model::init(config(), 2).unwrap();
    let mut full = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    full.share_prompts = false;
    let lf: Vec<f64> = run(&mut full, &data, 9).iter().map(|r| r.loss).collect();

    let mut t = Trainer::new(model.clone(), Objective::Sft, &st, &data).unwrap();
    t.share_prompts = false;
    run(&mut t, &data, 3);
    t.save(&dir("cpu3"), None, coa_model::SaveDtype::Bf16).unwrap();
    let mut t = Trainer::load(&dir("cpu3"), &data).unwrap();
    t.to_cuda(gpu.clone(), &data).unwrap();
    t.save(&dir("roundtrip"), None, coa_model::SaveDtype::Bf16).unwrap();
    // Byte for byte but for adapter_config.json's base_model_name_or_path: the directory itself.
    let without_dir = |d: &Path| {
        let mut f = files(d);
        for (name, bytes) in &mut f {
            if name == coa_model::lora::ADAPTER_CONFIG {
                *bytes = String::from_utf8(bytes.clone()).unwrap().replace(&std::path::absolute(d).unwrap().to_string_lossy().into_owned(), "DIR").into_bytes();
            }
        }
        f
    };
    assert!(without_dir(&dir("cpu3")) == without_dir(&dir("roundtrip")), "a LoRA checkpoint must survive the trip to the GPU unchanged");
    let mut lg: Vec<f64> = run(&mut t, &data, 3).iter().map(|r| r.loss).collect();
    t.save(&dir("gpu6"), None, coa_model::SaveDtype::Bf16).unwrap();
    assert!(dir("gpu6").join(coa_model::lora::ADAPTER_CONFIG).is_file() && dir("gpu6").join(coa_model::lora::ADAPTER_WEIGHTS).is_file());
    let base = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(base(&dir("gpu6")) == base(&dir("cpu3")), "the GPU's LoRA steps changed the saved base");
    let mut t = Trainer::load(&dir("gpu6"), &data).unwrap();
    t.share_prompts = false;
    assert!(t.cuda.is_none() && t.model.lora.is_some());
    lg.extend(run(&mut t, &data, 3).iter().map(|r| r.loss));
    for (i, (a, b)) in lg.iter().zip(&lf[3..]).enumerate() {
        eprintln!("  LoRA step {}: cpu->gpu->cpu {a:.4}  cpu {b:.4}", i + 4);
        assert!((a - b).abs() <= 0.05 * b + 0.02, "LoRA step {}: loss {a} after moving between devices vs {b} on the CPU", i + 4);
    }
}

// ---- the device flag (runs everywhere) ---------------------------------------------------------

fn bin() -> Command {
    Command::new(std::env::var_os("COA_TRAIN_STEP_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_coa-train-step"))))
}

fn exec(args: &[&str]) -> Output {
    bin().args(args).output().expect("running coa-train-step")
}

struct Env {
    dir: tempfile::TempDir,
    tokens: PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.parquet");
    let batch = tokens_batch(&rows(12, 7));
    let prov = Provenance { stage: "test".into(), version: "0".into(), args: vec![], seed: None, inputs: vec![] };
    io::write_all(Some(&tokens), None, &batch.schema(), &[batch], &prov).unwrap();
    Env { dir, tokens }
}

impl Env {
    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// A config.json; `head_dim` 64 (the GPU can train it) or 8 (it cannot).
    fn config(&self, gpu_ok: bool) -> PathBuf {
        let mut c = config();
        if !gpu_ok {
            c.hidden_size = 32;
            c.num_attention_heads = 4;
            c.num_key_value_heads = 2;
            c.intermediate_size = 64;
        }
        let p = self.p(if gpu_ok { "config64.json" } else { "config8.json" });
        std::fs::write(&p, serde_json::to_string_pretty(&c.to_json()).unwrap()).unwrap();
        p
    }
    fn args<'a>(&'a self, config: &'a Path, out: &'a Path, device: &'a str) -> Vec<&'a str> {
        let s = |p: &'a Path| p.to_str().unwrap();
        vec!["-i", s(&self.tokens), "--init-config", s(config), "--steps", "3", "--batch-tokens", "100", "--threads", "2", "--device", device, "-o", s(out)]
    }
}

fn losses(path: &Path) -> Vec<u32> {
    let (_, batches) = io::read_all(Some(path), &METRICS).unwrap();
    batches.iter().flat_map(|b| b.column_by_name("loss").unwrap().as_any().downcast_ref::<Float32Array>().unwrap().values().iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect()
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error() {
    let e = env();
    let cfg = e.config(true);
    let out = e.p("m.parquet");
    let o = exec(&e.args(&cfg, &out, "cuda"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "a panic instead of an error:\n{err}");
    match coa_kernels::probe() {
        Err(reason) => {
            assert!(!o.status.success(), "--device cuda without a GPU must fail");
            assert!(err.contains("--device cuda: ") && err.contains(&reason.0), "the error must say why:\n{err}");
            assert!(!out.exists(), "no partial output");
            println!("device_cuda_without_a_gpu_is_a_clear_error: no GPU here: {reason}");
        }
        Ok(info) => {
            assert!(o.status.success(), "--device cuda on {info}:\n{err}");
            assert!(err.contains("training on cuda:0"), "{err}");
            assert_eq!(losses(&out).len(), 3);
        }
    }
}

#[test]
fn device_cuda_names_what_the_gpu_path_cannot_train() {
    let e = env();
    let cfg = e.config(false);
    let o = exec(&e.args(&cfg, &e.p("m.parquet"), "cuda"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains("--device cuda: "), "{err}");
    // Without a GPU the missing GPU is reported first (before any data is read); the message for
    // the model is then checked by coa-kernels' `unsupported_models_are_named`.
    if coa_kernels::probe().is_ok() {
        assert!(err.contains("head_dim 8"), "the error must name the unsupported feature:\n{err}");
    }
}

#[test]
fn device_auto_falls_back_to_the_cpu_with_the_cpu_results() {
    let e = env();
    // head_dim 8: auto runs on the CPU with or without a GPU here.
    let cfg = e.config(false);
    let (a, c) = (e.p("auto.parquet"), e.p("cpu.parquet"));
    let oa = exec(&e.args(&cfg, &a, "auto"));
    let oc = exec(&e.args(&cfg, &c, "cpu"));
    let (ea, ec) = (String::from_utf8_lossy(&oa.stderr), String::from_utf8_lossy(&oc.stderr));
    assert!(oa.status.success() && oc.status.success(), "{ea}\n{ec}");
    let notes: Vec<&str> = ea.lines().filter(|l| l.starts_with("note: --device auto:")).collect();
    assert!(notes.len() == 1 && notes[0].ends_with("running on the CPU"), "one note saying why:\n{ea}");
    assert!(!ec.contains("--device auto"), "{ec}");
    assert_eq!(losses(&a), losses(&c), "auto on the CPU must give the CPU's results exactly");
    assert_eq!(losses(&a).len(), 3);
}

/// The command line: `--lora-rank` on the emulated device (what `--device cuda` runs, on the CPU)
/// trains and saves a PEFT adapter beside its base.
#[test]
fn device_emu_trains_a_lora_adapter() {
    let e = env();
    let cfg = e.config(true);
    let (out, save) = (e.p("m.parquet"), e.p("ck"));
    let mut a = e.args(&cfg, &out, "emu");
    a.extend(["--lora-rank", "4", "--lora-dropout", "0.1", "--lora-targets", "q_proj,v_proj,down_proj", "--save", save.to_str().unwrap()]);
    let o = exec(&a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("training on") && err.contains("LoRA r 4"), "{err}");
    assert_eq!(losses(&out).len(), 3);
    let m = Model::load_with_adapter(&save).unwrap();
    let l = m.lora.as_ref().expect("an adapter beside the base");
    assert!(l.params.tensors.iter().filter(|t| t.name.contains("lora_B")).all(|t| t.data.iter().any(|&x| x != 0.0)), "every B trained");
}
