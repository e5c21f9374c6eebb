//! LoRA adapters on the GPU ([`GpuLora`]): `coa_model::lora`'s `y = W x + s · B A drop(x)` for
//! [`crate::GpuModel`], with the adapter's own flat buffers (f32 masters, bf16 working copy, f32
//! gradients and AdamW moments: the base weights then get none of the three) and the activations
//! its backward needs (`xs = s · A drop(x)` per adapted layer, `[T, r]`).
//!
//! The dropout mask is the CPU's (`coa_model::lora::dropout_factor`, kernel `lora_dropout`): each
//! packed sequence draws with its own seed ([`crate::GpuModel::set_dropout_seeds`]) over its own
//! element indices, so a packed GPU pass drops exactly what the CPU drops sequence by sequence. The
//! backward redraws it instead of keeping it.
//!
//! q, k, v (and gate, up) share one fused output buffer; an adapter on one of them reads and writes
//! its column block through the leading-dimension form of the matmul ([`Gpu::gemm_ld`]).

use coa_model::lora::{dropout_key, Lora, LoraConfig, Target};
use coa_model::ops::Gemm;
use coa_model::ModelConfig;
use cudarc::driver::CudaSlice;

use crate::gpu::Alloc;
use crate::layout::FlatLayout;
use crate::ops::elementwise::DropoutMask;
use crate::{bf16, Error, Gpu, Result};

/// One adapted layer: flat offsets of A `[r, in]` and B `[out, r]`, and (in, out).
#[derive(Clone, Copy)]
struct Site {
    a: usize,
    b: usize,
    inp: usize,
    out: usize,
}

/// Which adapter a LoRA forward or backward runs and where its product lands: layer `layer`'s
/// adapter on `target`, over `rows` rows, on columns `col..col + out_features` of an output (or
/// its gradient) whose rows are `ld` elements apart (a block of the fused q|k|v or gate|up rows).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuLoraCall {
    pub layer: usize,
    pub target: Target,
    pub rows: usize,
    pub col: usize,
    pub ld: usize,
}

/// The adapter on the device (see the module doc).
pub(crate) struct GpuLora {
    pub(crate) config: LoraConfig,
    /// The adapter's tensors in `Lora::params` order.
    pub(crate) flat: FlatLayout,
    sites: Vec<[Option<Site>; 7]>,
    pub(crate) master: CudaSlice<f32>,
    pub(crate) w: CudaSlice<bf16>,
    pub(crate) grad: CudaSlice<f32>,
    pub(crate) m: CudaSlice<f32>,
    pub(crate) v: CudaSlice<f32>,
    xs: Vec<[Option<CudaSlice<bf16>>; 7]>, // [T, r] per adapted layer: s · A drop(x)
    scratch: CudaSlice<bf16>,              // [T, max in]: drop(x), then the input gradient's term
    dxa: CudaSlice<bf16>,                  // [T, r]: s · dy B
    seeds: CudaSlice<u64>,                 // [T] the mask seed of each token's sequence
    rows: CudaSlice<i32>,                  // [T] each token's index within its sequence
    /// Off while other working weights (an RL reference model) stand in for the base.
    pub(crate) active: bool,
}

impl GpuLora {
    pub(crate) fn new(al: &mut Alloc, gpu: &Gpu, model: &ModelConfig, lora: &Lora, capacity: usize) -> Result<GpuLora> {
        let flat = FlatLayout::of_tensors(&lora.params);
        let r = lora.config.rank;
        let t = capacity;
        let mut sites = vec![[None; 7]; model.num_hidden_layers];
        let mut xs: Vec<[Option<CudaSlice<bf16>>; 7]> = Vec::with_capacity(model.num_hidden_layers);
        let mut max_in = 1;
        for (l, site) in sites.iter_mut().enumerate() {
            let mut layer: [Option<CudaSlice<bf16>>; 7] = Default::default();
            for tg in Target::ALL {
                let Some(k) = lora.tensor_index(l, tg) else { continue };
                let (inp, out) = tg.dims(model);
                site[tg as usize] = Some(Site { a: flat.slots[k].offset, b: flat.slots[k + 1].offset, inp, out });
                layer[tg as usize] = Some(al.bf16(t * r)?);
                max_in = max_in.max(inp);
            }
            xs.push(layer);
        }
        let total = flat.total;
        let (master, w, grad, m, v) = (al.f32(total)?, al.bf16(total)?, al.f32(total)?, al.f32(total)?, al.f32(total)?);
        let mut g = GpuLora {
            config: lora.config.clone(),
            sites,
            master,
            w,
            grad,
            m,
            v,
            xs,
            scratch: al.bf16(t * max_in)?,
            dxa: al.bf16(t * r)?,
            seeds: al.u64(t)?,
            rows: al.i32(t)?,
            active: true,
            flat,
        };
        let host = g.flat.flatten(|i| &lora.params.tensors[i].data);
        gpu.stream.memcpy_htod(&host, &mut g.master)?;
        g.restore_working_weights(gpu)?;
        Ok(g)
    }

    /// The bf16 A and B from the f32 masters.
    pub(crate) fn restore_working_weights(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.cast_f32_bf16(&self.master, &mut self.w, self.flat.total)
    }

    fn dropout(&self) -> f64 {
        self.config.dropout
    }

    /// Uploads the mask seed and the in-sequence row of every token of a pass: `seeds[k]` for
    /// the sequence at `spans[k]` (start, length). Nothing to do without dropout.
    pub(crate) fn upload_seeds(&mut self, gpu: &Gpu, seeds: &[u64], spans: &[(usize, usize)]) -> Result<()> {
        if self.dropout() == 0.0 {
            return Ok(());
        }
        if seeds.len() != spans.len() {
            return Err(Error(format!(
                "LoRA dropout {} needs a mask seed per sequence (GpuModel::set_dropout_seeds): {} seeds for {} sequences",
                self.dropout(),
                seeds.len(),
                spans.len()
            )));
        }
        let n: usize = spans.iter().map(|s| s.1).sum();
        let (mut per_token, mut rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (&s, &(_, len)) in seeds.iter().zip(spans) {
            per_token.extend(std::iter::repeat_n(s, len));
            rows.extend(0..len as i32);
        }
        gpu.stream.memcpy_htod(&per_token, &mut self.seeds)?;
        gpu.stream.memcpy_htod(&rows, &mut self.rows)?;
        Ok(())
    }

    /// `out[:, col..col + out_features] += s · B A drop(x)` for the adapter `at` names; nothing
    /// without one or while inactive. `x` `[n, in]`; `train`: a training pass (dropout on, `xs`
    /// kept for the backward).
    pub(crate) fn forward(&mut self, gpu: &Gpu, at: GpuLoraCall, x: &CudaSlice<bf16>, out: &mut CudaSlice<bf16>, train: bool) -> Result<()> {
        let GpuLoraCall { layer: l, target: tg, rows: n, col, ld: ldo } = at;
        let Some(s) = self.sites[l][tg as usize].filter(|_| self.active) else { return Ok(()) };
        let (r, p, scale) = (self.config.rank, self.config.dropout, self.config.scale());
        let GpuLora { w, xs, scratch, seeds, rows, .. } = self;
        let xs = xs[l][tg as usize].as_mut().expect("an adapted layer has its xs");
        let drop = train && p > 0.0;
        if drop {
            let mask = DropoutMask { seeds, local_row: rows, key_hi: dropout_key(l, tg, 0), p };
            gpu.lora_dropout(&x.slice(..n * s.inp), &mut scratch.slice_mut(..n * s.inp), (n, s.inp), &mask, false)?;
        }
        let xin = if drop { &*scratch } else { x };
        gpu.gemm(Gemm::new(n, r, s.inp).transposed(false, true).alpha(scale), &xin.slice(..n * s.inp), &w.slice(s.a..s.a + r * s.inp), &mut xs.slice_mut(..n * r))?;
        let g = Gemm::new(n, s.out, r).transposed(false, true).ld(r, r, ldo).beta(1.0);
        gpu.gemm(g, &xs.slice(..n * r), &w.slice(s.b..s.b + s.out * r), &mut out.slice_mut(col..))
    }

    /// The backward of [`GpuLora::forward`] (after a training forward): `dy` is d loss / d out,
    /// read at the columns and row distance `at` gives; adds dA and dB into `grad` and the input
    /// gradient's LoRA term `drop'(s · dy B A)` into `dx` `[n, in]`.
    pub(crate) fn backward(&mut self, gpu: &Gpu, at: GpuLoraCall, x: &CudaSlice<bf16>, dy: &CudaSlice<bf16>, dx: &mut CudaSlice<bf16>) -> Result<()> {
        let GpuLoraCall { layer: l, target: tg, rows: n, col, ld: ldy } = at;
        let Some(s) = self.sites[l][tg as usize].filter(|_| self.active) else { return Ok(()) };
        let (r, p, scale) = (self.config.rank, self.config.dropout, self.config.scale());
        let GpuLora { w, grad, xs, scratch, dxa, seeds, rows, .. } = self;
        let xs = xs[l][tg as usize].as_ref().expect("an adapted layer has its xs");
        let (ra, rb) = (s.a..s.a + r * s.inp, s.b..s.b + s.out * r);
        let dy = dy.slice(col..);
        // dB [out, r] += dyᵀ @ xs
        gpu.gemm(Gemm::new(s.out, r, n).transposed(true, false).ld(ldy, r, r).beta(1.0), &dy, &xs.slice(..n * r), &mut grad.slice_mut(rb.clone()))?;
        // dxa [n, r] = s · dy @ B
        gpu.gemm(Gemm::new(n, r, s.out).ld(ldy, r, r).alpha(scale), &dy, &w.slice(rb), &mut dxa.slice_mut(..n * r))?;
        let drop = p > 0.0;
        let mask = DropoutMask { seeds, local_row: rows, key_hi: dropout_key(l, tg, 0), p };
        if drop {
            gpu.lora_dropout(&x.slice(..n * s.inp), &mut scratch.slice_mut(..n * s.inp), (n, s.inp), &mask, false)?;
        }
        let xin = if drop { &*scratch } else { x };
        // dA [r, in] += dxaᵀ @ drop(x)
        gpu.gemm(Gemm::new(r, s.inp, n).transposed(true, false).beta(1.0), &dxa.slice(..n * r), &xin.slice(..n * s.inp), &mut grad.slice_mut(ra.clone()))?;
        // dx += drop'(dxa @ A)
        if drop {
            gpu.gemm(Gemm::new(n, s.inp, r), &dxa.slice(..n * r), &w.slice(ra), &mut scratch.slice_mut(..n * s.inp))?;
            gpu.lora_dropout(&scratch.slice(..n * s.inp), &mut dx.slice_mut(..n * s.inp), (n, s.inp), &mask, true)
        } else {
            gpu.gemm(Gemm::new(n, s.inp, r).beta(1.0), &dxa.slice(..n * r), &w.slice(ra), &mut dx.slice_mut(..n * s.inp))
        }
    }
}
