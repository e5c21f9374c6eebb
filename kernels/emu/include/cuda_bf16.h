// The emulated device's <cuda_bf16.h>: the bf16 types and conversions the kernels use, with the
// semantics of CUDA's header (round-to-nearest-even; a NaN stays a NaN). Found before any CUDA
// toolkit's header because kernels/build.rs puts this directory first on the include path of the
// emulated build only; NVRTC never sees it.
#pragma once
#include <cstdint>
#include <cstring>

#include <vector_types.h>

struct __nv_bfloat16 {
    uint16_t x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x;  // low 16 bits of the 32-bit register
    __nv_bfloat16 y;  // high 16 bits
};
static_assert(sizeof(__nv_bfloat162) == 4, "bf16x2 is one 32-bit register");

inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = uint32_t(h.x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest, ties to even; NaN -> the canonical quiet NaN 0x7fff (CUDA's choice).
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        h.x = 0x7fff;
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.x = uint16_t(u >> 16);
    return h;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    return float2{__bfloat162float(v.x), __bfloat162float(v.y)};
}
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
