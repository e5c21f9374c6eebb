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
// LoRA dropout, the mask of `coa_model::lora::dropout_factor` drawn on the device: x and y are
// [n / cols, cols]; element (r, c) has factor f = 0 when u < p, else `keep` = 1 / (1 - p), where u
// is SplitMix64's first unit draw from seeds[r] ^ (key * golden), key = key_hi ^ (local_row[r] *
// cols + c) (key_hi: the layer and target bits; local_row: r's row within its own sequence, so a
// packed pass draws each sequence's mask as the CPU draws it alone). y = x f, or y += x f with
// `accumulate` (the backward: the input gradient's LoRA term through the same mask). The mask is
// recomputed rather than stored: a hash per element costs less than a [T, in] mask per target.
extern "C" __global__ void lora_dropout(const bf16* __restrict__ x, bf16* __restrict__ y,
                                        const unsigned long long* __restrict__ seeds,
                                        const int* __restrict__ local_row, i64 n, int cols,
                                        unsigned long long key_hi, double p, float keep,
                                        int accumulate) {
    const unsigned long long golden = 0x9E3779B97F4A7C15ull;
    GRID_STRIDE(i, n) {
        const i64 r = i / cols;
        const unsigned long long key = key_hi ^ ((unsigned long long)local_row[r] * (unsigned long long)cols + (unsigned long long)(i - r * cols));
        unsigned long long z = (seeds[r] ^ (key * golden)) + golden;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const double u = (double)(z >> 11) / 9007199254740992.0;  // 2^53
        const float v = bf2f(x[i]) * (u < p ? 0.f : keep);
        y[i] = f2bf(accumulate ? bf2f(y[i]) + v : v);
    }
}
