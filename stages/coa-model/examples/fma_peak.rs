//! One core's peak multiply-add rate in f32 (AVX-512 `vfmadd231ps`) against bf16 dot products
//! with f32 accumulation (AVX-512 BF16 `vdpbf16ps`, what a bf16 matrix kernel on this CPU would
//! run) and fp16 FMA (AVX-512 FP16, fp16 accumulation), each on 12 independent accumulator
//! chains so that latency does not limit them.
//!
//!     cargo run --release -p coa-model --example fma_peak
//!
//! Why it exists: bf16 products are only worth a kernel where `vdpbf16ps` gives more FLOP/s than
//! f32 FMA; on the 2-core Xeon this project measures on it gives half (README, "Benchmarks").

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Independent accumulators: more than latency × issue rate of either instruction, and few
    /// enough to stay in registers.
    const CHAINS: usize = 12;

    /// GFLOP/s of `iters` rounds of CHAINS f32 FMAs (16 lanes × 2 FLOP each).
    ///
    /// # Safety
    /// The CPU supports AVX-512F (`main` checks before calling).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_f32(iters: usize) -> f64 {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let b = _mm512_set1_ps(1e-9);
        let t = Instant::now();
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(b, b, *a);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let sum: f32 = acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum();
        std::hint::black_box(sum);
        (iters * CHAINS * 32) as f64 / secs / 1e9
    }

    /// GFLOP/s of `iters` rounds of CHAINS `vdpbf16ps` (16 lanes × 2 products × 2 FLOP each).
    ///
    /// # Safety
    /// The CPU supports AVX-512F and AVX-512 BF16 (`main` checks before calling).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dot_bf16(iters: usize) -> f64 {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        // bf16 0x3000 = 2^-31: the sums stay small and normal.
        let b: __m512bh = std::mem::transmute(_mm512_set1_epi16(0x3000));
        let t = Instant::now();
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, b, b);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let sum: f32 = acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum();
        std::hint::black_box(sum);
        (iters * CHAINS * 64) as f64 / secs / 1e9
    }

    /// GFLOP/s of `iters` rounds of 12 fp16 FMAs (`vfmadd231ph`: 32 lanes × 2 FLOP each, fp16
    /// accumulation), in assembly: the fp16 intrinsics are not stable Rust.
    ///
    /// # Safety
    /// The CPU supports AVX-512 FP16 (`main` checks before calling): the assembly uses
    /// `vfmadd231ph` whatever the target features say.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_fp16(iters: usize) -> f64 {
        let b = [0x1400u16; 32]; // fp16 2^-10 in every lane
        let t = Instant::now();
        std::arch::asm!(
            "vmovdqu16 zmm12, [{b}]",
            "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1", "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3", "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7", "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9", "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
            "2:",
            "vfmadd231ph zmm0, zmm12, zmm12", "vfmadd231ph zmm1, zmm12, zmm12", "vfmadd231ph zmm2, zmm12, zmm12",
            "vfmadd231ph zmm3, zmm12, zmm12", "vfmadd231ph zmm4, zmm12, zmm12", "vfmadd231ph zmm5, zmm12, zmm12",
            "vfmadd231ph zmm6, zmm12, zmm12", "vfmadd231ph zmm7, zmm12, zmm12", "vfmadd231ph zmm8, zmm12, zmm12",
            "vfmadd231ph zmm9, zmm12, zmm12", "vfmadd231ph zmm10, zmm12, zmm12", "vfmadd231ph zmm11, zmm12, zmm12",
            "dec {n}",
            "jnz 2b",
            b = in(reg) b.as_ptr(),
            n = inout(reg) iters.max(1) => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _,
            out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _,
            options(nostack, readonly),
        );
        let secs = t.elapsed().as_secs_f64();
        (iters.max(1) * 12 * 64) as f64 / secs / 1e9
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !std::is_x86_feature_detected!("avx512f") {
            println!("this CPU has no AVX-512: nothing to compare");
            return;
        }
        let iters = 25_000_000;
        // SAFETY: AVX-512F is present (checked above).
        let f32_rate = (0..3).map(|_| unsafe { x86::fma_f32(iters) }).fold(0.0, f64::max);
        println!("f32 FMA (vfmadd231ps zmm), one core:  {f32_rate:.1} GFLOP/s");
        if std::is_x86_feature_detected!("avx512bf16") {
            // SAFETY: AVX-512 BF16 is present (checked just above).
            let bf16_rate = (0..3).map(|_| unsafe { x86::dot_bf16(iters) }).fold(0.0, f64::max);
            println!("bf16 dot (vdpbf16ps zmm), one core:   {bf16_rate:.1} GFLOP/s ({:.2}x f32)", bf16_rate / f32_rate);
        } else {
            println!("this CPU has no AVX-512 BF16");
        }
        if std::is_x86_feature_detected!("avx512fp16") {
            // SAFETY: AVX-512 FP16 (and so AVX-512F) is present.
            let fp16_rate = (0..3).map(|_| unsafe { x86::fma_fp16(iters) }).fold(0.0, f64::max);
            println!("fp16 FMA (vfmadd231ph zmm), one core: {fp16_rate:.1} GFLOP/s ({:.2}x f32; fp16 accumulation)", fp16_rate / f32_rate);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("an x86-64 measurement; nothing to do on this CPU");
}
