// Attention of new rows over a slot KV cache: the decoding path of `coa-generate policy`.
//
// A batch of R new rows (a decode step is one row per sequence; a prompt or an observation is
// several rows of one sequence). Row r belongs to cache slot slot[r] and sits at absolute position
// pos[r]; it attends causally to positions 0..=pos[r] of its slot (with a sliding window W > 0,
// only to positions > pos[r] - W: the cache keeps every key), which must already hold the keys
// and values of every position up to and including pos[r] (kv_append first).
//
// Shapes (bf16 storage, fp32 arithmetic, as the CPU reference `coa_model::Model::extend`):
//   q        [R, Hq, D]      rows after RoPE, row stride q_st elements (head stride D)
//   k_cache  [S, L, Hkv, D]  one layer's keys: S slots of L positions
//   v_cache  [S, L, Hkv, D]
//   o        [R, Hq, D]      contiguous
// Query head h reads kv head h / (Hq / Hkv) (grouped-query attention). D <= 256.
#include "coa_common.cuh"

#define DEC_MAX_D 256
#define DEC_WARPS 4

// Writes the new rows' keys and values into their slots: k_new/v_new [R, Hkv*D] with row stride
// kv_st elements (they may be column blocks of a fused QKV projection).
extern "C" __global__ void kv_append(const bf16* __restrict__ k_new, const bf16* __restrict__ v_new,
                                     i64 kv_st, bf16* __restrict__ k_cache,
                                     bf16* __restrict__ v_cache, const int* __restrict__ slot,
                                     const int* __restrict__ pos, int R, int HkvD, int L) {
    const i64 total = (i64)R * HkvD;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.x * blockDim.x) {
        const i64 r = e / HkvD;
        const int c = (int)(e % HkvD);
        const i64 dst = ((i64)slot[r] * L + pos[r]) * HkvD + c;
        k_cache[dst] = k_new[r * kv_st + c];
        v_cache[dst] = v_new[r * kv_st + c];
    }
}

// One warp per (row, query head). Keys are visited 32 at a time: lane l scores key j0 + l (a full
// D-long dot product against q, kept in shared memory as fp32), the warp updates the running max
// and normaliser (online softmax), then every lane accumulates its D/32 output dimensions over the
// 32 keys, reading each value row coalesced.
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS)
    attn_extend(const bf16* __restrict__ q, i64 q_st, const bf16* __restrict__ k_cache,
                const bf16* __restrict__ v_cache, const int* __restrict__ slot,
                const int* __restrict__ pos, bf16* __restrict__ o, int R, int Hq, int Hkv, int D,
                int L, float scale, int window) {
    __shared__ float qs[DEC_WARPS][DEC_MAX_D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 task = (i64)blockIdx.x * DEC_WARPS + warp;
    if (task >= (i64)R * Hq) return;  // whole warps leave together; no block barrier below
    const i64 r = task / Hq;
    const int h = (int)(task % Hq);
    const int kvh = h / (Hq / Hkv);
    const int n_keys = pos[r] + 1;
    const i64 kv_row = (i64)Hkv * D;
    const bf16* kb = k_cache + (i64)slot[r] * L * kv_row + (i64)kvh * D;
    const bf16* vb = v_cache + (i64)slot[r] * L * kv_row + (i64)kvh * D;
    const bf16* qr = q + r * q_st + (i64)h * D;
    for (int d = lane; d < D; d += 32) qs[warp][d] = bf2f(qr[d]) * scale;
    __syncwarp();

    const int per_lane = (D + 31) / 32;  // output dims of this lane: lane, lane + 32, ...
    float acc[DEC_MAX_D / 32];
#pragma unroll
    for (int i = 0; i < DEC_MAX_D / 32; ++i) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int j_first = window > 0 ? max(0, n_keys - window) : 0;
    for (int j0 = j_first; j0 < n_keys; j0 += 32) {
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j < n_keys) {
            const bf16* kr = kb + (i64)j * kv_row;
            float dot = 0.f;
            for (int d = 0; d < D; d += 2) {
                const float2 kv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kr + d));
                dot += qs[warp][d] * kv.x + qs[warp][d + 1] * kv.y;
            }
            s = dot;
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float p = j < n_keys ? __expf(s - m_new) : 0.f;
        const float corr = __expf(m - m_new);  // 0 on the first chunk (m = -inf)
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < DEC_MAX_D / 32; ++i) acc[i] *= corr;
        const int n_chunk = min(32, n_keys - j0);
        for (int k = 0; k < n_chunk; ++k) {
            const float pk = __shfl_sync(0xffffffffu, p, k);
            const bf16* vr = vb + (i64)(j0 + k) * kv_row;
#pragma unroll
            for (int i = 0; i < DEC_MAX_D / 32; ++i) {
                const int d = lane + 32 * i;
                if (i < per_lane && d < D) acc[i] += pk * bf2f(vr[d]);
            }
        }
        m = m_new;
    }
    bf16* orow = o + (r * Hq + h) * (i64)D;
    const float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < DEC_MAX_D / 32; ++i) {
        const int d = lane + 32 * i;
        if (i < per_lane && d < D) orow[d] = f2bf(acc[i] * inv);
    }
}
