// Causal flash attention, forward and backward (FlashAttention-2 scheme on bf16 tensor cores:
// mma.sync m16n8k16, ldmatrix, cp.async double buffering), grouped-query heads, optional segment
// ids for packed sequences.
//
// Semantics (must equal the CPU reference `coa_model::ops` attention):
//   q [B, T, Hq, D], k/v [B, T, Hkv, D] (any strides, last dim contiguous), Hq % Hkv == 0,
//   query head h reads kv head h / (Hq / Hkv);
//   seg_start [B, T] int32 or NULL: the first token of token i's packed segment
//   (coa_model::ops::segment_layout; seg_start[i] <= i and non-decreasing in i; NULL = all 0);
//   window W >= 0 (0: none): a sliding window, key j allowed only while i - j < W
//   (coa_model::ops attention's `window`; within a segment i - j is the position difference);
//   z[i, j] = scale * q_i . k_j, allowed iff seg_start[b, i] <= j <= i (and i - j < W);
//   p = softmax_j(z) over allowed j; o_i = sum_j p[i, j] v_j;
//   lse[b, i, h] = ln sum_{allowed j} exp(z[i, j])  (f32, natural log, [B, T, Hq] like the CPU
//   reference's [T, Hq]), saved for backward.
// Every row has at least one allowed key (j = i), so lse is finite. Key blocks entirely before a
// query block's first segment start, or before its window, are skipped (packed sequences cost what
// their segments cost).
// Gradients are WRITTEN (the CPU reference accumulates into zeroed buffers: same values).
//
// Backward: delta_i = dO_i . O_i (flash_attn_bwd_pre), then one block per (key block, kv head,
// batch) recomputes P from lse and accumulates dK, dV over every query block and every query head
// of its group in registers (the GQA reduction needs no atomics); dQ is accumulated in f32 with
// atomics into dq_acc [B, T, Hq, D] (zeroed by the host) and converted by flash_attn_dq_convert.
#include "coa_common.cuh"

// One parameter block for all attention kernels (mirrored by `AttnParams` in src/gpu.rs; the
// order and types must stay identical).
struct AttnParams {
    const bf16* q;
    const bf16* k;
    const bf16* v;
    bf16* o;
    float* lse;       // [B, T, Hq]
    const int* seg;   // seg_start [B, T] or NULL
    const bf16* dout; // [B, T, Hq, D] with o's strides
    float* dq_acc;    // [B, T, Hq, D] contiguous f32
    bf16* dq;         // q's strides
    bf16* dk;         // k's strides
    bf16* dv;         // v's strides
    float* delta;     // [B, T, Hq]
    i64 q_sb, q_st, q_sh;
    i64 k_sb, k_st, k_sh;
    i64 v_sb, v_st, v_sh;
    i64 o_sb, o_st, o_sh;
    int B, T, Hq, Hkv;
    float scale;
    int window;       // sliding window (0: none)
};

#define ATT_PAD 8  // bf16 elements of padding per shared-memory row: ldmatrix without bank conflicts

// Loads rows [row0, row0 + ROWS) of a [T, D] slice (row stride `st`) into shared memory with
// cp.async; rows at or past T are zero-filled.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(bf16* sm, const bf16* g, i64 st, int row0, int T) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int LD = D + ATT_PAD;
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
        const int r = c / CPR, col = (c % CPR) * 8;
        const int gr = row0 + r;
        const bool ok = gr < T;
        const bf16* src = g + (i64)(ok ? gr : 0) * st + col;
        cp_async16(sm + r * LD + col, src, ok ? 16 : 0);
    }
}

// ------------------------------------------------------------------------------------------------
// Forward. Block: 4 warps, 64 query rows (16 per warp); loop over 64-key blocks up to the diagonal.
// ------------------------------------------------------------------------------------------------
template <int D>
__device__ __forceinline__ void attn_fwd_impl(const AttnParams& p) {
    constexpr int BM = 64, BN = 64, NT = 128, LD = D + ATT_PAD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* Ks = Qs + BM * LD;          // [2][BN][LD]
    bf16* Vs = Ks + 2 * BN * LD;      // [2][BN][LD]
    __shared__ int first_key;          // smallest seg_start of this block's rows

    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (p.Hq / p.Hkv);
    const int T = p.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;

    const bf16* qg = p.q + (i64)b * p.q_sb + (i64)h * p.q_sh;
    const bf16* kg = p.k + (i64)b * p.k_sb + (i64)hk * p.k_sh;
    const bf16* vg = p.v + (i64)b * p.v_sb + (i64)hk * p.v_sh;
    const int* segb = p.seg ? p.seg + (i64)b * T : nullptr;
    const int q0 = m_block * BM;
    const int row_a = q0 + warp * 16 + g;  // this thread's two query rows: row_a, row_a + 8
    // Segment starts of this thread's rows (rows past T: no constraint; they are not stored).
    const int ss0 = (segb && row_a < T) ? segb[row_a] : 0;
    const int ss1 = (segb && row_a + 8 < T) ? segb[row_a + 8] : 0;

    load_tile<BM, D, NT>(Qs, qg, p.q_st, q0, T);
    cp_async_commit();
    if (threadIdx.x == 0) first_key = T;
    __syncthreads();
    if (threadIdx.x < BM && q0 + (int)threadIdx.x < T)
        atomicMin(&first_key, segb ? segb[q0 + threadIdx.x] : 0);
    __syncthreads();
    // With a window, keys before q0 - W + 1 are out of every row's reach.
    const int n_begin = max(first_key, p.window > 0 ? q0 - p.window + 1 : 0) / BN;
    const int n_end = min((T + BN - 1) / BN, (q0 + BM - 1) / BN + 1);
    load_tile<BN, D, NT>(Ks + (n_begin & 1) * BN * LD, kg, p.k_st, n_begin * BN, T);
    load_tile<BN, D, NT>(Vs + (n_begin & 1) * BN * LD, vg, p.v_st, n_begin * BN, T);
    cp_async_commit();

    // Q fragments stay in registers for the whole loop.
    cp_async_wait<1>();
    __syncthreads();
    unsigned qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const float sl2 = p.scale * COA_LOG2E;

    for (int nb = n_begin; nb < n_end; ++nb) {
        const int buf = nb & 1;
        if (nb + 1 < n_end) {
            const int nxt = (nb + 1) & 1;
            load_tile<BN, D, NT>(Ks + nxt * BN * LD, kg, p.k_st, (nb + 1) * BN, T);
            load_tile<BN, D, NT>(Vs + nxt * BN * LD, vg, p.v_st, (nb + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* Kb = Ks + buf * BN * LD;
        const bf16* Vb = Vs + buf * BN * LD;

        // S = Q K^T for this warp's 16 rows x 64 keys.
        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3,
                        Kb + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                            ((lane >> 3) & 1) * 8);
                mma_bf16_16816(s[2 * np], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
                mma_bf16_16816(s[2 * np + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b2, b3);
            }
        }

        // Scale to log2 units, mask, online softmax.
        const bool need_mask = segb != nullptr || (nb + 1) * BN > q0 || p.window > 0;
        float mnew[2] = {mrow[0], mrow[1]};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[nt][e] * sl2;
                if (need_mask) {
                    const int j = nb * BN + nt * 8 + 2 * t + (e & 1);
                    const int i = row_a + (e >> 1) * 8;
                    if (j > i || j < ((e >> 1) ? ss1 : ss0) || (p.window > 0 && i - j >= p.window))
                        x = -INFINITY;
                }
                s[nt][e] = x;
                mnew[e >> 1] = fmaxf(mnew[e >> 1], x);
            }
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mnew[r] = fmaxf(mnew[r], __shfl_xor_sync(0xffffffffu, mnew[r], 1));
            mnew[r] = fmaxf(mnew[r], __shfl_xor_sync(0xffffffffu, mnew[r], 2));
            const float base = mnew[r] == -INFINITY ? 0.f : mnew[r];
            corr[r] = exp2f(mrow[r] - base);  // exp2(-inf) = 0 on the first live block
            mrow[r] = mnew[r];
            lrow[r] *= corr[r];
        }
        const float base0 = mrow[0] == -INFINITY ? 0.f : mrow[0];
        const float base1 = mrow[1] == -INFINITY ? 0.f : mrow[1];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - base0);
            s[nt][1] = exp2f(s[nt][1] - base0);
            s[nt][2] = exp2f(s[nt][2] - base1);
            s[nt][3] = exp2f(s[nt][3] - base1);
            lrow[0] += s[nt][0] + s[nt][1];
            lrow[1] += s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= corr[0];
            o[dt][1] *= corr[0];
            o[dt][2] *= corr[1];
            o[dt][3] *= corr[1];
        }

        // O += P V, P straight from the accumulators (C layout of two tiles == A layout).
#pragma unroll
        for (int kc = 0; kc < BN / 16; ++kc) {
            const unsigned a0 = pack_bf16x2(s[2 * kc][0], s[2 * kc][1]);
            const unsigned a1 = pack_bf16x2(s[2 * kc][2], s[2 * kc][3]);
            const unsigned a2 = pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            const unsigned a3 = pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3,
                          Vb + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                              (lane >> 4) * 8);
                mma_bf16_16816(o[2 * dp], a0, a1, a2, a3, b0, b1);
                mma_bf16_16816(o[2 * dp + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        __syncthreads();  // this buffer is refilled two iterations later
    }

    // Finish: full row sums across the 4 threads of a row group, normalise, store.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    }
    const float inv0 = 1.f / lrow[0], inv1 = 1.f / lrow[1];
    bf16* og = p.o + (i64)b * p.o_sb + (i64)h * p.o_sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = row_a + r * 8;
        if (i < T) {
            const float inv = r ? inv1 : inv0;
            bf16* orow = og + (i64)i * p.o_st;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                *reinterpret_cast<unsigned*>(orow + dt * 8 + 2 * t) =
                    pack_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
            }
            if (t == 0) p.lse[((i64)b * T + i) * p.Hq + h] = (mrow[r] + log2f(lrow[r])) * COA_LN2;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) flash_attn_fwd_d64(const AttnParams p) {
    attn_fwd_impl<64>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_attn_fwd_d128(const AttnParams p) {
    attn_fwd_impl<128>(p);
}

// ------------------------------------------------------------------------------------------------
// Backward preprocessing: delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d]. One warp per row.
// ------------------------------------------------------------------------------------------------
extern "C" __global__ void flash_attn_bwd_pre(const AttnParams p, int D) {
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const i64 nrows = (i64)p.B * p.T * p.Hq;
    if (row >= nrows) return;
    // row enumerates (b, i, h) in lse/delta order [B, T, Hq].
    const int h = (int)(row % p.Hq);
    const int i = (int)((row / p.Hq) % p.T);
    const int b = (int)(row / ((i64)p.T * p.Hq));
    const bf16* orow = p.o + (i64)b * p.o_sb + (i64)i * p.o_st + (i64)h * p.o_sh;
    const bf16* drow = p.dout + (i64)b * p.o_sb + (i64)i * p.o_st + (i64)h * p.o_sh;
    float acc = 0.f;
    for (int d = lane * 2; d < D; d += 64) {
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(orow + d));
        const float2 c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(drow + d));
        acc += a.x * c.x + a.y * c.y;
    }
    acc = warp_sum(acc);
    if (lane == 0) p.delta[row] = acc;
}

// dq[b, i, h, :] = bf16(dq_acc[b, i, h, :]); one thread per element.
extern "C" __global__ void flash_attn_dq_convert(const AttnParams p, int D) {
    const i64 n = (i64)p.B * p.T * p.Hq * D;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        const int d = (int)(e % D);
        const i64 r = e / D;
        const int h = (int)(r % p.Hq);
        const i64 bi = r / p.Hq;
        const int i = (int)(bi % p.T);
        const int b = (int)(bi / p.T);
        p.dq[(i64)b * p.q_sb + (i64)i * p.q_st + (i64)h * p.q_sh + d] = f2bf(p.dq_acc[e]);
    }
}

// ------------------------------------------------------------------------------------------------
// Backward main. Block: 4 warps, 64 keys (16 per warp) of kv head hk; loops over the query heads of
// the group and the query blocks (BM rows) at or below the diagonal.
// ------------------------------------------------------------------------------------------------
template <int D, int BM>
__device__ __forceinline__ void attn_bwd_impl(const AttnParams& p) {
    constexpr int BN = 64, NT = 128, LD = D + ATT_PAD, LDS = BM + ATT_PAD;
    constexpr int MT = BM / 16;        // query m-tiles in the dQ product
    constexpr int WD = D * MT / 4;     // d columns per warp in the dQ product
    static_assert(WD % 16 == 0, "dQ split");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Ks = reinterpret_cast<bf16*>(smem_raw);  // [BN][LD]
    bf16* Vs = Ks + BN * LD;                       // [BN][LD]
    bf16* Qs = Vs + BN * LD;                       // [2][BM][LD]
    bf16* dOs = Qs + 2 * BM * LD;                  // [2][BM][LD]
    bf16* dSs = dOs + 2 * BM * LD;                 // [BN][LDS]  dS^T
    float* lse_s = reinterpret_cast<float*>(dSs + BN * LDS);  // [2][BM], log2 units
    float* del_s = lse_s + 2 * BM;                            // [2][BM]
    int* ssq = reinterpret_cast<int*>(del_s + 2 * BM);        // [2][BM] seg_start of the queries
    __shared__ int m_stop;

    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int G = p.Hq / p.Hkv;
    const int T = p.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int k0 = n_block * BN;
    const int* segb = p.seg ? p.seg + (i64)b * T : nullptr;

    const bf16* kg = p.k + (i64)b * p.k_sb + (i64)hk * p.k_sh;
    const bf16* vg = p.v + (i64)b * p.v_sb + (i64)hk * p.v_sh;
    load_tile<BN, D, NT>(Ks, kg, p.k_st, k0, T);
    load_tile<BN, D, NT>(Vs, vg, p.v_st, k0, T);
    cp_async_commit();

    // Query blocks that can see this key block: from the diagonal down to the first block whose
    // rows all start their segment after the block's last key (seg_start is non-decreasing), and,
    // with a window, no further than the block's last key plus W - 1.
    const int m_start = k0 / BM;
    const int m_blocks = (T + BM - 1) / BM;
    if (threadIdx.x == 0) m_stop = p.window > 0 ? min(m_blocks, (k0 + BN - 1 + p.window - 1) / BM + 1) : m_blocks;
    __syncthreads();
    if (segb) {
        const int k_last = k0 + BN - 1;
        for (int m = m_start + threadIdx.x; m < m_blocks; m += NT)
            if (segb[m * BM] > k_last) atomicMin(&m_stop, m);
    }
    __syncthreads();
    const int nm = max(m_stop - m_start, 0);
    const int niter = nm * G;

    auto issue = [&](int it, int buf) {
        const int h = hk * G + it / nm;
        const int q0 = (m_start + it % nm) * BM;
        const bf16* qg = p.q + (i64)b * p.q_sb + (i64)h * p.q_sh;
        const bf16* dg = p.dout + (i64)b * p.o_sb + (i64)h * p.o_sh;
        load_tile<BM, D, NT>(Qs + buf * BM * LD, qg, p.q_st, q0, T);
        load_tile<BM, D, NT>(dOs + buf * BM * LD, dg, p.o_st, q0, T);
        cp_async_commit();
        const float* lg = p.lse + (i64)b * T * p.Hq + h;
        const float* dl = p.delta + (i64)b * T * p.Hq + h;
        for (int r = threadIdx.x; r < BM; r += NT) {
            const int i = q0 + r;
            lse_s[buf * BM + r] = i < T ? lg[(i64)i * p.Hq] * COA_LOG2E : 0.f;
            del_s[buf * BM + r] = i < T ? dl[(i64)i * p.Hq] : 0.f;
            ssq[buf * BM + r] = (segb && i < T) ? segb[i] : 0;
        }
    };

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    const float sl2 = p.scale * COA_LOG2E;

    if (niter > 0) issue(0, 0);
    for (int it = 0; it < niter; ++it) {
        const int buf = it & 1;
        const int h = hk * G + it / nm;
        const int q0 = (m_start + it % nm) * BM;
        if (it + 1 < niter) {
            issue(it + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* Qb = Qs + buf * BM * LD;
        const bf16* dOb = dOs + buf * BM * LD;
        const float* lb = lse_s + buf * BM;
        const float* db = del_s + buf * BM;
        const int* sq = ssq + buf * BM;

        // S^T = K Q^T and dP^T = V dO^T, this warp's 16 keys x BM queries.
        float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
        for (int i = 0; i < BM / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned ka0, ka1, ka2, ka3, va0, va1, va2, va3;
            const int arow = (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8;
            ldsm_x4(ka0, ka1, ka2, ka3, Ks + arow);
            ldsm_x4(va0, va1, va2, va3, Vs + arow);
#pragma unroll
            for (int np = 0; np < BM / 16; ++np) {
                const int brow = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                                 ((lane >> 3) & 1) * 8;
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, Qb + brow);
                mma_bf16_16816(st[2 * np], ka0, ka1, ka2, ka3, b0, b1);
                mma_bf16_16816(st[2 * np + 1], ka0, ka1, ka2, ka3, b2, b3);
                ldsm_x4(b0, b1, b2, b3, dOb + brow);
                mma_bf16_16816(dpt[2 * np], va0, va1, va2, va3, b0, b1);
                mma_bf16_16816(dpt[2 * np + 1], va0, va1, va2, va3, b2, b3);
            }
        }

        // P^T = exp(z - lse) with the mask; dS^T = P^T * (dP^T - delta).
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int kr = warp * 16 + g + (e >> 1) * 8;  // key row in block
                const int qc = nt * 8 + 2 * t + (e & 1);      // query col in block
                const int j = k0 + kr, i = q0 + qc;
                const bool ok = j <= i && i < T && j >= sq[qc] && (p.window == 0 || i - j < p.window);
                const float pv = ok ? exp2f(st[nt][e] * sl2 - lb[qc]) : 0.f;
                st[nt][e] = pv;
                dpt[nt][e] = pv * (dpt[nt][e] - db[qc]);
            }
        }

        // dV += P^T dO and dK += dS^T Q (A operands from registers); dS^T to shared memory.
#pragma unroll
        for (int kc = 0; kc < BM / 16; ++kc) {
            const unsigned pa0 = pack_bf16x2(st[2 * kc][0], st[2 * kc][1]);
            const unsigned pa1 = pack_bf16x2(st[2 * kc][2], st[2 * kc][3]);
            const unsigned pa2 = pack_bf16x2(st[2 * kc + 1][0], st[2 * kc + 1][1]);
            const unsigned pa3 = pack_bf16x2(st[2 * kc + 1][2], st[2 * kc + 1][3]);
            const unsigned sa0 = pack_bf16x2(dpt[2 * kc][0], dpt[2 * kc][1]);
            const unsigned sa1 = pack_bf16x2(dpt[2 * kc][2], dpt[2 * kc][3]);
            const unsigned sa2 = pack_bf16x2(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]);
            const unsigned sa3 = pack_bf16x2(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3]);
            bf16* ds_row0 = dSs + (warp * 16 + g) * LDS + kc * 16 + 2 * t;
            bf16* ds_row1 = ds_row0 + 8 * LDS;
            *reinterpret_cast<unsigned*>(ds_row0) = sa0;
            *reinterpret_cast<unsigned*>(ds_row1) = sa1;
            *reinterpret_cast<unsigned*>(ds_row0 + 8) = sa2;
            *reinterpret_cast<unsigned*>(ds_row1 + 8) = sa3;
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                const int brow = (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                 (lane >> 4) * 8;
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, dOb + brow);
                mma_bf16_16816(dv[2 * dp], pa0, pa1, pa2, pa3, b0, b1);
                mma_bf16_16816(dv[2 * dp + 1], pa0, pa1, pa2, pa3, b2, b3);
                ldsm_x4_t(b0, b1, b2, b3, Qb + brow);
                mma_bf16_16816(dk[2 * dp], sa0, sa1, sa2, sa3, b0, b1);
                mma_bf16_16816(dk[2 * dp + 1], sa0, sa1, sa2, sa3, b2, b3);
            }
        }
        __syncthreads();

        // dQ (BM x D) += dS (BM x BN) K (BN x D): warp -> m-tile (warp % MT), d columns
        // [(warp / MT) * WD, + WD).
        {
            const int mt = warp % MT, d0 = (warp / MT) * WD;
            float dq[WD / 8][4];
#pragma unroll
            for (int i = 0; i < WD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < BN / 16; ++kc) {
                unsigned a0, a1, a2, a3;
                ldsm_x4_t(a0, a1, a2, a3,
                          dSs + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + mt * 16 +
                              ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int dp = 0; dp < WD / 16; ++dp) {
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_t(b0, b1, b2, b3,
                              Ks + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d0 +
                                  dp * 16 + (lane >> 4) * 8);
                    mma_bf16_16816(dq[2 * dp], a0, a1, a2, a3, b0, b1);
                    mma_bf16_16816(dq[2 * dp + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            float* dqg = p.dq_acc + (((i64)b * T) * p.Hq + h) * D;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = q0 + mt * 16 + g + r * 8;
                if (i < T) {
                    float* row = dqg + (i64)i * p.Hq * D + d0;
#pragma unroll
                    for (int dt = 0; dt < WD / 8; ++dt) {
                        atomicAdd(row + dt * 8 + 2 * t, dq[dt][2 * r] * p.scale);
                        atomicAdd(row + dt * 8 + 2 * t + 1, dq[dt][2 * r + 1] * p.scale);
                    }
                }
            }
        }
        __syncthreads();  // Q/dO/dS buffers are refilled next
    }
    cp_async_wait<0>();  // niter == 0 leaves the K/V group pending; never exit with copies in flight

    // Store dK (scaled) and dV for this warp's 16 keys.
    bf16* dkg = p.dk + (i64)b * p.k_sb + (i64)hk * p.k_sh;
    bf16* dvg = p.dv + (i64)b * p.v_sb + (i64)hk * p.v_sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = k0 + warp * 16 + g + r * 8;
        if (j < T) {
            bf16* krow = dkg + (i64)j * p.k_st;
            bf16* vrow = dvg + (i64)j * p.v_st;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                *reinterpret_cast<unsigned*>(krow + dt * 8 + 2 * t) =
                    pack_bf16x2(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
                *reinterpret_cast<unsigned*>(vrow + dt * 8 + 2 * t) =
                    pack_bf16x2(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) flash_attn_bwd_d64(const AttnParams p) {
    attn_bwd_impl<64, 64>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_attn_bwd_d128(const AttnParams p) {
    attn_bwd_impl<128, 32>(p);
}
