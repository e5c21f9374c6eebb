//! Single-threaded f32 matrix multiply with arbitrary strides, the inner engine of
//! `ops::gemm` and of the attention's block products.
//!
//! On x86-64 it is a packed, cache-blocked GEMM (BLIS structure): B is packed into column panels
//! of NR and A into row panels of MR (blocks of KC along k, MC rows, NC columns), and an MR×NR
//! register-blocked kernel computes each C tile. The kernel broadcasts A's values and loads B's
//! as vectors, so, as BLIS does for its broadcast operand, one A micro-panel stays in L1 while the
//! kernel walks along the packed B block in L2 (A's panel outer, B's inner: on 2048x1536x576
//! single-threaded ~165 GFLOP/s against ~143 the other way round, where a 32 KB B micro-panel
//! had to survive a 12 KB A panel's stream in a 48 KB L1). Two kernels, chosen once per process
//! by the CPU: AVX-512 (12×32: 24 zmm accumulators, Intel since Skylake-SP, AMD since Zen 4)
//! and AVX2 + FMA (6×16: 12 ymm accumulators, the Haswell / Zen shape). Elsewhere it calls
//! `matrixmultiply`.
//! `COA_CPU_KERNEL=avx2` forces the AVX2 kernel (to compare the two on one machine);
//! `COA_CPU_KERNEL=avx512` keeps the bf16 products off the bf16 engines ([`crate::bf16mm`]: AMX
//! tiles, AVX-512 BF16 dot products), `COA_CPU_KERNEL=avx512bf16` off AMX.
//!
//! Every C element is `Σ_k a·b` accumulated by FMA in k order within each KC block, blocks added
//! to C in k order, then scaled by alpha and added to beta·C, whatever the kernel, the position of
//! the element in its tile or the tiling of C by the caller: so the two kernels give the same bits,
//! and splitting C across threads does not change any result bit.

/// Depth of a packed block: a 12×KC micro-panel of A (12 KB) stays in L1.
/// Part of the arithmetic (each block is summed apart, then added to C), so the same for every
/// kernel.
const KC: usize = 256;
const _: () = assert!(KC.is_multiple_of(crate::quant::INT8_GROUP), "an int8 group never straddles two KC blocks");
/// Rows of A packed at once (MC×KC floats, 144 KB). A multiple of every kernel's MR.
const MC: usize = 144;
/// Columns of B packed at once: KC×NC floats (1 MB) stay in L2 while every A micro-panel of the
/// block walks along them (512 and 1536 were slower). A multiple of every kernel's NR.
const NC: usize = 1024;

use crate::quant::{self, DecodeDtype};
use rayon::prelude::*;

/// The packed kernel this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// 12×32 tiles, AVX-512F.
    Avx512,
    /// 6×16 tiles, AVX2 + FMA.
    Avx2,
    /// No packed kernel: the `matrixmultiply` crate.
    Portable,
}

impl Kernel {
    /// `"avx512"`, `"avx2"` or `"portable"` (what benchmarks report, and what `COA_CPU_KERNEL` caps).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }
}

/// The best kernel this CPU has (`COA_CPU_KERNEL=avx2` caps it at AVX2), detected once.
pub(crate) fn kernel() -> Kernel {
    static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            let capped = std::env::var("COA_CPU_KERNEL").is_ok_and(|v| v == "avx2");
            if avx2 && !capped && std::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if avx2 {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    })
}

/// `C = alpha · A·B + beta · C` with A element (i,p) at `a + i·rsa + p·csa`, B (p,j) at
/// `b + p·rsb + j·csb`, C (i,j) at `c + i·ldc + j`. With `beta == 0` C is not read (it may hold
/// anything, even NaN).
///
/// # Safety
/// Every addressed element must lie inside the allocations, and no other thread may access the
/// addressed part of C concurrently.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    rsb: usize,
    csb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    sgemm_with(kernel(), m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc)
}

/// [`sgemm`] with both operands rounded to bf16 ([`crate::MatmulDtype::Bf16`]), `alpha · A`
/// rounded: on the CPU's bf16 engine where it has one ([`crate::bf16mm`]: AMX tiles or AVX-512
/// BF16 dot products; within f32 summation error of the exact product of the rounded operands),
/// elsewhere [`sgemm`] on rounded copies (its bits). Same arguments and safety as [`sgemm`].
///
/// # Safety
/// As [`sgemm`]: every addressed element lies inside its allocation, and no other thread
/// accesses the addressed part of C concurrently.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_bf16(m: usize, n: usize, k: usize, alpha: f32, a: *const f32, rsa: usize, csa: usize, b: *const f32, rsb: usize, csb: usize, beta: f32, c: *mut f32, ldc: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(engine) = crate::bf16mm::engine() {
        return crate::bf16mm::gemm(engine, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc);
    }
    let a_r: Vec<f32> = (0..m * k).map(|x| quant::bf16_value(alpha * *a.add(x / k * rsa + x % k * csa))).collect();
    let b_r: Vec<f32> = (0..k * n).map(|x| quant::bf16_value(*b.add(x / n * rsb + x % n * csb))).collect();
    sgemm(m, n, k, 1.0, a_r.as_ptr(), k, 1, b_r.as_ptr(), n, 1, beta, c, ldc)
}

/// [`sgemm`] (f32) or [`sgemm_bf16`] as `dtype` says. Same arguments and safety as [`sgemm`].
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_as(dtype: crate::MatmulDtype, m: usize, n: usize, k: usize, alpha: f32, a: *const f32, rsa: usize, csa: usize, b: *const f32, rsb: usize, csb: usize, beta: f32, c: *mut f32, ldc: usize) {
    match dtype {
        crate::MatmulDtype::F32 => sgemm(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc),
        crate::MatmulDtype::Bf16 => sgemm_bf16(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc),
    }
}

/// [`sgemm`] on a given kernel, which the CPU must have.
///
/// # Safety
/// As [`sgemm`], and the CPU has `kernel` (what [`kernel`] returned, or a lesser one).
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_with(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    rsb: usize,
    csb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if k > 0 {
        let g = packed::Gemm { m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc };
        match kernel {
            Kernel::Avx512 => return packed::run::<{ packed::avx512::MR }, { packed::avx512::NR }>(&g, packed::avx512::tile),
            Kernel::Avx2 => return packed::run::<{ packed::avx2::MR }, { packed::avx2::NR }>(&g, packed::avx2::tile),
            Kernel::Portable => {}
        }
    }
    let _ = kernel;
    matrixmultiply::sgemm(
        m, k, n, alpha, a, rsa as isize, csa as isize, b, rsb as isize, csb as isize, beta, c, ldc as isize, 1,
    );
}

/// A weight `w[n, k]` (a linear layer's `[out, in]`) packed once, as the B operand of `x · wᵀ`,
/// into the panels the register kernel reads: for a model whose weights do not change
/// (decoding), each product then streams the weight once, with no packing per call. Products
/// through it give the same bits as [`sgemm`] on the unpacked weight (same KC blocks, same
/// kernel), so a row's result does not depend on the path or on the other rows.
///
/// In a narrower format ([`DecodeDtype`]) the AVX-512 kernel streams bf16 or int8 panels and
/// widens each value to the f32 that [`DecodeDtype::round_weight`] gives (then the same FMAs), so
/// a product equals [`sgemm`] on the rounded weight, bit for bit; the AVX2 kernel holds those
/// rounded values as f32 (the same bits, none of the bytes saved).
///
/// In [`DecodeDtype::Bf16Matmul`] the left operand is rounded to bf16 as it is packed too; on
/// CPUs with a bf16 engine (AMX tiles or AVX-512 BF16, [`crate::bf16mm`]) the weight is packed in
/// its VNNI order and the product runs on it (within f32 summation error of [`sgemm`] on the two
/// rounded operands), elsewhere on the bf16 panels above (its bits).
pub(crate) struct PackedB {
    n: usize,
    k: usize,
    kernel: Kernel,
    dtype: DecodeDtype,
    /// The kernel's tile: rows of A, columns of B (a panel).
    mr: usize,
    nr: usize,
    /// KC blocks in k order; block `pc` (at `pc · n_pad` values) holds the panels of NR
    /// columns, each `kc` deep, from `off` (in values of the panels' type; 64-byte aligned).
    panels: Panels,
    off: usize,
}

/// The values of a [`PackedB`], in the panel order above.
enum Panels {
    F32(Vec<f32>),
    /// Per depth p of a 32-column panel, 32 values as 16 u32 lanes: lane t holds column t in its
    /// low half and column 16 + t in its high half (one shift and one mask widen them).
    Bf16(Vec<u16>),
    /// Per depth p, the panel's 32 columns in order; `scales[(p / INT8_GROUP) · n_pad + j]`.
    Int8 { q: Vec<i8>, scales: Vec<f32> },
    /// bf16 depth pairs for a bf16 engine, in [`crate::bf16mm::pack_b`]'s order (the depth
    /// padded to 32).
    #[cfg(target_arch = "x86_64")]
    Vnni(Vec<u16>, crate::bf16mm::Engine),
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedB {{ n: {}, k: {}, kernel: {:?}, dtype: {} }}", self.n, self.k, self.kernel, self.dtype)
    }
}

impl PackedB {
    /// Packs `w[n, k]` in `dtype` for this CPU's kernel; `None` where it has none (the portable
    /// path).
    pub(crate) fn new_as(w: &[f32], n: usize, k: usize, dtype: DecodeDtype) -> Option<PackedB> {
        assert_eq!(w.len(), n * k, "PackedB: w has {} elements, expected {n}x{k}", w.len());
        #[cfg(target_arch = "x86_64")]
        if let (DecodeDtype::Bf16Matmul, Some(engine)) = (dtype, crate::bf16mm::engine()) {
            return Some(PackedB::vnni(w, n, k, engine));
        }
        PackedB::with_kernel(kernel(), w, n, k, dtype)
    }

    /// `w[n, k]` in bf16 depth pairs for `engine` ([`DecodeDtype::Bf16Matmul`]); the CPU must
    /// have it.
    #[cfg(target_arch = "x86_64")]
    fn vnni(w: &[f32], n: usize, k: usize, engine: crate::bf16mm::Engine) -> PackedB {
        use crate::bf16mm::{TILE_K, TILE_M};
        let (n_pad, k_pad) = (n.next_multiple_of(2 * TILE_M), k.next_multiple_of(TILE_K));
        let mut data = vec![0u16; n_pad * k_pad + 32];
        let off = data.as_ptr().align_offset(64);
        crate::bf16mm::pack_b(w, n, k, &mut data[off..]);
        let panels = Panels::Vnni(data, engine);
        PackedB { n, k, kernel: Kernel::Avx512, dtype: DecodeDtype::Bf16Matmul, mr: TILE_M, nr: 2 * TILE_M, panels, off }
    }

    fn with_kernel(kernel: Kernel, w: &[f32], n: usize, k: usize, dtype: DecodeDtype) -> Option<PackedB> {
        if dtype != DecodeDtype::F32 && kernel != Kernel::Avx512 {
            // The AVX2 kernel reads f32: the format's values, as f32.
            let mut rounded = w.to_vec();
            dtype.round_weight(&mut rounded, k);
            return PackedB::with_kernel(kernel, &rounded, n, k, DecodeDtype::F32).map(|p| PackedB { dtype, ..p });
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (mr, nr) = match kernel {
                Kernel::Avx512 => (packed::avx512::MR, packed::avx512::NR),
                Kernel::Avx2 => (packed::avx2::MR, packed::avx2::NR),
                Kernel::Portable => return None,
            };
            let n_pad = n.next_multiple_of(nr);
            let mut data = vec![0f32; n_pad * k + 16];
            let off = data.as_ptr().align_offset(64);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let dst = &mut data[off + pc * n_pad..];
                // SAFETY: B(p, j) = w[j·k + p] addresses w [n, k] for p < kc, j < n.
                unsafe {
                    match kernel {
                        Kernel::Avx512 => packed::pack::<{ packed::avx512::NR }>(dst, w.as_ptr().add(pc), k, 1, n, kc),
                        _ => packed::pack::<{ packed::avx2::NR }>(dst, w.as_ptr().add(pc), k, 1, n, kc),
                    }
                }
            }
            let panels = match dtype {
                DecodeDtype::F32 => Panels::F32(data),
                DecodeDtype::Bf16 | DecodeDtype::Bf16Matmul => {
                    // Every depth of every panel is 32 consecutive values (NR = 32).
                    let mut out = vec![0u16; n_pad * k + 32];
                    let out_off = out.as_ptr().align_offset(64);
                    let (dst, src) = (&mut out[out_off..out_off + n_pad * k], &data[off..off + n_pad * k]);
                    for (o, v) in dst.chunks_exact_mut(32).zip(src.chunks_exact(32)) {
                        for t in 0..16 {
                            o[2 * t] = quant::bf16_bits(v[t]);
                            o[2 * t + 1] = quant::bf16_bits(v[16 + t]);
                        }
                    }
                    return Some(PackedB { n, k, kernel, dtype, mr, nr, panels: Panels::Bf16(out), off: out_off });
                }
                DecodeDtype::Int8 => {
                    let groups = k.div_ceil(quant::INT8_GROUP);
                    let mut scales = vec![0f32; groups * n_pad];
                    for (j, row) in w.chunks_exact(k).enumerate() {
                        for (g, group) in row.chunks(quant::INT8_GROUP).enumerate() {
                            scales[g * n_pad + j] = quant::int8_scale(group);
                        }
                    }
                    let mut q = vec![0i8; n_pad * k + 64];
                    let q_off = q.as_ptr().align_offset(64);
                    for pc in (0..k).step_by(KC) {
                        let kc = KC.min(k - pc);
                        for jr in (0..n_pad).step_by(nr) {
                            for p in 0..kc {
                                let at = pc * n_pad + jr * kc + p * nr;
                                let s = &scales[((pc + p) / quant::INT8_GROUP) * n_pad + jr..][..nr];
                                for t in 0..nr {
                                    q[q_off + at + t] = quant::int8_quant(data[off + at + t], s[t]);
                                }
                            }
                        }
                    }
                    return Some(PackedB { n, k, kernel, dtype, mr, nr, panels: Panels::Int8 { q, scales }, off: q_off });
                }
            };
            Some(PackedB { n, k, kernel, dtype, mr, nr, panels, off })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (kernel, w, n, k, dtype);
            None
        }
    }

    /// Output columns (the weight's rows).
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Columns per panel: a column range handed to [`PackedB::gemm_cols`] starts on a multiple.
    pub(crate) fn panel(&self) -> usize {
        self.nr
    }

    /// The left operand `a[m, k]` (row-major) packed for [`PackedB::gemm_cols`]: once per
    /// product, shared by the threads that split its columns.
    pub(crate) fn pack_a(&self, m: usize, a: &[f32]) -> PackedA {
        assert_eq!(a.len(), m * self.k, "PackedB::pack_a: a has {} elements, expected {m}x{}", a.len(), self.k);
        let m_pad = m.next_multiple_of(self.mr);
        #[cfg(target_arch = "x86_64")]
        if let Panels::Vnni(..) = self.panels {
            // bf16 rows, the depth padded to whole tiles with zeros.
            let k_pad = self.k.next_multiple_of(crate::bf16mm::TILE_K);
            let mut bf16 = vec![0u16; m_pad * k_pad + 32];
            let off = bf16.as_ptr().align_offset(64);
            // In parallel for a prompt's rows (one thread would leave the other waiting).
            let chunks = bf16[off..off + m_pad * k_pad].par_chunks_mut(64 * k_pad).zip(a.par_chunks(64 * self.k));
            // SAFETY: each chunk's rows of a are read whole into its rows of bf16; PackedB::vnni
            // exists only where the CPU has a bf16 engine (AVX-512F and BW included).
            chunks.for_each(|(dst, x)| unsafe { crate::bf16mm::pack_rows(dst, x.as_ptr(), x.len() / self.k, self.k, self.k, 1, dst.len() / k_pad, k_pad, 1.0) });
            return PackedA { m, data: Vec::new(), bf16, off };
        }
        let rounded: Vec<f32>;
        let a = match self.dtype {
            DecodeDtype::Bf16Matmul => {
                rounded = a.iter().map(|&x| quant::bf16_value(x)).collect();
                &rounded[..]
            }
            _ => a,
        };
        let mut data = vec![0f32; m_pad * self.k];
        #[cfg(target_arch = "x86_64")]
        for pc in (0..self.k).step_by(KC) {
            let kc = KC.min(self.k - pc);
            let dst = &mut data[pc * m_pad..];
            // SAFETY: A(i, p) = a[i·k + p] addresses a [m, k] for i < m, p < kc.
            unsafe {
                match self.kernel {
                    Kernel::Avx512 => packed::pack::<{ packed::avx512::MR }>(dst, a.as_ptr().add(pc), self.k, 1, m, kc),
                    _ => packed::pack::<{ packed::avx2::MR }>(dst, a.as_ptr().add(pc), self.k, 1, m, kc),
                }
            }
        }
        PackedA { m, data, bf16: Vec::new(), off: 0 }
    }

    /// `C[:, j0..j1] = A · wᵀ[:, j0..j1]` for `C[m, n]` row-major (not read), `j0` a multiple of
    /// [`PackedB::panel`].
    ///
    /// # Safety
    /// `c` holds m·n values, and no other thread accesses columns j0..j1 of C.
    pub(crate) unsafe fn gemm_cols(&self, a: &PackedA, c: *mut f32, j0: usize, j1: usize) {
        debug_assert!((j0 == j1 || j0.is_multiple_of(self.panel())) && j0 <= j1 && j1 <= self.n);
        if a.m == 0 || j0 == j1 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use packed::{avx2, avx512};
            let (n, n_pad) = (self.n, self.n.next_multiple_of(self.nr));
            // Where panel jr of the KC block at pc starts, in values of the panels' type.
            let at = |pc: usize, jr: usize, kc: usize| self.off + pc * n_pad + jr * kc;
            match (&self.panels, self.kernel) {
                (Panels::Vnni(d, engine), _) => {
                    // The whole depth at once (the engine's sums are not sgemm's anyway).
                    let k_pad = self.k.next_multiple_of(crate::bf16mm::TILE_K);
                    crate::bf16mm::tiles(*engine, a.bf16.as_ptr().add(a.off), k_pad, a.m, d.as_ptr().add(self.off), k_pad, 0..k_pad, j0..j1, c, n, false);
                }
                (Panels::F32(d), Kernel::Avx512) => {
                    packed::run_prepacked::<{ avx512::MR }, { avx512::NR }>(self, a, c, j0, j1, |pc, kc, ap, jr, beta, cp, mr, nr, _, next| {
                        let bp = d.as_ptr().add(at(pc, jr, kc));
                        // The first row tile of a panel brings in the next panel of this block meanwhile.
                        match next {
                            true => avx512::tile_pf(kc, ap, bp, beta, cp, n, mr, nr, bp.add(avx512::NR * kc)),
                            false => avx512::tile(kc, 1.0, ap, bp, beta, cp, n, mr, nr),
                        }
                    })
                }
                (Panels::F32(d), _) => packed::run_prepacked::<{ avx2::MR }, { avx2::NR }>(self, a, c, j0, j1, |pc, kc, ap, jr, beta, cp, mr, nr, _, _| {
                    avx2::tile(kc, 1.0, ap, d.as_ptr().add(at(pc, jr, kc)), beta, cp, n, mr, nr)
                }),
                (Panels::Bf16(_) | Panels::Int8 { .. }, _) => {
                    // Where a block has more than one row tile (a prompt, a batch of decode rows
                    // over 12), each panel is widened to f32 once, into `wide` (in L1), for all
                    // of them; a single row tile widens as it multiplies (at batch 1, 79 against
                    // 59 tok/s widening first), and needs no buffer.
                    let single = a.m.min(MC) <= avx512::MR;
                    let mut wide = if single { Vec::new() } else { vec![0f32; KC * avx512::NR + 16] };
                    let wide = wide.as_mut_ptr().wrapping_add(wide.as_ptr().align_offset(64));
                    let fmt = |pc: usize, jr: usize, kc: usize| -> (*const u8, *const f32, usize, usize) {
                        match &self.panels {
                            Panels::Bf16(d) => (d.as_ptr().add(at(pc, jr, kc)) as *const u8, std::ptr::null(), 0, 2 * avx512::NR),
                            Panels::Int8 { q, scales } => {
                                (q.as_ptr().add(at(pc, jr, kc)) as *const u8, scales.as_ptr().add(pc / quant::INT8_GROUP * n_pad + jr), n_pad, avx512::NR)
                            }
                            _ => unreachable!(),
                        }
                    };
                    let bf16 = matches!(self.panels, Panels::Bf16(_));
                    packed::run_prepacked::<{ avx512::MR }, { avx512::NR }>(self, a, c, j0, j1, |pc, kc, ap, jr, beta, cp, mr, nr, first, next| {
                        let (bp, sp, s_stride, step) = fmt(pc, jr, kc);
                        let pf = if next { bp.add(step * kc) } else { std::ptr::null() };
                        if single {
                            match bf16 {
                                true => avx512::qtile::<{ avx512::BF16 }>(kc, ap, bp, sp, s_stride, beta, cp, n, mr, nr, pf),
                                false => avx512::qtile::<{ avx512::INT8 }>(kc, ap, bp, sp, s_stride, beta, cp, n, mr, nr, pf),
                            }
                            return;
                        }
                        if first {
                            match bf16 {
                                true => avx512::widen::<{ avx512::BF16 }>(kc, bp, sp, s_stride, wide),
                                false => avx512::widen::<{ avx512::INT8 }>(kc, bp, sp, s_stride, wide),
                            }
                        }
                        avx512::tile(kc, 1.0, ap, wide, beta, cp, n, mr, nr)
                    })
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (a, c, j0, j1);
    }
}

/// A left operand packed by [`PackedB::pack_a`]: per KC block (at `pc · m_pad`), panels of MR
/// rows, each `kc` deep; or, for AMX tiles, bf16 rows (from `off`) of the depth padded to 32.
pub(crate) struct PackedA {
    m: usize,
    data: Vec<f32>,
    bf16: Vec<u16>,
    off: usize,
}

#[cfg(target_arch = "x86_64")]
mod packed {
    use super::{KC, MC, NC};
    use std::cell::RefCell;

    thread_local! {
        /// This thread's packing buffers (A~ [MC·KC], B~ [KC·NC]), allocated once.
        static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }

    /// One product's operands, as [`super::sgemm`] takes them.
    pub(super) struct Gemm {
        pub m: usize,
        pub n: usize,
        pub k: usize,
        pub alpha: f32,
        pub a: *const f32,
        pub rsa: usize,
        pub csa: usize,
        pub b: *const f32,
        pub rsb: usize,
        pub csb: usize,
        pub beta: f32,
        pub c: *mut f32,
        pub ldc: usize,
    }

    /// A register kernel: `C[mr, nr] = alpha · Ã·B̃ + beta · C` for one MR×NR tile from packed
    /// panels `a` [kc·MR] and `b` [kc·NR] (args: kc, alpha, a, b, beta, c, ldc, mr, nr).
    ///
    /// # Safety
    /// For a kernel of this type: the CPU has its features; `a` holds `kc·MR` and `b` `kc·NR`
    /// packed values; C's `mr ≤ MR` rows of `nr ≤ NR` values from `c` (`ldc` apart) are writable,
    /// and readable when `beta != 0`.
    pub(super) type Tile = unsafe fn(usize, f32, *const f32, *const f32, f32, *mut f32, usize, usize, usize);

    /// The blocked loops around an MR×NR kernel (k > 0).
    ///
    /// # Safety
    /// The CPU has the features of `tile`, an MR×NR kernel; `g` satisfies [`super::sgemm`]'s
    /// contract; `g.k > 0`.
    pub(super) unsafe fn run<const MR: usize, const NR: usize>(g: &Gemm, tile: Tile) {
        let Gemm { m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc } = *g;
        PACKED.with(|bufs| {
            let mut bufs = bufs.borrow_mut();
            let (pa, pb) = &mut *bufs;
            // 16 floats of slack: the panels start on a 64-byte line, so that no vector load of
            // a packed panel straddles two cache lines.
            let need_a = MC.min(m.next_multiple_of(MR)) * KC.min(k) + 16;
            let need_b = KC.min(k) * NC.min(n.next_multiple_of(NR)) + 16;
            if pa.len() < need_a {
                pa.resize(need_a, 0.0);
            }
            if pb.len() < need_b {
                pb.resize(need_b, 0.0);
            }
            let (off_a, off_b) = (pa.as_ptr().align_offset(64), pb.as_ptr().align_offset(64));
            let (pa, pb) = (&mut pa[off_a..], &mut pb[off_b..]);
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    // The first k block applies beta; the later ones add to it.
                    let beta_blk = if pc == 0 { beta } else { 1.0 };
                    pack::<NR>(pb, b.add(pc * rsb + jc * csb), csb, rsb, nc, kc);
                    for ic in (0..m).step_by(MC) {
                        let mc = MC.min(m - ic);
                        pack::<MR>(pa, a.add(ic * rsa + pc * csa), rsa, csa, mc, kc);
                        for ir in (0..mc).step_by(MR) {
                            let mr = MR.min(mc - ir);
                            let ap = pa.as_ptr().add(ir * kc);
                            for jr in (0..nc).step_by(NR) {
                                let nr = NR.min(nc - jr);
                                let bp = pb.as_ptr().add(jr * kc);
                                let cp = c.add((ic + ir) * ldc + jc + jr);
                                tile(kc, alpha, ap, bp, beta_blk, cp, ldc, mr, nr);
                            }
                        }
                    }
                }
            }
        });
    }

    /// [`super::PackedB::gemm_cols`]: for each KC block, the rows in blocks of MC (in L2), and
    /// for each prepacked panel of B (read once, in L1) every row tile of the block: a decode
    /// step's few rows stream each weight panel once. `tile(pc, kc, a panel, jr, beta, c tile,
    /// mr, nr, first, next)` computes one tile: `first` for the first row tile of the row block
    /// on this panel, `next` where that one should also prefetch the block's next panel.
    ///
    /// # Safety
    /// `w` and `a` were packed for this MR×NR; `c` holds `a.m` rows of `w.n` values, and no other
    /// thread accesses its columns `j0..j1`; `tile` may be called on the panels and C tiles it is
    /// handed.
    pub(super) unsafe fn run_prepacked<const MR: usize, const NR: usize>(
        w: &super::PackedB,
        a: &super::PackedA,
        c: *mut f32,
        j0: usize,
        j1: usize,
        tile: impl Fn(usize, usize, *const f32, usize, f32, *mut f32, usize, usize, bool, bool),
    ) {
        let (m, n, k) = (a.m, w.n, w.k);
        let m_pad = m.next_multiple_of(MR);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let beta_blk = if pc == 0 { 0.0 } else { 1.0 };
            let block_a = a.data.as_ptr().add(pc * m_pad);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                for jr in (j0..j1).step_by(NR) {
                    let nr = NR.min(j1 - jr);
                    for ir in (ic..ic + mc).step_by(MR) {
                        let mr = MR.min(m - ir);
                        let next = ir == ic && jr + NR < j1;
                        tile(pc, kc, block_a.add(ir * kc), jr, beta_blk, c.add(ir * n + jr), mr, nr, ir == ic, next);
                    }
                }
            }
        }
    }

    /// Packs an operand into panels of W lanes, `kc` deep: panel q holds, for each p, lanes
    /// q·W.. (zero beyond `lanes`), lane i of depth p read at `x + i·lane_stride + p·depth_stride`.
    /// A[mc, kc] packs as `pack::<MR>(a, rsa, csa, mc)`, B[kc, nc] as `pack::<NR>(b, csb, rsb, nc)`.
    /// Packing only moves values, so every path gives the same panel.
    ///
    /// # Safety
    /// Lane `i < lanes` at depth `p < kc` (`x + i·lane_stride + p·depth_stride`) is readable; `dst`
    /// holds `lanes.div_ceil(W)·W·kc` values.
    pub(super) unsafe fn pack<const W: usize>(dst: &mut [f32], x: *const f32, lane_stride: usize, depth_stride: usize, lanes: usize, kc: usize) {
        if lane_stride == 1 {
            // The lanes of one depth are contiguous (a row-major B, a transposed A): copy every
            // panel's W lanes of depth p before moving to p + 1, so the source is read row by
            // row (one sequential stream the prefetchers follow) rather than panel by panel (kc
            // strided 48- or 128-byte reads, each on another page). A last partial panel is
            // copied too and padded with zeros.
            let (full, rem) = (lanes / W, lanes % W);
            for p in 0..kc {
                let row = x.add(p * depth_stride);
                for qi in 0..full {
                    let o = qi * W * kc + p * W;
                    dst[o..o + W].copy_from_slice(std::slice::from_raw_parts(row.add(qi * W), W));
                }
                if rem > 0 {
                    let o = full * W * kc + p * W;
                    dst[o..o + rem].copy_from_slice(std::slice::from_raw_parts(row.add(full * W), rem));
                    dst[o + rem..o + W].fill(0.0);
                }
            }
            return;
        }
        for (qi, i0) in (0..lanes).step_by(W).enumerate() {
            let n = W.min(lanes - i0);
            let panel = &mut dst[qi * W * kc..(qi + 1) * W * kc];
            let first = x.add(i0 * lane_stride);
            if n >= 4 && depth_stride == 1 {
                // Each lane is contiguous in depth (a row-major A, a weight [n, k] as B).
                transpose_rows4::<W>(panel, first, lane_stride, n, kc);
            } else {
                for p in 0..kc {
                    for (i, o) in panel[p * W..(p + 1) * W].iter_mut().enumerate() {
                        *o = if i < n { *first.add(i * lane_stride + p * depth_stride) } else { 0.0 };
                    }
                }
            }
        }
    }

    /// One panel of W lanes from `rows` (4 ≤ rows ≤ W) lanes contiguous in p (lane i at
    /// `a + i·rsa`): `panel[p·W + i] = a[i][p]`, zero
    /// for i ≥ rows. Groups of 4 rows go through SSE 4×4 transposes (4 loads, 8 shuffles, 4
    /// stores for 16 values); the rest element by element.
    ///
    /// # Safety
    /// `panel` holds `kc·W` values and `4 ≤ rows ≤ W` (checked in debug builds only: it writes
    /// through a raw pointer); lane `i < rows` at depth `p < kc` (`a + i·rsa + p`) is readable.
    unsafe fn transpose_rows4<const W: usize>(panel: &mut [f32], a: *const f32, rsa: usize, rows: usize, kc: usize) {
        use std::arch::x86_64::*;
        debug_assert!(panel.len() >= kc * W && rows <= W);
        let groups = rows / 4;
        let out = panel.as_mut_ptr();
        let p4 = kc / 4 * 4;
        for g in 0..groups {
            let r = a.add(4 * g * rsa);
            for p in (0..p4).step_by(4) {
                // SSE2 is part of x86-64, so these need no runtime check.
                let r0 = _mm_loadu_ps(r.add(p));
                let r1 = _mm_loadu_ps(r.add(rsa + p));
                let r2 = _mm_loadu_ps(r.add(2 * rsa + p));
                let r3 = _mm_loadu_ps(r.add(3 * rsa + p));
                let t0 = _mm_unpacklo_ps(r0, r1); // a0 b0 a1 b1
                let t1 = _mm_unpacklo_ps(r2, r3); // c0 d0 c1 d1
                let t2 = _mm_unpackhi_ps(r0, r1); // a2 b2 a3 b3
                let t3 = _mm_unpackhi_ps(r2, r3); // c2 d2 c3 d3
                let o = out.add(p * W + 4 * g);
                _mm_storeu_ps(o, _mm_movelh_ps(t0, t1));
                _mm_storeu_ps(o.add(W), _mm_movehl_ps(t1, t0));
                _mm_storeu_ps(o.add(2 * W), _mm_movelh_ps(t2, t3));
                _mm_storeu_ps(o.add(3 * W), _mm_movehl_ps(t3, t2));
            }
            for p in p4..kc {
                for i in 0..4 {
                    *out.add(p * W + 4 * g + i) = *r.add(i * rsa + p);
                }
            }
        }
        for p in 0..kc {
            for i in 4 * groups..W {
                *out.add(p * W + i) = if i < rows { *a.add(i * rsa + p) } else { 0.0 };
            }
        }
    }

    /// Writes a partial tile (mr < MR or nr < NR) held in `acc` rows: the same arithmetic as a
    /// full tile's vector epilogue (`y = v·alpha`, then `C·beta + y`; no fused multiply-add).
    ///
    /// # Safety
    /// C's `mr` rows of `nr` values from `c` (`ldc` apart) are writable, and readable when
    /// `beta != 0`; `mr ≤ MR`, `nr ≤ NR`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_partial<const MR: usize, const NR: usize>(acc: &[[f32; NR]; MR], alpha: f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize) {
        for (i, row) in acc.iter().enumerate().take(mr) {
            let cr = c.add(i * ldc);
            for (j, &v) in row.iter().enumerate().take(nr) {
                let y = v * alpha;
                *cr.add(j) = if beta != 0.0 { *cr.add(j) * beta + y } else { y };
            }
        }
    }

    pub(super) mod avx2 {
        use std::arch::x86_64::*;

        pub const MR: usize = 6;
        /// Two ymm vectors.
        pub const NR: usize = 16;

        /// See [`super::Tile`]; requires AVX2 and FMA.
        ///
        /// # Safety
        /// As [`super::Tile`], on a CPU with AVX2 and FMA.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn tile(kc: usize, alpha: f32, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize) {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            let (mut ap, mut bp) = (a, b);
            // C's lines, asked for before the k loop (see the AVX-512 kernel).
            for i in 0..mr {
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + nr - 1) as *const i8);
            }
            for _ in 0..kc {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm256_broadcast_ss(&*ap.add(i));
                    row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(NR);
            }
            if mr == MR && nr == NR {
                let va = _mm256_set1_ps(alpha);
                let vb = _mm256_set1_ps(beta);
                for (i, row) in acc.iter().enumerate() {
                    let cr = c.add(i * ldc);
                    for (h, &v) in row.iter().enumerate() {
                        let mut y = _mm256_mul_ps(v, va);
                        if beta != 0.0 {
                            y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(cr.add(8 * h)), vb), y);
                        }
                        _mm256_storeu_ps(cr.add(8 * h), y);
                    }
                }
            } else {
                let mut tile = [[0f32; NR]; MR];
                for (i, row) in acc.iter().enumerate() {
                    _mm256_storeu_ps(tile[i].as_mut_ptr(), row[0]);
                    _mm256_storeu_ps(tile[i].as_mut_ptr().add(8), row[1]);
                }
                super::store_partial(&tile, alpha, beta, c, ldc, mr, nr);
            }
        }
    }

    pub(super) mod avx512 {
        use std::arch::x86_64::*;

        /// 12 rows × 2 zmm = 24 accumulators of the 32 registers, leaving room for the two B
        /// vectors and the broadcast A value.
        pub const MR: usize = 12;
        /// Two zmm vectors.
        pub const NR: usize = 32;

        /// See [`super::Tile`]; requires AVX-512F. A tile of `mr < MR` rows (the last row block,
        /// or a decode step's few rows) runs a kernel with `mr` accumulator rows: the same FMAs
        /// per element in the same order, without the work on zero-padded rows (a one-row
        /// product would otherwise do 12 times its FMAs).
        ///
        /// # Safety
        /// As [`super::Tile`], on a CPU with AVX-512F.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f")]
        pub unsafe fn tile(kc: usize, alpha: f32, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize) {
            tile_rows::<false>(kc, alpha, a, b, beta, c, ldc, mr, nr, std::ptr::null())
        }

        /// [`tile`] with alpha 1 that also asks, at each step of k, for the matching 128 bytes of
        /// another B panel `pf` (null: none): the next weight panel of a prepacked product arrives
        /// from memory while this one's FMAs run (decoding at batch 16: 2% to 39% faster over
        /// five back-to-back pairs, median 8%; the same hints issued for a whole panel at once,
        /// to L2, gained nothing).
        ///
        /// # Safety
        /// As [`tile`]; `pf` is null or the start of another panel of `kc·NR` values (only
        /// prefetched, never read).
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f")]
        pub unsafe fn tile_pf(kc: usize, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, pf: *const f32) {
            if pf.is_null() {
                return tile(kc, 1.0, a, b, beta, c, ldc, mr, nr);
            }
            tile_rows::<true>(kc, 1.0, a, b, beta, c, ldc, mr, nr, pf)
        }

        /// The kernel with `mr` accumulator rows, prefetching `pf` when PF.
        ///
        /// # Safety
        /// As [`tile_pf`] when PF, else as [`tile`].
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn tile_rows<const PF: bool>(kc: usize, alpha: f32, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, pf: *const f32) {
            match mr {
                1 => rows::<1, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                2 => rows::<2, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                3 => rows::<3, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                4 => rows::<4, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                5 => rows::<5, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                6 => rows::<6, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                7 => rows::<7, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                8 => rows::<8, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                9 => rows::<9, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                10 => rows::<10, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                11 => rows::<11, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
                _ => rows::<MR, PF>(kc, alpha, a, b, beta, c, ldc, nr, pf),
            }
        }

        /// [`tile`] on its first `R ≤ MR` rows (the A panel keeps its MR stride).
        ///
        /// # Safety
        /// As [`tile_rows`], for `R ≤ MR` rows.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn rows<const R: usize, const PF: bool>(kc: usize, alpha: f32, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, nr: usize, pf: *const f32) {
            let mr = R;
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            let (mut ap, mut bp) = (a, b);
            // The C tile is read (beta ≠ 0) and written after the k loop: ask for its lines now,
            // so that they arrive while the FMAs run (the epilogue would wait on L2 or L3).
            for i in 0..mr {
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + nr - 1) as *const i8);
            }
            let mut pp = pf as *const i8;
            for _ in 0..kc {
                if PF {
                    _mm_prefetch::<_MM_HINT_T0>(pp);
                    _mm_prefetch::<_MM_HINT_T0>(pp.add(64));
                    pp = pp.wrapping_add(4 * NR);
                }
                let b0 = _mm512_loadu_ps(bp);
                let b1 = _mm512_loadu_ps(bp.add(16));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*ap.add(i));
                    row[0] = _mm512_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(ai, b1, row[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(NR);
            }
            store(&acc, alpha, beta, c, ldc, nr);
        }

        /// `C = alpha · acc + beta · C` for the tile's R rows and `nr` columns.
        ///
        /// # Safety
        /// The CPU has AVX-512F; C's R rows of `nr ≤ NR` values from `c` (`ldc` apart) are writable,
        /// and readable when `beta != 0`.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn store<const R: usize>(acc: &[[__m512; 2]; R], alpha: f32, beta: f32, c: *mut f32, ldc: usize, nr: usize) {
            if nr == NR {
                let va = _mm512_set1_ps(alpha);
                let vb = _mm512_set1_ps(beta);
                for (i, row) in acc.iter().enumerate() {
                    let cr = c.add(i * ldc);
                    for (h, &v) in row.iter().enumerate() {
                        let mut y = _mm512_mul_ps(v, va);
                        if beta != 0.0 {
                            y = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cr.add(16 * h)), vb), y);
                        }
                        _mm512_storeu_ps(cr.add(16 * h), y);
                    }
                }
            } else {
                let mut tile = [[0f32; NR]; MR];
                for (i, row) in acc.iter().enumerate() {
                    _mm512_storeu_ps(tile[i].as_mut_ptr(), row[0]);
                    _mm512_storeu_ps(tile[i].as_mut_ptr().add(16), row[1]);
                }
                super::store_partial(&tile, alpha, beta, c, ldc, R, nr);
            }
        }

        /// Widens one depth of a bf16 or int8 panel (32 columns) to two f32 vectors, keeping
        /// the int8 group's scales between calls (depths in order from 0).
        struct Widen<const FMT: u8> {
            high: __m512i,
            s: [__m512; 2],
            sp: *const f32,
            s_stride: usize,
        }

        impl<const FMT: u8> Widen<FMT> {
            /// # Safety
            /// The CPU has AVX-512F; for INT8, `scales` addresses the scales [`Self::load`] will read
            /// (32 per depth group, groups `s_stride` apart).
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn new(scales: *const f32, s_stride: usize) -> Self {
                Widen { high: _mm512_set1_epi32(0xffff_0000u32 as i32), s: [_mm512_setzero_ps(); 2], sp: scales, s_stride }
            }

            /// Depth `p`'s values, at `bp`.
            ///
            /// # Safety
            /// The CPU has AVX-512F; `bp` addresses depth `p` of the panel (64 bytes for BF16, 32 for
            /// INT8); depths come in order from 0.
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn load(&mut self, bp: *const u8, p: usize) -> [__m512; 2] {
                if FMT == BF16 {
                    let v = _mm512_loadu_si512(bp as *const __m512i);
                    return [_mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)), _mm512_castsi512_ps(_mm512_and_si512(v, self.high))];
                }
                if p % crate::quant::INT8_GROUP == 0 {
                    self.s = [_mm512_loadu_ps(self.sp), _mm512_loadu_ps(self.sp.add(16))];
                    // wrapping: after the last group the pointer may pass the scales' end unread.
                    self.sp = self.sp.wrapping_add(self.s_stride);
                }
                let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(bp as *const __m128i));
                let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(bp.add(16) as *const __m128i));
                [_mm512_mul_ps(_mm512_cvtepi32_ps(q0), self.s[0]), _mm512_mul_ps(_mm512_cvtepi32_ps(q1), self.s[1])]
            }
        }

        /// [`qtile`]'s panel formats.
        pub const BF16: u8 = 1;
        pub const INT8: u8 = 2;

        /// [`tile`] (alpha 1) over a panel of bf16 (`FMT` = [`BF16`], 64 bytes per depth) or
        /// int8 values (`FMT` = [`INT8`], 32 bytes per depth, scaled by `scales[g·s_stride + j]`
        /// for depth group g): each value is widened to its f32 (bf16: exact; int8: q · scale,
        /// one rounding) and then fed to the same FMAs, so the tile equals [`tile`] on those
        /// f32 values bit for bit. `pf` (null: none) is the next panel, prefetched as we go.
        ///
        /// # Safety
        /// The CPU has AVX-512F; `a` holds `kc·MR` packed f32; `b` holds `kc` depths of the panel
        /// (64 or 32 bytes each) and, for INT8, `scales` the `kc.div_ceil(INT8_GROUP)` groups of 32
        /// scales `s_stride` apart; C as for [`tile`]; `pf` null or the start of the next panel (only
        /// prefetched).
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f")]
        pub unsafe fn qtile<const FMT: u8>(kc: usize, a: *const f32, b: *const u8, scales: *const f32, s_stride: usize, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, pf: *const u8) {
            match mr {
                1 => qrows::<1, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                2 => qrows::<2, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                3 => qrows::<3, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                4 => qrows::<4, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                5 => qrows::<5, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                6 => qrows::<6, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                7 => qrows::<7, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                8 => qrows::<8, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                9 => qrows::<9, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                10 => qrows::<10, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                11 => qrows::<11, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
                _ => qrows::<MR, FMT>(kc, a, b, scales, s_stride, beta, c, ldc, nr, pf),
            }
        }

        /// [`qtile`] on its first `R ≤ MR` rows.
        ///
        /// # Safety
        /// As [`qtile`], for `R ≤ MR` rows.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn qrows<const R: usize, const FMT: u8>(kc: usize, a: *const f32, b: *const u8, scales: *const f32, s_stride: usize, beta: f32, c: *mut f32, ldc: usize, nr: usize, pf: *const u8) {
            let step = if FMT == BF16 { 2 * NR } else { NR };
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            let (mut ap, mut bp) = (a, b);
            for i in 0..R {
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + nr - 1) as *const i8);
            }
            let mut w = Widen::<FMT>::new(scales, s_stride);
            for p in 0..kc {
                if !pf.is_null() && (FMT == BF16 || p % 2 == 0) {
                    _mm_prefetch::<_MM_HINT_T0>(pf.add(p * step) as *const i8);
                }
                let [b0, b1] = w.load(bp, p);
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*ap.add(i));
                    row[0] = _mm512_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(ai, b1, row[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(step);
            }
            store(&acc, 1.0, beta, c, ldc, nr);
        }

        /// A bf16 or int8 panel (see [`qtile`]) widened to the f32 panel [`tile`] reads,
        /// `out[kc · NR]`: the same values [`qtile`] multiplies.
        ///
        /// # Safety
        /// The CPU has AVX-512F; `b` and `scales` as for [`qtile`]; `out` holds `kc·NR` f32 and is
        /// 64-byte aligned (aligned stores).
        #[target_feature(enable = "avx512f")]
        pub unsafe fn widen<const FMT: u8>(kc: usize, b: *const u8, scales: *const f32, s_stride: usize, out: *mut f32) {
            let step = if FMT == BF16 { 2 * NR } else { NR };
            let mut w = Widen::<FMT>::new(scales, s_stride);
            for p in 0..kc {
                let bp = b.add(p * step);
                let [b0, b1] = w.load(bp, p);
                _mm512_store_ps(out.add(p * NR), b0);
                _mm512_store_ps(out.add(p * NR + 16), b1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
        (0..n).map(|_| (rng.unit_nonzero() * 2.0 - 1.0) as f32).collect()
    }

    /// One strided product's operands: a [m,k] and b [k,n] (stored transposed where asked), C
    /// [m, n + 3] (NaN where beta is 0, so that reading it would show), and the strides.
    struct Strided {
        a: Vec<f32>,
        b: Vec<f32>,
        c0: Vec<f32>,
        ldc: usize,
        rsa: usize,
        csa: usize,
        rsb: usize,
        csb: usize,
    }

    fn strided(m: usize, n: usize, k: usize, a_t: bool, b_t: bool, beta: f32, rng: &mut SplitMix64) -> Strided {
        let a = random(m * k, rng);
        let b = random(k * n, rng);
        let ldc = n + 3;
        let c0: Vec<f32> = if beta == 0.0 { vec![f32::NAN; m * ldc] } else { random(m * ldc, rng) };
        let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
        let (rsb, csb) = if b_t { (1, k) } else { (n, 1) };
        Strided { a, b, c0, ldc, rsa, csa, rsb, csb }
    }

    /// Calls `f(i, j, c[i][j])` for every element of C [m, n] (rows `ldc` apart), after checking
    /// that the columns between n and ldc still hold `c0`'s bits.
    fn each_in_c(c: &[f32], c0: &[f32], m: usize, n: usize, ldc: usize, mut f: impl FnMut(usize, usize, f32)) {
        for i in 0..m {
            for j in 0..ldc {
                let got = c[i * ldc + j];
                if j >= n {
                    assert!(got.to_bits() == c0[i * ldc + j].to_bits(), "wrote outside C at ({i},{j})");
                    continue;
                }
                f(i, j, got);
            }
        }
    }

    /// The kernels this CPU can run, the portable one included; says which it skips.
    fn kernels() -> Vec<Kernel> {
        let mut have = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                have.push(Kernel::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                have.push(Kernel::Avx512);
            }
        }
        if have.len() < 3 {
            eprintln!("sgemm tests: this CPU runs only {have:?}; the other kernels are not tested here");
        }
        have
    }

    /// Every kernel, every register-tile edge (m, n not multiples of 6, 16, 12, 32), k across KC
    /// blocks, n across NC blocks, m across MC blocks, every stride layout, alpha, beta 0 over
    /// NaN and beta 1, and a C with a leading dimension wider than n: against an f64 reference.
    #[test]
    fn matches_f64_reference_on_edges_blocks_and_strides() {
        let mut rng = SplitMix64::new(7);
        let shapes = [(1, 1, 1), (5, 17, 3), (6, 16, 256), (12, 32, 256), (13, 33, 257), (25, 65, 100), (150, 20, 70), (7, NC + 21, 300), (145, 47, 513)];
        for kernel in kernels() {
            for &(m, n, k) in &shapes {
                for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                    for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, 1.0), (-2.0, 0.25)] {
                        let Strided { a, b, c0, ldc, rsa, csa, rsb, csb } = strided(m, n, k, a_t, b_t, beta, &mut rng);
                        let mut c = c0.clone();
                        // SAFETY: the strides address a [m,k], b [k,n] and c [m, ldc] in bounds.
                        unsafe { sgemm_with(kernel, m, n, k, alpha, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), ldc) };
                        each_in_c(&c, &c0, m, n, ldc, |i, j, got| {
                            let dot: f64 = (0..k).map(|p| a[i * rsa + p * csa] as f64 * b[p * rsb + j * csb] as f64).sum();
                            let old = if beta == 0.0 { 0.0 } else { beta as f64 * c0[i * ldc + j] as f64 };
                            let want = alpha as f64 * dot + old;
                            let tol = 1e-5 * (k as f64).sqrt() * (alpha.abs() as f64 + 1.0) + 1e-6;
                            assert!((got as f64 - want).abs() <= tol, "{kernel:?} {m}x{n}x{k} a_t={a_t} b_t={b_t} alpha={alpha} beta={beta} at ({i},{j}): {got} vs {want}");
                        });
                    }
                }
            }
        }
    }

    /// The AVX-512 and AVX2 kernels give the same bits (same FMA order per element, same
    /// epilogue), so a run's outputs do not depend on which CPU trained it: random shapes across
    /// tile edges and KC blocks, every stride layout, beta 0 and not.
    #[test]
    fn avx512_and_avx2_kernels_are_bit_identical() {
        let have = kernels();
        if !(have.contains(&Kernel::Avx2) && have.contains(&Kernel::Avx512)) {
            eprintln!("avx512_and_avx2_kernels_are_bit_identical: skipped, this CPU lacks AVX-512 or AVX2");
            return;
        }
        let mut rng = SplitMix64::new(11);
        for case in 0..24 {
            let m = 1 + rng.below(150);
            let n = 1 + rng.below(200);
            let k = 1 + rng.below(700);
            let (a_t, b_t) = (case % 2 == 1, case % 4 >= 2);
            let beta = if case % 3 == 0 { 0.0 } else { 0.5 };
            let a = random(m * k, &mut rng);
            let b = random(k * n, &mut rng);
            let c0 = random(m * n, &mut rng);
            let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
            let (rsb, csb) = if b_t { (1, k) } else { (n, 1) };
            let run = |kernel| {
                let mut c = c0.clone();
                // SAFETY: the strides address a [m,k], b [k,n] and c [m,n] in bounds; the CPU has both kernels.
                unsafe { sgemm_with(kernel, m, n, k, 1.5, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), n) };
                c
            };
            let (wide, narrow) = (run(Kernel::Avx512), run(Kernel::Avx2));
            let same = wide.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "case {case}: {m}x{n}x{k} a_t={a_t} b_t={b_t} beta={beta}: the kernels differ");
        }
    }

    /// Whether `x[m, k] · pwᵀ` through the packed weight, its columns split as threads split
    /// them (one panel, then the rest), has the bits of [`sgemm`] on `w[n, k]`.
    fn packed_equals_sgemm(kernel: Kernel, pw: &PackedB, x: &[f32], w: &[f32], m: usize) -> bool {
        packed_equals(kernel, pw, x, x, w, m)
    }

    /// [`packed_equals_sgemm`] where sgemm multiplies `x_want` (`x` as the format rounds it).
    fn packed_equals(kernel: Kernel, pw: &PackedB, x: &[f32], x_want: &[f32], w: &[f32], m: usize) -> bool {
        let (n, k) = (pw.n, pw.k);
        let mut want = vec![f32::NAN; m * n];
        // SAFETY: x [m,k], w [n,k] read as wᵀ [k,n], want [m,n], all in bounds.
        unsafe { sgemm_with(kernel, m, n, k, 1.0, x_want.as_ptr(), k, 1, w.as_ptr(), 1, k, 0.0, want.as_mut_ptr(), n) };
        let mut got = vec![f32::NAN; m * n];
        let step = pw.panel();
        let xa = pw.pack_a(m, x);
        for (j0, j1) in [(0, step.min(n)), (step.min(n), n)] {
            // SAFETY: got holds m·n values; one range at a time.
            unsafe { pw.gemm_cols(&xa, got.as_mut_ptr(), j0, j1) };
        }
        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// A prepacked weight gives [`sgemm`]'s bits for `x · wᵀ` on any column range and any row
    /// count (one row, a decode step's few, more than MC), k across KC blocks, every kernel.
    #[test]
    fn prepacked_weights_match_sgemm_bit_for_bit() {
        let mut rng = SplitMix64::new(5);
        for kernel in kernels() {
            for &(m, n, k) in &[(1, 1, 1), (1, 70, 576), (3, 33, 257), (12, 32, 256), (13, 200, 600), (50, 96, 513), (150, 40, 70)] {
                let w = random(n * k, &mut rng);
                let x = random(m * k, &mut rng);
                let Some(pw) = PackedB::with_kernel(kernel, &w, n, k, DecodeDtype::F32) else {
                    assert_eq!(kernel, Kernel::Portable);
                    continue;
                };
                assert!(packed_equals_sgemm(kernel, &pw, &x, &w, m), "{kernel:?} {m}x{n}x{k}: the prepacked product differs from sgemm");
            }
        }
    }

    /// A weight packed as bf16 or int8 gives [`sgemm`]'s bits on the weight rounded by
    /// [`DecodeDtype::round_weight`]: the narrow panels widen to exactly those values (every
    /// kernel; row counts across the 12-row tile; k across KC blocks and int8 groups; a last
    /// partial panel; column ranges as threads split them).
    #[test]
    fn narrow_weights_match_sgemm_on_the_rounded_weight_bit_for_bit() {
        let mut rng = SplitMix64::new(9);
        for kernel in kernels() {
            for dtype in [DecodeDtype::Bf16, DecodeDtype::Int8] {
                for &(m, n, k) in &[(1, 1, 1), (1, 70, 576), (3, 33, 257), (12, 64, 256), (16, 200, 600), (29, 96, 1536), (150, 40, 70)] {
                    // Rows of very different magnitudes, so the int8 groups' scales differ.
                    let w: Vec<f32> = random(n * k, &mut rng).iter().enumerate().map(|(i, x)| x * (1 + (i / k) % 5 + 10 * (i % k / 64 % 2)) as f32).collect();
                    let x = random(m * k, &mut rng);
                    let Some(pw) = PackedB::with_kernel(kernel, &w, n, k, dtype) else {
                        assert_eq!(kernel, Kernel::Portable);
                        continue;
                    };
                    let mut rounded = w.clone();
                    dtype.round_weight(&mut rounded, k);
                    assert!(n * k == 1 || rounded != w, "{dtype:?} rounds these weights");
                    let same = packed_equals_sgemm(kernel, &pw, &x, &rounded, m);
                    assert!(same, "{kernel:?} {dtype:?} {m}x{n}x{k}: differs from sgemm on the rounded weight");
                }
            }
        }
    }

    /// The bf16 engines ([`crate::bf16mm`]) this CPU has, each named (none off x86-64).
    fn bf16_engines() -> Vec<crate::bf16mm::Engine> {
        #[cfg(target_arch = "x86_64")]
        let engines = crate::bf16mm::Engine::on_this_cpu();
        #[cfg(not(target_arch = "x86_64"))]
        let engines = Vec::new();
        if engines.is_empty() {
            eprintln!("bf16: this CPU has neither AMX tiles nor AVX-512 BF16; no bf16 engine is tested here");
        }
        engines
    }

    /// In [`DecodeDtype::Bf16Matmul`] both operands are rounded to bf16: on every kernel the
    /// product has the bits of [`sgemm`] on the rounded operands; on each bf16 engine the CPU has
    /// (AMX tiles, AVX-512 BF16 dot products) it is within f32 summation error of the exact
    /// product of the rounded operands (the engines round their sums in their own ways) and near
    /// sgemm's. Row counts across the 12- and 16-row tiles and their pairs, columns across the
    /// 32-column panel, depths across the 32-deep tile and KC blocks, column ranges as threads
    /// split them.
    #[test]
    fn bf16_matmul_multiplies_both_operands_rounded() {
        let mut rng = SplitMix64::new(13);
        let dtype = DecodeDtype::Bf16Matmul;
        let engines = bf16_engines();
        for &(m, n, k) in &[(1, 1, 1), (1, 70, 576), (3, 33, 31), (15, 64, 257), (16, 32, 256), (17, 200, 600), (33, 96, 1536), (150, 40, 70)] {
            let w = random(n * k, &mut rng);
            let x = random(m * k, &mut rng);
            let (mut w_r, mut x_r) = (w.clone(), x.clone());
            dtype.round_weight(&mut w_r, k);
            dtype.round_weight(&mut x_r, k);
            assert!(n * k == 1 || w_r != w);
            for kernel in kernels() {
                if let Some(pw) = PackedB::with_kernel(kernel, &w, n, k, dtype) {
                    assert!(packed_equals(kernel, &pw, &x, &x_r, &w_r, m), "{kernel:?} {m}x{n}x{k}: differs from sgemm on the rounded operands");
                }
            }
            #[cfg(target_arch = "x86_64")]
            for &engine in &engines {
                let pw = PackedB::vnni(&w, n, k, engine);
                assert!(matches!(pw.panels, Panels::Vnni(_, e) if e == engine));
                let mut got = vec![f32::NAN; m * n];
                let xa = pw.pack_a(m, &x);
                let step = pw.panel();
                for (j0, j1) in [(0, step.min(n)), (step.min(n), n)] {
                    // SAFETY: got holds m·n values; one range at a time.
                    unsafe { pw.gemm_cols(&xa, got.as_mut_ptr(), j0, j1) };
                }
                let mut fma = vec![0f32; m * n];
                // SAFETY: x_r [m,k], w_r [n,k] read as wᵀ [k,n], fma [m,n], all in bounds.
                unsafe { sgemm_with(Kernel::Avx512, m, n, k, 1.0, x_r.as_ptr(), k, 1, w_r.as_ptr(), 1, k, 0.0, fma.as_mut_ptr(), n) };
                let tol = 1e-5 * (k as f64).sqrt() + 1e-6;
                let (mut worst, mut to_fma) = (0f64, 0f64);
                for i in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k).map(|p| x_r[i * k + p] as f64 * w_r[j * k + p] as f64).sum();
                        worst = worst.max((got[i * n + j] as f64 - exact).abs());
                        to_fma = to_fma.max((got[i * n + j] - fma[i * n + j]).abs() as f64);
                    }
                }
                assert!(worst <= tol, "{engine:?} {m}x{n}x{k}: {worst:e} from the exact product of the rounded operands (tolerance {tol:e})");
                assert!(to_fma <= 2.0 * tol, "{engine:?} {m}x{n}x{k}: {to_fma:e} from sgemm on the rounded operands");
            }
        }
    }

    /// Training's bf16 products on every stride layout, edges of the 12-row and 32×32 tiles,
    /// depths across the packed depth blocks (512), rows across the row blocks (128), columns
    /// across the column blocks (256), beta 0 over NaN, 1 and 0.5, alpha 1 and 0.125 (the
    /// attention's scale): within f32 summation error of the exact product of the bf16-rounded
    /// operands (alpha·A rounded), and not within it of the unrounded product (so the operands
    /// were rounded). [`sgemm_bf16`] (this process's engine, or rounded copies on the f32
    /// kernel) and each bf16 engine of this CPU.
    #[test]
    fn bf16_products_multiply_the_rounded_operands() {
        type Product = Box<dyn Fn(usize, usize, usize, f32, &Strided, f32, &mut [f32])>;
        let mut products: Vec<(String, Product)> = vec![(
            "sgemm_bf16".into(),
            // SAFETY: the strides address a [m,k], b [k,n] and c [m, ldc] in bounds.
            Box::new(|m, n, k, alpha, s: &Strided, beta, c: &mut [f32]| unsafe {
                sgemm_bf16(m, n, k, alpha, s.a.as_ptr(), s.rsa, s.csa, s.b.as_ptr(), s.rsb, s.csb, beta, c.as_mut_ptr(), s.ldc)
            }),
        )];
        #[cfg(target_arch = "x86_64")]
        for engine in bf16_engines() {
            products.push((
                format!("{engine:?}"),
                // SAFETY: as above; the CPU has the engine.
                Box::new(move |m, n, k, alpha, s: &Strided, beta, c: &mut [f32]| unsafe {
                    crate::bf16mm::gemm(engine, m, n, k, alpha, s.a.as_ptr(), s.rsa, s.csa, s.b.as_ptr(), s.rsb, s.csb, beta, c.as_mut_ptr(), s.ldc)
                }),
            ));
        }
        let mut rng = SplitMix64::new(17);
        for &(m, n, k) in &[(1, 1, 1), (5, 17, 3), (13, 40, 64), (16, 32, 32), (33, 65, 100), (150, 20, 513), (40, 300, 70), (17, 40, 1100)] {
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                for (beta, alpha) in [(0.0f32, 1.0f32), (1.0, 1.0), (0.5, 1.0), (1.0, 0.125)] {
                    let st = strided(m, n, k, a_t, b_t, beta, &mut rng);
                    for (name, product) in &products {
                        let Strided { a, b, c0, ldc, rsa, csa, rsb, csb } = &st;
                        let (ldc, rsa, csa, rsb, csb) = (*ldc, *rsa, *csa, *rsb, *csb);
                        let mut c = c0.clone();
                        product(m, n, k, alpha, &st, beta, &mut c);
                        let r = |x: f32| quant::bf16_value(x) as f64;
                        let mut far_from_f32 = false;
                        each_in_c(&c, c0, m, n, ldc, |i, j, got| {
                            let old = if beta == 0.0 { 0.0 } else { beta as f64 * c0[i * ldc + j] as f64 };
                            let want = (0..k).map(|p| r(alpha * a[i * rsa + p * csa]) * r(b[p * rsb + j * csb])).sum::<f64>() + old;
                            let unrounded = (0..k).map(|p| alpha as f64 * a[i * rsa + p * csa] as f64 * b[p * rsb + j * csb] as f64).sum::<f64>() + old;
                            let tol = 1e-5 * (k as f64).sqrt() + 1e-6;
                            assert!((got as f64 - want).abs() <= tol, "{name} {m}x{n}x{k} a_t={a_t} b_t={b_t} alpha={alpha} beta={beta} at ({i},{j}): {got} vs {want}");
                            far_from_f32 |= (got as f64 - unrounded).abs() > tol;
                        });
                        assert!(far_from_f32 || k == 1, "{name} {m}x{n}x{k}: the product of the unrounded operands");
                    }
                }
            }
        }
    }

    /// A tile of C computed alone equals the same tile of the whole product, bit for bit (the
    /// callers split C across threads).
    #[test]
    fn tiles_of_c_are_bit_identical_to_the_whole() {
        let mut rng = SplitMix64::new(3);
        let (m, n, k) = (157, 301, 600);
        let a = random(m * k, &mut rng);
        let b = random(k * n, &mut rng);
        let mut whole = vec![0f32; m * n];
        // SAFETY: in bounds (row-major a [m,k], b [k,n], c [m,n]).
        unsafe { sgemm(m, n, k, 1.0, a.as_ptr(), k, 1, b.as_ptr(), n, 1, 0.0, whole.as_mut_ptr(), n) };
        let mut tiled = vec![0f32; m * n];
        for (i0, j0, mm, nn) in [(0, 0, 61, 200), (61, 0, 96, 200), (0, 200, 157, 101)] {
            // SAFETY: the tile lies inside a, b and c.
            unsafe {
                sgemm(mm, nn, k, 1.0, a.as_ptr().add(i0 * k), k, 1, b.as_ptr().add(j0), n, 1, 0.0, tiled.as_mut_ptr().add(i0 * n + j0), n)
            };
        }
        assert!(whole.iter().zip(&tiled).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// The register kernel alone, its panels in L1 (one 12x32 tile, k = KC, called again and
    /// again with beta 1): every element must hold the exact running sum, and the run reports
    /// the kernel's ceiling that the blocking aims at (~190 GFLOP/s a core in a release build on
    /// this repo's 2-core Xeon, where `ops::gemm` reaches ~165 on 2048x1536x576 single-threaded;
    /// `cargo test --release -p coa-model --lib kernel_in_l1 -- --nocapture`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn kernel_in_l1() {
        if kernel() != Kernel::Avx512 {
            eprintln!("kernel_in_l1: skipped, this CPU runs {:?}", kernel());
            return;
        }
        let (mr, nr) = (packed::avx512::MR, packed::avx512::NR);
        let a = vec![0.5f32; KC * mr];
        let b = vec![0.25f32; KC * nr + 16];
        let b0 = b.as_ptr().align_offset(64);
        let mut c = vec![0f32; mr * nr];
        let reps = 4000;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            // SAFETY: a [KC·MR], b [KC·NR] from b0 and c [MR·NR] are in bounds; the CPU has AVX-512F.
            unsafe { packed::avx512::tile(KC, 1.0, a.as_ptr(), b.as_ptr().add(b0), 1.0, c.as_mut_ptr(), nr, mr, nr) };
        }
        let flop = 2.0 * (mr * nr * KC) as f64 * reps as f64;
        eprintln!("avx512 tile, panels in L1: {:.1} GFLOP/s", flop / t.elapsed().as_secs_f64() / 1e9);
        // Each call adds KC · 0.5 · 0.25 = 32 to every element: sums of powers of two, exact in f32.
        let want = (KC as f32 * 0.125) * reps as f32;
        assert!(c.iter().all(|&x| x == want), "the tile's running sums differ from {want}");
    }
}
