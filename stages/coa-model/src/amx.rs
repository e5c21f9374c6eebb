//! Intel AMX tiles (Xeon since Sapphire Rapids): one of the two engines of `bf16mm`
//! (the products whose two inputs are bf16), over its packed operands.
//!
//! One `tdpbf16ps` multiplies a 16×32 bf16 tile of A by a 32×16 tile of B into a 16×16 f32 tile:
//! 16,384 FLOPs. In a loop over tiles in L1 one core of this repo's Xeon runs 2.8 TFLOP/s, against
//! ~190 GFLOP/s for the f32 AVX-512 kernel.
//!
//! Both operands are bf16 (the left one rounded as it is packed) and each product is summed in
//! f32: within f32 summation error of the exact product of the rounded operands, but not the bits
//! of `sgemm` on them. The tile instruction rounds its sums in its own way: on 51,200
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

/// Values of a tile row: 64 bytes of bf16 (in B's panels, one depth pair of 16 columns).
pub(crate) const TILE_K: usize = 32;
/// Rows of a tile, and columns of B (and C) per tile.
pub(crate) const TILE_M: usize = 16;
/// bf16 values in one tile of B (16 rows of k pairs × 16 columns × 2).
pub(crate) const TILE_B: usize = TILE_K * TILE_M;

/// Whether this process multiplies on AMX: CPUID reports AMX-TILE and AMX-BF16, the CPU has
/// AVX-512F and BW (the rest of the packed path, and the packing), and Linux granted the tile
/// data. Asked once (whatever `COA_CPU_KERNEL` says: `bf16mm::engine` reads that).
pub(crate) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
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
