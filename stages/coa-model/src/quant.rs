//! The formats decoding can hold its weights in: f32 (exact), bf16, or int8 with a scale per
//! group of [`INT8_GROUP`] inputs of one output.
//!
//! A batch-1 decode step reads every weight once, so its time is the weights' bytes over the
//! memory bandwidth: bf16 halves them, int8 quarters them. Each format is defined by the values
//! it stores, [`DecodeDtype::round_weight`]: decoding a model in a format gives the bits f32
//! decoding gives on that model's weights rounded so (the kernels widen each stored value to
//! exactly that f32 and then run the f32 arithmetic), which is what the tests hold it to.
//! Training and the trainer's log-probs stay f32; a rollout decoded in bf16 or int8 has a
//! non-zero sampling-vs-trainer log-prob mismatch. [`DecodeDtype::Bf16Matmul`] also rounds the
//! activations each product multiplies: the arithmetic of bf16 inference elsewhere, and the one
//! AMX tiles run.

use anyhow::{bail, Result};

/// Inputs of one output column sharing an int8 scale; a divisor of the GEMM's KC blocks.
pub const INT8_GROUP: usize = 32;

/// How decoding holds the weights it multiplies (the embedding table, every linear layer, the
/// head); norms and biases stay f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeDtype {
    /// The weights as trained (4 bytes each).
    #[default]
    F32,
    /// Rounded to bfloat16, to nearest even (2 bytes).
    Bf16,
    /// Symmetric int8 with one f32 scale per [`INT8_GROUP`] inputs of an output: scale =
    /// max |w| / 127 over the group, value = round(w / scale) · scale (1.125 bytes; the group of
    /// llama.cpp's Q8_0). Groups of 64 were measured too: on 32 greedy math responses of
    /// SmolLM2-135M their log-probs moved 1.6x as far from f32's for 3% more speed.
    Int8,
    /// bf16 weights, and the other input of each product (the activations) rounded to bf16 as it
    /// is multiplied; f32 sums. The arithmetic of llama.cpp's BF16 weights and of PyTorch's bf16
    /// autocast. It runs on AMX tiles where the CPU has them (`amx.rs`; their f32 sums round
    /// in the tiles' own way), elsewhere on the bf16 path with the activations rounded first.
    Bf16Matmul,
}

impl DecodeDtype {
    /// `"f32"`, `"bf16"`, `"int8"` or `"bf16-matmul"`.
    pub fn name(self) -> &'static str {
        match self {
            DecodeDtype::F32 => "f32",
            DecodeDtype::Bf16 => "bf16",
            DecodeDtype::Int8 => "int8",
            DecodeDtype::Bf16Matmul => "bf16-matmul",
        }
    }

    /// The values this format stores for a row-major weight `w[n, k]` (one output per row of k
    /// inputs), written back into `w`.
    pub fn round_weight(self, w: &mut [f32], k: usize) {
        assert!(k > 0 && w.len().is_multiple_of(k), "round_weight: {} values are not rows of {k}", w.len());
        match self {
            DecodeDtype::F32 => {}
            DecodeDtype::Bf16 | DecodeDtype::Bf16Matmul => w.iter_mut().for_each(|x| *x = bf16_value(*x)),
            DecodeDtype::Int8 => {
                for row in w.chunks_mut(k) {
                    for group in row.chunks_mut(INT8_GROUP) {
                        let s = int8_scale(group);
                        group.iter_mut().for_each(|x| *x = int8_quant(*x, s) as f32 * s);
                    }
                }
            }
        }
    }
}

impl std::str::FromStr for DecodeDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "f32" => DecodeDtype::F32,
            "bf16" => DecodeDtype::Bf16,
            "int8" => DecodeDtype::Int8,
            "bf16-matmul" => DecodeDtype::Bf16Matmul,
            other => bail!("unknown decoding weight format `{other}` (expected f32, bf16, int8 or bf16-matmul)"),
        })
    }
}

impl std::fmt::Display for DecodeDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a linear layer's product multiplies in training and in the trainer's log-probs: f32 (the
/// reference), or both inputs rounded to bf16 with f32 sums (PyTorch's CPU autocast to bf16, on
/// AMX tiles where the CPU has them). Only the products: weights, gradients, optimizer state,
/// norms, attention and the loss stay f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulDtype {
    #[default]
    F32,
    Bf16,
}

impl MatmulDtype {
    /// `"f32"` or `"bf16"`.
    pub fn name(self) -> &'static str {
        match self {
            MatmulDtype::F32 => "f32",
            MatmulDtype::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for MatmulDtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "f32" => MatmulDtype::F32,
            "bf16" => MatmulDtype::Bf16,
            other => bail!("unknown matmul type `{other}` (expected f32 or bf16)"),
        })
    }
}

impl std::fmt::Display for MatmulDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The bf16 bits of `x`, rounded to nearest even (NaN stays a quiet NaN): `half::bf16::from_f32`'s
/// bits, written without branches so that loops of it become vector code (the AMX packing).
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let rounded = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
    let nan = (u >> 16) as u16 | 0x40;
    if u & 0x7fff_ffff > 0x7f80_0000 { nan } else { rounded }
}

/// The f32 that bf16 `bits` hold (exact widening).
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `x` rounded to bf16, as f32.
pub(crate) fn bf16_value(x: f32) -> f32 {
    bf16_to_f32(bf16_bits(x))
}

/// The scale of an int8 group: max |w| / 127 (0 for an all-zero group).
pub(crate) fn int8_scale(group: &[f32]) -> f32 {
    group.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0
}

/// `w` in units of `scale`, rounded to the nearest integer in [-127, 127] (0 where scale is 0).
pub(crate) fn int8_quant(w: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    (w / scale).round().clamp(-127.0, 127.0) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_are_errors() {
        for d in [DecodeDtype::F32, DecodeDtype::Bf16, DecodeDtype::Int8, DecodeDtype::Bf16Matmul] {
            assert_eq!(d.name().parse::<DecodeDtype>().unwrap(), d);
        }
        let e = "fp8".parse::<DecodeDtype>().unwrap_err().to_string();
        assert!(e.contains("fp8") && e.contains("bf16"), "{e}");
    }

    #[test]
    fn bf16_bits_are_halfs_for_every_kind_of_value() {
        // Ties both ways, the largest finite values (round to infinity), infinities, NaNs,
        // subnormals, zeros of both signs, and a sweep of bit patterns.
        let mut xs: Vec<u32> = vec![0, 0x8000_0000, 0x3f80_8000, 0x3f81_8000, 0x7f7f_ffff, 0xff7f_ffff, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 0xffff_ffff, 0x0000_8000, 0x0001_8000];
        xs.extend((0..200_000u32).map(|i| i.wrapping_mul(2_654_435_761)));
        for u in xs {
            let x = f32::from_bits(u);
            assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{u:#010x}");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
        assert_eq!(bf16_value(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(bf16_value(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2.0 * 2f32.powi(-7));
        assert_eq!(bf16_value(-0.15625), -0.15625);
        assert!(bf16_value(f32::NAN).is_nan());
    }

    #[test]
    fn int8_groups_keep_their_maximum_and_bound_the_error() {
        // Two rows of 150 inputs: groups of 32 (the last of 22) per row, each with its own scale.
        let k = 150;
        let w: Vec<f32> = (0..2 * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * if i % k < 64 { 0.001 } else { 0.1 }).collect();
        let mut r = w.clone();
        DecodeDtype::Int8.round_weight(&mut r, k);
        for (row_w, row_r) in w.chunks(k).zip(r.chunks(k)) {
            for (gw, gr) in row_w.chunks(INT8_GROUP).zip(row_r.chunks(INT8_GROUP)) {
                let amax = gw.iter().fold(0f32, |m, x| m.max(x.abs()));
                let (i, _) = gw.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap();
                assert!((gr[i].abs() - amax).abs() <= 1e-6 * amax, "the group's largest value is kept");
                for (x, y) in gw.iter().zip(gr) {
                    assert!((x - y).abs() <= amax / 254.0 * 1.0001, "{x} -> {y}: more than half a step off");
                }
            }
        }
        let mut zeros = vec![0f32; 70];
        DecodeDtype::Int8.round_weight(&mut zeros, 70);
        assert!(zeros.iter().all(|&x| x == 0.0));
    }
}
