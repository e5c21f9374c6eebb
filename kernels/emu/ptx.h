// The tensor-core and async-copy primitives of coa_common.cuh for the emulated device: same names
// and signatures as the inline-PTX versions there, implemented by the emulator (runtime.h) with
// the PTX ISA's semantics (fragment layouts, alignment rules, wait_group).
#pragma once

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes) {
    ::coa_emu::cp_async16(smem, gmem, bytes);
}
__device__ __forceinline__ void cp_async_commit() { ::coa_emu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    ::coa_emu::cp_async_wait(N);
}

__device__ __forceinline__ void ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                        const void* p) {
    unsigned r[4];
    ::coa_emu::ldmatrix_x4(false, p, r);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
__device__ __forceinline__ void ldsm_x4_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                          const void* p) {
    unsigned r[4];
    ::coa_emu::ldmatrix_x4(true, p, r);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

__device__ __forceinline__ void mma_bf16_16816(float* c, unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
    const unsigned a[4] = {a0, a1, a2, a3};
    const unsigned b[2] = {b0, b1};
    const float cin[4] = {c[0], c[1], c[2], c[3]};
    ::coa_emu::mma_m16n8k16_bf16(c, a, b, cin);
}
