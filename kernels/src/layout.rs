//! The model as the GPU kernels see it, shared by training (`model`) and decoding
//! (`decode`): its dimensions ([`Dims`]), the flat fused weight layout ([`FlatLayout`]:
//! per layer q|k|v stacked into one matrix and gate|up into another, so each is one matmul), and
//! what every kernel of the model path requires of a config ([`check_common`]).

use coa_model::{layout, param_specs, ModelConfig, Params};

use crate::error::{Error, Result};
use crate::ops::attention::{AttnLayout, AttnShape, Strides};
use crate::ops::rope::HeadRows;

/// What every kernel of the model path needs, training or decoding: an even hidden size (RMSNorm
/// reads bf16 pairs) and token ids that fit the kernels' int32. The attention kernels add their
/// own head_dim rule (`model::check_supported`, `decode::check_decodable`).
pub(crate) fn check_common(c: &ModelConfig) -> Result<()> {
    if c.hidden_size % 2 != 0 {
        return Err(Error(format!("the GPU kernels' RMSNorm needs an even hidden_size, this model has {}", c.hidden_size)));
    }
    if c.vocab_size > i32::MAX as usize {
        return Err(Error(format!("vocab_size {} does not fit the GPU kernels' int32 token ids", c.vocab_size)));
    }
    Ok(())
}

/// Groups of the flat buffers start at multiples of this many elements (256 bytes of f32):
/// aligned pointers for cuBLAS and vector loads.
pub(crate) const ALIGN: usize = 64;

/// Model dimensions, as the kernels see them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) vocab: usize,
    pub(crate) d: usize,
    pub(crate) layers: usize,
    pub(crate) hq: usize,
    pub(crate) hkv: usize,
    pub(crate) hd: usize,
    /// Hq * hd
    pub(crate) qd: usize,
    /// Hkv * hd
    pub(crate) kvd: usize,
    /// (Hq + 2 Hkv) * hd: the fused q|k|v width
    pub(crate) wqkv: usize,
    pub(crate) inter: usize,
    pub(crate) eps: f32,
}

impl Dims {
    pub(crate) fn of(c: &ModelConfig) -> Dims {
        let hd = c.head_dim();
        let (hq, hkv) = (c.num_attention_heads, c.num_key_value_heads);
        Dims {
            vocab: c.vocab_size,
            d: c.hidden_size,
            layers: c.num_hidden_layers,
            hq,
            hkv,
            hd,
            qd: hq * hd,
            kvd: hkv * hd,
            wqkv: (hq + 2 * hkv) * hd,
            inter: c.intermediate_size,
            eps: c.rms_norm_eps as f32,
        }
    }

    /// One packed sequence of `n` tokens: q, k, v read from the fused qkv rows, o contiguous;
    /// no sliding window (a layer with one sets its own, `AttnShape::window`).
    pub(crate) fn attention(&self, n: usize) -> (AttnShape, AttnLayout) {
        let s = AttnShape { batch: 1, seq: n, q_heads: self.hq, kv_heads: self.hkv, head_dim: self.hd, window: 0 };
        let qkv = Strides { b: (n * self.wqkv) as i64, t: self.wqkv as i64, h: self.hd as i64 };
        (s, AttnLayout { q: qkv, k: qkv, v: qkv, o: Strides::contiguous(n, self.hq, self.hd) })
    }

    /// The heads of `n` fused q|k|v rows, each slice starting at its block's first column: q's,
    /// k's, and q's and k's together (what RoPE rotates).
    pub(crate) fn head_rows(&self, n: usize) -> [HeadRows; 3] {
        let rows = |heads| HeadRows { tokens: n, heads, head_dim: self.hd, ld: self.wqkv };
        [rows(self.hq), rows(self.hkv), rows(self.hq + self.hkv)]
    }
}

/// Where one canonical parameter tensor lives in the flat buffers.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) offset: usize,
    pub(crate) numel: usize,
}

/// Flat-buffer offsets of one layer's (fused) weights; gradients use the same offsets.
#[derive(Debug, Clone)]
pub(crate) struct LayerW {
    pub(crate) qkv: usize,              // [W, D]
    pub(crate) qkv_bias: Option<usize>, // [W]
    pub(crate) o: usize,                // [D, Hq hd]
    pub(crate) o_bias: Option<usize>,   // [D]
    pub(crate) gu: usize,               // [2I, D]
    pub(crate) gu_bias: Option<usize>,  // [2I]
    pub(crate) down: usize,             // [D, I]
    pub(crate) down_bias: Option<usize>, // [D]
    pub(crate) ln1: usize,              // [D]
    pub(crate) ln2: usize,              // [D]
    /// Qwen3's q and k norms (`[hd]` each).
    pub(crate) q_norm: Option<usize>,
    pub(crate) k_norm: Option<usize>,
}

/// The flat layout: groups of canonical tensors placed contiguously (fused matmul operands), each
/// group starting at a multiple of [`ALIGN`].
pub(crate) struct FlatLayout {
    pub(crate) slots: Vec<Slot>,
    pub(crate) layers: Vec<LayerW>,
    pub(crate) embed: usize,
    pub(crate) norm: usize,
    /// The head's weight (`embed` when tied).
    pub(crate) head: usize,
    pub(crate) total: usize,
}

/// Places groups of canonical tensors one after another in the flat buffers.
struct Placer {
    sizes: Vec<usize>,
    offset: Vec<usize>,
    total: usize,
}

impl Placer {
    /// Places the tensors of `group` contiguously from the next aligned offset; returns that
    /// offset, or None for an empty group (a model without these biases).
    fn group(&mut self, group: &[Option<usize>]) -> Option<usize> {
        let mut members = group.iter().flatten().peekable();
        members.peek()?;
        self.total = self.total.next_multiple_of(ALIGN);
        let start = self.total;
        for &i in members {
            self.offset[i] = self.total;
            self.total += self.sizes[i];
        }
        Some(start)
    }
    fn one(&mut self, i: usize) -> usize {
        self.group(&[Some(i)]).unwrap_or(0)
    }
}

impl FlatLayout {
    pub(crate) fn of(c: &ModelConfig) -> FlatLayout {
        let specs = param_specs(c);
        let lay = layout(c);
        let sizes: Vec<usize> = specs.iter().map(|s| s.shape.iter().product()).collect();
        let mut p = Placer { offset: vec![0; sizes.len()], sizes, total: 0 };
        let embed = p.one(lay.embed);
        let mut layers = Vec::with_capacity(lay.layers.len());
        for li in &lay.layers {
            let qkv = p.group(&[Some(li.wq), Some(li.wk), Some(li.wv)]).unwrap_or(0);
            let o = p.one(li.wo);
            let gu = p.group(&[Some(li.wg), Some(li.wu)]).unwrap_or(0);
            let down = p.one(li.wd);
            let qkv_bias = p.group(&[li.bq, li.bk, li.bv]);
            let o_bias = p.group(&[li.bo]);
            let gu_bias = p.group(&[li.bg, li.bu]);
            let down_bias = p.group(&[li.bd]);
            let (ln1, ln2) = (p.one(li.ln1), p.one(li.ln2));
            let (q_norm, k_norm) = (p.group(&[li.qn]), p.group(&[li.kn]));
            layers.push(LayerW { qkv, qkv_bias, o, o_bias, gu, gu_bias, down, down_bias, ln1, ln2, q_norm, k_norm });
        }
        let norm = p.one(lay.norm);
        let head = p.group(&[lay.lm_head]).unwrap_or(embed);
        let total = p.total.next_multiple_of(ALIGN);
        let slots = specs
            .into_iter()
            .zip(p.offset.iter().zip(&p.sizes))
            .map(|(s, (&offset, &numel))| Slot { name: s.name, shape: s.shape, offset, numel })
            .collect();
        FlatLayout { slots, layers, embed, norm, head, total }
    }

    /// The layout of a plain list of tensors (a LoRA adapter's A and B matrices), each at an
    /// aligned offset; no layers (`layers` empty, `embed`, `norm`, `head` unused).
    pub(crate) fn of_tensors(params: &Params) -> FlatLayout {
        let sizes: Vec<usize> = params.tensors.iter().map(|t| t.data.len()).collect();
        let mut p = Placer { offset: vec![0; sizes.len()], sizes, total: 0 };
        (0..params.tensors.len()).for_each(|i| {
            p.one(i);
        });
        let total = p.total.next_multiple_of(ALIGN);
        let slots = params.tensors.iter().zip(p.offset.iter().zip(&p.sizes)).map(|(t, (&offset, &numel))| Slot { name: t.name.clone(), shape: t.shape.clone(), offset, numel }).collect();
        FlatLayout { slots, layers: Vec::new(), embed: 0, norm: 0, head: 0, total }
    }

    /// Errors unless `params` are the canonical tensors of this layout's config, in order.
    pub(crate) fn check_tensors(&self, params: &Params) -> Result<()> {
        if params.tensors.len() != self.slots.len() {
            return Err(Error(format!("the parameters have {} tensors, the config calls for {}", params.tensors.len(), self.slots.len())));
        }
        for (t, s) in params.tensors.iter().zip(&self.slots) {
            if t.name != s.name || t.shape != s.shape || t.data.len() != s.numel {
                return Err(Error(format!("parameter tensor {} {:?} found where {} {:?} was expected", t.name, t.shape, s.name, s.shape)));
            }
        }
        Ok(())
    }

    /// One host buffer of `total` elements with canonical tensor `i` (`tensor(i)`) at its slot.
    pub(crate) fn flatten<'a>(&self, tensor: impl Fn(usize) -> &'a [f32]) -> Vec<f32> {
        let mut out = vec![0f32; self.total];
        for (i, s) in self.slots.iter().enumerate() {
            out[s.offset..s.offset + s.numel].copy_from_slice(tensor(i));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs() -> Vec<ModelConfig> {
        let mut llama = ModelConfig::preset("small", 1000).unwrap();
        llama.num_hidden_layers = 3;
        let mut qwen = llama.clone();
        qwen.model_type = "qwen2".into();
        qwen.tie_word_embeddings = false;
        let mut biased = llama.clone();
        biased.attention_bias = true;
        biased.mlp_bias = true;
        biased.intermediate_size = 1001; // odd sizes: groups still start aligned
        let mut qwen3 = llama.clone();
        qwen3.model_type = "qwen3".into();
        vec![llama, qwen, biased, qwen3]
    }

    /// Every tensor has its own range, fused groups are contiguous in the order the fused matmuls
    /// read them, and every group starts aligned.
    #[test]
    fn flat_layout_places_fused_groups_contiguously() {
        for c in configs() {
            let f = FlatLayout::of(&c);
            let specs = param_specs(&c);
            assert_eq!(f.slots.len(), specs.len());
            let mut ranges: Vec<(usize, usize)> = f.slots.iter().map(|s| (s.offset, s.offset + s.numel)).collect();
            ranges.sort();
            assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping tensors");
            assert!(ranges.last().unwrap().1 <= f.total && f.total % ALIGN == 0);
            let at = |name: &str| f.slots.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name}"));
            let follows = |a: &str, b: &str| {
                let (x, y) = (at(a), at(b));
                assert_eq!(x.offset + x.numel, y.offset, "{b} must follow {a}");
            };
            let lay = layout(&c);
            for (l, lw) in f.layers.iter().enumerate() {
                let p = |s: &str| format!("model.layers.{l}.{s}");
                assert_eq!(lw.qkv, at(&p("self_attn.q_proj.weight")).offset);
                follows(&p("self_attn.q_proj.weight"), &p("self_attn.k_proj.weight"));
                follows(&p("self_attn.k_proj.weight"), &p("self_attn.v_proj.weight"));
                assert_eq!(lw.gu, at(&p("mlp.gate_proj.weight")).offset);
                follows(&p("mlp.gate_proj.weight"), &p("mlp.up_proj.weight"));
                assert_eq!(lw.qkv_bias.is_some(), c.qkv_bias());
                if let Some(b) = lw.qkv_bias {
                    assert_eq!(b, at(&p("self_attn.q_proj.bias")).offset);
                    follows(&p("self_attn.q_proj.bias"), &p("self_attn.k_proj.bias"));
                    follows(&p("self_attn.k_proj.bias"), &p("self_attn.v_proj.bias"));
                }
                assert_eq!(lw.o_bias.is_some(), c.o_bias());
                assert_eq!(lw.gu_bias.is_some() && lw.down_bias.is_some(), c.mlp_bias());
                if let Some(b) = lw.gu_bias {
                    assert_eq!(b, at(&p("mlp.gate_proj.bias")).offset);
                    follows(&p("mlp.gate_proj.bias"), &p("mlp.up_proj.bias"));
                }
                assert_eq!(lw.o, at(&p("self_attn.o_proj.weight")).offset);
                assert_eq!(lw.down, at(&p("mlp.down_proj.weight")).offset);
                assert_eq!(lw.ln1, at(&p("input_layernorm.weight")).offset);
                assert_eq!(lw.ln2, at(&p("post_attention_layernorm.weight")).offset);
                assert_eq!(lw.q_norm.is_some() && lw.k_norm.is_some(), c.qk_norm());
                if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                    assert_eq!((qn, kn), (at(&p("self_attn.q_norm.weight")).offset, at(&p("self_attn.k_norm.weight")).offset));
                }
                for off in [lw.qkv, lw.o, lw.gu, lw.down, lw.ln1, lw.ln2].into_iter().chain(lw.qkv_bias).chain(lw.o_bias).chain(lw.gu_bias).chain(lw.down_bias) {
                    assert_eq!(off % ALIGN, 0);
                }
            }
            assert_eq!(f.embed, f.slots[lay.embed].offset);
            assert_eq!(f.norm, f.slots[lay.norm].offset);
            match lay.lm_head {
                Some(h) => assert_eq!(f.head, f.slots[h].offset),
                None => assert_eq!(f.head, f.embed),
            }
        }
    }

    #[test]
    fn attention_geometry_reads_q_k_v_from_the_fused_rows() {
        let c = Dims::of(&configs()[0]);
        let (s, l) = c.attention(100);
        assert_eq!((s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim), (1, 100, c.hq, c.hkv, c.hd));
        assert_eq!(l.q.t as usize, c.qd + 2 * c.kvd);
        assert_eq!((l.k, l.v), (l.q, l.q));
        assert_eq!(l.o, Strides::contiguous(100, c.hq, c.hd));
    }
}
