// RMSNorm, forward and backward (Llama / Qwen2: y = w * x / sqrt(mean(x^2) + eps), all in f32,
// one rounding to bf16 at the end).
//
// x, y, dy, dx [N, D] bf16 row-major (row stride D), w [D] bf16, rstd [N] f32 (saved by forward).
// Rows may also be heads inside wider rows (Qwen3's q/k norm over the fused q|k|v rows): with
// `per` heads of D per token and token stride `ld`, row r lives at (r / per) * ld + (r % per) * D
// (per = 1, ld = D: plain rows). Such rows are normalised in place (y = x), the input optionally
// kept in `xsave` [N, D] (contiguous), which the backward reads as x; dy and dx use the mapping
// (in place as well: dx = dy), x is contiguous.
// Backward, with xh = x * rstd and gy = dy * w:
//   dx = rstd * (gy - xh * mean(gy * xh))          (accumulate != 0: dx += that, for the residual)
//   dw = sum over rows of dy * xh                  (per-block partials [gridDim.x, D] f32, summed
//                                                   deterministically by sum_rows_f32_add)
#include "coa_common.cuh"

// Offset of row r under the (per, ld) mapping above.
__device__ __forceinline__ i64 norm_row(int r, int per, i64 ld, int D) {
    return (i64)(r / per) * ld + (i64)(r % per) * D;
}

// One block per row (grid-stride over rows). D even. x and y may be the same buffer.
extern "C" __global__ void rmsnorm_fwd(const bf16* x, const bf16* __restrict__ w, bf16* y,
                                       float* __restrict__ rstd, bf16* __restrict__ xsave, int N,
                                       int D, float eps, int per, i64 ld) {
    __shared__ float scratch[32];
    for (int r = blockIdx.x; r < N; r += gridDim.x) {
        const i64 off = norm_row(r, per, ld, D);
        const __nv_bfloat162* xr = reinterpret_cast<const __nv_bfloat162*>(x + off);
        float ss = 0.f;
        for (int c = threadIdx.x; c < D / 2; c += blockDim.x) {
            const float2 v = __bfloat1622float2(xr[c]);
            ss += v.x * v.x + v.y * v.y;
        }
        ss = block_sum(ss, scratch);
        const float rs = rsqrtf(ss / (float)D + eps);
        if (threadIdx.x == 0 && rstd) rstd[r] = rs;
        const __nv_bfloat162* wr = reinterpret_cast<const __nv_bfloat162*>(w);
        __nv_bfloat162* yr = reinterpret_cast<__nv_bfloat162*>(y + off);
        __nv_bfloat162* xs = xsave ? reinterpret_cast<__nv_bfloat162*>(xsave + (i64)r * D) : nullptr;
        for (int c = threadIdx.x; c < D / 2; c += blockDim.x) {
            const __nv_bfloat162 raw = xr[c];  // read before y (maybe x) is written
            if (xs) xs[c] = raw;
            const float2 v = __bfloat1622float2(raw);
            const float2 ww = __bfloat1622float2(wr[c]);
            yr[c] = __floats2bfloat162_rn(v.x * rs * ww.x, v.y * rs * ww.y);
        }
    }
}

// Grid-stride over rows; dynamic shared memory: D floats (this block's dw partial). dy and dx
// may be the same buffer (each thread reads its columns of dy before writing them to dx).
extern "C" __global__ void rmsnorm_bwd(const bf16* dy, const bf16* __restrict__ x,
                                       const bf16* __restrict__ w, const float* __restrict__ rstd,
                                       bf16* dx, float* __restrict__ dw_part, int N, int D,
                                       int accumulate, int per, i64 ld) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* dws = reinterpret_cast<float*>(smem_raw);
    __shared__ float scratch[32];
    // Zeroed with the accumulation's own mapping (thread t owns columns 2c and 2c+1 for its c),
    // so no barrier is needed before the first row adds into them.
    for (int c = threadIdx.x; c < D / 2; c += blockDim.x) dws[2 * c] = dws[2 * c + 1] = 0.f;
    const __nv_bfloat162* wr = reinterpret_cast<const __nv_bfloat162*>(w);
    for (int r = blockIdx.x; r < N; r += gridDim.x) {
        const __nv_bfloat162* xr = reinterpret_cast<const __nv_bfloat162*>(x + (i64)r * D);
        const i64 off = norm_row(r, per, ld, D);
        const __nv_bfloat162* dyr = reinterpret_cast<const __nv_bfloat162*>(dy + off);
        const float rs = rstd[r];
        float dot = 0.f;
        for (int c = threadIdx.x; c < D / 2; c += blockDim.x) {
            const float2 v = __bfloat1622float2(xr[c]);
            const float2 d = __bfloat1622float2(dyr[c]);
            const float2 ww = __bfloat1622float2(wr[c]);
            dot += d.x * ww.x * v.x + d.y * ww.y * v.y;
            dws[2 * c] += d.x * v.x * rs;  // each column is owned by one thread: no race
            dws[2 * c + 1] += d.y * v.y * rs;
        }
        dot = block_sum(dot, scratch) * rs;  // sum(gy * xh)
        const float mean = dot / (float)D;
        __nv_bfloat162* dxr = reinterpret_cast<__nv_bfloat162*>(dx + off);
        for (int c = threadIdx.x; c < D / 2; c += blockDim.x) {
            const float2 v = __bfloat1622float2(xr[c]);
            const float2 d = __bfloat1622float2(dyr[c]);
            const float2 ww = __bfloat1622float2(wr[c]);
            float g0 = rs * (d.x * ww.x - v.x * rs * mean);
            float g1 = rs * (d.y * ww.y - v.y * rs * mean);
            if (accumulate) {
                const float2 o = __bfloat1622float2(dxr[c]);
                g0 += o.x;
                g1 += o.y;
            }
            dxr[c] = __floats2bfloat162_rn(g0, g1);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) dw_part[(i64)blockIdx.x * D + c] = dws[c];
}

// out[c] += sum_r part[r, c] for part [R, C] f32; one thread per column, fixed order.
extern "C" __global__ void sum_rows_f32_add(const float* __restrict__ part, float* __restrict__ out,
                                            int R, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) acc += part[(i64)r * C + c];
    out[c] += acc;
}
