// Small elementwise and reduction helpers of the training step.
#include "coa_common.cuh"

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// y = bf16(x)
extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16* __restrict__ y, i64 n) {
    GRID_STRIDE(i, n) y[i] = f2bf(x[i]);
}
// y = f32(x)
extern "C" __global__ void cast_bf16_f32(const bf16* __restrict__ x, float* __restrict__ y, i64 n) {
    GRID_STRIDE(i, n) y[i] = bf2f(x[i]);
}
// y = a + b (bf16, f32 add, one rounding); y may alias a or b (residual stream).
extern "C" __global__ void add_bf16(const bf16* a, const bf16* b, bf16* y, i64 n) {
    GRID_STRIDE(i, n) y[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
}
// acc += f32(x): gradient accumulation of a bf16 gradient into an f32 buffer.
extern "C" __global__ void accum_bf16_f32(const bf16* __restrict__ x, float* __restrict__ acc, i64 n) {
    GRID_STRIDE(i, n) acc[i] += bf2f(x[i]);
}
// partial[blockIdx.x] = sum of x[i]^2 over this block's grid-stride elements (the host sums the
// gridDim.x partials in f64: global gradient norm for clipping). Deterministic.
extern "C" __global__ void sumsq_f32(const float* __restrict__ x, float* __restrict__ partial, i64 n) {
    __shared__ float scratch[32];
    float acc = 0.f;
    GRID_STRIDE(i, n) acc += x[i] * x[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
