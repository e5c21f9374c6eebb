// Rotary position embedding, HF "rotate_half" convention, in place.
//
// x: rows of H heads of D = head_dim bf16 values; token n, head h starts at x + n*st + h*sh.
// cos_t, sin_t [P, D/2] f32 tables built on the host by the CPU reference
// (coa_model::ops::rope_tables: angle = pos * theta^(-2i/D) in f32).
// pos [N] int32 selects table row pos[n] for token n; pos == NULL means the tables are per token
// (row n for token n, P = N), exactly the CPU reference's layout.
// For i < D/2, with c = cos_t[r, i], s = sin_t[r, i] (s negated when inverse != 0):
//   out[i]       = x[i] * c - x[i + D/2] * s
//   out[i + D/2] = x[i + D/2] * c + x[i] * s
// The backward of the rotation is the rotation by -angle: call with inverse = 1 on the gradient.
#include "coa_common.cuh"

extern "C" __global__ void rope_apply(bf16* __restrict__ x, const int* __restrict__ pos,
                                      const float* __restrict__ cos_t,
                                      const float* __restrict__ sin_t, int N, int H, int D, i64 st,
                                      i64 sh, int inverse) {
    const int half = D / 2;
    const i64 total = (i64)N * H * half;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (i64)gridDim.x * blockDim.x) {
        const int i = (int)(e % half);
        const i64 nh = e / half;
        const int h = (int)(nh % H);
        const i64 n = nh / H;
        const i64 p = pos ? (i64)pos[n] : n;
        const float c = cos_t[p * half + i];
        const float s = inverse ? -sin_t[p * half + i] : sin_t[p * half + i];
        bf16* xr = x + n * st + (i64)h * sh;
        const float a = bf2f(xr[i]), b = bf2f(xr[i + half]);
        xr[i] = f2bf(a * c - b * s);
        xr[i + half] = f2bf(b * c + a * s);
    }
}
