//! Products whose two inputs are bf16 and whose sums are f32 ([`crate::MatmulDtype::Bf16`] in
//! training, [`crate::DecodeDtype::Bf16Matmul`] in decoding), on one of two engines over the same
//! packed operands:
//!
//! - [`Engine::Amx`]: Intel AMX tiles ([`crate::amx`]; Xeon since Sapphire Rapids), 16×32 by
//!   32×16 tile products;
//! - [`Engine::Dot`]: AVX-512 BF16 `vdpbf16ps` (AMD since Zen 4, Intel since Cooper Lake), each
//!   instruction 16 lanes × a pair of products added to an f32 accumulator: twice the f32 FMA
//!   rate on a Zen 4 core (235 against 117 GFLOP/s, `cargo run --release -p coa-model --example
//!   fma_peak`), half of it on this repo's Xeon (which has AMX instead). A register kernel of 12
//!   rows × 32 columns (24 zmm accumulators) as the f32 kernel's, each step two depths deep.
//!
//! A is packed as bf16 rows, B in VNNI order (per 32-column panel and depth of 32, two tiles of
//! 16 columns, each 16 rows of depth pairs: the AMX tile's layout, and for the dot kernel one
//! tile row is one zmm of 16 column pairs). Both engines round the operands to nearest even as
//! they pack them and sum in f32: within f32 summation error of the exact product of the rounded
//! operands, not the bits of `sgemm` on them (AMX rounds its sums in its own way; a
//! `vdpbf16ps` adds two products to its accumulator per step). Each output depends only on its
//! row, its column and the fixed depth blocks, so results do not change with the batch or the
//! threads, but they differ between the engines in the last bits. Both read subnormal inputs and
//! write subnormal results as zero.
//!
//! `COA_CPU_KERNEL=avx512` (or `avx2`) turns both engines off (the f32 kernel on rounded
//! copies, to compare on one machine), `COA_CPU_KERNEL=avx512bf16` takes the dot engine where
//! AMX is there too.

use std::arch::x86_64::*;

// The AMX tile's shape is the packed operands' for both engines.
pub(crate) use crate::amx::{TILE_B, TILE_K, TILE_M};

/// What multiplies the bf16 operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// AMX tiles.
    Amx,
    /// AVX-512 BF16 dot products in zmm registers.
    Dot,
}

impl Engine {
    /// Every engine this CPU has, whatever `COA_CPU_KERNEL` says (the tests run each).
    pub(crate) fn on_this_cpu() -> Vec<Engine> {
        let mut out = Vec::new();
        if crate::amx::available() {
            out.push(Engine::Amx);
        }
        if dot_available() {
            out.push(Engine::Dot);
        }
        out
    }
}

/// Whether the CPU runs `vdpbf16ps` on zmm registers (and the AVX-512BW the packing uses).
fn dot_available() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512bf16")
}

/// The engine of this process: AMX where the CPU has it, else the dot products, else none (the
/// f32 kernel then multiplies rounded copies). `COA_CPU_KERNEL` as the module says. Chosen once.
pub(crate) fn engine() -> Option<Engine> {
    static CHOSEN: std::sync::OnceLock<Option<Engine>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let cap = std::env::var("COA_CPU_KERNEL").unwrap_or_default();
        match cap.as_str() {
            "avx512" | "avx2" => None,
            "avx512bf16" => dot_available().then_some(Engine::Dot),
            _ => Engine::on_this_cpu().first().copied(),
        }
    })
}

/// Packs `w[n, k]` (row-major, the B operand of `x · wᵀ`) as bf16 tiles: per 32-column panel
/// (at `jr · k_pad`, the depth padded to 32), per depth of 32, two tiles of 16 columns, each 16
/// rows of k pairs: value `r·32 + 2j + e` of a tile is column j's weight at depth `2r + e`.
/// Padding is zero.
pub(crate) fn pack_b(w: &[f32], n: usize, k: usize, dst: &mut [u16]) {
    let (n_pad, k_pad) = (n.next_multiple_of(2 * TILE_M), k.next_multiple_of(TILE_K));
    assert!(w.len() == n * k && dst.len() >= n_pad * k_pad);
    assert!(dot_available() || crate::amx::available(), "bf16mm::pack_b: this CPU has no bf16 engine");
    // SAFETY: B(p, j) = w[j·k + p] addresses w [n, k] for p < k, j < n; every engine's CPU has
    // AVX-512F and BW (asserted above).
    unsafe { pack_panels(dst, w.as_ptr(), k, n, 1, k, n_pad, k_pad) }
}

/// Rows of A per block of [`tiles`]' loops (`MC_A × KC_A` bf16, 128 KB, in L2).
const MC_A: usize = 128;
/// Depth per block (a multiple of 32): a 32-column panel's part is `KC_A × 32` bf16 (32 KB); the
/// dot kernel's 12 rows of A are `12 × KC_A` bf16 (12 KB, in L1).
const KC_A: usize = 512;
/// Columns per block (`KC_A × NC_A` bf16 of B, 256 KB, in L2).
const NC_A: usize = 256;

thread_local! {
    /// This thread's packed operands (A as bf16 rows, B as tile panels), allocated once.
    static PACKED: std::cell::RefCell<(Vec<u16>, Vec<u16>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Where B's value (p, j) lies in [`pack_b`]'s order for a depth padded to `k_pad`.
#[inline(always)]
fn panel_index(p: usize, j: usize, k_pad: usize) -> usize {
    (j / (2 * TILE_M)) * 2 * TILE_M * k_pad + (p / TILE_K) * 2 * TILE_B + (j % (2 * TILE_M) / TILE_M) * TILE_B + (p % TILE_K / 2) * TILE_K + (j % TILE_M) * 2 + p % 2
}

/// `dst[i] = bf16(alpha · src[i])`, rounded to nearest even ([`crate::quant::bf16_bits`]), in a
/// loop the compiler turns into AVX-512 vectors.
#[inline(always)]
fn to_bf16(dst: &mut [u16], src: &[f32], alpha: f32) {
    if alpha == 1.0 {
        dst.iter_mut().zip(src).for_each(|(v, &x)| *v = crate::quant::bf16_bits(x));
    } else {
        dst.iter_mut().zip(src).for_each(|(v, &x)| *v = crate::quant::bf16_bits(alpha * x));
    }
}

/// [`to_bf16`] in AVX-512 vectors for a caller outside this module's `target_feature` code (an
/// [`Engine`] means the CPU has AVX-512F and BW: [`pack_rows`] needs them too).
pub(crate) fn round_to_bf16(_: Engine, dst: &mut [u16], src: &[f32], alpha: f32) {
    /// # Safety
    /// The CPU has AVX-512F and BW (an [`Engine`] exists).
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(dst: &mut [u16], src: &[f32], alpha: f32) {
        to_bf16(dst, src, alpha)
    }
    // SAFETY: the engine exists on this CPU, so do the features.
    unsafe { wide(dst, src, alpha) }
}

/// What an A operand may hold: f32 (rounded to bf16 as it is packed, times alpha) or bf16 bits
/// already rounded (copied: what [`to_bf16`] made earlier, alpha then must be 1), so a product
/// whose A is read twice rounds it once and moves half the bytes.
pub(crate) trait AElem: Copy {
    /// `dst[i] = bf16(alpha · src[i])` for `i < dst.len()`.
    ///
    /// # Safety
    /// `src` addresses `dst.len()` readable elements.
    unsafe fn run_to_bf16(dst: &mut [u16], src: *const Self, alpha: f32);
}

impl AElem for f32 {
    /// # Safety
    /// As [`AElem::run_to_bf16`]: `src` addresses `dst.len()` readable f32s.
    #[inline(always)]
    unsafe fn run_to_bf16(dst: &mut [u16], src: *const f32, alpha: f32) {
        to_bf16(dst, std::slice::from_raw_parts(src, dst.len()), alpha)
    }
}

impl AElem for u16 {
    /// # Safety
    /// As [`AElem::run_to_bf16`]: `src` addresses `dst.len()` readable bf16 values, not
    /// overlapping `dst`.
    #[inline(always)]
    unsafe fn run_to_bf16(dst: &mut [u16], src: *const u16, alpha: f32) {
        debug_assert!(alpha == 1.0, "bf16 operands are scaled before they are rounded");
        // A transposed A's runs are a tile's 16 rows: one 32-byte move, not a call to memmove.
        if dst.len() == TILE_M {
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), TILE_M);
        } else {
            dst.copy_from_slice(std::slice::from_raw_parts(src, dst.len()))
        }
    }
}

/// Two bf16 values in one u32: `lo` in the low half (the even depth of a VNNI pair).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    crate::quant::bf16_bits(lo) as u32 | (crate::quant::bf16_bits(hi) as u32) << 16
}

/// `alpha ·` A (element (i, p) at `a + i·rsa + p·csa`) as bf16 rows `[m_pad, k_pad]`,
/// zero-padded; read along whichever of its dimensions is contiguous.
///
/// # Safety
/// The CPU has AVX-512F and BW; A's addressed elements are readable; `dst` holds `m_pad·k_pad`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_rows<T: AElem>(dst: &mut [u16], a: *const T, m: usize, k: usize, rsa: usize, csa: usize, m_pad: usize, k_pad: usize, alpha: f32) {
    if csa == 1 {
        for (i, row) in dst[..m * k_pad].chunks_exact_mut(k_pad).enumerate() {
            T::run_to_bf16(&mut row[..k], a.add(i * rsa), alpha);
            row[k..].fill(0);
        }
    } else {
        // Columns of A are contiguous (A is a transpose): blocks of 16 rows × 32 depths, read
        // as 32 runs of 16 values, turned in L1, written as 16 runs of 32 (a cache line each).
        assert!(dst.len() >= m_pad * k_pad && rsa == 1);
        let mut block = [[0u16; 16]; TILE_K];
        let out = dst.as_mut_ptr();
        for i0 in (0..m).step_by(16) {
            let rows = 16.min(m - i0);
            for p0 in (0..k).step_by(TILE_K) {
                let depth = TILE_K.min(k - p0);
                for (d, run) in block.iter_mut().enumerate().take(depth) {
                    T::run_to_bf16(&mut run[..rows], a.add(i0 + (p0 + d) * csa), alpha);
                }
                if rows == 16 && depth == TILE_K {
                    // SAFETY: rows i0..i0 + 16, depths p0..p0 + 32: inside dst (asserted above).
                    transpose_block(&block, out.add(i0 * k_pad + p0), k_pad);
                    continue;
                }
                for ii in 0..rows {
                    // SAFETY: row i0 + ii < m, depths p0..p0 + depth ≤ k: inside dst (asserted above).
                    let row = std::slice::from_raw_parts_mut(out.add((i0 + ii) * k_pad + p0), depth);
                    for (d, v) in row.iter_mut().enumerate() {
                        *v = block[d][ii];
                    }
                }
            }
        }
        for row in dst[..m * k_pad].chunks_exact_mut(k_pad) {
            row[k..].fill(0);
        }
    }
    dst[m * k_pad..m_pad * k_pad].fill(0);
}

/// A block of 32 depths × 16 rows of bf16 (`block[d][ii]`) written as 16 rows of 32 depths, row
/// `ii` at `out + ii·ld` (a cache line each): each pair of depths interleaved into 16 u32 by one
/// permute, then those 16 × 16 u32 transposed in registers (the scalar loop it replaces was a
/// quarter of a multihop SFT step on AMX, where the products themselves are fast).
///
/// # Safety
/// The CPU has AVX-512F and BW; `out + ii·ld .. + 32` is writable for every `ii < 16`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn transpose_block(block: &[[u16; TILE_M]; TILE_K], out: *mut u16, ld: usize) {
    // Lane 2i takes value i of depth 2q, lane 2i + 1 value i of depth 2q + 1 (the 16 after it).
    const INTERLEAVE: [u16; 32] = {
        let mut idx = [0u16; 32];
        let mut l = 0;
        while l < 32 {
            idx[l] = ((l % 2) * 16 + l / 2) as u16;
            l += 1;
        }
        idx
    };
    let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr() as *const _);
    let mut r = [_mm512_setzero_si512(); 16];
    for (q, rq) in r.iter_mut().enumerate() {
        // Depths 2q and 2q + 1 are 32 consecutive u16 of the block.
        *rq = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(block[2 * q].as_ptr() as *const _));
    }
    transpose_16x16_u32(&mut r);
    for (ii, row) in r.iter().enumerate() {
        _mm512_storeu_si512(out.add(ii * ld) as *mut _, *row);
    }
}

/// `r[i]` lane `j` ↔ `r[j]` lane `i`, for 16 rows of 16 u32: pairs of rows interleaved by 32 and
/// by 64 bits, then 128-bit lanes exchanged twice.
///
/// # Safety
/// The CPU has AVX-512F (no memory is touched but `r`).
#[target_feature(enable = "avx512f")]
unsafe fn transpose_16x16_u32(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let b = 4 * i;
        r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    for i in 0..4 {
        t[i] = _mm512_shuffle_i32x4::<0x88>(r[i], r[i + 4]);
        t[i + 4] = _mm512_shuffle_i32x4::<0xdd>(r[i], r[i + 4]);
        t[i + 8] = _mm512_shuffle_i32x4::<0x88>(r[i + 8], r[i + 12]);
        t[i + 12] = _mm512_shuffle_i32x4::<0xdd>(r[i + 8], r[i + 12]);
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[i + 8]);
        r[i + 8] = _mm512_shuffle_i32x4::<0xdd>(t[i], t[i + 8]);
    }
}

/// B (element (p, j) at `b + p·rsb + j·csb`) as [`pack_b`]'s tile panels, zero-padded. A VNNI
/// pair (depths 2q and 2q + 1 of one column) is one u32: taken from two neighbours of a column
/// where columns are contiguous (`rsb == 1`), else from two rows, 16 columns at a time (one
/// tile row).
///
/// # Safety
/// The CPU has AVX-512F and BW; B's `k × n` addressed elements are readable; `dst` holds
/// `n_pad·k_pad` values and is 4-byte aligned (it is written as u32 pairs).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_panels(dst: &mut [u16], b: *const f32, k: usize, n: usize, rsb: usize, csb: usize, n_pad: usize, k_pad: usize) {
    dst[..n_pad * k_pad].fill(0);
    // The u32 at which pair q of column j lies.
    let at = |q: usize, j: usize| panel_index(2 * q, j, k_pad) / 2;
    let out = std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u32, n_pad * k_pad / 2);
    debug_assert!(dst.as_ptr().align_offset(4) == 0);
    if rsb == 1 {
        // A column's depths 32s..32s + 32 are one tile row per pair: converted together, then
        // written down the tile (pairs 16 u32 apart).
        let mut pairs = [0u32; TILE_M];
        for j in 0..n {
            let col = std::slice::from_raw_parts(b.add(j * csb), k);
            for (s, depths) in col.chunks(TILE_K).enumerate() {
                if depths.len() == TILE_K {
                    for (v, two) in pairs.iter_mut().zip(depths.chunks_exact(2)) {
                        *v = pair(two[0], two[1]);
                    }
                } else {
                    pairs.fill(0);
                    for (q, two) in depths.chunks(2).enumerate() {
                        pairs[q] = pair(two[0], two.get(1).copied().unwrap_or(0.0));
                    }
                }
                let first = at(s * TILE_M, j);
                for (r, &v) in pairs.iter().enumerate() {
                    out[first + r * TILE_M] = v;
                }
            }
        }
    } else {
        // A row's n values span (n - 1)·csb + 1 floats.
        let len = (n - 1) * csb + 1;
        let zeros = vec![0f32; len];
        for q in 0..k.div_ceil(2) {
            let lo = std::slice::from_raw_parts(b.add(2 * q * rsb), len);
            let hi = if 2 * q + 1 < k { std::slice::from_raw_parts(b.add((2 * q + 1) * rsb), len) } else { &zeros[..] };
            if csb == 1 {
                for j0 in (0..n).step_by(TILE_M) {
                    let w = TILE_M.min(n - j0);
                    let row = &mut out[at(q, j0)..][..w];
                    for ((v, &l), &h) in row.iter_mut().zip(&lo[j0..j0 + w]).zip(&hi[j0..j0 + w]) {
                        *v = pair(l, h);
                    }
                }
            } else {
                for j in 0..n {
                    out[at(q, j)] = pair(lo[j * csb], hi[j * csb]);
                }
            }
        }
    }
}

/// The loops over packed operands: C's columns `cols` (from a multiple of 32) and rows `0..m`,
/// summed over the depths `depth` (multiples of 32) of A's bf16 rows `a` (`lda` apart, padded
/// to 16; A's value at row i and depth p is `a + i·lda + p`) and B's panels `b` ([`pack_b`]'s
/// order, depth `ldb`), into C (C's column j at `c + j`, rows `ldc` apart), added to it when
/// `add`, on `engine`. `a` and `c` may point before their buffers (a product over a part of a
/// prepacked B, [`gemm_prepacked`]): only the addressed elements need be inside.
///
/// # Safety
/// The CPU has `engine`; the operands and C hold what is said above; no other thread accesses
/// the addressed part of C.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiles(engine: Engine, a: *const u16, lda: usize, m: usize, b: *const u16, ldb: usize, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, c: *mut f32, ldc: usize, add: bool) {
    match engine {
        Engine::Amx => {
            crate::amx::configure();
            amx_tiles(a, lda, m, b, ldb, depth, cols, c, ldc, add)
        }
        Engine::Dot => {
            // Depth blocks of KC_A: each row tile's A stays in L1 while it walks along the panels.
            for d0 in depth.clone().step_by(KC_A) {
                let d = d0..KC_A.min(depth.end - d0) + d0;
                dot::tiles(a, lda, m, b, ldb, d, cols.clone(), c, ldc, add || d0 > depth.start);
            }
        }
    }
}

/// [`tiles`] on AMX: rows in blocks of `MC_A` (their A stays in L2 while the panels go by),
/// 32×32 blocks of C; an edge of C goes through a whole block.
///
/// # Safety
/// [`crate::amx::configure`] ran on this thread; as [`tiles`].
#[allow(clippy::too_many_arguments)]
unsafe fn amx_tiles(a: *const u16, lda: usize, m: usize, b: *const u16, ldb: usize, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, c: *mut f32, ldc: usize, add: bool) {
    use crate::amx::{block, Block};
    let (w, steps) = (2 * TILE_M, depth.len() / TILE_K);
    let mut part = Block([0.0; 4 * TILE_M * TILE_M]);
    for ic in (0..m).step_by(MC_A) {
        let mc = MC_A.min(m - ic);
        for jr in cols.clone().step_by(w) {
            let nr = w.min(cols.end - jr);
            let bp = b.add(jr * ldb + depth.start * w);
            for ir in (ic..ic + mc).step_by(w) {
                let mr = w.min(ic + mc - ir);
                let (ap, two) = (a.wrapping_add(ir * lda + depth.start), mr > TILE_M);
                let cp = c.wrapping_add(ir * ldc + jr);
                if nr == w && (mr == TILE_M || mr == w) {
                    block(steps, ap, lda, two, bp, cp, ldc, add);
                    continue;
                }
                if add {
                    for i in 0..mr {
                        std::ptr::copy_nonoverlapping(cp.add(i * ldc), part.0.as_mut_ptr().add(i * w), nr);
                    }
                }
                block(steps, ap, lda, two, bp, part.0.as_mut_ptr(), w, add);
                for i in 0..mr {
                    std::ptr::copy_nonoverlapping(part.0.as_ptr().add(i * w), cp.add(i * ldc), nr);
                }
            }
        }
    }
}

/// The `vdpbf16ps` register kernel and its loops.
mod dot {
    use super::*;

    /// Rows of C per register tile: 12 rows × 2 zmm = 24 accumulators, 2 for B, the rest for
    /// broadcasts (as the f32 AVX-512 kernel's 12×32).
    pub(super) const MR: usize = 12;

    /// [`super::tiles`] on the dot engine for one depth block (at most `KC_A` deep): for each
    /// block of `MC_A` rows, each row tile (its A in L1) walks along every 32-column panel of B
    /// (in L2), the order the f32 kernel found fastest.
    ///
    /// # Safety
    /// As [`super::tiles`], with the dot engine.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tiles(a: *const u16, lda: usize, m: usize, b: *const u16, ldb: usize, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, c: *mut f32, ldc: usize, add: bool) {
        let (w, steps) = (2 * TILE_M, depth.len() / TILE_K);
        for ir in (0..m).step_by(MR) {
            let mr = MR.min(m - ir);
            let ap = a.wrapping_add(ir * lda + depth.start);
            for jr in cols.clone().step_by(w) {
                let nr = w.min(cols.end - jr);
                let bp = b.add(jr * ldb + depth.start * w);
                let cp = c.wrapping_add(ir * ldc + jr);
                match mr {
                    12 => rows::<12>(steps, ap, lda, bp, cp, ldc, add, nr),
                    11 => rows::<11>(steps, ap, lda, bp, cp, ldc, add, nr),
                    10 => rows::<10>(steps, ap, lda, bp, cp, ldc, add, nr),
                    9 => rows::<9>(steps, ap, lda, bp, cp, ldc, add, nr),
                    8 => rows::<8>(steps, ap, lda, bp, cp, ldc, add, nr),
                    7 => rows::<7>(steps, ap, lda, bp, cp, ldc, add, nr),
                    6 => rows::<6>(steps, ap, lda, bp, cp, ldc, add, nr),
                    5 => rows::<5>(steps, ap, lda, bp, cp, ldc, add, nr),
                    4 => rows::<4>(steps, ap, lda, bp, cp, ldc, add, nr),
                    3 => rows::<3>(steps, ap, lda, bp, cp, ldc, add, nr),
                    2 => rows::<2>(steps, ap, lda, bp, cp, ldc, add, nr),
                    _ => rows::<1>(steps, ap, lda, bp, cp, ldc, add, nr),
                }
            }
        }
    }

    /// R rows × 32 columns of C (the first `nr` written) = (C when `add`) + Σ over `steps`
    /// depths of 32 of A's rows at `a` (`lda` apart) times the panel `b`. Per depth pair: the
    /// panel's two tile rows (16 column pairs each) and each row's pair broadcast, 2R dot steps.
    ///
    /// # Safety
    /// The CPU has AVX-512F and BF16; A's R rows hold `32·steps` values from `a`, the panel
    /// `2·TILE_B·steps`, C R rows of `nr` from `c`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn rows<const R: usize>(steps: usize, a: *const u16, lda: usize, b: *const u16, c: *mut f32, ldc: usize, add: bool, nr: usize) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for s in 0..steps {
            let (bs, as_) = (b.add(2 * TILE_B * s), a.add(TILE_K * s));
            for r in 0..TILE_K / 2 {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bs.add(r * TILE_K) as *const __m512i));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bs.add(TILE_B + r * TILE_K) as *const __m512i));
                for (i, row) in acc.iter_mut().enumerate() {
                    let pair = (as_.add(i * lda + 2 * r) as *const i32).read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    row[0] = _mm512_dpbf16_ps(row[0], av, b0);
                    row[1] = _mm512_dpbf16_ps(row[1], av, b1);
                }
            }
        }
        let mask = |h: usize| -> __mmask16 {
            let cols = nr.saturating_sub(16 * h).min(16);
            ((1u32 << cols) - 1) as __mmask16
        };
        let (m0, m1) = (mask(0), mask(1));
        for (i, row) in acc.iter().enumerate() {
            let cr = c.add(i * ldc);
            for (h, m) in [(0, m0), (1, m1)] {
                if m == 0 {
                    continue;
                }
                let mut v = row[h];
                if add {
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr.add(16 * h)), v);
                }
                _mm512_mask_storeu_ps(cr.add(16 * h), m, v);
            }
        }
    }
}

/// `C = bf16(alpha·A)·bf16(B) + beta·C` with f32 sums on `engine`, strides as `sgemm`
/// takes them (A (i,p) at `a + i·rsa + p·csa`, B (p,j) at `b + p·rsb + j·csb`, C (i,j) at
/// `c + i·ldc + j`); alpha scales A before it is rounded (exact for a power of two, as the
/// attention's 1/√64). Both operands are packed once (A as bf16 rows, B as tile panels); the
/// loops then go over blocks of `NC_A` columns and `KC_A` of depth, C carrying the sum from one
/// depth block to the next.
///
/// # Safety
/// The CPU has `engine`; every addressed element lies inside its allocation, and no other
/// thread accesses the addressed part of C.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(engine: Engine, m: usize, n: usize, k: usize, alpha: f32, a: *const f32, rsa: usize, csa: usize, b: *const f32, rsb: usize, csb: usize, beta: f32, c: *mut f32, ldc: usize) {
    if m == 0 || n == 0 {
        return;
    }
    // C = beta·C first where beta is neither 0 (C not read) nor 1 (the tiles add to C).
    if beta != 0.0 && beta != 1.0 {
        for i in 0..m {
            std::slice::from_raw_parts_mut(c.add(i * ldc), n).iter_mut().for_each(|x| *x *= beta);
        }
    }
    if k == 0 {
        if beta == 0.0 {
            (0..m).for_each(|i| std::slice::from_raw_parts_mut(c.add(i * ldc), n).fill(0.0));
        }
        return;
    }
    let (m_pad, n_pad, k_pad) = (m.next_multiple_of(TILE_M), n.next_multiple_of(2 * TILE_M), k.next_multiple_of(TILE_K));
    PACKED.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let (pa, pb) = &mut *bufs;
        if pa.len() < m_pad * k_pad + 32 {
            pa.resize(m_pad * k_pad + 32, 0);
        }
        if pb.len() < n_pad * k_pad + 32 {
            pb.resize(n_pad * k_pad + 32, 0);
        }
        let (off_a, off_b) = (pa.as_ptr().align_offset(64), pb.as_ptr().align_offset(64));
        let (pa, pb) = (&mut pa[off_a..], &mut pb[off_b..]);
        pack_rows(pa, a, m, k, rsa, csa, m_pad, k_pad, alpha);
        pack_panels(pb, b, k, n, rsb, csb, n_pad, k_pad);
        for jc in (0..n).step_by(NC_A) {
            let nc = NC_A.min(n - jc);
            for pc in (0..k_pad).step_by(KC_A) {
                // The first depth block sets C (or adds to beta·C), the later ones add to it.
                let add = pc > 0 || beta != 0.0;
                tiles(engine, pa.as_ptr(), k_pad, m, pb.as_ptr(), k_pad, pc..KC_A.min(k_pad - pc) + pc, jc..jc + nc, c, ldc, add);
            }
        }
    });
}

/// A B operand packed once in [`pack_b`]'s panel order, for many products over parts of it: the
/// attention's keys, values, queries and output gradients, one head each, packed once per layer
/// rather than once per (head, query block) product. The buffer is kept and reused by
/// [`Panels::pack`].
#[derive(Default)]
pub(crate) struct Panels {
    data: Vec<u16>,
    /// Where the 64-byte aligned panels start in `data`.
    off: usize,
    /// The depth, padded to 32: a panel's stride factor (`ldb` of [`tiles`]).
    k_pad: usize,
    /// Columns, padded to 32.
    n_pad: usize,
}

impl Panels {
    /// Packs B (element (p, j) at `b + p·rsb + j·csb`, `k × n`) into this buffer.
    ///
    /// # Safety
    /// The CPU has a bf16 engine; every addressed element of B is readable.
    pub(crate) unsafe fn pack(&mut self, b: *const f32, k: usize, n: usize, rsb: usize, csb: usize) {
        let (n_pad, k_pad) = (n.next_multiple_of(2 * TILE_M), k.next_multiple_of(TILE_K));
        if self.data.len() < n_pad * k_pad + 32 {
            self.data.resize(n_pad * k_pad + 32, 0);
        }
        self.off = self.data.as_ptr().align_offset(64);
        (self.k_pad, self.n_pad) = (k_pad, n_pad);
        if n > 0 && k > 0 {
            pack_panels(&mut self.data[self.off..], b, k, n, rsb, csb, n_pad, k_pad);
        }
    }
}

/// `C[m, cols] = bf16(alpha·A) · B[depth, cols]`, added to C when `add`, for a B packed once
/// ([`Panels`]): A is `m × depth.len()` (f32, or bf16 bits with alpha 1: [`AElem`]; element (i, p) at `a + i·rsa + p·csa`, its column p
/// B's depth `depth.start + p`), C's column 0 is B's column `cols.start` (rows `ldc` apart).
/// `depth.start` and `cols.start` are multiples of 32 (the panels' grain); B's depths past
/// `depth.end` within the padding meet A's zero padding.
///
/// # Safety
/// The CPU has `engine`; A's addressed elements are readable; C holds `m` rows of
/// `cols.len()`, which no other thread accesses.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_prepacked<T: AElem>(engine: Engine, m: usize, alpha: f32, a: *const T, rsa: usize, csa: usize, b: &Panels, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, add: bool, c: *mut f32, ldc: usize) {
    assert!(depth.start % TILE_K == 0 && cols.start % (2 * TILE_M) == 0, "gemm_prepacked: depth and columns start on the panels' grain");
    assert!(depth.end <= b.k_pad && cols.end <= b.n_pad, "gemm_prepacked: outside the packed operand");
    if m == 0 || cols.is_empty() {
        return;
    }
    let k = depth.len();
    if k == 0 {
        if !add {
            (0..m).for_each(|i| std::slice::from_raw_parts_mut(c.add(i * ldc), cols.len()).fill(0.0));
        }
        return;
    }
    let (m_pad, k_pad) = (m.next_multiple_of(TILE_M), k.next_multiple_of(TILE_K));
    PACKED.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let pa = &mut bufs.0;
        if pa.len() < m_pad * k_pad + 32 {
            pa.resize(m_pad * k_pad + 32, 0);
        }
        let off = pa.as_ptr().align_offset(64);
        let pa = &mut pa[off..];
        pack_rows(pa, a, m, k, rsa, csa, m_pad, k_pad, alpha);
        // A's column p is B's depth depth.start + p; C's column j is B's column cols.start + j.
        let (a0, c0) = (pa.as_ptr().wrapping_sub(depth.start), c.wrapping_sub(cols.start));
        let bp = b.data.as_ptr().add(b.off);
        // The padded depth stays inside the panels: depth.start + k_pad ≤ ceil32(depth.end).
        let depths = depth.start..depth.start + k_pad;
        for jc in cols.clone().step_by(NC_A) {
            let jn = NC_A.min(cols.end - jc) + jc;
            for pc in depths.clone().step_by(KC_A) {
                tiles(engine, a0, k_pad, m, bp, b.k_pad, pc..KC_A.min(depths.end - pc) + pc, jc..jn, c0, ldc, add || pc > depths.start);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed packing (A read along its columns) in whole 16 × 32 blocks and at the
    /// edges gives what the rows-contiguous packing of the transposed copy gives, bit for bit,
    /// from f32 and from bf16 bits rounded beforehand.
    #[test]
    fn transposed_rows_pack_as_the_contiguous_rows() {
        if !dot_available() && !crate::amx::available() {
            eprintln!("transposed_rows_pack_as_the_contiguous_rows: skipped, this CPU has no bf16 engine");
            return;
        }
        let mut rng = crate::rng::SplitMix64::new(11);
        for (m, k) in [(16usize, 32usize), (48, 96), (37, 70), (5, 3), (130, 33)] {
            let (m_pad, k_pad) = (m.next_multiple_of(16), k.next_multiple_of(TILE_K));
            // A [m, k] stored column by column (element (i, p) at p·m + i), and its row-major copy.
            let cols: Vec<f32> = (0..m * k).map(|_| (rng.unit_nonzero() * 4.0 - 2.0) as f32).collect();
            let rows: Vec<f32> = (0..m * k).map(|x| cols[(x % k) * m + x / k]).collect();
            let (mut from_cols, mut from_rows) = (vec![7u16; m_pad * k_pad], vec![9u16; m_pad * k_pad]);
            // SAFETY: both read A [m, k] inside its buffer; the CPU has AVX-512F and BW.
            unsafe {
                pack_rows(&mut from_cols, cols.as_ptr(), m, k, 1, m, m_pad, k_pad, 0.5);
                pack_rows(&mut from_rows, rows.as_ptr(), m, k, k, 1, m_pad, k_pad, 0.5);
            }
            assert_eq!(from_cols, from_rows, "m {m}, k {k}");
            // The same A rounded beforehand (bf16 bits, the scale applied first) packs alike.
            let mut rounded = vec![0u16; m * k];
            to_bf16(&mut rounded, &cols, 0.5);
            let mut from_bits = vec![5u16; m_pad * k_pad];
            // SAFETY: as above.
            unsafe { pack_rows(&mut from_bits, rounded.as_ptr(), m, k, 1, m, m_pad, k_pad, 1.0) };
            assert_eq!(from_bits, from_rows, "m {m}, k {k}, from bf16 bits");
        }
    }

    /// The dot kernel alone, its operands in L1 (one 12×32 tile, a depth block of 512, called
    /// again and again adding to C): every element must hold the exact running sum, and the run
    /// reports the kernel's ceiling (`cargo test --release -p coa-model --lib dot_kernel_in_l1 --
    /// --nocapture`; on a 2-core AMD EPYC Zen 4, where `vdpbf16ps` peaks at 235 GFLOP/s a core).
    #[test]
    fn dot_kernel_in_l1() {
        if !dot_available() {
            eprintln!("dot_kernel_in_l1: skipped, this CPU has no AVX-512 BF16");
            return;
        }
        let (k, w) = (KC_A, 2 * TILE_M);
        // bf16 0.5 and 0.25 (0x3f00, 0x3e80): every product 1/8, sums of powers of two, exact.
        let a = vec![0x3f00u16; dot::MR * k];
        let b = vec![0x3e80u16; w * k];
        let mut c = vec![0f32; dot::MR * w];
        let reps = 4000;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            // SAFETY: a holds 12 rows of k, b one 32-column panel of depth k, c 12×32; the CPU has the engine.
            unsafe { dot::tiles(a.as_ptr(), k, dot::MR, b.as_ptr(), k, 0..k, 0..w, c.as_mut_ptr(), w, true) };
        }
        let flop = 2.0 * (dot::MR * w * k) as f64 * reps as f64;
        eprintln!("vdpbf16ps tile, operands in L1: {:.1} GFLOP/s", flop / t.elapsed().as_secs_f64() / 1e9);
        let want = (k as f32 * 0.125) * reps as f32;
        assert!(c.iter().all(|&x| x == want), "the tile's running sums differ from {want}");
    }
}
