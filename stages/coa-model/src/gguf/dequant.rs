//! Dequantizing ggml tensor data to f32, bit for bit as gguf-py (`gguf.quants.dequantize`, what HF
//! transformers' GGUF loader calls) does it.
//!
//! Block layouts (32 values per block; `d` and `m` are little-endian f16 scales):
//!
//! | type | bytes | block | value `j` |
//! |---|---|---|---|
//! | Q8_0 | 34 | `d`, 32 × i8 `q` | `q[j] * d` |
//! | Q4_0 | 18 | `d`, 16 bytes `qs` | `d * (n[j] - 8)` |
//! | Q4_1 | 20 | `d`, `m`, 16 bytes `qs` | `d * n[j] + m` |
//!
//! where the nibble `n[j]` is the low half of `qs[j]` for `j < 16` and the high half of
//! `qs[j - 16]` for `j >= 16`. The scales are widened to f32 first and every product and sum is
//! one f32 operation, in this order (no fused multiply-add), so the results equal numpy's.

use super::file::GgmlType;

/// The types [`to_f32`] reads.
pub const SUPPORTED: [GgmlType; 6] =
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1];

/// `bytes` (whole blocks of `ty`) as f32 values; None for a type outside [`SUPPORTED`].
pub fn to_f32(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match ty {
        GgmlType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|b| f16(b[0], b[1])).collect(),
        GgmlType::BF16 => {
            bytes.chunks_exact(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)).collect()
        }
        GgmlType::Q8_0 => blocks(bytes, 34, |b, out| {
            let d = f16(b[0], b[1]);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }),
        GgmlType::Q4_0 => blocks(bytes, 18, |b, out| {
            let d = f16(b[0], b[1]);
            for (j, &q) in b[2..18].iter().enumerate() {
                out[j] = d * f32::from((q & 0x0F) as i8 - 8);
                out[j + 16] = d * f32::from((q >> 4) as i8 - 8);
            }
        }),
        GgmlType::Q4_1 => blocks(bytes, 20, |b, out| {
            let d = f16(b[0], b[1]);
            let m = f16(b[2], b[3]);
            for (j, &q) in b[4..20].iter().enumerate() {
                out[j] = d * f32::from(q & 0x0F) + m;
                out[j + 16] = d * f32::from(q >> 4) + m;
            }
        }),
        _ => return None,
    })
}

fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Runs `decode` over each `block_bytes`-byte block, filling its 32 values.
fn blocks(bytes: &[u8], block_bytes: usize, decode: impl Fn(&[u8], &mut [f32])) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / block_bytes * 32];
    for (b, o) in bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(32)) {
        decode(b, o);
    }
    out
}
