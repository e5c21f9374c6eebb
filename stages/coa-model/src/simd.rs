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
    #[derive(Clone, Copy)]
    struct Out(*mut f32);
    unsafe impl Send for Out {}
    unsafe impl Sync for Out {}
    let outp = Out(out.as_mut_ptr());
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
