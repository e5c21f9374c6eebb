//! Small vectorisable kernels for the elementwise parts of the ops (exp, reductions), compiled
//! twice: for AVX2+FMA (picked at run time when the CPU has it) and for the baseline target.
//! Plain Rust loops; LLVM vectorises them inside the `target_feature` wrapper.

/// Defines `pub fn $name(...)` that dispatches to an AVX2+FMA build of the same body when the CPU
/// supports it (detection is cached by std), else runs the baseline build.
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn inner($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn fast($($arg: $ty),*) $(-> $ret)? { inner($($arg),*) }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the features `fast` was compiled for.
                    return unsafe { fast($($arg),*) };
                }
            }
            inner($($arg),*)
        }
    };
}

/// exp(x) for f32, branch-free (Cephes polynomial, max rel. error ~2 ulp on [-87.3, 88]);
/// inputs are clamped to that range (exp(−∞) gives ~1e-38, callers zero masked entries).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.336_55, 88.0);
    // n = round(x / ln 2) via the 1.5·2^23 trick (vectorises without SSE4.1 round).
    let t = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = t - 12_582_912.0;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r2 + r + 1.0;
    // 2^n from the exponent bits; n is an exact small integer in [-126, 128]
    let bits = ((n as i32 + 127) as u32) << 23;
    y * f32::from_bits(bits)
}

multiversion! {
    /// max over a slice (−∞ if empty).
    pub fn max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; 16];
        let n16 = x.len() / 16 * 16;
        for c in x[..n16].chunks_exact(16) {
            for l in 0..16 {
                acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &a in acc.iter().chain(&x[n16..]) {
            m = if a > m { a } else { m };
        }
        m
    }
}

multiversion! {
    /// Σ a_i b_i with 16 f32 lanes.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; 16];
        let n16 = n / 16 * 16;
        for (ca, cb) in a[..n16].chunks_exact(16).zip(b[..n16].chunks_exact(16)) {
            for l in 0..16 {
                acc[l] += ca[l] * cb[l];
            }
        }
        let mut s = 0f32;
        for v in acc {
            s += v;
        }
        for i in n16..n {
            s += a[i] * b[i];
        }
        s
    }
}

multiversion! {
    /// In place `x_i ← exp(x_i − shift)`; returns (Σ e_i, Σ e_i·(x_i − shift)), summed in f64.
    pub fn exp_shift_sums(x: &mut [f32], shift: f32) -> (f64, f64) {
        let mut s = [0f64; 8];
        let mut sz = [0f64; 8];
        let n8 = x.len() / 8 * 8;
        let (head, tail) = x.split_at_mut(n8);
        for c in head.chunks_exact_mut(8) {
            for l in 0..8 {
                let d = c[l] - shift;
                let e = exp_f32(d);
                s[l] += e as f64;
                sz[l] += (e * d) as f64;
                c[l] = e;
            }
        }
        let (mut a, mut b) = (0f64, 0f64);
        for l in 0..8 {
            a += s[l];
            b += sz[l];
        }
        for v in tail.iter_mut() {
            let d = *v - shift;
            let e = exp_f32(d);
            a += e as f64;
            b += (e * d) as f64;
            *v = e;
        }
        (a, b)
    }
}

multiversion! {
    /// In place `x_i ← exp(x_i · scale − shift)`; returns Σ (f32, 8 lanes).
    pub fn exp_affine_sum(x: &mut [f32], scale: f32, shift: f32) -> f32 {
        let mut s = [0f32; 8];
        let n8 = x.len() / 8 * 8;
        let (head, tail) = x.split_at_mut(n8);
        for c in head.chunks_exact_mut(8) {
            for l in 0..8 {
                let e = exp_f32(c[l] * scale - shift);
                s[l] += e;
                c[l] = e;
            }
        }
        let mut a = 0f32;
        for v in s {
            a += v;
        }
        for v in tail.iter_mut() {
            let e = exp_f32(*v * scale - shift);
            a += e;
            *v = e;
        }
        a
    }
}

multiversion! {
    /// In place `x_i ← x_i · s`.
    pub fn scale(x: &mut [f32], s: f32) {
        for v in x.iter_mut() {
            *v *= s;
        }
    }
}

multiversion! {
    /// In place dlogits from probabilities: `x_i ← −c · x_i · s` (x holds unnormalised probs).
    pub fn neg_scale(x: &mut [f32], s: f32) {
        for v in x.iter_mut() {
            *v *= -s;
        }
    }
}

multiversion! {
    /// In place `x_i ← −c · exp(x_i − l)` (dlogits without the one-hot term).
    pub fn neg_c_exp_shift(x: &mut [f32], c: f32, l: f32) {
        for v in x.iter_mut() {
            *v = -c * exp_f32(*v - l);
        }
    }
}

multiversion! {
    /// `out_i = silu(g_i) · u_i`.
    pub fn swiglu(out: &mut [f32], g: &[f32], u: &[f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            let s = 1.0 / (1.0 + exp_f32(-g));
            *o = g * s * u;
        }
    }
}

multiversion! {
    /// `dg_i += dy_i·u_i·σ(g_i)·(1 + g_i(1 − σ(g_i)))`, `du_i += dy_i·silu(g_i)`.
    pub fn swiglu_back(dg: &mut [f32], du: &mut [f32], dy: &[f32], g: &[f32], u: &[f32]) {
        let n = dg.len().min(du.len()).min(dy.len()).min(g.len()).min(u.len());
        for i in 0..n {
            let s = 1.0 / (1.0 + exp_f32(-g[i]));
            dg[i] += dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
            du[i] += dy[i] * g[i] * s;
        }
    }
}

multiversion! {
    /// Attention probability and score-gradient row: for `p` (scores on entry) and `dp`
    /// (dout·v on entry): `p_i ← exp(p_i·scale − lse)`, `dp_i ← p_i · (dp_i − delta)`.
    pub fn attn_ds_row(p: &mut [f32], dp: &mut [f32], scale: f32, lse: f32, delta: f32) {
        let n = p.len().min(dp.len());
        for i in 0..n {
            let e = exp_f32(p[i] * scale - lse);
            p[i] = e;
            dp[i] = e * (dp[i] - delta);
        }
    }
}

multiversion! {
    /// Like `attn_ds_row` with a per-column lse and delta (keys as rows, queries as columns):
    /// `p_c ← exp(p_c·scale − lse_c)`, `dp_c ← p_c · (dp_c − delta_c)`.
    pub fn attn_ds_row_cols(p: &mut [f32], dp: &mut [f32], scale: f32, lse: &[f32], delta: &[f32]) {
        let n = p.len().min(dp.len()).min(lse.len()).min(delta.len());
        for c in 0..n {
            let e = exp_f32(p[c] * scale - lse[c]);
            p[c] = e;
            dp[c] = e * (dp[c] - delta[c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let a = exp_f32(x) as f64;
            let b = (x as f64).exp();
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst rel err {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn reductions() {
        let x: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        assert_eq!(max(&x), 5.0);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let d = dot(&x, &x);
        let want: f32 = x.iter().map(|v| v * v).sum();
        assert!((d - want).abs() < 1e-4);
        let mut y = x.clone();
        let (s, _) = exp_shift_sums(&mut y, 5.0);
        let want: f64 = x.iter().map(|&v| ((v - 5.0) as f64).exp()).sum();
        assert!((s - want).abs() < 1e-5 * want);
    }
}

/// `out[R,O] = x[R,I] @ w[O,I]ᵀ` (written) for a few rows R (a decode step): every output is an
/// 8-lane dot product of its row and weight row, lanes summed in a fixed order, so a row's result
/// does not depend on the other rows. The AVX2+FMA kernel computes blocks of up to 3 rows × 4
/// outputs in registers: each weight vector loaded feeds 3 rows, each row vector 4 outputs, and
/// the weights are read straight from memory (no packing: at a few rows, packing them would cost
/// as much as the products). Parallel over blocks of 64 outputs.
pub fn linear_rows(out: &mut [f32], x: &[f32], w: &[f32], r: usize, i: usize, o: usize) {
    use rayon::prelude::*;
    assert!(out.len() == r * o && x.len() == r * i && w.len() == o * i, "linear_rows: shapes");
    const CHUNK: usize = 64;
    let outp = crate::ops::SendPtr(out.as_mut_ptr());
    (0..o.div_ceil(CHUNK)).into_par_iter().for_each(|ch| {
        let outp = outp;
        let (o0, o1) = (ch * CHUNK, ((ch + 1) * CHUNK).min(o));
        let mut oo = o0;
        while oo < o1 {
            let no = (o1 - oo).min(4);
            let mut t = 0;
            while t < r {
                let nr = (r - t).min(3);
                let mut acc = [[0f32; 4]; 3];
                dots_block(&x[t * i..(t + nr) * i], &w[oo * i..(oo + no) * i], i, nr, no, &mut acc);
                for (rr, row) in acc.iter().enumerate().take(nr) {
                    for (k, &v) in row.iter().enumerate().take(no) {
                        // SAFETY: (t + rr, oo + k) is inside out, and column oo + k belongs to this
                        // chunk's task alone.
                        unsafe { *outp.0.add((t + rr) * o + oo + k) = v };
                    }
                }
                t += nr;
            }
            oo += no;
        }
    });
}

/// Dot products of `nr` rows of `x[nr, I]` with `no` rows of `w[no, I]` into `acc[row][out]`.
fn dots_block(x: &[f32], w: &[f32], i: usize, nr: usize, no: usize, acc: &mut [[f32; 4]; 3]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features; slices hold nr·I and no·I values.
            unsafe { dots_block_avx2(x, w, i, nr, no, acc) };
            return;
        }
    }
    for r in 0..nr {
        for k in 0..no {
            let (xr, wr) = (&x[r * i..(r + 1) * i], &w[k * i..(k + 1) * i]);
            let mut lanes = [0f32; 8];
            let n8 = i / 8 * 8;
            for j in (0..n8).step_by(8) {
                for l in 0..8 {
                    lanes[l] = xr[j + l].mul_add(wr[j + l], lanes[l]);
                }
            }
            let mut s = hsum8(&lanes);
            for j in n8..i {
                s += xr[j] * wr[j];
            }
            acc[r][k] = s;
        }
    }
}

/// The fixed lane order of every 8-lane sum: (0+4, 1+5, 2+6, 3+7), then (a+c, b+d), then the two.
#[inline(always)]
fn hsum8(l: &[f32; 8]) -> f32 {
    let q = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_block_avx2(x: &[f32], w: &[f32], i: usize, nr: usize, no: usize, acc: &mut [[f32; 4]; 3]) {
    use std::arch::x86_64::*;
    let n8 = i / 8 * 8;
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut a = [[_mm256_setzero_ps(); 4]; 3];
    // Rows and outputs beyond nr / no point at row 0 / output 0 (valid memory); their sums are
    // not returned.
    let xr: [*const f32; 3] = std::array::from_fn(|r| xp.add(if r < nr { r * i } else { 0 }));
    let wr: [*const f32; 4] = std::array::from_fn(|k| wp.add(if k < no { k * i } else { 0 }));
    let mut j = 0;
    while j < n8 {
        let xv = [_mm256_loadu_ps(xr[0].add(j)), _mm256_loadu_ps(xr[1].add(j)), _mm256_loadu_ps(xr[2].add(j))];
        for k in 0..4 {
            let wv = _mm256_loadu_ps(wr[k].add(j));
            a[0][k] = _mm256_fmadd_ps(xv[0], wv, a[0][k]);
            a[1][k] = _mm256_fmadd_ps(xv[1], wv, a[1][k]);
            a[2][k] = _mm256_fmadd_ps(xv[2], wv, a[2][k]);
        }
        j += 8;
    }
    for r in 0..nr {
        for k in 0..no {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), a[r][k]);
            let mut s = hsum8(&lanes);
            for jj in n8..i {
                s += *xr[r].add(jj) * *wr[k].add(jj);
            }
            acc[r][k] = s;
        }
    }
}

/// Attention of one new token's `group` query heads that share one key/value head (a decode step
/// under grouped-query attention) against that head's `nk` cached keys and values:
/// `out[g] = softmax(q[g]·Kᵀ · scale) V` for `q[group, hd]`, `k[nk, hd]`, `v[nk, hd]` (rows
/// contiguous), `out[group, hd]`; `scores` is scratch (resized to `group·nk`).
///
/// Every cached key and value is read once for the whole group (not once per query head), and the
/// result depends only on `q`, `k` and `v`: each score is an 8-lane dot product reduced in a fixed
/// order (that of [`hsum8_pairs`]), the softmax is [`max`], [`exp_affine_sum`] and [`scale`], and
/// each output element sums p_j·v_j over j in order.
#[allow(clippy::too_many_arguments)]
pub fn attend_group(out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], group: usize, nk: usize, hd: usize, scale: f32, scores: &mut Vec<f32>) {
    assert!(
        out.len() == group * hd && q.len() == group * hd && k.len() >= nk * hd && v.len() >= nk * hd && nk > 0,
        "attend_group: shapes"
    );
    scores.resize(group * nk, 0.0);
    attend_scores(scores, q, k, group, nk, hd);
    for s in scores.chunks_mut(nk) {
        let mx = max(s) * scale;
        let sum = exp_affine_sum(s, scale, mx);
        self::scale(s, 1.0 / sum);
    }
    attend_values(out, scores, v, group, nk, hd);
}

/// The fixed summation order of an 8-lane dot product's lanes in [`attend_group`]:
/// ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), what the AVX2 kernel's `hadd` tree computes.
#[inline(always)]
fn hsum8_pairs(l: &[f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// `s[g, j] = q[g] · k[j]` for `s[group, nk]`.
fn attend_scores(s: &mut [f32], q: &[f32], k: &[f32], group: usize, nk: usize, hd: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if hd % 8 == 0 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features; the shapes were checked by the caller.
            unsafe { attend_scores_avx2(s, q, k, group, nk, hd) };
            return;
        }
    }
    attend_scores_plain(s, q, k, group, nk, hd);
}

/// The portable [`attend_scores`] (same sums, same order as the AVX2 kernel).
fn attend_scores_plain(s: &mut [f32], q: &[f32], k: &[f32], group: usize, nk: usize, hd: usize) {
    for g in 0..group {
        let qg = &q[g * hd..(g + 1) * hd];
        for j in 0..nk {
            let kj = &k[j * hd..(j + 1) * hd];
            let mut lanes = [0f32; 8];
            let n8 = hd / 8 * 8;
            for d in (0..n8).step_by(8) {
                for l in 0..8 {
                    lanes[l] = qg[d + l].mul_add(kj[d + l], lanes[l]);
                }
            }
            let mut acc = hsum8_pairs(&lanes);
            for d in n8..hd {
                acc += qg[d] * kj[d];
            }
            s[g * nk + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_scores_avx2(s: &mut [f32], q: &[f32], k: &[f32], group: usize, nk: usize, hd: usize) {
    use std::arch::x86_64::*;
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    // Blocks of 4 keys; a last partial block repeats its last key (valid memory), whose extra
    // sums are not stored.
    let mut j = 0;
    while j < nk {
        let nb = (nk - j).min(4);
        let kr: [*const f32; 4] = std::array::from_fn(|t| kp.add((j + t.min(nb - 1)) * hd));
        for g in 0..group {
            let qg = qp.add(g * hd);
            let mut a = [_mm256_setzero_ps(); 4];
            let mut d = 0;
            while d < hd {
                let qv = _mm256_loadu_ps(qg.add(d));
                for t in 0..4 {
                    a[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[t].add(d)), a[t]);
                }
                d += 8;
            }
            // lanes (0+1, 2+3) of a0, a1, then of a2, a3; then (01+23); then the two halves.
            let h01 = _mm256_hadd_ps(a[0], a[1]);
            let h23 = _mm256_hadd_ps(a[2], a[3]);
            let h = _mm256_hadd_ps(h01, h23);
            let sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            let mut four = [0f32; 4];
            _mm_storeu_ps(four.as_mut_ptr(), sums);
            s[g * nk + j..g * nk + j + nb].copy_from_slice(&four[..nb]);
        }
        j += nb;
    }
}

/// `out[g] = Σ_j p[g, j] · v[j]` for `p[group, nk]`, `out[group, hd]`.
fn attend_values(out: &mut [f32], p: &[f32], v: &[f32], group: usize, nk: usize, hd: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if hd % 8 == 0 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features; the shapes were checked by the caller.
            unsafe { attend_values_avx2(out, p, v, group, nk, hd) };
            return;
        }
    }
    attend_values_plain(out, p, v, group, nk, hd);
}

/// The portable [`attend_values`] (same sums, same order as the AVX2 kernel).
fn attend_values_plain(out: &mut [f32], p: &[f32], v: &[f32], group: usize, nk: usize, hd: usize) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for g in 0..group {
        let o = &mut out[g * hd..(g + 1) * hd];
        for j in 0..nk {
            let pj = p[g * nk + j];
            o.iter_mut().zip(&v[j * hd..(j + 1) * hd]).for_each(|(a, &b)| *a = pj.mul_add(b, *a));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_values_avx2(out: &mut [f32], p: &[f32], v: &[f32], group: usize, nk: usize, hd: usize) {
    // Up to 3 query heads × 32 output columns in 12 registers; each value vector loaded feeds
    // the 3 heads.
    let mut g0 = 0;
    while g0 < group {
        let ng = (group - g0).min(3);
        let mut c = 0;
        while c < hd {
            match (hd - c) / 8 {
                1 => attend_values_cols::<1>(out, p, v, g0, ng, nk, hd, c),
                2 => attend_values_cols::<2>(out, p, v, g0, ng, nk, hd, c),
                3 => attend_values_cols::<3>(out, p, v, g0, ng, nk, hd, c),
                _ => attend_values_cols::<4>(out, p, v, g0, ng, nk, hd, c),
            }
            c += 8 * ((hd - c) / 8).min(4);
        }
        g0 += ng;
    }
}

/// Columns `c..c + 8·NC` of heads `g0..g0 + ng` (ng ≤ 3) of [`attend_values`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_values_cols<const NC: usize>(out: &mut [f32], p: &[f32], v: &[f32], g0: usize, ng: usize, nk: usize, hd: usize, c: usize) {
    use std::arch::x86_64::*;
    let (vp, op) = (v.as_ptr(), out.as_mut_ptr());
    // Heads beyond ng read head g0's probabilities (valid memory); their sums are not stored.
    let pr: [*const f32; 3] = std::array::from_fn(|g| p.as_ptr().add((g0 + if g < ng { g } else { 0 }) * nk));
    let mut a = [[_mm256_setzero_ps(); NC]; 3];
    for j in 0..nk {
        let vr = vp.add(j * hd + c);
        let pb = [_mm256_broadcast_ss(&*pr[0].add(j)), _mm256_broadcast_ss(&*pr[1].add(j)), _mm256_broadcast_ss(&*pr[2].add(j))];
        for t in 0..NC {
            let vv = _mm256_loadu_ps(vr.add(8 * t));
            a[0][t] = _mm256_fmadd_ps(pb[0], vv, a[0][t]);
            a[1][t] = _mm256_fmadd_ps(pb[1], vv, a[1][t]);
            a[2][t] = _mm256_fmadd_ps(pb[2], vv, a[2][t]);
        }
    }
    for (g, ag) in a.iter().enumerate().take(ng) {
        for (t, &at) in ag.iter().enumerate() {
            _mm256_storeu_ps(op.add((g0 + g) * hd + c + 8 * t), at);
        }
    }
}

#[cfg(test)]
mod attend_tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// softmax(q·Kᵀ·scale)·V in f64, one query head at a time.
    fn reference(q: &[f32], k: &[f32], v: &[f32], group: usize, nk: usize, hd: usize, scale: f32) -> Vec<f64> {
        let mut out = vec![0f64; group * hd];
        for g in 0..group {
            let sc: Vec<f64> = (0..nk)
                .map(|j| (0..hd).map(|d| q[g * hd + d] as f64 * k[j * hd + d] as f64).sum::<f64>() * scale as f64)
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..nk {
                for d in 0..hd {
                    out[g * hd + d] += e[j] / z * v[j * hd + d] as f64;
                }
            }
        }
        out
    }

    #[test]
    fn attend_group_matches_the_f64_reference() {
        // GQA groups 1..7, head dims with and without a full 32-column block, 1 to 1000+ keys.
        for (group, hd, nk) in [(3, 64, 1), (3, 64, 5), (3, 64, 1031), (1, 8, 3), (2, 16, 70), (4, 24, 9), (7, 40, 33), (2, 12, 6)] {
            let (q, k, v) = (random(group * hd, 1), random(nk * hd, 2), random(nk * hd, 3));
            let scale = 1.0 / (hd as f32).sqrt();
            let mut out = vec![f32::NAN; group * hd];
            let mut scratch = Vec::new();
            attend_group(&mut out, &q, &k, &v, group, nk, hd, scale, &mut scratch);
            let want = reference(&q, &k, &v, group, nk, hd, scale);
            let err = out.iter().zip(&want).map(|(&a, &b)| (a as f64 - b).abs()).fold(0f64, f64::max);
            assert!(err < 2e-5, "group {group} hd {hd} nk {nk}: max abs err {err}");
        }
    }

    #[test]
    fn attend_kernels_equal_the_portable_ones_bit_for_bit() {
        for (group, hd, nk) in [(3, 64, 1), (3, 64, 1031), (2, 16, 70), (4, 24, 9), (7, 40, 33)] {
            let (q, k, p) = (random(group * hd, 4), random(nk * hd, 5), random(group * nk, 6));
            let (mut s1, mut s2) = (vec![0f32; group * nk], vec![1f32; group * nk]);
            attend_scores(&mut s1, &q, &k, group, nk, hd);
            attend_scores_plain(&mut s2, &q, &k, group, nk, hd);
            assert_eq!(s1, s2, "scores: group {group} hd {hd} nk {nk}");
            let (mut o1, mut o2) = (vec![0f32; group * hd], vec![1f32; group * hd]);
            attend_values(&mut o1, &p, &k, group, nk, hd);
            attend_values_plain(&mut o2, &p, &k, group, nk, hd);
            assert_eq!(o1, o2, "values: group {group} hd {hd} nk {nk}");
        }
    }
}

/// GFLOP/s (the best of many calls: a busy machine disturbs the median) of [`linear_rows`] and
/// [`linear_rows_blocked`] on SmolLM2-135M's shapes, at ROWS rows (default 1, 16, 32):
/// `ROWS="16 32" cargo test -p coa-model --lib linear_rows_speed -- --ignored --nocapture`
#[cfg(test)]
#[test]
#[ignore = "a measurement: run alone on a quiet machine"]
fn linear_rows_speed() {
    let rows: Vec<usize> = std::env::var("ROWS")
        .map_or(vec![1, 16, 32], |s| s.split_whitespace().map(|a| a.parse().expect("ROWS")).collect());
    type Rows = fn(&mut [f32], &[f32], &[f32], usize, usize, usize);
    for &r in &rows {
        for (i, o) in [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49174)] {
            let sgemm: Rows = |out, x, w, r, i, o| crate::ops::linear_forward(out, x, w, None, r, i, o);
            for (name, f) in [("linear_rows", linear_rows as Rows), ("linear_rows_blocked", linear_rows_blocked), ("ops::linear_forward", sgemm)] {
                let x: Vec<f32> = (0..r * i).map(|k| (k % 7) as f32 * 0.1).collect();
                let w: Vec<f32> = (0..o * i).map(|k| (k % 5) as f32 * 0.1).collect();
                let mut out = vec![0f32; r * o];
                let flop = 2.0 * (r * i * o) as f64;
                let reps = (4e9 / flop).clamp(5.0, 5000.0) as usize;
                let mut best = f64::INFINITY;
                for _ in 0..reps {
                    let t0 = std::time::Instant::now();
                    f(&mut out, &x, &w, r, i, o);
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                println!("{name:20} rows {r:3} {i:5}x{o:5}: {:6.1} GFLOP/s", flop / best / 1e9);
            }
        }
    }
}

/// `out[R,O] = x[R,I] @ w[O,I]ᵀ` for the few rows of a decode step, as dot products (no packing
/// of the weights), each row's result independent of the other rows: on CPUs with AVX-512,
/// [`linear_rows_avx512`]; with AVX2, [`linear_rows`]'s result bit for bit from a faster block
/// ([`linear_rows_avx2`]); else [`linear_rows`].
pub fn linear_rows_blocked(out: &mut [f32], x: &[f32], w: &[f32], r: usize, i: usize, o: usize) {
    assert!(out.len() == r * o && x.len() == r * i && w.len() == o * i, "linear_rows_blocked: shapes");
    #[cfg(target_arch = "x86_64")]
    {
        match crate::sgemm::kernel() {
            crate::sgemm::Kernel::Avx512 => return linear_rows_avx512(out, x, w, r, i, o),
            crate::sgemm::Kernel::Avx2 => return linear_rows_avx2(out, x, w, r, i, o),
            crate::sgemm::Kernel::Portable => {}
        }
    }
    linear_rows(out, x, w, r, i, o);
}

/// [`linear_rows_blocked`]'s AVX2 + FMA path (the CPU must have both): [`linear_rows`] with the
/// same result bit for bit (each output's 8 lanes accumulate over the inputs in the same order
/// and are reduced by the same `hsum8`), from a 3-row × 3-output register block that fits AVX2's
/// 16 registers (9 sums, 3 row vectors, 1 weight vector): the 3 × 4 block of [`linear_rows`]
/// needs 16 plus a temporary, and LLVM spills its sums to the stack, which made it ~3x slower
/// than sgemm at 32 rows. Rows are taken 12 at a time (their 27 KiB of x at 576 inputs stays in
/// L1 while 3 weight rows stream past), in parallel over blocks of 32 outputs.
#[cfg(target_arch = "x86_64")]
fn linear_rows_avx2(out: &mut [f32], x: &[f32], w: &[f32], r: usize, i: usize, o: usize) {
    use rayon::prelude::*;
    const CHUNK: usize = 32;
    const RT: usize = 12;
    let outp = crate::ops::SendPtr(out.as_mut_ptr());
    let n8 = i / 8 * 8;
    (0..o.div_ceil(CHUNK)).into_par_iter().for_each(|ch| {
        let outp = outp;
        let (o0, o1) = (ch * CHUNK, ((ch + 1) * CHUNK).min(o));
        for t0 in (0..r).step_by(RT) {
            let t1 = (t0 + RT).min(r);
            for oo in (o0..o1).step_by(3) {
                let no = (o1 - oo).min(3);
                for t in (t0..t1).step_by(3) {
                    let nr = (t1 - t).min(3);
                    // Rows / outputs beyond nr / no repeat row t / output oo (valid
                    // memory); their sums are not kept.
                    let xr: [&[f32]; 3] = std::array::from_fn(|q| &x[(t + if q < nr { q } else { 0 }) * i..][..i]);
                    let wr: [&[f32]; 3] = std::array::from_fn(|k| &w[(oo + if k < no { k } else { 0 }) * i..][..i]);
                    // SAFETY: the CPU has the features; every slice holds i ≥ n8 values.
                    let lanes = unsafe { dots3x3_avx2(xr, wr, n8) };
                    for q in 0..nr {
                        for k in 0..no {
                            let mut s = hsum8(&lanes[q][k]);
                            for jj in n8..i {
                                s += xr[q][jj] * wr[k][jj];
                            }
                            // SAFETY: (t + q, oo + k) is inside out, and column oo + k
                            // belongs to this chunk alone.
                            unsafe { *outp.0.add((t + q) * o + oo + k) = s };
                        }
                    }
                }
            }
        }
    });
}

/// The 8-lane partial sums of 3 rows · 3 weight rows over the first `n8` inputs (a multiple of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots3x3_avx2(x: [&[f32]; 3], w: [&[f32]; 3], n8: usize) -> [[[f32; 8]; 3]; 3] {
    use std::arch::x86_64::*;
    let (x0, x1, x2) = (x[0].as_ptr(), x[1].as_ptr(), x[2].as_ptr());
    let (w0, w1, w2) = (w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr());
    let z = _mm256_setzero_ps();
    let (mut a00, mut a01, mut a02, mut a10, mut a11, mut a12, mut a20, mut a21, mut a22) = (z, z, z, z, z, z, z, z, z);
    let mut j = 0;
    while j < n8 {
        let (v0, v1, v2) = (_mm256_loadu_ps(x0.add(j)), _mm256_loadu_ps(x1.add(j)), _mm256_loadu_ps(x2.add(j)));
        let u = _mm256_loadu_ps(w0.add(j));
        a00 = _mm256_fmadd_ps(v0, u, a00);
        a10 = _mm256_fmadd_ps(v1, u, a10);
        a20 = _mm256_fmadd_ps(v2, u, a20);
        let u = _mm256_loadu_ps(w1.add(j));
        a01 = _mm256_fmadd_ps(v0, u, a01);
        a11 = _mm256_fmadd_ps(v1, u, a11);
        a21 = _mm256_fmadd_ps(v2, u, a21);
        let u = _mm256_loadu_ps(w2.add(j));
        a02 = _mm256_fmadd_ps(v0, u, a02);
        a12 = _mm256_fmadd_ps(v1, u, a12);
        a22 = _mm256_fmadd_ps(v2, u, a22);
        j += 8;
    }
    let mut lanes = [[[0f32; 8]; 3]; 3];
    for (l, a) in lanes.iter_mut().flatten().zip([a00, a01, a02, a10, a11, a12, a20, a21, a22]) {
        _mm256_storeu_ps(l.as_mut_ptr(), a);
    }
    lanes
}

/// [`linear_rows_blocked`] on CPUs with AVX-512: each output is a 16-lane dot product over the
/// first `i / 16 * 16` inputs, reduced by one fixed tree ([`hsum16_avx512`]), plus the tail in order, so
/// a row's result is the same whatever the number of rows (the sum order differs from the AVX2
/// path's, which this CPU does not run). A decode step is bound by reading the weights: one
/// 64-byte load of a weight row feeds one FMA per row of the block, and the register blocks are
/// 1 row × 8 outputs (batch 1: eight weight streams in flight) or up to 6 rows × 4 outputs
/// (24 sums in 32 registers), in parallel over blocks of 32 outputs.
#[cfg(target_arch = "x86_64")]
fn linear_rows_avx512(out: &mut [f32], x: &[f32], w: &[f32], r: usize, i: usize, o: usize) {
    use rayon::prelude::*;
    const CHUNK: usize = 32;
    let outp = crate::ops::SendPtr(out.as_mut_ptr());
    (0..o.div_ceil(CHUNK)).into_par_iter().for_each(|ch| {
        let outp = outp;
        let (o0, o1) = (ch * CHUNK, ((ch + 1) * CHUNK).min(o));
        let ob = if r == 1 { 8 } else { 4 };
        for oo in (o0..o1).step_by(ob) {
            let no = (o1 - oo).min(ob);
            let mut t = 0;
            while t < r {
                let nr = (r - t).min(6);
                let xs = &x[t * i..(t + nr) * i];
                let ws = &w[oo * i..(oo + no) * i];
                let mut sums = [[0f32; 8]; 6];
                // SAFETY: the kernel was detected; xs holds nr rows and ws no rows of i values.
                unsafe {
                    match nr {
                        1 => dots_avx512::<1, 8>(xs, ws, i, no, &mut sums),
                        2 => dots_avx512::<2, 4>(xs, ws, i, no, &mut sums),
                        3 => dots_avx512::<3, 4>(xs, ws, i, no, &mut sums),
                        4 => dots_avx512::<4, 4>(xs, ws, i, no, &mut sums),
                        5 => dots_avx512::<5, 4>(xs, ws, i, no, &mut sums),
                        _ => dots_avx512::<6, 4>(xs, ws, i, no, &mut sums),
                    }
                }
                for (q, row) in sums.iter().enumerate().take(nr) {
                    for (k, &s) in row.iter().enumerate().take(no) {
                        // SAFETY: (t + q, oo + k) is inside out, and column oo + k belongs to
                        // this chunk alone.
                        unsafe { *outp.0.add((t + q) * o + oo + k) = s };
                    }
                }
                t += nr;
            }
        }
    });
}

/// `sums[q][k] = x[q] · w[k]` for the R rows of `x[R, I]` and the first `no ≤ O` rows of
/// `w[no, I]` (outputs beyond `no` reread row 0 and are not written).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512<const R: usize, const O: usize>(x: &[f32], w: &[f32], i: usize, no: usize, sums: &mut [[f32; 8]; 6]) {
    use std::arch::x86_64::*;
    let n16 = i / 16 * 16;
    let xr: [*const f32; R] = std::array::from_fn(|q| x.as_ptr().add(q * i));
    let wr: [*const f32; O] = std::array::from_fn(|k| w.as_ptr().add(if k < no { k * i } else { 0 }));
    let mut acc = [[_mm512_setzero_ps(); O]; R];
    let mut j = 0;
    while j < n16 {
        let xv: [__m512; R] = std::array::from_fn(|q| _mm512_loadu_ps(xr[q].add(j)));
        for k in 0..O {
            let u = _mm512_loadu_ps(wr[k].add(j));
            for q in 0..R {
                acc[q][k] = _mm512_fmadd_ps(xv[q], u, acc[q][k]);
            }
        }
        j += 16;
    }
    // The sums leave the registers through memory: reduced in place, LLVM spilled the
    // accumulators inside the loop above (~10% slower decode).
    let acc = std::hint::black_box(acc);
    for q in 0..R {
        for k in 0..no {
            let mut s = hsum16_avx512(acc[q][k]);
            for jj in n16..i {
                s += *xr[q].add(jj) * *wr[k].add(jj);
            }
            sums[q][k] = s;
        }
    }
}

/// The 16 lanes' sum in one fixed order (halves folded, then [`hsum8`]'s tree), in registers:
/// stored and summed as scalars, the sums took as long as the dot products at 576 inputs.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum16_avx512(a: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    // m[k] = l[k] + l[k + 8]
    let m = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))));
    // q[k] = m[k] + m[k + 4]
    let q = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    // p = [q0 + q2, q1 + q3], then p0 + p1
    let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)))
}

#[cfg(all(test, target_arch = "x86_64"))]
#[test]
fn avx512_rows_do_not_depend_on_the_batch_and_match_f64() {
    if crate::sgemm::kernel() != crate::sgemm::Kernel::Avx512 {
        eprintln!("avx512_rows_do_not_depend_on_the_batch_and_match_f64: skipped, this CPU runs no AVX-512 kernel");
        return;
    }
    // The register reduction is hsum8 of the folded halves, bit for bit.
    let l: [f32; 16] = std::array::from_fn(|k| ((k * 7919 % 113) as f32 - 56.0) * 1.37e-3 * (1 << (k % 9)) as f32);
    // SAFETY: the CPU has AVX-512F (the kernel was detected).
    let got = unsafe { hsum16_avx512(std::arch::x86_64::_mm512_loadu_ps(l.as_ptr())) };
    assert_eq!(got.to_bits(), hsum8(&std::array::from_fn(|k| l[k] + l[k + 8])).to_bits());
    // rows across the 1-row and 6-row blocks, inputs across the 16-lane tail, outputs across the
    // 8- and 4-output groups and the 32-output tasks.
    for (r, i, o) in [(1, 576, 70), (2, 9, 5), (16, 576, 192), (13, 300, 37), (7, 1536, 33), (40, 7, 3), (6, 520, 129)] {
        let x: Vec<f32> = (0..r * i).map(|k| ((k * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let w: Vec<f32> = (0..o * i).map(|k| ((k * 53 % 97) as f32 - 48.0) * 0.011).collect();
        let mut all = vec![f32::NAN; r * o];
        linear_rows_avx512(&mut all, &x, &w, r, i, o);
        for t in 0..r {
            let mut one = vec![f32::NAN; o];
            linear_rows_avx512(&mut one, &x[t * i..(t + 1) * i], &w, 1, i, o);
            assert_eq!(one, all[t * o..(t + 1) * o], "rows {r}, inputs {i}, outputs {o}: row {t} alone differs");
        }
        let err = (0..r * o)
            .map(|e| (all[e] as f64 - (0..i).map(|j| x[e / o * i + j] as f64 * w[e % o * i + j] as f64).sum::<f64>()).abs())
            .fold(0f64, f64::max);
        assert!(err < 1e-3, "rows {r}, inputs {i}, outputs {o}: max abs err {err} against f64");
    }
}

#[cfg(test)]
#[test]
fn linear_rows_blocked_equals_linear_rows_bit_for_bit() {
    // rows across the 3-row blocks and 12-row tiles, inputs across the 256 block and the 8-lane
    // tail, outputs across the 4-output groups and 32-output tasks.
    for (r, i, o) in [
        (1, 576, 70),
        (2, 9, 5),
        (16, 576, 192),
        (32, 1536, 33),
        (13, 300, 64),
        (40, 7, 3),
        (5, 520, 129),
    ] {
        let x: Vec<f32> = (0..r * i)
            .map(|k| ((k * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let w: Vec<f32> = (0..o * i)
            .map(|k| ((k * 53 % 97) as f32 - 48.0) * 0.011)
            .collect();
        let (mut a, mut b) = (vec![0f32; r * o], vec![1f32; r * o]);
        linear_rows(&mut a, &x, &w, r, i, o);
        #[cfg(target_arch = "x86_64")]
        if crate::sgemm::kernel() != crate::sgemm::Kernel::Portable {
            // The AVX2 path, whichever path this CPU's linear_rows_blocked takes.
            linear_rows_avx2(&mut b, &x, &w, r, i, o);
            assert_eq!(a, b, "rows {r}, inputs {i}, outputs {o}");
        }
        linear_rows_blocked(&mut b, &x, &w, r, i, o);
        let want: Vec<f64> = (0..r * o)
            .map(|e| {
                (0..i)
                    .map(|j| x[e / o * i + j] as f64 * w[e % o * i + j] as f64)
                    .sum()
            })
            .collect();
        let err = b
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0f64, f64::max);
        assert!(
            err < 1e-3,
            "rows {r}, inputs {i}, outputs {o}: max abs err {err} against f64"
        );
    }
}
