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
                /// # Safety
                /// The CPU supports AVX2 and FMA (checked just below).
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
    y * pow2_of_rounded(t)
}

/// 2^n for `exp_f32`'s `t = 1.5·2^23 + n`: t is an integer in [2^23, 2^24), so its mantissa bits
/// hold n exactly. Read from the bits rather than `n as i32`, whose saturating conversion LLVM
/// cannot vectorise (it went lane by lane: 17% of a decode's time).
#[inline(always)]
fn pow2_of_rounded(t: f32) -> f32 {
    f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127) << 23)
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
    fn exponent_bits_are_the_rounded_integer() {
        // Every t exp_f32 can form (x clamped to [-87.34, 88]: n in [-126, 127]).
        for n in -126i32..=127 {
            let t = 12_582_912.0f32 + n as f32;
            let want = f32::from_bits(((n + 127) as u32) << 23);
            assert_eq!(pow2_of_rounded(t).to_bits(), want.to_bits(), "n = {n}");
        }
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

/// A KV cache head's keys or values as stored: f32, or bf16 bits (widened exactly on load).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl KvRows<'_> {
    /// Values held.
    pub fn n_values(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::Bf16(x) => x.len(),
        }
    }
}

/// A stored KV element, widened to f32.
pub(crate) trait KvElem: Copy {
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::quant::bf16_to_f32(self)
    }
}

/// Keys per tile of a KV cache head's keys (see [`key_at`]).
pub const KEY_TILE: usize = 16;

/// Where element `d` of key `j` lies among one head's cached keys, stored in tiles of
/// [`KEY_TILE`] keys, each `[hd, KEY_TILE]` (one dimension of 16 consecutive keys is one
/// 64-byte vector): a decode step's scores `q·kⱼ` then run down the dimensions with one FMA per
/// 16 keys and no horizontal sums.
#[inline]
pub fn key_at(j: usize, d: usize, hd: usize) -> usize {
    (j / KEY_TILE * hd + d) * KEY_TILE + j % KEY_TILE
}

/// What one [`attend_group`] call attends: `group` query heads of `hd` values over the first `nk`
/// cached keys, those before `lo` out of the sliding window, scores scaled by `scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupShape {
    pub group: usize,
    pub lo: usize,
    pub nk: usize,
    pub hd: usize,
    pub scale: f32,
}

/// Attention of one new token's `group` query heads that share one key/value head (a decode step
/// under grouped-query attention) against that head's `nk` cached keys and values (`shape`):
/// `out[g] = softmax(q[g]·Kᵀ · scale) V` for `q[group, hd]`, keys `kt` in tiles ([`key_at`],
/// `nk.div_ceil(KEY_TILE)` whole tiles), `v[nk, hd]` (rows contiguous), `out[group, hd]`; keys
/// before `lo` (out of a sliding window) are left out of the softmax;
/// `scores` is scratch (resized to `group·nk`).
///
/// Every cached key and value is read once for the whole group (not once per query head), and the
/// result depends only on `q`, the keys and `v`: each score sums q[d]·k[d] by FMA in d order, the
/// softmax is [`max`], [`exp_affine_sum`] and [`scale`], and each output element sums p_j·v_j
/// over j in order.
pub fn attend_group(out: &mut [f32], q: &[f32], kt: KvRows, v: KvRows, shape: GroupShape, scores: &mut Vec<f32>) {
    let GroupShape { group, lo, nk, hd, scale } = shape;
    assert!(
        out.len() == group * hd && q.len() == group * hd && kt.n_values() >= nk.div_ceil(KEY_TILE) * KEY_TILE * hd && v.n_values() >= nk * hd && lo < nk,
        "attend_group: shapes"
    );
    scores.resize(group * nk, 0.0);
    attend_scores(scores, q, kt, v, group, nk, hd);
    for s in scores.chunks_mut(nk) {
        // keys before `lo` (out of a sliding window) weigh 0
        s[..lo].iter_mut().for_each(|x| *x = 0.0);
        let s = &mut s[lo..];
        let mx = max(s) * scale;
        let sum = exp_affine_sum(s, scale, mx);
        self::scale(s, 1.0 / sum);
    }
    attend_values(out, scores, v, group, nk, hd);
}

/// `s[g, j] = q[g] · k[j]` for `s[group, nk]`, keys in tiles; the values `v` that come next are
/// asked for from memory meanwhile (AVX-512 path).
fn attend_scores(s: &mut [f32], q: &[f32], kt: KvRows, v: KvRows, group: usize, nk: usize, hd: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature; the shapes were checked by the caller.
            unsafe { attend_scores_avx512(s, q, kt, v, group, nk, hd) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            unsafe {
                match kt {
                    KvRows::F32(k) => attend_scores_fma(s, q, k, group, nk, hd),
                    KvRows::Bf16(k) => attend_scores_fma(s, q, k, group, nk, hd),
                }
            }
            return;
        }
    }
    match kt {
        KvRows::F32(k) => attend_scores_plain(s, q, k, group, nk, hd),
        KvRows::Bf16(k) => attend_scores_plain(s, q, k, group, nk, hd),
    }
}

/// The portable [`attend_scores`] (the same sums in the same order as the vector kernels).
#[inline(always)]
fn attend_scores_plain<T: KvElem>(s: &mut [f32], q: &[f32], kt: &[T], group: usize, nk: usize, hd: usize) {
    for t in 0..nk.div_ceil(KEY_TILE) {
        let tile = &kt[t * hd * KEY_TILE..(t + 1) * hd * KEY_TILE];
        let n = (nk - t * KEY_TILE).min(KEY_TILE);
        for g in 0..group {
            let mut acc = [0f32; KEY_TILE];
            for (qd, kd) in q[g * hd..(g + 1) * hd].iter().zip(tile.chunks_exact(KEY_TILE)) {
                acc.iter_mut().zip(kd).for_each(|(a, &k)| *a = qd.mul_add(k.to_f32(), *a));
            }
            s[g * nk + t * KEY_TILE..][..n].copy_from_slice(&acc[..n]);
        }
    }
}

/// [`attend_scores_plain`] compiled for AVX2 + FMA (vectorised by the compiler, the same bits).
///
/// # Safety
/// The CPU has AVX2 and FMA (the slices are bounds-checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_scores_fma<T: KvElem>(s: &mut [f32], q: &[f32], kt: &[T], group: usize, nk: usize, hd: usize) {
    attend_scores_plain(s, q, kt, group, nk, hd)
}

/// 16 consecutive stored values from `p`, widened to f32 (`BF16`: u16 bits, else f32).
///
/// # Safety
/// The CPU has AVX-512F; `p` addresses 16 readable values (bf16 bits when BF16, else f32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16<const BF16: bool>(p: *const u8) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i))))
    } else {
        _mm512_loadu_ps(p as *const f32)
    }
}

/// [`attend_scores`] on AVX-512: two tiles (32 keys) at a time against up to four query heads
/// (eight accumulator chains, enough to hide the FMA latency).
///
/// # Safety
/// The CPU has AVX-512F; the shapes [`attend_group`] asserts: `s` holds `group·nk` values, `q`
/// `group·hd`, `kt` `nk.div_ceil(KEY_TILE)` whole tiles of `KEY_TILE·hd` (`v` is only
/// prefetched).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_scores_avx512(s: &mut [f32], q: &[f32], kt: KvRows, v: KvRows, group: usize, nk: usize, hd: usize) {
    let (k, bf16) = match kt {
        KvRows::F32(k) => (k.as_ptr() as *const u8, false),
        KvRows::Bf16(k) => (k.as_ptr() as *const u8, true),
    };
    let v = match v {
        KvRows::F32(v) => v.as_ptr() as *const u8,
        KvRows::Bf16(v) => v.as_ptr() as *const u8,
    };
    let mut g0 = 0;
    while g0 < group {
        // The first pass over the keys asks for the values.
        let pv = if g0 == 0 { v } else { std::ptr::null() };
        match (group - g0, bf16) {
            (1, false) => scores_heads::<1, false>(s, q, k, pv, g0, nk, hd),
            (2, false) => scores_heads::<2, false>(s, q, k, pv, g0, nk, hd),
            (3, false) => scores_heads::<3, false>(s, q, k, pv, g0, nk, hd),
            (_, false) => scores_heads::<4, false>(s, q, k, pv, g0, nk, hd),
            (1, true) => scores_heads::<1, true>(s, q, k, pv, g0, nk, hd),
            (2, true) => scores_heads::<2, true>(s, q, k, pv, g0, nk, hd),
            (3, true) => scores_heads::<3, true>(s, q, k, pv, g0, nk, hd),
            (_, true) => scores_heads::<4, true>(s, q, k, pv, g0, nk, hd),
        }
        g0 += (group - g0).min(4);
    }
}

/// Query heads `g0..g0 + G` of [`attend_scores_avx512`], keys at `kt` (f32, or bf16 bits). With
/// `pv` (the values, same type; null: none), each pair of tiles also prefetches the values of its
/// 32 keys and the next pair's keys, spread over its steps: one head's keys and values are a fresh
/// stream from DRAM each call, and their misses then overlap the FMAs rather than stall them
/// (1,440 heads of 364 keys, one thread: 25.6 -> 23.2 ms in f32, 21.0 -> 14.5 ms in bf16).
///
/// # Safety
/// The CPU has AVX-512F; `g0 + G ≤ group` for `s` [group, nk] and `q` [group, hd]; `kt` holds
/// `nk.div_ceil(KEY_TILE)` tiles of `KEY_TILE·hd` values (bf16 bits when BF16, else f32);
/// `pv` is null or the values (only prefetched).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scores_heads<const G: usize, const BF16: bool>(s: &mut [f32], q: &[f32], kt: *const u8, pv: *const u8, g0: usize, nk: usize, hd: usize) {
    use std::arch::x86_64::*;
    let size = if BF16 { 2 } else { 4 };
    let tiles = nk.div_ceil(KEY_TILE);
    let (qp, sp) = (q.as_ptr().add(g0 * hd), s.as_mut_ptr().add(g0 * nk));
    let mut t = 0;
    while t < tiles {
        // A last odd tile pairs with itself (valid memory); its copy is not stored.
        let t1 = (t + 1).min(tiles - 1);
        let (k0, k1) = (kt.add(t * hd * KEY_TILE * size), kt.add(t1 * hd * KEY_TILE * size));
        let mut a = [[_mm512_setzero_ps(); 2]; G];
        // The values of keys t·16.. (and the next pair of key tiles) are 32·hd·size bytes each:
        // size / 2 lines of 64 bytes per step d.
        let vblock = pv.wrapping_add(t * KEY_TILE * hd * size);
        for d in 0..hd {
            if !pv.is_null() {
                for line in 0..size / 2 {
                    _mm_prefetch::<_MM_HINT_T0>(vblock.wrapping_add((d * size / 2 + line) * 64) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(k0.wrapping_add(2 * KEY_TILE * hd * size + (d * size / 2 + line) * 64) as *const i8);
                }
            }
            let (kv0, kv1) = (load16::<BF16>(k0.add(d * KEY_TILE * size)), load16::<BF16>(k1.add(d * KEY_TILE * size)));
            for (g, ag) in a.iter_mut().enumerate() {
                let qv = _mm512_set1_ps(*qp.add(g * hd + d));
                ag[0] = _mm512_fmadd_ps(qv, kv0, ag[0]);
                ag[1] = _mm512_fmadd_ps(qv, kv1, ag[1]);
            }
        }
        for (g, ag) in a.iter().enumerate() {
            for (h, tt) in [t, t + 1].into_iter().enumerate() {
                if tt < tiles {
                    let n = (nk - tt * KEY_TILE).min(KEY_TILE);
                    _mm512_mask_storeu_ps(sp.add(g * nk + tt * KEY_TILE), ((1u32 << n) - 1) as u16, ag[h]);
                }
            }
        }
        t += 2;
    }
}

/// `out[g] = Σ_j p[g, j] · v[j]` for `p[group, nk]`, `out[group, hd]`.
fn attend_values(out: &mut [f32], p: &[f32], v: KvRows, group: usize, nk: usize, hd: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if hd % 16 == 0 && std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature; the shapes were checked by the caller.
            unsafe { attend_values_avx512(out, p, v, group, nk, hd) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features; the shapes were checked by the caller.
            unsafe {
                match v {
                    KvRows::F32(v) if hd % 8 == 0 => attend_values_avx2(out, p, v, group, nk, hd),
                    KvRows::F32(v) => attend_values_fma(out, p, v, group, nk, hd),
                    KvRows::Bf16(v) => attend_values_fma(out, p, v, group, nk, hd),
                }
            }
            return;
        }
    }
    match v {
        KvRows::F32(v) => attend_values_plain(out, p, v, group, nk, hd),
        KvRows::Bf16(v) => attend_values_plain(out, p, v, group, nk, hd),
    }
}

/// [`attend_values_plain`] compiled for AVX2 + FMA (the FMAs inline; the same bits).
///
/// # Safety
/// The CPU has AVX2 and FMA (the slices are bounds-checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_values_fma<T: KvElem>(out: &mut [f32], p: &[f32], v: &[T], group: usize, nk: usize, hd: usize) {
    attend_values_plain(out, p, v, group, nk, hd)
}

/// The portable [`attend_values`] (same sums, same order as the vector kernels).
#[inline(always)]
fn attend_values_plain<T: KvElem>(out: &mut [f32], p: &[f32], v: &[T], group: usize, nk: usize, hd: usize) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for g in 0..group {
        let o = &mut out[g * hd..(g + 1) * hd];
        for j in 0..nk {
            let pj = p[g * nk + j];
            o.iter_mut().zip(&v[j * hd..(j + 1) * hd]).for_each(|(a, &b)| *a = pj.mul_add(b.to_f32(), *a));
        }
    }
}

/// # Safety
/// The CPU has AVX2 and FMA; `hd` is a multiple of 8; `out` holds `group·hd` values, `p`
/// `group·nk`, `v` `nk·hd` (the shapes [`attend_group`] asserts).
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
///
/// # Safety
/// The CPU has AVX2 and FMA; `g0 + ng ≤ group`, `ng ≤ 3` and `c + 8·NC ≤ hd` for `out`
/// [group, hd], `p` [group, nk] and `v` [nk, hd].
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

/// [`attend_values`] on AVX-512: up to 3 query heads × 64 output columns in 12 registers, each
/// value row read once per 64 columns (the same sums, in the same order, as the other kernels).
///
/// # Safety
/// The CPU has AVX-512F; `hd` is a multiple of 16; shapes as for [`attend_values_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_values_avx512(out: &mut [f32], p: &[f32], v: KvRows, group: usize, nk: usize, hd: usize) {
    let (v, bf16) = match v {
        KvRows::F32(v) => (v.as_ptr() as *const u8, false),
        KvRows::Bf16(v) => (v.as_ptr() as *const u8, true),
    };
    let mut g0 = 0;
    while g0 < group {
        let ng = (group - g0).min(3);
        let mut c = 0;
        while c < hd {
            match ((hd - c) / 16, bf16) {
                (1, false) => values_cols512::<1, false>(out, p, v, g0, ng, nk, hd, c),
                (2, false) => values_cols512::<2, false>(out, p, v, g0, ng, nk, hd, c),
                (3, false) => values_cols512::<3, false>(out, p, v, g0, ng, nk, hd, c),
                (_, false) => values_cols512::<4, false>(out, p, v, g0, ng, nk, hd, c),
                (1, true) => values_cols512::<1, true>(out, p, v, g0, ng, nk, hd, c),
                (2, true) => values_cols512::<2, true>(out, p, v, g0, ng, nk, hd, c),
                (3, true) => values_cols512::<3, true>(out, p, v, g0, ng, nk, hd, c),
                (_, true) => values_cols512::<4, true>(out, p, v, g0, ng, nk, hd, c),
            }
            c += 16 * ((hd - c) / 16).min(4);
        }
        g0 += ng;
    }
}

/// Columns `c..c + 16·NC` of heads `g0..g0 + ng` (ng ≤ 3) of [`attend_values_avx512`], values
/// at `v` (f32, or bf16 bits).
///
/// # Safety
/// The CPU has AVX-512F; as for [`attend_values_cols`] with `c + 16·NC ≤ hd`, `v` holding
/// `nk·hd` values (bf16 bits when BF16, else f32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn values_cols512<const NC: usize, const BF16: bool>(out: &mut [f32], p: &[f32], v: *const u8, g0: usize, ng: usize, nk: usize, hd: usize, c: usize) {
    use std::arch::x86_64::*;
    let size = if BF16 { 2 } else { 4 };
    let op = out.as_mut_ptr();
    // Heads beyond ng read head g0's probabilities (valid memory); their sums are not stored.
    let pr: [*const f32; 3] = std::array::from_fn(|g| p.as_ptr().add((g0 + if g < ng { g } else { 0 }) * nk));
    let mut a = [[_mm512_setzero_ps(); NC]; 3];
    for j in 0..nk {
        let vr = v.add((j * hd + c) * size);
        let pb = [_mm512_set1_ps(*pr[0].add(j)), _mm512_set1_ps(*pr[1].add(j)), _mm512_set1_ps(*pr[2].add(j))];
        for t in 0..NC {
            let vv = load16::<BF16>(vr.add(16 * t * size));
            a[0][t] = _mm512_fmadd_ps(pb[0], vv, a[0][t]);
            a[1][t] = _mm512_fmadd_ps(pb[1], vv, a[1][t]);
            a[2][t] = _mm512_fmadd_ps(pb[2], vv, a[2][t]);
        }
    }
    for (g, ag) in a.iter().enumerate().take(ng) {
        for (t, &at) in ag.iter().enumerate() {
            _mm512_storeu_ps(op.add((g0 + g) * hd + c + 16 * t), at);
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

    /// Keys `k[nk, hd]` in the cache's tiles ([`key_at`]); the last tile's unused lanes hold NaN,
    /// which no result may see.
    fn tiled(k: &[f32], nk: usize, hd: usize) -> Vec<f32> {
        let mut t = vec![f32::NAN; nk.div_ceil(KEY_TILE) * KEY_TILE * hd];
        for j in 0..nk {
            for d in 0..hd {
                t[key_at(j, d, hd)] = k[j * hd + d];
            }
        }
        t
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

    /// `x` as bf16 bits (and the f32 values those hold).
    fn bf16(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let bits: Vec<u16> = x.iter().map(|&v| crate::quant::bf16_bits(v)).collect();
        let values = bits.iter().map(|&b| b.to_f32()).collect();
        (bits, values)
    }

    #[test]
    fn attend_group_matches_the_f64_reference() {
        // GQA groups 1..7, head dims with and without a full 32-column block, 1 to 1000+ keys;
        // keys and values stored in f32 and in bf16 (the reference then reads the bf16 values).
        for (group, hd, nk) in [(3, 64, 1), (3, 64, 5), (3, 64, 1031), (1, 8, 3), (2, 16, 70), (4, 24, 9), (7, 40, 33), (2, 12, 6)] {
            let (q, k, v) = (random(group * hd, 1), random(nk * hd, 2), random(nk * hd, 3));
            let scale = 1.0 / (hd as f32).sqrt();
            let ((kb, k16), (vb, v16)) = (bf16(&tiled(&k, nk, hd)), bf16(&v));
            let k16_rows: Vec<f32> = (0..nk * hd).map(|i| k16[key_at(i / hd, i % hd, hd)]).collect();
            for (kt, vr, kref, vref) in [(KvRows::F32(&tiled(&k, nk, hd)), KvRows::F32(&v), &k, &v), (KvRows::Bf16(&kb), KvRows::Bf16(&vb), &k16_rows, &v16)] {
                let mut out = vec![f32::NAN; group * hd];
                let mut scratch = Vec::new();
                attend_group(&mut out, &q, kt, vr, GroupShape { group, lo: 0, nk, hd, scale }, &mut scratch);
                let want = reference(&q, kref, vref, group, nk, hd, scale);
                let err = out.iter().zip(&want).map(|(&a, &b)| (a as f64 - b).abs()).fold(0f64, f64::max);
                assert!(err < 2e-5, "group {group} hd {hd} nk {nk} {kt:?}: max abs err {err}", kt = std::mem::discriminant(&kt));
            }
        }
    }

    #[test]
    fn attend_kernels_equal_the_portable_ones_bit_for_bit() {
        for (group, hd, nk) in [(3, 64, 1), (3, 64, 1031), (2, 16, 70), (4, 24, 9), (7, 40, 33)] {
            let (q, k, p) = (random(group * hd, 4), random(nk * hd, 5), random(group * nk, 6));
            let kt = tiled(&k, nk, hd);
            let ((ktb, _), (kb, _)) = (bf16(&kt), bf16(&k));
            let (mut s1, mut s2) = (vec![0f32; group * nk], vec![1f32; group * nk]);
            attend_scores(&mut s1, &q, KvRows::F32(&kt), KvRows::F32(&k), group, nk, hd);
            attend_scores_plain(&mut s2, &q, &kt, group, nk, hd);
            assert_eq!(s1, s2, "scores: group {group} hd {hd} nk {nk}");
            attend_scores(&mut s1, &q, KvRows::Bf16(&ktb), KvRows::Bf16(&kb), group, nk, hd);
            attend_scores_plain(&mut s2, &q, &ktb, group, nk, hd);
            assert_eq!(s1, s2, "scores, bf16 keys: group {group} hd {hd} nk {nk}");
            let (mut o1, mut o2) = (vec![0f32; group * hd], vec![1f32; group * hd]);
            attend_values(&mut o1, &p, KvRows::F32(&k), group, nk, hd);
            attend_values_plain(&mut o2, &p, &k, group, nk, hd);
            assert_eq!(o1, o2, "values: group {group} hd {hd} nk {nk}");
            #[cfg(target_arch = "x86_64")]
            if hd % 8 == 0 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                let mut o3 = vec![1f32; group * hd];
                // SAFETY: the CPU has the features; shapes as above.
                unsafe { attend_values_avx2(&mut o3, &p, &k, group, nk, hd) };
                assert_eq!(o1, o3, "values, AVX2: group {group} hd {hd} nk {nk}");
            }
            attend_values(&mut o1, &p, KvRows::Bf16(&kb), group, nk, hd);
            attend_values_plain(&mut o2, &p, &kb, group, nk, hd);
            assert_eq!(o1, o2, "values, bf16: group {group} hd {hd} nk {nk}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                let mut o3 = vec![1f32; group * hd];
                // SAFETY: the CPU has the features; shapes as above.
                unsafe { attend_values_fma(&mut o3, &p, &kb, group, nk, hd) };
                assert_eq!(o1, o3, "values, bf16, AVX2: group {group} hd {hd} nk {nk}");
                // SAFETY: as above.
                unsafe { attend_scores_fma(&mut s2, &q, &ktb, group, nk, hd) };
                assert_eq!(s1, s2, "scores, bf16 keys, AVX2: group {group} hd {hd} nk {nk}");
            }
        }
    }
}

/// Time of one-token attention over SmolLM2-135M's shapes (3 query heads per key/value head,
/// hd 64, 364 cached keys), one thread, for HEADS heads (default 1440: a batch-16 decode step's
/// 16 slots × 30 layers × 3 heads, each head's keys and values in its own memory, so they come
/// from DRAM as in decoding; HEADS=16 keeps them in cache; BF16=1 stores them in bf16):
/// `HEADS=16 cargo test --release -p coa-model --lib attend_speed -- --ignored --nocapture`
#[cfg(test)]
#[test]
#[ignore = "a measurement: run alone on a quiet machine"]
fn attend_speed() {
    let (group, hd, nk, heads) = (3usize, 64usize, 364usize, std::env::var("HEADS").map_or(1440, |h| h.parse().expect("HEADS")));
    let stride = 512 * hd;
    // Keys then values of every head, in one buffer (the values of head h at (heads + h) · stride).
    let kv: Vec<f32> = (0..2 * heads * stride).map(|i| (i % 13) as f32 * 0.01).collect();
    // BF16=1: the cache in bf16.
    let bf16 = std::env::var_os("BF16").is_some();
    let kv16: Vec<u16> = kv.iter().map(|&x| crate::quant::bf16_bits(x)).collect();
    let rows = |x: usize| if bf16 { KvRows::Bf16(&kv16[x..]) } else { KvRows::F32(&kv[x..]) };
    let vals = |h: usize| rows((heads + h) * stride);
    let q: Vec<f32> = (0..group * hd).map(|i| (i % 7) as f32 * 0.1).collect();
    let mut out = vec![0f32; group * hd];
    let mut s = Vec::new();
    for rep in 0..3 {
        let t = std::time::Instant::now();
        for h in 0..heads {
            attend_group(&mut out, &q, rows(h * stride), vals(h), GroupShape { group, lo: 0, nk, hd, scale: 0.125 }, &mut s);
        }
        let dt = t.elapsed().as_secs_f64();
        eprintln!("rep {rep}: {:.2} ms for {heads} heads, {:.1} GB/s", dt * 1e3, (2 * heads * nk * hd * if bf16 { 2 } else { 4 }) as f64 / dt / 1e9);
        let t = std::time::Instant::now();
        for h in 0..heads {
            attend_scores(&mut s[..group * nk], &q, rows(h * stride), vals(h), group, nk, hd);
        }
        eprintln!("  scores alone {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        for h in 0..heads {
            attend_values(&mut out, &s[..group * nk], vals(h), group, nk, hd);
        }
        eprintln!("  values alone {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    }
}
