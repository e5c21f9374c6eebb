//! Dequantizing ggml tensor data to f32, bit for bit as gguf-py (`gguf.quants.dequantize`, what HF
//! transformers' GGUF loader calls) does it.
//!
//! Block layouts of the 32-value types (`d` and `m` are little-endian f16 scales, `qh` a
//! little-endian u32):
//!
//! | type | bytes | block | value `j` |
//! |---|---|---|---|
//! | Q8_0 | 34 | `d`, 32 × i8 `q` | `q[j] * d` |
//! | Q4_0 | 18 | `d`, 16 bytes `qs` | `d * (n[j] - 8)` |
//! | Q4_1 | 20 | `d`, `m`, 16 bytes `qs` | `d * n[j] + m` |
//! | Q5_0 | 22 | `d`, `qh`, 16 bytes `qs` | `d * (n[j] + 16 h[j] - 16)` |
//! | Q5_1 | 24 | `d`, `m`, `qh`, 16 bytes `qs` | `d * (n[j] + 16 h[j]) + m` |
//!
//! where the nibble `n[j]` is the low half of `qs[j]` for `j < 16` and the high half of
//! `qs[j - 16]` for `j >= 16`, and `h[j]` is bit `j` of `qh`.
//!
//! The K-quants pack 256 values in a super-block of sub-blocks, each with its own scale:
//!
//! | type | bytes | block |
//! |---|---|---|
//! | Q4_K | 144 | `d`, `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes `qs` |
//! | Q5_K | 176 | `d`, `dmin`, 12 bytes of 6-bit scales and mins, 32 bytes `qh`, 128 bytes `qs` |
//! | Q6_K | 210 | 128 bytes `ql`, 64 bytes `qh`, 16 × i8 scales, `d` (last) |
//!
//! Q4_K / Q5_K: 8 sub-blocks of 32; sub-block `i` takes the low (even `i`) or high (odd `i`)
//! nibbles of `qs[32 (i / 2) ..][..32]`, Q5_K adds bit `i` of `qh[l]` as the fifth bit of value
//! `l`; value = `(d * sc[i]) * q - (dmin * mn[i])`, with [`scale_min_k4`] unpacking `sc` / `mn`.
//! Q6_K: two halves of 128; group `g` (0..4) of half `h` takes nibble `g / 2` of
//! `ql[64 h + 32 (g % 2) + l]` and bits `2g, 2g + 1` of `qh[32 h + l]` as its high two bits;
//! value `e` = `(d * scale[e / 16]) * (q - 32)`.
//!
//! The scales are widened to f32 first and every product and sum is one f32 operation, in
//! gguf-py's order (no fused multiply-add), so the results equal numpy's.

use super::file::GgmlType;

/// The types [`to_f32`] reads.
pub const SUPPORTED: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// `bytes` (whole blocks of `ty`) as f32 values; None for a type outside [`SUPPORTED`].
pub fn to_f32(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match ty {
        GgmlType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|b| f16(b[0], b[1])).collect(),
        GgmlType::BF16 => {
            bytes.chunks_exact(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)).collect()
        }
        GgmlType::Q8_0 => blocks(bytes, 34, 32, |b, out| {
            let d = f16(b[0], b[1]);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }),
        GgmlType::Q4_0 => blocks(bytes, 18, 32, |b, out| {
            let d = f16(b[0], b[1]);
            for (j, &q) in b[2..18].iter().enumerate() {
                out[j] = d * f32::from((q & 0x0F) as i8 - 8);
                out[j + 16] = d * f32::from((q >> 4) as i8 - 8);
            }
        }),
        GgmlType::Q4_1 => blocks(bytes, 20, 32, |b, out| {
            let d = f16(b[0], b[1]);
            let m = f16(b[2], b[3]);
            for (j, &q) in b[4..20].iter().enumerate() {
                out[j] = d * f32::from(q & 0x0F) + m;
                out[j + 16] = d * f32::from(q >> 4) + m;
            }
        }),
        GgmlType::Q5_0 => blocks(bytes, 22, 32, |b, out| {
            let d = f16(b[0], b[1]);
            let q = five_bit(&b[2..22]);
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * f32::from(q as i8 - 16);
            }
        }),
        GgmlType::Q5_1 => blocks(bytes, 24, 32, |b, out| {
            let d = f16(b[0], b[1]);
            let m = f16(b[2], b[3]);
            let q = five_bit(&b[4..24]);
            for (o, q) in out.iter_mut().zip(q) {
                *o = d * f32::from(q) + m;
            }
        }),
        GgmlType::Q4_K => blocks(bytes, 144, 256, |b, out| {
            let (d, dmin) = (f16(b[0], b[1]), f16(b[2], b[3]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let qs = &b[16..144];
            for (i, sub) in out.chunks_exact_mut(32).enumerate() {
                let (sc, mn) = scale_min_k4(scales, i);
                let (scale, min) = (d * f32::from(sc), dmin * f32::from(mn));
                let shift = 4 * (i % 2);
                for (o, &q) in sub.iter_mut().zip(&qs[32 * (i / 2)..][..32]) {
                    *o = scale * f32::from((q >> shift) & 0x0F) - min;
                }
            }
        }),
        GgmlType::Q5_K => blocks(bytes, 176, 256, |b, out| {
            let (d, dmin) = (f16(b[0], b[1]), f16(b[2], b[3]));
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let (qh, qs) = (&b[16..48], &b[48..176]);
            for (i, sub) in out.chunks_exact_mut(32).enumerate() {
                let (sc, mn) = scale_min_k4(scales, i);
                let (scale, min) = (d * f32::from(sc), dmin * f32::from(mn));
                let shift = 4 * (i % 2);
                for ((o, &q), &h) in sub.iter_mut().zip(&qs[32 * (i / 2)..][..32]).zip(qh) {
                    let q = ((q >> shift) & 0x0F) | (((h >> i) & 1) << 4);
                    *o = scale * f32::from(q) - min;
                }
            }
        }),
        GgmlType::Q6_K => blocks(bytes, 210, 256, |b, out| {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16(b[208], b[209]);
            for (e, o) in out.iter_mut().enumerate() {
                let (h, g, l) = (e / 128, e / 32 % 4, e % 32);
                let low = (ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
                let high = (qh[32 * h + l] >> (2 * g)) & 0x03;
                let q = (low | (high << 4)) as i8 - 32;
                *o = (d * f32::from(scales[e / 16] as i8)) * f32::from(q);
            }
        }),
        _ => return None,
    })
}

fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// The 32 five-bit values of a Q5_0 / Q5_1 block from its `qh` (4 bytes) and `qs` (16 bytes).
fn five_bit(qh_qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh_qs[..4].try_into().expect("4 bytes"));
    let mut q = [0u8; 32];
    for (j, &b) in qh_qs[4..20].iter().enumerate() {
        q[j] = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// The 6-bit scale and min of sub-block `i` (0..8) of a Q4_K / Q5_K super-block. Bytes 0-3 hold
/// the scales of sub-blocks 0-3 in their low 6 bits, bytes 4-7 their mins; sub-blocks 4-7 keep
/// their low 4 bits in the nibbles of bytes 8-11 (scale low, min high) and their top 2 bits in
/// the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
pub fn scale_min_k4(scales: &[u8; 12], i: usize) -> (u8, u8) {
    if i < 4 {
        (scales[i] & 63, scales[i + 4] & 63)
    } else {
        let sc = (scales[i + 4] & 0x0F) | ((scales[i - 4] >> 6) << 4);
        let mn = (scales[i + 4] >> 4) | ((scales[i] >> 6) << 4);
        (sc, mn)
    }
}

/// Runs `decode` over each `block_bytes`-byte block, filling its `block_elems` values.
fn blocks(bytes: &[u8], block_bytes: usize, block_elems: usize, decode: impl Fn(&[u8], &mut [f32])) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / block_bytes * block_elems];
    for (b, o) in bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(block_elems)) {
        decode(b, o);
    }
    out
}
