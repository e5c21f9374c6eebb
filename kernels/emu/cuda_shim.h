// Force-included (`-include`) before every kernels/*.cu compiled for the emulated device: the CUDA
// keywords, built-in variables and intrinsics the kernels use, mapped onto the emulator
// (runtime.h). The .cu sources themselves are compiled unchanged; coa_common.cuh swaps its inline
// PTX for emu/ptx.h under COA_EMU.
#pragma once
#ifndef COA_EMU
#define COA_EMU 1
#endif

#include <climits>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <vector_types.h>

#include "runtime.h"

// ---- keywords ----------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One OS thread runs one block at a time, and all of that block's fibers: a thread-local variable
// is exactly a block's shared variable. `extern __shared__` arrays resolve to the block's dynamic
// shared memory (`smem_raw`, defined by the runtime; the emulator poisons shared memory with 0xff
// bytes, NaN as bf16 or f32, before each block).
#define __shared__ thread_local

// ---- built-in variables -------------------------------------------------------------------------
#define threadIdx (::coa_emu::here()->thread_idx)
#define blockIdx (::coa_emu::here()->block_idx)
#define blockDim (::coa_emu::here()->block_dim)
#define gridDim (::coa_emu::here()->grid_dim)
#define warpSize 32

// ---- synchronisation and warp collectives -------------------------------------------------------
inline void __syncthreads() { ::coa_emu::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::coa_emu::sync_warp(mask); }

namespace coa_emu {
template <typename T>
inline T shfl_as(Shfl kind, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a 1-8 byte value");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shfl(kind, mask, bits, arg, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
}  // namespace coa_emu

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return ::coa_emu::shfl_as(::coa_emu::Shfl::Idx, mask, v, src_lane, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::coa_emu::shfl_as(::coa_emu::Shfl::Up, mask, v, int(delta), width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::coa_emu::shfl_as(::coa_emu::Shfl::Down, mask, v, int(delta), width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::coa_emu::shfl_as(::coa_emu::Shfl::Xor, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return ::coa_emu::ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return ::coa_emu::ballot(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return ::coa_emu::ballot(mask, pred) == mask; }

// ---- atomics (blocks of a grid run on several OS threads: real atomics) --------------------------
// Not instrumented by -fsanitize=thread (its atomic hooks are not defined): each reports itself to
// the race check as an atomic access instead.
#define COA_EMU_ATOMIC template <typename T> __attribute__((no_sanitize_thread)) inline
COA_EMU_ATOMIC T atomicAdd(T* p, T v) {
    ::coa_emu::atomic_access(p, sizeof(T));
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    } else {
        T old, sum;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do {
            sum = old + v;
        } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    }
}
COA_EMU_ATOMIC T atomicMin(T* p, T v) {
    ::coa_emu::atomic_access(p, sizeof(T));
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
COA_EMU_ATOMIC T atomicMax(T* p, T v) {
    ::coa_emu::atomic_access(p, sizeof(T));
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
COA_EMU_ATOMIC T atomicExch(T* p, T v) {
    ::coa_emu::atomic_access(p, sizeof(T));
    T old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
COA_EMU_ATOMIC T atomicCAS(T* p, T expected, T desired) {
    ::coa_emu::atomic_access(p, sizeof(T));
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}

// ---- cache-hinted loads and stores: plain accesses on the CPU ------------------------------------
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcs(const T* p) { return *p; }
template <typename T>
inline void __stcs(T* p, T v) { *p = v; }

inline std::size_t __cvta_generic_to_shared(const void* p) { return ::coa_emu::shared_offset(p); }

// ---- math ---------------------------------------------------------------------------------------
// exp2f, expf, log2f, sqrtf, fmaxf, ... : the C library's (<math.h>), correctly rounded or close.
// The GPU's fast intrinsics are approximations; the emulator computes them exactly.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline unsigned __float_as_uint(float f) {
    unsigned i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float __uint_as_float(unsigned i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
