// The emulated device's internals shared by its runtime (runtime.cpp), its CUDA driver API
// (driver.cpp) and the registration code kernels/build.rs generates for each kernels/*.cu.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <vector_types.h>

namespace coa_emu {

// One `extern "C" __global__` function of a module (a kernels/*.cu file).
struct Kernel {
    const char* module;  // file stem, e.g. "attention"
    const char* name;    // entry point, e.g. "flash_attn_fwd_d64"
    void (*invoke)(void** params);  // calls the kernel with cuLaunchKernel's argument array
    unsigned max_threads;           // __launch_bounds__, else 1024
    unsigned static_smem;           // bytes of its static __shared__ variables (build.rs sums them)
    const char* shared_owners;      // the functions whose static __shared__ variables it uses, space-separated
};

// One field of a struct the kernels take by value (checked against the host's mirror by a test).
struct Field {
    const char* strct;
    const char* name;
    std::size_t offset;
    std::size_t size;
    std::size_t struct_size;
};

void register_kernel(const Kernel* k);
void register_field(const Field* f);
const Kernel* find_kernel(const char* module, const char* name);
bool module_exists(const char* module);
const Field* struct_field(const char* strct, int index);

struct Registrar {
    explicit Registrar(const Kernel* k) { register_kernel(k); }
    explicit Registrar(const Field* f) { register_field(f); }
};

// Calls `f` with the arguments cuLaunchKernel passes: params[i] points at argument i. Not
// instrumented (the kernels are compiled with -fsanitize=thread, see runtime.h): the argument array
// is the host's, outside device memory.
template <typename... A, std::size_t... I>
__attribute__((no_sanitize_thread)) void invoke_impl(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}
template <typename... A>
__attribute__((no_sanitize_thread)) void invoke_with(void (*f)(A...), void** params) {
    invoke_impl(f, params, std::index_sequence_for<A...>{});
}

// The order in which a block's runnable threads (and a grid's blocks) are run.
//   forward:   threads and blocks in index order, round robin: a thread runs until it waits,
//              and a released thread queues behind the others (warps stay close together);
//   reverse:   the same from the last thread and block;
//   random:    a seeded random pick at every switch, blocks in a seeded random order;
//   max-drift: always the lowest runnable thread: warp 0 runs as far as it can (to the next
//              block barrier) before warp 1 starts, so warps drift as far apart as they may.
// cp.async copies land at their wait_group in forward and reverse order, at their issue in
// max-drift order (a buffer refilled while another warp still reads it shows), either in random.
enum class Order : int { Forward = 0, Reverse = 1, Random = 2, MaxDrift = 3 };
struct Schedule {
    Order order;
    std::uint64_t seed;
};
// The schedule of launches from the calling host thread: set_schedule's, else COA_EMU_ORDER's.
Schedule schedule_for_caller();
void set_schedule_for_caller(Schedule s);
void clear_schedule_for_caller();
// COA_EMU_ORDER: forward (default), reverse, random, random:SEED, max-drift.
bool parse_order(const char* text, Schedule* out);
const char* order_name(Order o);

// Whether the memory checks (runtime.h: bounds, races between blocks, missing barriers, barriers
// only some threads reach) are on for the calling host thread's launches: set_checks_for_caller's
// choice, else COA_EMU_CHECKS's (on unless it is 0 or off).
bool checks_for_caller();
void set_checks_for_caller(int on);  // 1 on, 0 off, -1 back to COA_EMU_CHECKS's

// Device allocations (driver.cpp's cuMemAlloc / cuMemFree): each has its own bounds and a shadow
// for the race check; [p, p + n) must lie inside one of them.
void register_allocation(void* p, std::size_t bytes);
bool unregister_allocation(void* p);  // false: not an allocation
bool allocated(const void* p, std::size_t n);
// Bytes left unused after each allocation, so that an overrun lands outside every allocation.
constexpr std::size_t kAllocationGuard = 256;

// Runs a launch to completion on the worker threads. Returns a CUresult (0 = success) and, on
// failure, a message naming the kernel, the block and thread, and what went wrong.
int launch(const Kernel& k, dim3 grid, dim3 block, unsigned dyn_smem, void** params, std::string* message);

// Worker threads that run blocks (COA_EMU_THREADS, default: the CPUs available, at most 16).
unsigned worker_threads();

}  // namespace coa_emu

// Registration of one kernel / one struct field (used by the generated per-module files).
#define COA_EMU_CAT2(a, b) a##b
#define COA_EMU_CAT(a, b) COA_EMU_CAT2(a, b)
// ptxas refuses a kernel with more than 48 KiB of static shared memory; so does this build.
#define COA_EMU_KERNEL(module, fn, max_threads, static_smem, owners)                             \
    static_assert((static_smem) <= 48 * 1024, #fn ": over 48 KiB of static __shared__ memory");  \
    __attribute__((no_sanitize_thread)) static void COA_EMU_CAT(coa_emu_invoke_, fn)(void** p) { ::coa_emu::invoke_with(&fn, p); } \
    static const ::coa_emu::Kernel COA_EMU_CAT(coa_emu_kernel_, fn) = {                         \
        module, #fn, &COA_EMU_CAT(coa_emu_invoke_, fn), (unsigned)(max_threads), (unsigned)(static_smem), owners}; \
    static ::coa_emu::Registrar COA_EMU_CAT(coa_emu_reg_, fn)(&COA_EMU_CAT(coa_emu_kernel_, fn));
#define COA_EMU_FIELD(S, f)                                                                        \
    static const ::coa_emu::Field COA_EMU_CAT(coa_emu_field_##S##_, f) = {#S, #f, offsetof(S, f), \
                                                                         sizeof(((S*)nullptr)->f), sizeof(S)}; \
    static ::coa_emu::Registrar COA_EMU_CAT(coa_emu_freg_##S##_, f)(&COA_EMU_CAT(coa_emu_field_##S##_, f));
