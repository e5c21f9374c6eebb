// The emulated CUDA device: what device code compiled for the CPU calls into (kernels/emu/runtime.cpp
// implements it). Every GPU thread of a block runs as a fiber on one OS thread; a block's fibers
// are scheduled cooperatively, so a thread runs until it waits (a block barrier, a warp
// collective) or returns. Warp collectives (shuffles, votes, ldmatrix, mma.sync) meet in a
// per-warp exchange: each lane deposits its operands, the last lane to arrive computes every
// lane's result, and all of them become runnable again.
#pragma once
#include <cstddef>
#include <cstdint>

#include <vector_types.h>

namespace coa_emu {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
// The shared memory one block may use (static + dynamic), as on an H100 (sm_90): 227 KiB.
constexpr unsigned kSharedPerBlockOptin = 232448;
// Each fiber owns an aligned span of this many bytes: its descriptor at the bottom, a guard
// page, then its stack. A power of two, so a fiber finds its descriptor from any stack address.
constexpr std::size_t kFiberSpan = std::size_t(1) << 17;

// The built-in variables of the running GPU thread, at the bottom of its fiber span.
struct ThreadVars {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};

// The calling GPU thread's built-in variables (valid only inside a kernel). The stack pointer is
// read by an asm statement, not taken from a local's address: a pointer derived from a local would
// let the compiler treat stores through it as stores to that (dead) local and drop them.
inline const ThreadVars* here() {
    std::uintptr_t sp;
#if defined(__x86_64__)
    asm("movq %%rsp, %0" : "=r"(sp));
#elif defined(__aarch64__)
    asm("mov %0, sp" : "=r"(sp));
#else
    char probe;
    sp = reinterpret_cast<std::uintptr_t>(&probe);
    asm("" : "+r"(sp));  // hides where the value came from
#endif
    return reinterpret_cast<const ThreadVars*>(sp & ~(std::uintptr_t)(kFiberSpan - 1));
}

// CUresult codes the emulator reports for a faulting kernel.
constexpr int kErrIllegalAddress = 700;
constexpr int kErrMisaligned = 716;
constexpr int kErrLaunchFailed = 719;

// Ends the calling kernel's launch with `code` and a message (printf-style); never returns.
[[noreturn]] void fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// __syncthreads: waits until every thread of the block that has not returned arrives.
void sync_threads();

// Shuffles (`__shfl*_sync`): every lane in `mask` must call the same kind with the same mask.
enum class Shfl : int { Idx, Up, Down, Xor };
std::uint64_t shfl(Shfl kind, unsigned mask, std::uint64_t value, int arg, int width);
// __syncwarp(mask).
void sync_warp(unsigned mask);
// __ballot_sync / __any_sync / __all_sync: the ballot of `pred` over `mask`.
unsigned ballot(unsigned mask, int pred);

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: `row` is this lane's row address.
void ldmatrix_x4(bool trans, const void* row, unsigned out[4]);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + c, fragments as in the PTX ISA.
void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]);

// cp.async.cg.shared.global (16 bytes, the first `bytes` from global, the rest zero), and its
// commit / wait_group. A copy lands at the wait that covers it (as late as the hardware may) or at
// its issue (as early), depending on the schedule order (see emu.h).
void cp_async16(void* shared_dst, const void* global_src, int bytes);
void cp_async_commit();
void cp_async_wait(int pending_groups);

// Memory checks. kernels/*.cu are compiled with -fsanitize=thread, and the runtime defines the
// hooks that instrumentation calls (__tsan_read4, __tsan_write8, ...; no libtsan is linked): every
// load and store of kernel code reports its address. An access outside the thread's own stack
// must lie inside one device allocation, the block's dynamic shared memory (as launched) or its
// static shared variables; within a launch, an address one block wrote with a plain store may not
// be accessed by another block, nor one block's atomics mixed with another's plain accesses (a lost
// update); within a block, a shared address one thread wrote may not be read or written by
// another, nor one it read written by another, until a __syncthreads (or, within a warp, a
// __syncwarp) separates them. Atomics are not instrumented (cuda_shim.h marks them): they report
// themselves here.
void atomic_access(const void* p, std::size_t bytes);

// __cvta_generic_to_shared: the offset of `p` in the block's shared window (fails outside it).
unsigned shared_offset(const void* p);

}  // namespace coa_emu
