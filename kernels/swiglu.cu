// SwiGLU: h = silu(gate) * up, silu(z) = z * sigmoid(z).
// gate, up, h, dh, dgate, dup: [N, F] bf16, each with its own row stride (gate and up may be the
// two halves of one fused [N, 2F] projection, and dgate / dup of its gradient); elementwise.
// Backward: dgate = dh * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  dup = dh * silu(g).
#include "coa_common.cuh"

__device__ __forceinline__ float sigmoidf_(float z) { return 1.f / (1.f + __expf(-z)); }

extern "C" __global__ void swiglu_fwd(const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                      bf16* __restrict__ h, int N, int F, i64 gate_st, i64 up_st,
                                      i64 h_st) {
    const i64 total = (i64)N * F;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.x * blockDim.x) {
        const i64 n = e / F;
        const int f = (int)(e % F);
        const float g = bf2f(gate[n * gate_st + f]);
        const float u = bf2f(up[n * up_st + f]);
        h[n * h_st + f] = f2bf(g * sigmoidf_(g) * u);
    }
}

extern "C" __global__ void swiglu_bwd(const bf16* __restrict__ dh, const bf16* __restrict__ gate,
                                      const bf16* __restrict__ up, bf16* __restrict__ dgate,
                                      bf16* __restrict__ dup, int N, int F, i64 gate_st, i64 up_st,
                                      i64 h_st, i64 dg_st, i64 du_st) {
    const i64 total = (i64)N * F;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.x * blockDim.x) {
        const i64 n = e / F;
        const int f = (int)(e % F);
        const float g = bf2f(gate[n * gate_st + f]);
        const float u = bf2f(up[n * up_st + f]);
        const float d = bf2f(dh[n * h_st + f]);
        const float sg = sigmoidf_(g);
        dgate[n * dg_st + f] = f2bf(d * u * sg * (1.f + g * (1.f - sg)));
        dup[n * du_st + f] = f2bf(d * g * sg);
    }
}
