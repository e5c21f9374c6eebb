// The emulated device's CUDA driver API: the `cu*` functions cudarc calls, over host memory and the
// emulator's launch (runtime.cpp). This library is loaded under the soname `libcuda.so`, so cudarc
// (and every host function above it: Gpu, GpuModel, GpuDecoder) runs on it unchanged.
//
// One device, one (primary) context; every operation runs synchronously on the calling thread,
// so streams and events only keep time. Device memory is host memory (256-byte aligned), and a
// copy or memset outside an allocation is an error, as the driver's is. Modules are the
// kernels/*.cu files compiled into this library: `cuModuleLoadData("coa-emu:<stem>")`.
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <unistd.h>

#include "emu.h"
#include "runtime.h"

#define COA_API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;

namespace {

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

// Device limits: an H100 (sm_90) as far as the kernels can tell, with fewer multiprocessors so
// that launchers sizing grids by the SM count make fewer (emulated) blocks.
constexpr int kMultiprocessors = 16;
constexpr int kSharedPerBlock = 48 * 1024;
constexpr unsigned long long kTotalMem = 16ull << 30;

// ---- errors: the last detailed message of each host thread ---------------------------------------

std::mutex error_mu;
std::unordered_map<std::thread::id, std::pair<CUresult, std::string>>& last_errors() {
    static std::unordered_map<std::thread::id, std::pair<CUresult, std::string>> m;
    return m;
}

CUresult error(CUresult code, const std::string& message) {
    std::lock_guard<std::mutex> g(error_mu);
    last_errors()[std::this_thread::get_id()] = {code, message};
    return code;
}

CUresult errorf(CUresult code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult errorf(CUresult code, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return error(code, std::string("emulated device: ") + buf);
}

const char* code_name(CUresult c) {
    switch (c) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
        case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
        case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
        case CUDA_ERROR_MISALIGNED_ADDRESS: return "CUDA_ERROR_MISALIGNED_ADDRESS";
        case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
        case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
        default: return nullptr;
    }
}

const char* code_text(CUresult c) {
    switch (c) {
        case CUDA_SUCCESS: return "no error";
        case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
        case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
        case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
        case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
        case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
        case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
        case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
        case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
        case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "too many resources requested for launch";
        case CUDA_ERROR_MISALIGNED_ADDRESS: return "misaligned address";
        case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
        case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
        default: return nullptr;
    }
}

// ---- state --------------------------------------------------------------------------------------

bool initialised = false;
int the_context;  // its address is the one context handle
bool context_retained = false;

struct Event {
    std::chrono::steady_clock::time_point at;
    bool recorded = false;
};
struct Function {
    const coa_emu::Kernel* kernel;
    int max_dynamic_smem = kSharedPerBlock;
};
struct Module {
    std::string name;
    std::map<std::string, Function*> functions;
};

CUresult check_range(const char* what, CUdeviceptr p, std::size_t n) {
    if (n == 0 || coa_emu::allocated(reinterpret_cast<const void*>(p), n)) return CUDA_SUCCESS;
    return errorf(CUDA_ERROR_INVALID_VALUE, "%s of %zu bytes at device address 0x%llx is outside every allocation", what, n, p);
}

CUresult alloc(CUdeviceptr* out, std::size_t bytes) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (bytes == 0) return errorf(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes");
    // A guard zone after the allocation: a kernel's overrun lands outside every allocation (the
    // memory checks report it) instead of in the next one.
    const std::size_t rounded = (bytes + coa_emu::kAllocationGuard + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) return errorf(CUDA_ERROR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory for the device", bytes);
    coa_emu::register_allocation(p, bytes);
    *out = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr p) {
    if (p == 0) return CUDA_SUCCESS;
    if (!coa_emu::unregister_allocation(reinterpret_cast<void*>(p)))
        return errorf(CUDA_ERROR_INVALID_VALUE, "cuMemFree of 0x%llx, which is not an allocation", p);
    std::free(reinterpret_cast<void*>(p));
    return CUDA_SUCCESS;
}

CUresult copy(const char* what, void* dst, const void* src, std::size_t n, bool dst_dev, bool src_dev) {
    if (dst_dev) {
        if (CUresult r = check_range(what, CUdeviceptr(dst), n)) return r;
    }
    if (src_dev) {
        if (CUresult r = check_range(what, CUdeviceptr(src), n)) return r;
    }
    if (n) std::memmove(dst, src, n);
    return CUDA_SUCCESS;
}

}  // namespace

// ---- initialisation, device, context -------------------------------------------------------------

COA_API CUresult cuInit(unsigned) {
    initialised = true;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDeviceGetCount(int* n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = 1;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return errorf(CUDA_ERROR_INVALID_DEVICE, "device %d requested; the emulated device is device 0", ordinal);
    *d = 0;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(name, std::size_t(len), "coa emulated CUDA device (sm_90 on the CPU)");
    return CUDA_SUCCESS;
}
COA_API CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = kTotalMem;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
        case 1: *v = 1024; break;                          // MAX_THREADS_PER_BLOCK
        case 2: case 3: *v = 1024; break;                  // MAX_BLOCK_DIM_X, _Y
        case 4: *v = 64; break;                            // MAX_BLOCK_DIM_Z
        case 5: *v = 2147483647; break;                    // MAX_GRID_DIM_X
        case 6: case 7: *v = 65535; break;                 // MAX_GRID_DIM_Y, _Z
        case 8: *v = kSharedPerBlock; break;               // MAX_SHARED_MEMORY_PER_BLOCK
        case 9: *v = 65536; break;                         // TOTAL_CONSTANT_MEMORY
        case 10: *v = 32; break;                           // WARP_SIZE
        case 12: *v = 65536; break;                        // MAX_REGISTERS_PER_BLOCK
        case 13: *v = 1000000; break;                      // CLOCK_RATE (kHz)
        case 16: *v = kMultiprocessors; break;             // MULTIPROCESSOR_COUNT
        case 18: *v = 0; break;                            // INTEGRATED
        case 39: *v = 2048; break;                         // MAX_THREADS_PER_MULTIPROCESSOR
        case 41: *v = 1; break;                            // UNIFIED_ADDRESSING
        case 75: *v = 9; break;                            // COMPUTE_CAPABILITY_MAJOR
        case 76: *v = 0; break;                            // COMPUTE_CAPABILITY_MINOR
        case 81: *v = 233472; break;                       // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        case 89: *v = 0; break;                            // CONCURRENT_MANAGED_ACCESS
        case 97: *v = int(coa_emu::kSharedPerBlockOptin); break;  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        case 115: *v = 0; break;                           // MEMORY_POOLS_SUPPORTED: plain cuMemAlloc
        default: return errorf(CUDA_ERROR_INVALID_VALUE, "device attribute %d is not emulated", attr);
    }
    return CUDA_SUCCESS;
}
COA_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    context_retained = true;
    *ctx = &the_context;
    return CUDA_SUCCESS;
}
COA_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
COA_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    return ctx == nullptr || ctx == &the_context ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
COA_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = context_retained ? &the_context : nullptr;
    return CUDA_SUCCESS;
}
COA_API CUresult cuCtxGetDevice(CUdevice* d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
COA_API CUresult cuCtxSynchronize() { return CUDA_SUCCESS; }

// ---- streams and events (all work is synchronous: they only keep time) ---------------------------

COA_API CUresult cuStreamCreate(CUstream* s, unsigned) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = new int(0);
    return CUDA_SUCCESS;
}
COA_API CUresult cuStreamCreateWithPriority(CUstream* s, unsigned flags, int) { return cuStreamCreate(s, flags); }
COA_API CUresult cuStreamDestroy_v2(CUstream s) {
    delete static_cast<int*>(s);
    return CUDA_SUCCESS;
}
COA_API CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
COA_API CUresult cuStreamQuery(CUstream) { return CUDA_SUCCESS; }
COA_API CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return CUDA_SUCCESS; }

COA_API CUresult cuEventCreate(CUevent* e, unsigned) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = new Event();
    return CUDA_SUCCESS;
}
COA_API CUresult cuEventRecord(CUevent e, CUstream) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    static_cast<Event*>(e)->at = std::chrono::steady_clock::now();
    static_cast<Event*>(e)->recorded = true;
    return CUDA_SUCCESS;
}
COA_API CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
COA_API CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
COA_API CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    if (!ms || !a || !b) return CUDA_ERROR_INVALID_VALUE;
    const auto* x = static_cast<Event*>(a);
    const auto* y = static_cast<Event*>(b);
    if (!x->recorded || !y->recorded) return errorf(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime of an event never recorded");
    *ms = std::chrono::duration<float, std::milli>(y->at - x->at).count();
    return CUDA_SUCCESS;
}
COA_API CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }
COA_API CUresult cuEventDestroy_v2(CUevent e) {
    delete static_cast<Event*>(e);
    return CUDA_SUCCESS;
}

// ---- memory -------------------------------------------------------------------------------------

COA_API CUresult cuMemAlloc_v2(CUdeviceptr* p, std::size_t bytes) { return alloc(p, bytes); }
COA_API CUresult cuMemAllocAsync(CUdeviceptr* p, std::size_t bytes, CUstream) { return alloc(p, bytes); }
COA_API CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
COA_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) { return release(p); }
COA_API CUresult cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    *total = kTotalMem;
    *free_bytes = pages > 0 && size > 0 ? std::min<std::size_t>(kTotalMem, std::size_t(pages) * std::size_t(size)) : kTotalMem;
    return CUDA_SUCCESS;
}
COA_API CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, std::size_t n) {
    if (CUresult r = check_range("cuMemsetD8", p, n)) return r;
    std::memset(reinterpret_cast<void*>(p), v, n);
    return CUDA_SUCCESS;
}
COA_API CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, std::size_t n, CUstream) { return cuMemsetD8_v2(p, v, n); }
COA_API CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned v, std::size_t n) {
    if (CUresult r = check_range("cuMemsetD32", p, n * 4)) return r;
    auto* q = reinterpret_cast<unsigned*>(p);
    for (std::size_t i = 0; i < n; ++i) q[i] = v;
    return CUDA_SUCCESS;
}
COA_API CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, std::size_t n, CUstream) { return cuMemsetD32_v2(p, v, n); }
COA_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t n) {
    return copy("cuMemcpyHtoD", reinterpret_cast<void*>(dst), src, n, true, false);
}
COA_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t n, CUstream) { return cuMemcpyHtoD_v2(dst, src, n); }
COA_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t n) {
    return copy("cuMemcpyDtoH", dst, reinterpret_cast<const void*>(src), n, false, true);
}
COA_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t n, CUstream) { return cuMemcpyDtoH_v2(dst, src, n); }
COA_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n) {
    return copy("cuMemcpyDtoD", reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, true, true);
}
COA_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream) { return cuMemcpyDtoD_v2(dst, src, n); }

// ---- modules and launches -----------------------------------------------------------------------

COA_API CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    const char* text = static_cast<const char*>(image);
    static const char kPrefix[] = "coa-emu:";
    if (std::strncmp(text, kPrefix, sizeof kPrefix - 1) != 0)
        return errorf(CUDA_ERROR_INVALID_IMAGE, "the emulated device runs the kernels compiled into it (kernels/*.cu); load a module as \"coa-emu:<file stem>\", not PTX");
    const char* name = text + sizeof kPrefix - 1;
    if (!coa_emu::module_exists(name)) return errorf(CUDA_ERROR_INVALID_IMAGE, "no module %s is compiled into the emulated device", name);
    *m = new Module{name, {}};
    return CUDA_SUCCESS;
}
COA_API CUresult cuModuleUnload(CUmodule m) {
    auto* mod = static_cast<Module*>(m);
    if (!mod) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& f : mod->functions) delete f.second;
    delete mod;
    return CUDA_SUCCESS;
}
COA_API CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    auto* mod = static_cast<Module*>(m);
    if (!f || !mod || !name) return CUDA_ERROR_INVALID_VALUE;
    auto it = mod->functions.find(name);
    if (it == mod->functions.end()) {
        const coa_emu::Kernel* k = coa_emu::find_kernel(mod->name.c_str(), name);
        if (!k) return errorf(CUDA_ERROR_NOT_FOUND, "module %s has no kernel %s", mod->name.c_str(), name);
        it = mod->functions.emplace(name, new Function{k}).first;
    }
    *f = it->second;
    return CUDA_SUCCESS;
}
COA_API CUresult cuFuncGetAttribute(int* v, int attr, CUfunction f) {
    auto* fn = static_cast<Function*>(f);
    if (!v || !fn) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
        case 0: *v = int(fn->kernel->max_threads); break;  // MAX_THREADS_PER_BLOCK
        case 8: *v = fn->max_dynamic_smem; break;          // MAX_DYNAMIC_SHARED_SIZE_BYTES
        case 5: case 6: *v = 90; break;                    // PTX_VERSION, BINARY_VERSION
        case 1: *v = int(fn->kernel->static_smem); break;  // SHARED_SIZE_BYTES (static)
        case 2: case 3: case 4: *v = 0; break;             // CONST, LOCAL, NUM_REGS: not measured
        default: return errorf(CUDA_ERROR_INVALID_VALUE, "function attribute %d is not emulated", attr);
    }
    return CUDA_SUCCESS;
}
COA_API CUresult cuFuncSetAttribute(CUfunction f, int attr, int v) {
    auto* fn = static_cast<Function*>(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (attr == 8) {  // MAX_DYNAMIC_SHARED_SIZE_BYTES
        // As the driver: this plus the kernel's static shared memory may not exceed the opt-in limit.
        const unsigned st = fn->kernel->static_smem;
        if (v < 0 || unsigned(v) + st > coa_emu::kSharedPerBlockOptin)
            return errorf(CUDA_ERROR_INVALID_VALUE, "%s: %d bytes of dynamic shared memory requested, with its %u bytes of static shared memory over the %u a block may use",
                          fn->kernel->name, v, st, coa_emu::kSharedPerBlockOptin);
        fn->max_dynamic_smem = v;
        return CUDA_SUCCESS;
    }
    if (attr == 9) return CUDA_SUCCESS;  // PREFERRED_SHARED_MEMORY_CARVEOUT: a hint
    return errorf(CUDA_ERROR_INVALID_VALUE, "function attribute %d cannot be set on the emulated device", attr);
}
COA_API CUresult cuFuncSetCacheConfig(CUfunction, int) { return CUDA_SUCCESS; }

COA_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned smem, CUstream, void** params, void** extra) {
    auto* fn = static_cast<Function*>(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    const char* name = fn->kernel->name;
    if (extra) return errorf(CUDA_ERROR_NOT_SUPPORTED, "%s: launch arguments through `extra` are not emulated", name);
    if (bx == 0 || by == 0 || bz == 0 || bx > 1024 || by > 1024 || bz > 64)
        return errorf(CUDA_ERROR_INVALID_VALUE, "%s: block (%u,%u,%u) is outside the device's limits (1..1024, 1..1024, 1..64)", name, bx, by, bz);
    const unsigned long long threads = 1ull * bx * by * bz;
    if (threads > coa_emu::kMaxThreadsPerBlock)
        return errorf(CUDA_ERROR_INVALID_VALUE, "%s: block (%u,%u,%u) has %llu threads; a block holds at most 1024", name, bx, by, bz, threads);
    if (threads > fn->kernel->max_threads)
        return errorf(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "%s: launched with %llu threads per block, but it is compiled for at most %u (__launch_bounds__)",
                      name, threads, fn->kernel->max_threads);
    if (gx == 0 || gy == 0 || gz == 0 || gx > 2147483647u || gy > 65535 || gz > 65535)
        return errorf(CUDA_ERROR_INVALID_VALUE, "%s: grid (%u,%u,%u) is outside the device's limits", name, gx, gy, gz);
    const unsigned long long total = 0ull + fn->kernel->static_smem + smem;
    if (total > coa_emu::kSharedPerBlockOptin)
        return errorf(CUDA_ERROR_INVALID_VALUE, "%s: %u bytes of static + %u bytes of dynamic shared memory = %llu; a block may use at most %u",
                      name, fn->kernel->static_smem, smem, total, coa_emu::kSharedPerBlockOptin);
    if (smem > unsigned(fn->max_dynamic_smem))
        return errorf(CUDA_ERROR_INVALID_VALUE, "%s: %u bytes of dynamic shared memory requested, the kernel allows %d (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES; the device at most %u)",
                      name, smem, fn->max_dynamic_smem, coa_emu::kSharedPerBlockOptin);
    std::string message;
    const int r = coa_emu::launch(*fn->kernel, dim3{gx, gy, gz}, dim3{bx, by, bz}, smem, params, &message);
    return r ? error(r, message) : CUDA_SUCCESS;
}

COA_API CUresult cuGetErrorName(CUresult code, const char** out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    *out = code_name(code);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// The detailed message of this thread's last failure with `code`, else the driver's sentence.
COA_API CUresult cuGetErrorString(CUresult code, const char** out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    {
        std::lock_guard<std::mutex> g(error_mu);
        auto it = last_errors().find(std::this_thread::get_id());
        if (it != last_errors().end() && it->second.first == code) {
            *out = it->second.second.c_str();
            return CUDA_SUCCESS;
        }
    }
    *out = code_text(code);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---- the emulator's own API (found by dlsym from coa_kernels::emu) ----------------------------

// Identifies this library as the emulated device (not a real driver).
COA_API const char* coa_emu_version() { return "coa emulated CUDA device 1"; }

COA_API unsigned coa_emu_worker_threads() { return coa_emu::worker_threads(); }

// Sets the schedule of launches from the calling thread ("forward", "reverse", "random",
// "random:SEED", "max-drift"); 0 on success, -1 for an unknown order. NULL restores COA_EMU_ORDER's.
COA_API int coa_emu_set_order(const char* order) {
    if (!order) {
        coa_emu::clear_schedule_for_caller();
        return 0;
    }
    coa_emu::Schedule s;
    if (!coa_emu::parse_order(order, &s)) return -1;
    coa_emu::set_schedule_for_caller(s);
    return 0;
}

// Memory checks for the launches from the calling thread: 1 on, 0 off, -1 back to COA_EMU_CHECKS's
// choice. Returns whether they are on now.
COA_API int coa_emu_set_checks(int on) {
    if (on >= -1 && on <= 1) coa_emu::set_checks_for_caller(on);
    return coa_emu::checks_for_caller() ? 1 : 0;
}

// The schedule of launches from the calling thread, as COA_EMU_ORDER spells it.
COA_API const char* coa_emu_order() { return coa_emu::order_name(coa_emu::schedule_for_caller().order); }

// Field `index` of struct `strct` as compiled for the kernels: 1 and its name, offset and size
// (and the struct's size), or 0 past the last field.
COA_API int coa_emu_struct_field(const char* strct, int index, const char** name, std::size_t* offset, std::size_t* size,
                                 std::size_t* struct_size) {
    const coa_emu::Field* f = coa_emu::struct_field(strct, index);
    if (!f) return 0;
    *name = f->name;
    *offset = f->offset;
    *size = f->size;
    *struct_size = f->struct_size;
    return 1;
}

// Whether [p, p + n) is inside one device allocation (the emulated cuBLAS checks its operands).
COA_API int coa_emu_allocated(const void* p, std::size_t n) { return n == 0 || coa_emu::allocated(p, n); }
