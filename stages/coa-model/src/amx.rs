//! Intel AMX tiles (Xeon since Sapphire Rapids) for the products of
//! [`crate::DecodeDtype::Bf16Matmul`], whose two inputs are bf16.
//!
//! One `tdpbf16ps` multiplies a 16×32 bf16 tile of A by a 32×16 tile of B into a 16×16 f32 tile:
//! 16,384 FLOPs. In a loop over tiles in L1 one core of this repo's Xeon runs 2.8 TFLOP/s, against
//! ~190 GFLOP/s for the f32 AVX-512 kernel.
//!
//! Both operands are bf16 (the left one rounded as it is packed) and each product is summed in
//! f32: within f32 summation error of the exact product of the rounded operands, but not the bits
//! of [`super::sgemm`] on them. The tile instruction rounds its sums in its own way: on 51,200
//! random elements of this repo's Xeon, no order of f32 FMAs (k ascending or pairs swapped), no
//! pairwise sum and no single rounding of the exact sum (in any rounding mode) matched more
//! than 90% of them (the rest differ in the last bits). Each output still depends only on its row
//! and column, so results do not change with the batch or the threads. AMX reads subnormal
//! inputs and writes subnormal results as zero.
//!
//! Linux hands the tile registers' state (8 KB) to a process only when it asks
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); [`available`] asks once. Each thread loads the tile
//! configuration before its products ([`configure`]).

use std::arch::asm;

/// Values of a tile row: 64 bytes of bf16.
pub(crate) const TILE_K: usize = 32;
/// Rows of a tile, and columns of B (and C) per tile.
pub(crate) const TILE_M: usize = 16;
/// bf16 values in one tile of B (16 rows of k pairs × 16 columns × 2).
pub(crate) const TILE_B: usize = TILE_K * TILE_M;

/// Whether this process multiplies on AMX: CPUID reports AMX-TILE and AMX-BF16, the CPU has
/// AVX-512F and BW (the rest of the packed path, and the packing), and Linux granted the tile
/// data. Asked once;
/// `COA_CPU_KERNEL=avx512` (or `avx2`) turns it off, to compare the engines on one machine.
pub(crate) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if std::env::var("COA_CPU_KERNEL").is_ok_and(|v| v == "avx512" || v == "avx2") {
            return false;
        }
        let (max_leaf, leaf7) = (std::arch::x86_64::__cpuid(0).eax, std::arch::x86_64::__cpuid_count(7, 0));
        let (tile, bf16) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 22 & 1 == 1);
        max_leaf >= 7 && tile && bf16 && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && request_tile_data()
    })
}

/// Asks Linux for the AMX tile data state; true if granted.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: isize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: arch_prctl takes two integers and changes no memory; `syscall` clobbers rcx and r11.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// Palette 1 with all eight tiles 16 rows × 64 bytes: tmm0-3 accumulate C, tmm4-5 hold A, tmm6-7 B.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = (TILE_K * 2) as u8;
        c[48 + t] = TILE_M as u8;
        t += 1;
    }
    TileConfig(c)
};

/// Loads the tile configuration on this thread (a thread's own state; cheap to repeat).
///
/// # Safety
/// [`available`] must have returned true.
pub(crate) unsafe fn configure() {
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
}

/// A 32×32 f32 block of C, rows 32 floats apart (where a block of C is not whole).
#[repr(C, align(64))]
pub(crate) struct Block(pub [f32; 4 * TILE_M * TILE_M]);

/// C rows at `c` (`ldc` values apart), 32 columns = (C when `add`, else 0) + Σ over `steps` depths of 32: the A rows at
/// `a` (bf16, `lda` values apart; 16 rows, and 16 more from `a + 16·lda` when `two`) times one
/// 32-column panel `b` (per depth, its two 16-column tiles in VNNI order, [`TILE_B`] values
/// each). C's rows 16-31 are written only when `two`.
///
/// # Safety
/// [`configure`] ran on this thread; `a`, `b` and `c` address what is said above.
pub(crate) unsafe fn block(steps: usize, a: *const u16, lda: usize, two: bool, b: *const u16, c: *mut f32, ldc: usize, add: bool) {
    let sa = 2 * lda;
    let sb = 2 * TILE_K;
    let sc = 4 * ldc;
    if add {
        asm!(
            "tileloadd tmm0, [{c0} + {sc}*1]",
            "tileloadd tmm1, [{c1} + {sc}*1]",
            c0 = in(reg) c, c1 = in(reg) c.add(TILE_M), sc = in(reg) sc,
            options(nostack, readonly),
        );
        if two {
            let c = c.add(TILE_M * ldc);
            asm!(
                "tileloadd tmm2, [{c0} + {sc}*1]",
                "tileloadd tmm3, [{c1} + {sc}*1]",
                c0 = in(reg) c, c1 = in(reg) c.add(TILE_M), sc = in(reg) sc,
                options(nostack, readonly),
            );
        }
    } else {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
    }
    for s in 0..steps {
        let (a0, b0) = (a.add(TILE_K * s), b.add(2 * TILE_B * s));
        let b1 = b0.add(TILE_B);
        if two {
            let a1 = a0.add(TILE_M * lda);
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1, sa = in(reg) sa, sb = in(reg) sb,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                a0 = in(reg) a0, b0 = in(reg) b0, b1 = in(reg) b1, sa = in(reg) sa, sb = in(reg) sb,
                options(nostack, readonly),
            );
        }
    }
    asm!(
        "tilestored [{c0} + {sc}*1], tmm0",
        "tilestored [{c1} + {sc}*1], tmm1",
        c0 = in(reg) c, c1 = in(reg) c.add(TILE_M), sc = in(reg) sc,
        options(nostack),
    );
    if two {
        let c = c.add(TILE_M * ldc);
        asm!(
            "tilestored [{c0} + {sc}*1], tmm2",
            "tilestored [{c1} + {sc}*1], tmm3",
            c0 = in(reg) c, c1 = in(reg) c.add(TILE_M), sc = in(reg) sc,
            options(nostack),
        );
    }
}

/// Packs `w[n, k]` (row-major, the B operand of `x · wᵀ`) as bf16 tiles: per 32-column panel
/// (at `jr · k_pad`, the depth padded to 32), per depth of 32, two tiles of 16 columns, each 16
/// rows of k pairs: value `r·32 + 2j + e` of a tile is column j's weight at depth `2r + e`.
/// Padding is zero.
pub(crate) fn pack_b(w: &[f32], n: usize, k: usize, dst: &mut [u16]) {
    let (n_pad, k_pad) = (n.next_multiple_of(2 * TILE_M), k.next_multiple_of(TILE_K));
    assert!(w.len() == n * k && dst.len() >= n_pad * k_pad);
    // SAFETY: B(p, j) = w[j·k + p] addresses w [n, k] for p < k, j < n; only CPUs with AMX (and
    // so AVX-512BW, `available`) pack tiles.
    unsafe { pack_panels(dst, w.as_ptr(), k, n, 1, k, n_pad, k_pad) }
}

/// Rows of A per block of [`tiles`]' loops (`MC_A × KC_A` bf16, 128 KB, in L2).
const MC_A: usize = 128;
/// Depth per block (a multiple of 32): a 32-column panel's part is `KC_A × 32` bf16 (32 KB).
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

/// `dst[i] = bf16(src[i])`, rounded to nearest even ([`crate::quant::bf16_bits`]), in a loop the
/// compiler turns into AVX-512 vectors.
#[inline(always)]
fn to_bf16(dst: &mut [u16], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(v, &x)| *v = crate::quant::bf16_bits(x));
}

/// Two bf16 values in one u32: `lo` in the low half (the even depth of a VNNI pair).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    crate::quant::bf16_bits(lo) as u32 | (crate::quant::bf16_bits(hi) as u32) << 16
}

/// A (element (i, p) at `a + i·rsa + p·csa`) as bf16 rows `[m_pad, k_pad]`, zero-padded; read
/// along whichever of its dimensions is contiguous.
///
/// # Safety
/// The CPU has AVX-512F and BW; A's addressed elements are readable; `dst` holds `m_pad·k_pad`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_rows(dst: &mut [u16], a: *const f32, m: usize, k: usize, rsa: usize, csa: usize, m_pad: usize, k_pad: usize) {
    if csa == 1 {
        for (i, row) in dst[..m * k_pad].chunks_exact_mut(k_pad).enumerate() {
            to_bf16(&mut row[..k], std::slice::from_raw_parts(a.add(i * rsa), k));
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
                    to_bf16(&mut run[..rows], std::slice::from_raw_parts(a.add(i0 + (p0 + d) * csa), rows));
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

/// B (element (p, j) at `b + p·rsb + j·csb`) as [`pack_b`]'s tile panels, zero-padded. A VNNI
/// pair (depths 2q and 2q + 1 of one column) is one u32: taken from two neighbours of a column
/// where columns are contiguous (`rsb == 1`), else from two rows, 16 columns at a time (one
/// tile row).
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

/// The tile loops over packed operands: C's columns `cols` (from a multiple of 32) and rows
/// `0..m`, summed over the depths `depth` (multiples of 32) of A's bf16 rows `a` (`k_pad` apart,
/// padded to 16) and B's panels `b` ([`pack_b`]'s order, depth `k_pad`), into C (`ldc` apart),
/// added to it when `add`. Rows in blocks of `MC_A` (their A stays in L2 while the panels go by),
/// 32×32 blocks of C; an edge of C goes through a whole block.
///
/// # Safety
/// [`configure`] ran on this thread; the operands and C hold what is said above.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiles(a: *const u16, m: usize, k_pad: usize, b: *const u16, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, c: *mut f32, ldc: usize, add: bool) {
    let (w, steps) = (2 * TILE_M, depth.len() / TILE_K);
    let mut part = Block([0.0; 4 * TILE_M * TILE_M]);
    for ic in (0..m).step_by(MC_A) {
        let mc = MC_A.min(m - ic);
        for jr in cols.clone().step_by(w) {
            let nr = w.min(cols.end - jr);
            let bp = b.add(jr * k_pad + depth.start * w);
            for ir in (ic..ic + mc).step_by(w) {
                let mr = w.min(ic + mc - ir);
                let (ap, two) = (a.add(ir * k_pad + depth.start), mr > TILE_M);
                let cp = c.add(ir * ldc + jr);
                if nr == w && (mr == TILE_M || mr == w) {
                    block(steps, ap, k_pad, two, bp, cp, ldc, add);
                    continue;
                }
                if add {
                    for i in 0..mr {
                        std::ptr::copy_nonoverlapping(cp.add(i * ldc), part.0.as_mut_ptr().add(i * w), nr);
                    }
                }
                block(steps, ap, k_pad, two, bp, part.0.as_mut_ptr(), w, add);
                for i in 0..mr {
                    std::ptr::copy_nonoverlapping(part.0.as_ptr().add(i * w), cp.add(i * ldc), nr);
                }
            }
        }
    }
}

/// `C = A·B + beta·C` with both operands rounded to bf16 and f32 sums on the tiles, strides as
/// [`super::sgemm::sgemm`] takes them (A (i,p) at `a + i·rsa + p·csa`, B (p,j) at
/// `b + p·rsb + j·csb`, C (i,j) at `c + i·ldc + j`). Both operands are packed once (A as bf16
/// rows, B as tile panels); the loops then go over blocks of `NC_A` columns, `KC_A` of depth
/// and `MC_A` rows (BLIS's order), C carrying the sum from one depth block to the next (the
/// tiles load it back).
///
/// # Safety
/// [`available`] returned true; every addressed element lies inside its allocation, and no other
/// thread accesses the addressed part of C.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(m: usize, n: usize, k: usize, a: *const f32, rsa: usize, csa: usize, b: *const f32, rsb: usize, csb: usize, beta: f32, c: *mut f32, ldc: usize) {
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
    configure();
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
        pack_rows(pa, a, m, k, rsa, csa, m_pad, k_pad);
        pack_panels(pb, b, k, n, rsb, csb, n_pad, k_pad);
        for jc in (0..n).step_by(NC_A) {
            let nc = NC_A.min(n - jc);
            for pc in (0..k_pad).step_by(KC_A) {
                // The first depth block sets C (or adds to beta·C), the later ones add to it.
                let add = pc > 0 || beta != 0.0;
                tiles(pa.as_ptr(), m, k_pad, pb.as_ptr(), pc..KC_A.min(k_pad - pc) + pc, jc..jc + nc, c, ldc, add);
            }
        }
    });
}
