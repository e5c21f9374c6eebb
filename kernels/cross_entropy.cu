// Fused softmax cross-entropy, forward and backward in one pass over the logits.
//
// logits [N, V] bf16, row-major (row stride V); targets [N] int32; g [N] f32, the per-row gradient
// scale. For row i with target y_i >= 0:
//   lse_i  = ln sum_j exp(logits[i, j])
//   logp_i = logits[i, y_i] - lse_i                       (written to logp[i])
//   d/dlogits[i, j] = g_i * (softmax_ij - [j == y_i])     (written IN PLACE over logits, bf16)
// so the gradient is that of  L = sum_i g_i * (-logp_i).
//   - SFT masked loss: g_i = mask_i / sum(mask)  (xent_weights_from_mask), L = xent_loss_sum
//     (= coa_model::ops::masked_cross_entropy).
//   - RL / any token-level objective with c_i = dL/dlogp_i: pass g_i = -c_i
//     (= coa_model::ops::logsoftmax_backward_inplace with dlogp = c).
// Rows with y_i < 0, or with g_i == 0 when the gradient is written, are skipped without reading
// their logits: logp = 0, lse = 0, gradient row = 0 ("masked rows contribute nothing").
// write_grad = 0 computes logp / lse only (log-prob recompute for RL) and leaves logits unchanged.
//
// One block per row. Pass 1 reads the row once (online max / sum of exponentials per thread) and
// keeps the first `cache_elems` logits in shared memory; pass 2 writes the gradient from that copy
// (the rest of a very long row is re-read, normally from L2). DRAM traffic: one read and one write.
#include "coa_common.cuh"

struct MaxSum {
    float m;  // running max, log2 units
    float s;  // sum of exp2(x - m)
};

__device__ __forceinline__ void ms_add(MaxSum& a, float x) {
    if (x > a.m) {
        a.s = a.s * exp2f(a.m - x) + 1.f;
        a.m = x;
    } else {
        a.s += exp2f(x - a.m);
    }
}
__device__ __forceinline__ MaxSum ms_merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;
    MaxSum r;
    r.m = m;
    r.s = a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m);
    return r;
}

__device__ __forceinline__ MaxSum block_maxsum(MaxSum v, float* scratch /* 64 floats */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum w;
        w.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        w.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        v = ms_merge(v, w);
    }
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v.m;
        scratch[32 + warp] = v.s;
    }
    __syncthreads();
    MaxSum r;
    r.m = lane < nwarps ? scratch[lane] : -INFINITY;
    r.s = lane < nwarps ? scratch[32 + lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum w;
        w.m = __shfl_xor_sync(0xffffffffu, r.m, o);
        w.s = __shfl_xor_sync(0xffffffffu, r.s, o);
        r = ms_merge(r, w);
    }
    return r;
}

extern "C" __global__ void __launch_bounds__(1024)
    xent_fwd_bwd(bf16* __restrict__ logits, const int* __restrict__ targets,
                 const float* __restrict__ g, float* __restrict__ logp, float* __restrict__ lse_out,
                 int N, int V, int write_grad, int cache_elems) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float scratch[64];
    bf16* cache = reinterpret_cast<bf16*>(smem_raw);
    const int row = blockIdx.x;
    if (row >= N) return;
    bf16* x = logits + (i64)row * V;
    const int y = targets[row];
    const float gi = g ? g[row] : 1.f;
    const bool skip = y < 0 || y >= V || (write_grad && gi == 0.f);
    if (skip) {
        if (threadIdx.x == 0) {
            logp[row] = 0.f;
            if (lse_out) lse_out[row] = 0.f;
        }
        if (write_grad) {
            const bf16 z = f2bf(0.f);
            if ((V & 7) == 0) {
                uint4 zz = make_uint4(0, 0, 0, 0);
                for (int c = threadIdx.x; c < V / 8; c += blockDim.x) reinterpret_cast<uint4*>(x)[c] = zz;
            } else {
                for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = z;
            }
        }
        return;
    }

    MaxSum ms = {-INFINITY, 0.f};
    const bool vec = (V & 7) == 0;
    if (vec) {
        const int nc = V / 8, cc = cache_elems / 8;
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        uint4* cv = reinterpret_cast<uint4*>(cache);
#pragma unroll 4
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const uint4 u = __ldcs(xv + c);  // streamed: pass 2 reads the shared-memory copy
            if (c < cc) cv[c] = u;
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
            float f[8];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float2 p2 = unpack_bf16x2(w[q]);
                f[2 * q] = p2.x * COA_LOG2E;
                f[2 * q + 1] = p2.y * COA_LOG2E;
            }
            float mx = f[0];
#pragma unroll
            for (int q = 1; q < 8; ++q) mx = fmaxf(mx, f[q]);
            const float m = fmaxf(ms.m, mx);
            float s = ms.s * exp2f(ms.m - m);
#pragma unroll
            for (int q = 0; q < 8; ++q) s += exp2f(f[q] - m);
            ms.m = m;
            ms.s = s;
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) ms_add(ms, bf2f(x[j]) * COA_LOG2E);
    }
    ms = block_maxsum(ms, scratch);
    const float lse2 = ms.m + log2f(ms.s);  // log2 units
    const float lse = lse2 * COA_LN2;
    const float xy = bf2f(x[y]);  // read before pass 2 overwrites the row
    if (threadIdx.x == 0) {
        logp[row] = xy - lse;
        if (lse_out) lse_out[row] = lse;
    }
    if (!write_grad) return;
    __syncthreads();  // every thread has read x[y]; the cache is complete

    if (vec) {
        const int nc = V / 8, cc = cache_elems / 8;
        uint4* xv = reinterpret_cast<uint4*>(x);
        const uint4* cv = reinterpret_cast<const uint4*>(cache);
#pragma unroll 4
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const uint4 u = c < cc ? cv[c] : xv[c];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
            unsigned o[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float2 p2 = unpack_bf16x2(w[q]);
                const int j = c * 8 + 2 * q;
                float g0 = exp2f(p2.x * COA_LOG2E - lse2) - (j == y ? 1.f : 0.f);
                float g1 = exp2f(p2.y * COA_LOG2E - lse2) - (j + 1 == y ? 1.f : 0.f);
                o[q] = pack_bf16x2(gi * g0, gi * g1);
            }
            __stcs(xv + c, make_uint4(o[0], o[1], o[2], o[3]));
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float pj = exp2f(bf2f(x[j]) * COA_LOG2E - lse2);
            x[j] = f2bf(gi * (pj - (j == y ? 1.f : 0.f)));
        }
    }
}

// g[i] = mask[i] / sum(mask) (all 0 when sum(mask) == 0), mask [N] f32 (0/1 or any weights):
// the SFT weights of coa_model::ops::masked_cross_entropy. One block; deterministic (fixed
// reduction order for a given block size).
extern "C" __global__ void xent_weights_from_mask(const float* __restrict__ mask,
                                                  float* __restrict__ g, int N) {
    __shared__ float scratch[32];
    float c = 0.f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) c += mask[i];
    const float total = block_sum(c, scratch);
    const float inv = total == 0.f ? 0.f : 1.f / total;
    for (int i = threadIdx.x; i < N; i += blockDim.x) g[i] = mask[i] * inv;
}

// out[0] = sum_i g[i] * (-logp[i]): the loss whose gradient xent_fwd_bwd wrote. One block,
// deterministic.
extern "C" __global__ void xent_loss_sum(const float* __restrict__ logp, const float* __restrict__ g,
                                         float* __restrict__ out, int N) {
    __shared__ float scratch[32];
    float acc = 0.f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += (g ? g[i] : 1.f) * -logp[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = acc;
}

// Entropy of each row's predictive distribution, an RL statistic (the CPU reference's
// `logsoftmax_forward` entropy): with p_j = exp(z_j - lse) over logits [N, V] (unchanged) and
// lse [N] from xent_fwd_bwd (write_grad = 0),
//   entropy[i] = sum_j p_j * (lse - z_j)   (nats; 0 for rows with target < 0, like logp)
// One block per row (grid-stride), f32 accumulation, deterministic.
extern "C" __global__ void xent_entropy(const bf16* __restrict__ logits, const int* __restrict__ targets,
                                        const float* __restrict__ lse, float* __restrict__ entropy,
                                        int N, int V) {
    __shared__ float scratch[32];
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        // Uniform across the block: every thread reads the same target.
        if (targets[row] < 0 || targets[row] >= V) {
            if (threadIdx.x == 0) entropy[row] = 0.f;
            continue;
        }
        const bf16* x = logits + (i64)row * V;
        const float l = lse[row];
        float acc = 0.f;
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float nlp = l - bf2f(x[j]);  // -log p_j >= 0
            acc += expf(-nlp) * nlp;
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) entropy[row] = acc;
    }
}
