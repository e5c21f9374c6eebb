// AdamW (decoupled weight decay, PyTorch semantics) on fp32 master weights, writing the bf16 copy
// the forward pass uses; the same formulas, in the same order, as coa-train-step's CPU
// `optim::adamw_update` (not bit-identical: NVRTC may fuse multiply-adds into FMAs). All buffers [n]: p, m, v, g f32; p_bf16 bf16 (may be NULL).
// The host computes, in f64 then rounded to f32 (t = 1-based step):
//   keep = 1 - lr * wd (1 for tensors without decay), step_size = lr / (1 - b1^t),
//   bc2_sqrt = sqrt(1 - b2^t)
//   g'  = g * grad_scale                       (grad_scale: 1, or the clip-by-norm factor)
//   p   = p * keep
//   m   = b1 * m + (1 - b1) * g'
//   v   = b2 * v + (1 - b2) * g'^2
//   p   = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
#include "coa_common.cuh"

extern "C" __global__ void adamw_step(float* __restrict__ p, const float* __restrict__ g,
                                      float* __restrict__ m, float* __restrict__ v,
                                      bf16* __restrict__ p_bf16, i64 n, float b1, float b2,
                                      float eps, float keep, float step_size, float bc2_sqrt,
                                      float grad_scale) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {
        const float gi = g[i] * grad_scale;
        const float pi = p[i] * keep;
        const float mi = m[i] * b1 + (1.f - b1) * gi;
        const float vi = v[i] * b2 + (1.f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float pn = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        p[i] = pn;
        if (p_bf16) p_bf16[i] = f2bf(pn);
    }
}
