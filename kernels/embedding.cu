// Token embedding, forward and backward.
// Forward: out[n, :] = W[tok[n], :]   (W [Vocab, D] bf16, out [N, D] bf16).
// Backward (deterministic, sorted scatter-add): the host groups the positions by token id
// (EmbeddingGradPlan in src/gpu.rs): uniq [U] token ids, start [U + 1] offsets into order [N]
// (positions sorted by token). One block per unique token sums its rows of dout in a fixed order:
//   dW[uniq[u], :] += sum_{k in start[u]..start[u+1]} dout[order[k], :]    (dW f32 [Vocab, D])
#include "coa_common.cuh"

extern "C" __global__ void embedding_fwd(const int* __restrict__ tok, const bf16* __restrict__ W,
                                         bf16* __restrict__ out, int N, int D, int vocab) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        int t = tok[n];
        t = t < 0 ? 0 : (t >= vocab ? vocab - 1 : t);  // the host validates; never read outside W
        const bf16* src = W + (i64)t * D;
        bf16* dst = out + (i64)n * D;
        if ((D & 7) == 0) {
            for (int c = threadIdx.x; c < D / 8; c += blockDim.x)
                reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
        } else {
            for (int c = threadIdx.x; c < D; c += blockDim.x) dst[c] = src[c];
        }
    }
}

extern "C" __global__ void embedding_bwd_sorted(const bf16* __restrict__ dout,
                                                const int* __restrict__ order,
                                                const int* __restrict__ start,
                                                const int* __restrict__ uniq,
                                                float* __restrict__ dW, int U, int D) {
    for (int u = blockIdx.x; u < U; u += gridDim.x) {
        const int k0 = start[u], k1 = start[u + 1];
        float* dst = dW + (i64)uniq[u] * D;
        for (int c = threadIdx.x; c < D; c += blockDim.x) {
            float acc = 0.f;
            for (int k = k0; k < k1; ++k) acc += bf2f(dout[(i64)order[k] * D + c]);
            dst[c] += acc;
        }
    }
}
