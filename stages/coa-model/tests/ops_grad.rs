//! Each op: forward against a naive f64 reference where useful, and a central finite-difference
//! check of its backward on small random inputs.
//!
//! The scalar loss is L = Σ r ⊙ out for a fixed random r, so d L / d out = r. The check compares
//! the analytic gradient g with the numerical one n on every coordinate and asserts
//! max|g − n| / max|n| < tol (relative error w.r.t. the largest gradient entry).

use coa_model::ops;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let den = b.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-12);
    num / den
}

/// Numerical gradient of `loss(x)` w.r.t. every coordinate of x (central differences, f64 sum).
fn numgrad(x: &mut Vec<f32>, h: f32, loss: &mut dyn FnMut(&[f32]) -> f64) -> Vec<f32> {
    let mut g = vec![0f32; x.len()];
    for i in 0..x.len() {
        let orig = x[i];
        x[i] = orig + h;
        let lp = loss(x);
        x[i] = orig - h;
        let lm = loss(x);
        x[i] = orig;
        g[i] = ((lp - lm) / (2.0 * h as f64)) as f32;
    }
    g
}

fn dotf64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

const TOL: f32 = 1e-2;

#[test]
fn gemm_matches_naive_all_layouts() {
    // alpha and beta both away from 1: the product is scaled, the old c kept at half weight
    let mut rng = Rng(1);
    for &(m, n, k) in &[(1, 1, 1), (3, 5, 7), (70, 33, 19), (130, 260, 40), (9, 300, 64)] {
        let a = rng.vec(m * k, 1.0);
        let b = rng.vec(k * n, 1.0);
        for a_t in [false, true] {
            for b_t in [false, true] {
                let mut c = rng.vec(m * n, 1.0);
                let c0 = c.clone();
                ops::gemm(ops::Gemm::new(m, n, k).transposed(a_t, b_t).alpha(-1.5).beta(0.5), &a, &b, &mut c);
                let mut want = vec![0f32; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0f64;
                        for p in 0..k {
                            let av = if a_t { a[p * m + i] } else { a[i * k + p] };
                            let bv = if b_t { b[j * k + p] } else { b[p * n + j] };
                            s += av as f64 * bv as f64;
                        }
                        want[i * n + j] = (-1.5 * s + 0.5 * c0[i * n + j] as f64) as f32;
                    }
                }
                let e = rel_err(&c, &want);
                assert!(e < 1e-5, "gemm {m}x{n}x{k} a_t={a_t} b_t={b_t}: rel err {e}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "dense operands")]
fn gemm_refuses_leading_dimensions() {
    // sub-matrices are the GPU's (`Gpu::gemm`); the reference says so rather than reading past rows
    let (a, b, mut c) = (vec![0f32; 4], vec![0f32; 4], vec![0f32; 4]);
    ops::gemm(ops::Gemm::new(2, 2, 2).ld(3, 3, 3), &a, &b, &mut c);
}

#[test]
fn linear_backward_matches_finite_differences() {
    let (t, i, o) = (5, 6, 4);
    let mut rng = Rng(2);
    let mut x = rng.vec(t * i, 1.0);
    let mut w = rng.vec(o * i, 0.5);
    let mut b = rng.vec(o, 0.5);
    let r = rng.vec(t * o, 1.0);
    let fwd = |x: &[f32], w: &[f32], b: &[f32]| {
        let mut out = vec![0f32; t * o];
        ops::linear_forward(&mut out, x, w, Some(b), (t, i, o));
        dotf64(&out, &r)
    };
    let (mut dx, mut dw, mut db) = (vec![0f32; t * i], vec![0f32; o * i], vec![0f32; o]);
    ops::linear_backward(Some(&mut dx), &mut dw, Some(&mut db), &r, &x, &w, (t, i, o));
    let (w0, b0) = (w.clone(), b.clone());
    let nx = numgrad(&mut x, 1e-2, &mut |x| fwd(x, &w0, &b0));
    let x0 = x.clone();
    let nw = numgrad(&mut w, 1e-2, &mut |w| fwd(&x0, w, &b0));
    let nb = numgrad(&mut b, 1e-2, &mut |b| fwd(&x0, &w0, b));
    assert!(rel_err(&dx, &nx) < TOL, "dx {}", rel_err(&dx, &nx));
    assert!(rel_err(&dw, &nw) < TOL, "dw {}", rel_err(&dw, &nw));
    assert!(rel_err(&db, &nb) < TOL, "db {}", rel_err(&db, &nb));
    // accumulation: a second call adds the same amount
    let dw1 = dw.clone();
    ops::linear_backward(None, &mut dw, None, &r, &x, &w, (t, i, o));
    assert!(rel_err(&dw, &dw1.iter().map(|v| 2.0 * v).collect::<Vec<_>>()) < 1e-6);
    // beta 0 writes dx whatever it held (NaN here) and still adds to dw
    let mut dx_to = vec![f32::NAN; t * i];
    ops::linear_backward_as(coa_model::MatmulDtype::F32, Some((&mut dx_to, 0.0)), &mut dw, None, &r, &x, &w, (t, i, o));
    assert!(dx_to.iter().zip(&dx).all(|(a, b)| a.to_bits() == b.to_bits()), "dx {dx_to:?} vs {dx:?}");
    assert!(rel_err(&dw, &dw1.iter().map(|v| 3.0 * v).collect::<Vec<_>>()) < 1e-6);
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let (v, d) = (7, 3);
    let ids = [1u32, 4, 1, 6, 0];
    let mut rng = Rng(3);
    let mut table = rng.vec(v * d, 1.0);
    let r = rng.vec(ids.len() * d, 1.0);
    let mut out = vec![0f32; ids.len() * d];
    ops::embedding_forward(&mut out, &ids, &table, d);
    assert_eq!(&out[..d], &table[d..2 * d]);
    let mut dt = vec![0f32; v * d];
    ops::embedding_backward(&mut dt, &r, &ids, d);
    let n = numgrad(&mut table, 1e-2, &mut |tb| {
        let mut o = vec![0f32; ids.len() * d];
        ops::embedding_forward(&mut o, &ids, tb, d);
        dotf64(&o, &r)
    });
    assert!(rel_err(&dt, &n) < TOL);
    // id 1 appears twice: its gradient is the sum of two rows
    assert!((dt[d] - (r[0] + r[2 * d])).abs() < 1e-6);
}

#[test]
fn rmsnorm_forward_and_backward() {
    let (t, d) = (4, 8);
    let eps = 1e-5f32;
    let mut rng = Rng(4);
    let mut x = rng.vec(t * d, 1.0);
    let mut w = rng.vec(d, 1.0);
    let r = rng.vec(t * d, 1.0);
    let mut out = vec![0f32; t * d];
    let mut rstd = vec![0f32; t];
    ops::rmsnorm_forward(&mut out, &mut rstd, &x, &w, eps, d);
    for row in 0..t {
        let ms: f64 = x[row * d..(row + 1) * d].iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
        let rs = 1.0 / (ms + eps as f64).sqrt();
        for i in 0..d {
            let want = x[row * d + i] as f64 * rs * w[i] as f64;
            assert!((out[row * d + i] as f64 - want).abs() < 1e-5);
        }
    }
    let mut dx = vec![0f32; t * d];
    let mut dw = vec![0f32; d];
    ops::rmsnorm_backward(&mut dx, &mut dw, &r, &x, &w, &rstd, d);
    let w0 = w.clone();
    let f = |x: &[f32], w: &[f32]| {
        let mut o = vec![0f32; t * d];
        let mut rs = vec![0f32; t];
        ops::rmsnorm_forward(&mut o, &mut rs, x, w, eps, d);
        dotf64(&o, &r)
    };
    let nx = numgrad(&mut x, 1e-2, &mut |x| f(x, &w0));
    let x0 = x.clone();
    let nw = numgrad(&mut w, 1e-2, &mut |w| f(&x0, w));
    assert!(rel_err(&dx, &nx) < TOL, "dx {}", rel_err(&dx, &nx));
    assert!(rel_err(&dw, &nw) < TOL, "dw {}", rel_err(&dw, &nw));
}

#[test]
fn rope_forward_and_backward() {
    let (t, h, hd) = (5, 2, 8);
    let pos = [0u32, 1, 2, 0, 1];
    let (cos, sin) = ops::rope_tables(&pos, hd, 10000.0);
    let mut rng = Rng(5);
    let mut x = rng.vec(t * h * hd, 1.0);
    let r = rng.vec(t * h * hd, 1.0);
    // position 0 is the identity; rotation preserves the norm
    let mut y = x.clone();
    ops::rope_forward(&mut y, &cos, &sin, h, hd);
    assert_eq!(&y[..h * hd], &x[..h * hd]);
    let n2 = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
    assert!((n2(&y) - n2(&x)).abs() < 1e-4);
    // pair (i, i + hd/2) at position 1: x'[i] = x[i] cos − x[i+h] sin, HF rotate_half
    let row = h * hd;
    let inv1 = 1.0f64 / 10000f64.powf(2.0 / hd as f64);
    let want = x[row + 1] as f64 * inv1.cos() - x[row + 1 + hd / 2] as f64 * inv1.sin();
    assert!((y[row + 1] as f64 - want).abs() < 1e-5);
    let mut dx = r.clone();
    ops::rope_backward(&mut dx, &cos, &sin, h, hd);
    let n = numgrad(&mut x, 1e-2, &mut |x| {
        let mut y = x.to_vec();
        ops::rope_forward(&mut y, &cos, &sin, h, hd);
        dotf64(&y, &r)
    });
    assert!(rel_err(&dx, &n) < TOL, "{}", rel_err(&dx, &n));
}

/// Naive attention in f64 with an explicit mask, for the forward check.
fn naive_attention(x: ops::Qkv, shape: ops::AttentionShape) -> Vec<f32> {
    let (ops::Qkv { q, k, v }, ops::AttentionShape { seg_start: seg, n_heads: nh, n_kv_heads: nkv, head_dim: hd, .. }) = (x, shape);
    let t = seg.len();
    let (qw, kw) = (nh * hd, nkv * hd);
    let mut out = vec![0f32; t * qw];
    for i in 0..t {
        for h in 0..nh {
            let g = h / (nh / nkv);
            let mut s: Vec<(usize, f64)> = Vec::new();
            for j in 0..t {
                let allowed = j <= i && seg[j] == seg[i];
                if allowed {
                    let mut d = 0f64;
                    for c in 0..hd {
                        d += q[i * qw + h * hd + c] as f64 * k[j * kw + g * hd + c] as f64;
                    }
                    s.push((j, d / (hd as f64).sqrt()));
                }
            }
            let mx = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x.1 - mx).exp()).sum();
            for c in 0..hd {
                let mut acc = 0f64;
                for &(j, sc) in &s {
                    acc += (sc - mx).exp() / z * v[j * kw + g * hd + c] as f64;
                }
                out[i * qw + h * hd + c] = acc as f32;
            }
        }
    }
    out
}

#[test]
fn attention_forward_and_backward_gqa_segments() {
    let seg_ids = [0i32, 0, 0, 1, 1, 2, 2, 2];
    let t = seg_ids.len();
    let (_, seg_start) = ops::segment_layout(t, Some(&seg_ids));
    assert_eq!(seg_start, vec![0, 0, 0, 3, 3, 5, 5, 5]);
    assert_eq!(ops::segment_ends(&seg_start), vec![3, 3, 3, 5, 5, 8, 8, 8]);
    check_attention(&seg_start, 6, 1.0);
}

/// Attention forward against the naive reference, and its backward against finite differences,
/// on random q/k/v (q and k scaled by `qk_scale`) over the given packed segments.
fn check_attention(seg_start: &[usize], seed: u64, qk_scale: f32) {
    let (nh, nkv, hd) = (4, 2, 4);
    let t = seg_start.len();
    let mut rng = Rng(seed);
    let mut q = rng.vec(t * nh * hd, qk_scale);
    let mut k = rng.vec(t * nkv * hd, qk_scale);
    let mut v = rng.vec(t * nkv * hd, 1.0);
    let r = rng.vec(t * nh * hd, 1.0);
    let shape = ops::AttentionShape::segments(seg_start, nh, nkv, hd);
    let fwd = |q: &[f32], k: &[f32], v: &[f32]| {
        let mut out = vec![0f32; t * nh * hd];
        let mut lse = vec![0f32; t * nh];
        ops::attention_forward(&mut out, &mut lse, ops::Qkv { q, k, v }, shape);
        (out, lse)
    };
    let (out, lse) = fwd(&q, &k, &v);
    let want = naive_attention(ops::Qkv { q: &q, k: &k, v: &v }, shape);
    assert!(rel_err(&out, &want) < 1e-5, "forward {}", rel_err(&out, &want));
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
    let grads = ops::QkvGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv };
    ops::attention_backward(grads, &r, ops::Qkv { q: &q, k: &k, v: &v }, &out, &lse, shape);
    let (k0, v0) = (k.clone(), v.clone());
    let nq = numgrad(&mut q, 1e-2, &mut |q| dotf64(&fwd(q, &k0, &v0).0, &r));
    let q0 = q.clone();
    let nk = numgrad(&mut k, 1e-2, &mut |k| dotf64(&fwd(&q0, k, &v0).0, &r));
    let nv = numgrad(&mut v, 1e-2, &mut |v| dotf64(&fwd(&q0, &k0, v).0, &r));
    assert!(rel_err(&dq, &nq) < TOL, "dq {}", rel_err(&dq, &nq));
    assert!(rel_err(&dk, &nk) < TOL, "dk {}", rel_err(&dk, &nk));
    assert!(rel_err(&dv, &nv) < TOL, "dv {}", rel_err(&dv, &nv));
}

/// Longer than two attention blocks (128 rows), with segments that straddle block boundaries.
#[test]
fn attention_multi_block_segments() {
    let mut seg_ids = Vec::new();
    for (s, n) in [50usize, 30, 1, 60, 9, 120, 40].iter().enumerate() {
        seg_ids.extend(std::iter::repeat(s as i32).take(*n));
    }
    let t = seg_ids.len();
    let (_, seg_start) = ops::segment_layout(t, Some(&seg_ids));
    check_attention(&seg_start, 9, 1.5);
}

#[test]
fn swiglu_forward_and_backward() {
    let n = 12;
    let mut rng = Rng(7);
    let mut g = rng.vec(n, 3.0);
    let mut u = rng.vec(n, 1.0);
    let r = rng.vec(n, 1.0);
    let mut a = vec![0f32; n];
    ops::swiglu_forward(&mut a, &g, &u);
    for i in 0..n {
        let gg = g[i] as f64;
        let want = gg / (1.0 + (-gg).exp()) * u[i] as f64;
        assert!((a[i] as f64 - want).abs() < 1e-5);
    }
    let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
    ops::swiglu_backward(&mut dg, &mut du, &r, &g, &u);
    let u0 = u.clone();
    let f = |g: &[f32], u: &[f32]| {
        let mut a = vec![0f32; n];
        ops::swiglu_forward(&mut a, g, u);
        dotf64(&a, &r)
    };
    let ng = numgrad(&mut g, 1e-2, &mut |g| f(g, &u0));
    let g0 = g.clone();
    let nu = numgrad(&mut u, 1e-2, &mut |u| f(&g0, u));
    assert!(rel_err(&dg, &ng) < TOL, "dg {}", rel_err(&dg, &ng));
    assert!(rel_err(&du, &nu) < TOL, "du {}", rel_err(&du, &nu));
}

#[test]
fn logsoftmax_and_masked_cross_entropy() {
    let (r, v) = (5, 9);
    let mut rng = Rng(8);
    let mut z = rng.vec(r * v, 4.0);
    let targets = [3u32, 0, 8, 8, 1];
    let mask = [1.0f32, 0.0, 1.0, 1.0, 1.0];
    let tg: Vec<Option<u32>> = targets.iter().map(|&t| Some(t)).collect();
    let (mut lp, mut en, mut lse) = (vec![0f32; r], vec![0f32; r], vec![0f32; r]);
    ops::logsoftmax_forward(&mut lp, &mut en, &mut lse, &z, &tg, v);
    for row in 0..r {
        let zr: Vec<f64> = z[row * v..(row + 1) * v].iter().map(|&x| x as f64).collect();
        let l = zr.iter().map(|x| x.exp()).sum::<f64>().ln();
        assert!((lse[row] as f64 - l).abs() < 1e-5);
        assert!((lp[row] as f64 - (zr[targets[row] as usize] - l)).abs() < 1e-5);
        let h: f64 = -zr.iter().map(|x| (x - l).exp() * (x - l)).sum::<f64>();
        assert!((en[row] as f64 - h).abs() < 1e-5, "entropy {} vs {h}", en[row]);
    }
    let (loss, dz) = ops::masked_cross_entropy(&z, &targets, &mask, v);
    let want: f64 = -(0..r).map(|i| mask[i] as f64 * lp[i] as f64).sum::<f64>() / 4.0;
    assert!((loss as f64 - want).abs() < 1e-6);
    let n = numgrad(&mut z, 1e-2, &mut |z| ops::masked_cross_entropy(z, &targets, &mask, v).0 as f64);
    assert!(rel_err(&dz, &n) < TOL, "{}", rel_err(&dz, &n));
    // the masked row has zero gradient
    assert!(dz[v..2 * v].iter().all(|&x| x == 0.0));
    // in-place backward equals the out-of-place one
    let dlogp: Vec<f32> = mask.iter().map(|m| -m / 4.0).collect();
    let mut zz = z.clone();
    ops::logsoftmax_backward_inplace(&mut zz, &lse, &tg, &dlogp, v);
    assert!(rel_err(&zz, &dz) < 1e-6);
}
