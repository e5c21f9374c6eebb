//! Single-threaded f32 matrix multiply with arbitrary strides, the inner engine of
//! [`crate::ops::gemm`] and of the attention's block products.
//!
//! On x86-64 CPUs with AVX2 and FMA it is a packed, cache-blocked GEMM (BLIS structure): B is
//! packed into column panels of 16 and A into row panels of 6 (blocks of KC along k, MC rows, NC
//! columns), and a 6×16 register-blocked kernel (12 ymm accumulators, the Zen / Haswell shape)
//! computes each C tile. Elsewhere it calls `matrixmultiply`.
//!
//! Every C element is `Σ_k a·b` accumulated in k order within each KC block, blocks added to C
//! in k order, whatever the position of the element in its tile or the tiling of C by the
//! caller: so splitting C across threads does not change any result bit.

/// Rows of A per register tile.
const MR: usize = 6;
/// Columns of B per register tile (two ymm vectors).
const NR: usize = 16;
/// Depth of a packed block: a 6×KC panel of A (6 KB) and a KC×16 panel of B (16 KB) fit in L1.
const KC: usize = 256;
/// Rows of A packed at once: MC×KC floats (144 KB) stay in L2.
const MC: usize = 144;
/// Columns of B packed at once: KC×NC floats (3 MB) stay in L3.
const NC: usize = 3072;

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
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if k > 0 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return avx2::sgemm(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, ldc);
        }
    }
    matrixmultiply::sgemm(
        m, k, n, alpha, a, rsa as isize, csa as isize, b, rsb as isize, csb as isize, beta, c, ldc as isize, 1,
    );
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{KC, MC, MR, NC, NR};
    use std::arch::x86_64::*;
    use std::cell::RefCell;

    thread_local! {
        /// This thread's packing buffers (A~ [MC·KC], B~ [KC·NC]), allocated once.
        static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }

    /// See [`super::sgemm`]; requires AVX2 and FMA, and k > 0.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sgemm(
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
        PACKED.with(|bufs| {
            let mut bufs = bufs.borrow_mut();
            let (pa, pb) = &mut *bufs;
            let need_a = MC.min(m.next_multiple_of(MR)) * KC.min(k);
            let need_b = KC.min(k) * NC.min(n.next_multiple_of(NR));
            if pa.len() < need_a {
                pa.resize(need_a, 0.0);
            }
            if pb.len() < need_b {
                pb.resize(need_b, 0.0);
            }
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    // The first k block applies beta; the later ones add to it.
                    let beta_blk = if pc == 0 { beta } else { 1.0 };
                    pack_b(pb, b.add(pc * rsb + jc * csb), rsb, csb, kc, nc);
                    for ic in (0..m).step_by(MC) {
                        let mc = MC.min(m - ic);
                        pack_a(pa, a.add(ic * rsa + pc * csa), rsa, csa, mc, kc);
                        for jr in (0..nc).step_by(NR) {
                            let nr = NR.min(nc - jr);
                            let bp = pb.as_ptr().add(jr * kc);
                            for ir in (0..mc).step_by(MR) {
                                let mr = MR.min(mc - ir);
                                let ap = pa.as_ptr().add(ir * kc);
                                let cp = c.add((ic + ir) * ldc + jc + jr);
                                kernel(kc, alpha, ap, bp, beta_blk, cp, ldc, mr, nr);
                            }
                        }
                    }
                }
            }
        });
    }

    /// Packs A[mc, kc] into row panels of MR: panel r holds, for each p, rows r·MR.. of column p
    /// (zero beyond mc).
    unsafe fn pack_a(dst: &mut [f32], a: *const f32, rsa: usize, csa: usize, mc: usize, kc: usize) {
        for (pi, i0) in (0..mc).step_by(MR).enumerate() {
            let rows = MR.min(mc - i0);
            let panel = &mut dst[pi * MR * kc..(pi + 1) * MR * kc];
            for p in 0..kc {
                let col = a.add(i0 * rsa + p * csa);
                let out = &mut panel[p * MR..(p + 1) * MR];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = if i < rows { *col.add(i * rsa) } else { 0.0 };
                }
            }
        }
    }

    /// Packs B[kc, nc] into column panels of NR: panel q holds, for each p, columns q·NR.. of
    /// row p (zero beyond nc).
    unsafe fn pack_b(dst: &mut [f32], b: *const f32, rsb: usize, csb: usize, kc: usize, nc: usize) {
        for (qi, j0) in (0..nc).step_by(NR).enumerate() {
            let cols = NR.min(nc - j0);
            let panel = &mut dst[qi * NR * kc..(qi + 1) * NR * kc];
            if csb == 1 && cols == NR {
                for p in 0..kc {
                    let row = std::slice::from_raw_parts(b.add(p * rsb + j0), NR);
                    panel[p * NR..(p + 1) * NR].copy_from_slice(row);
                }
            } else if rsb == 1 {
                // B stored transposed (a weight [n, k]): each column is contiguous in p.
                panel.iter_mut().for_each(|x| *x = 0.0);
                for j in 0..cols {
                    let col = b.add((j0 + j) * csb);
                    for p in 0..kc {
                        panel[p * NR + j] = *col.add(p);
                    }
                }
            } else {
                for p in 0..kc {
                    for j in 0..NR {
                        panel[p * NR + j] = if j < cols { *b.add(p * rsb + (j0 + j) * csb) } else { 0.0 };
                    }
                }
            }
        }
    }

    /// C[mr, nr] = alpha · Ã·B̃ + beta · C for one MR×NR tile from packed panels `a` [kc·MR] and
    /// `b` [kc·NR]. Partial tiles go through a local buffer, with the same arithmetic.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel(kc: usize, alpha: f32, a: *const f32, b: *const f32, beta: f32, c: *mut f32, ldc: usize, mr: usize, nr: usize) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a, b);
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
        let va = _mm256_set1_ps(alpha);
        let vb = _mm256_set1_ps(beta);
        if mr == MR && nr == NR {
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
            for (i, trow) in tile.iter().enumerate().take(mr) {
                let cr = c.add(i * ldc);
                for (j, &v) in trow.iter().enumerate().take(nr) {
                    let y = v * alpha;
                    *cr.add(j) = if beta != 0.0 { *cr.add(j) * beta + y } else { y };
                }
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

    /// Every register-tile edge (m, n not multiples of 6, 16), k across KC blocks, n across NC
    /// blocks, m across MC blocks, every stride layout, alpha, beta 0 over NaN and beta 1, and a
    /// C with a leading dimension wider than n: against an f64 reference.
    #[test]
    fn matches_f64_reference_on_edges_blocks_and_strides() {
        let mut rng = SplitMix64::new(7);
        let shapes = [(1, 1, 1), (5, 17, 3), (6, 16, 256), (13, 33, 257), (150, 20, 70), (7, NC + 21, 300), (145, 47, 513)];
        for &(m, n, k) in &shapes {
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, 1.0), (-2.0, 0.25)] {
                    let a = random(m * k, &mut rng);
                    let b = random(k * n, &mut rng);
                    let ldc = n + 3;
                    let c0: Vec<f32> = if beta == 0.0 { vec![f32::NAN; m * ldc] } else { random(m * ldc, &mut rng) };
                    let mut c = c0.clone();
                    let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
                    let (rsb, csb) = if b_t { (1, k) } else { (n, 1) };
                    // SAFETY: the strides address a [m,k], b [k,n] and c [m, ldc] in bounds.
                    unsafe { sgemm(m, n, k, alpha, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), ldc) };
                    for i in 0..m {
                        for j in 0..ldc {
                            let got = c[i * ldc + j];
                            if j >= n {
                                assert!(got.to_bits() == c0[i * ldc + j].to_bits(), "wrote outside C at ({i},{j})");
                                continue;
                            }
                            let dot: f64 = (0..k).map(|p| a[i * rsa + p * csa] as f64 * b[p * rsb + j * csb] as f64).sum();
                            let old = if beta == 0.0 { 0.0 } else { beta as f64 * c0[i * ldc + j] as f64 };
                            let want = alpha as f64 * dot + old;
                            let tol = 1e-5 * (k as f64).sqrt() * (alpha.abs() as f64 + 1.0) + 1e-6;
                            assert!((got as f64 - want).abs() <= tol, "{m}x{n}x{k} a_t={a_t} b_t={b_t} alpha={alpha} beta={beta} at ({i},{j}): {got} vs {want}");
                        }
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
}
