// Kernels that do what a GPU refuses or what goes wrong without a barrier: compiled into the
// emulated device only (module "emu_hazards"), for its tests (kernels/tests/emulated_device.rs).
// Each comment says what the emulator must report.
#include "coa_common.cuh"

// ldmatrix from a row address that is not 16-byte aligned: CUDA_ERROR_MISALIGNED_ADDRESS.
extern "C" __global__ void ldmatrix_misaligned(unsigned* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned r0, r1, r2, r3;
    ldsm_x4(r0, r1, r2, r3, smem_raw + 16 * threadIdx.x + 2);
    out[threadIdx.x] = r0 + r1 + r2 + r3;
}

// ldmatrix from global memory: CUDA_ERROR_ILLEGAL_ADDRESS.
extern "C" __global__ void ldmatrix_from_global(const bf16* g, unsigned* out) {
    unsigned r0, r1, r2, r3;
    ldsm_x4(r0, r1, r2, r3, g + 8 * threadIdx.x);
    out[threadIdx.x] = r0 + r1 + r2 + r3;
}

// cp.async into a shared address that is not 16-byte aligned: CUDA_ERROR_MISALIGNED_ADDRESS.
extern "C" __global__ void cp_async_misaligned(const bf16* g, float* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    cp_async16(smem_raw + 8, g, 16);
    cp_async_commit();
    cp_async_wait<0>();
    out[threadIdx.x] = 0.f;
}

// Half of each warp returns before a full-mask shuffle: the other half waits for lanes that will
// never come (a warp collective some lanes skip): CUDA_ERROR_LAUNCH_FAILED.
extern "C" __global__ void shuffle_some_lanes_skip(float* out) {
    if ((threadIdx.x & 31) >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1);
}

// Lanes 0-15 of warp 0 shuffle while everyone else waits at __syncthreads: neither can finish.
extern "C" __global__ void deadlock(float* out) {
    float v = float(threadIdx.x);
    if (threadIdx.x < 16) {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = v;
}

// Two halves of a warp in different collectives: CUDA_ERROR_LAUNCH_FAILED.
extern "C" __global__ void divergent_collectives(float* out) {
    float v = float(threadIdx.x);
    if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else v = float(__ballot_sync(0xffffffffu, 1));
    out[threadIdx.x] = v;
}

// Every thread writes its slot, then reads its neighbour's: with `barrier` a __syncthreads between
// the two (correct: out[i] = i + 1 mod n), without it the read races the neighbour's write and the
// emulator shows it (poisoned shared memory reads as NaN).
extern "C" __global__ void neighbour_read(float* out, int barrier) {
    __shared__ float slot[1024];
    const unsigned n = blockDim.x, i = threadIdx.x;
    slot[i] = float(i);
    if (barrier) __syncthreads();
    out[i] = slot[(i + 1) % n];
}

// cp.async without its wait_group: the copy has not landed when the thread reads it (NaN).
extern "C" __global__ void cp_async_read_before_wait(const float* g, float* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* s = reinterpret_cast<float*>(smem_raw);
    cp_async16(s + 4 * threadIdx.x, g + 4 * threadIdx.x, 16);
    cp_async_commit();
    out[threadIdx.x] = s[4 * threadIdx.x];
    cp_async_wait<0>();
    out[blockDim.x + threadIdx.x] = s[4 * threadIdx.x];
}

// The order threads run in: each appends its index, meets its warp at __syncwarp, appends 1000 +
// its index.
extern "C" __global__ void order_probe(int* log, int* count) {
    log[atomicAdd(count, 1)] = int(threadIdx.x);
    __syncwarp();
    log[atomicAdd(count, 1)] = 1000 + int(threadIdx.x);
}

// Launch bounds: may not be launched with more than 64 threads per block.
extern "C" __global__ void __launch_bounds__(64) bounded(float* out) { out[threadIdx.x] = 1.f; }

// ---- the primitives against their PTX ISA definitions (one warp) --------------------------------

// D [16, 8] = A [16, 16] B [16, 8] through one mma.sync.m16n8k16, the fragments gathered by hand
// from the ISA's layout: A row-major, B given transposed (bt [8, 16], row n = column n of B).
extern "C" __global__ void mma_probe(const bf16* a, const bf16* bt, const float* c, float* d) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    auto pk = [](bf16 lo, bf16 hi) { return pack_bf16x2(bf2f(lo), bf2f(hi)); };
    const unsigned a0 = pk(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
    const unsigned a1 = pk(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
    const unsigned a2 = pk(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
    const unsigned a3 = pk(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
    const unsigned b0 = pk(bt[g * 16 + 2 * t], bt[g * 16 + 2 * t + 1]);
    const unsigned b1 = pk(bt[g * 16 + 2 * t + 8], bt[g * 16 + 2 * t + 9]);
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    mma_bf16_16816(acc, a0, a1, a2, a3, b0, b1);
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// A 16x16 bf16 tile through shared memory and ldmatrix.x4 (lane l gives row l % 16, column
// 8 (l / 16) of the tile), plain and .trans: out[lane][0..4] and out[lane][4..8].
extern "C" __global__ void ldmatrix_probe(const bf16* tile, unsigned* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* s = reinterpret_cast<bf16*>(smem_raw);
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) s[i] = tile[i];
    __syncwarp();
    const bf16* row = s + (lane & 15) * 16 + (lane >> 4) * 8;
    unsigned* o = out + lane * 8;
    ldsm_x4(o[0], o[1], o[2], o[3], row);
    ldsm_x4_t(o[4], o[5], o[6], o[7], row);
}

// ---- what the memory checks report (runtime.h) --------------------------------------------------

// Thread i of the grid copies in[i] to out[i] (`mode` 0) or writes 1 to out[i] (`mode` 1): the
// caller passes buffers shorter than the grid, so the last threads read or write past their end.
extern "C" __global__ void global_overrun(const float* in, float* out, int mode) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = mode == 0 ? in[i] : 1.f;
}

// Thread i writes word i of the dynamic shared memory; launched with fewer bytes than the block
// has threads, the last ones write past it.
extern "C" __global__ void dynamic_shared_overrun(float* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* s = reinterpret_cast<float*>(smem_raw);
    s[threadIdx.x] = float(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = s[0];
}

// Every thread of every block adds 1 to acc[threadIdx.x % 8]: with atomics the sums are exact;
// with a plain read-modify-write two blocks' updates race (on a GPU some are lost). `mode` 2: the
// atomics, then a plain read of another block's sum (a read racing its atomics).
extern "C" __global__ void count_up(float* acc, float* out, int mode) {
    float* a = acc + threadIdx.x % 8;
    if (mode == 0) *a += 1.f;
    else atomicAdd(a, 1.f);
    if (mode == 2 && threadIdx.x == 0) out[blockIdx.x] = acc[(blockIdx.x + 1) % 8];
}

// Lane l of each warp writes its slot and reads lane l ^ 1's: ordered by __syncwarp when `sync`,
// a race without it.
extern "C" __global__ void warp_exchange(float* out, int sync) {
    __shared__ float slot[1024];
    const unsigned i = threadIdx.x;
    slot[i] = float(i);
    if (sync) __syncwarp();
    out[i] = slot[i ^ 1];
}

// A __syncthreads only some threads reach: `mode` 0, the threads after the first warp return
// before it; `mode` 1, the first warp waits at one __syncthreads and the others at another.
extern "C" __global__ void partial_barrier(float* out, int mode) {
    __shared__ float s[1024];
    const unsigned i = threadIdx.x;
    s[i] = float(i);
    if (mode == 0 && i >= 32) return;
    if (i < 32) {
        __syncthreads();
        out[i] = s[(i + 1) % blockDim.x];
    } else {
        out[i] = -1.f;
        __syncthreads();
        out[i] += s[i - 1];
    }
}

// Thread i writes word i of a 32-word static __shared__ array; with more than 32 threads the
// last ones write past its end.
extern "C" __global__ void static_shared_overrun(float* out) {
    __shared__ float words[32];
    words[threadIdx.x] = float(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = words[threadIdx.x % 32];
}
