// The emulated device's cuBLAS: the handle functions cudarc calls and `cublasGemmEx` with
// cuBLAS's exact semantics, on the CPU. Loaded under the soname `libcublas.so`.
//
//   C = alpha op(A) op(B) + beta C, column-major: op(A) is m x k (A stored m x k with lda >= m, or
//   k x m with lda >= k when transposed), op(B) is k x n (ldb >= k, or n x k with ldb >= n),
//   C is m x n with ldc >= m. A and B bf16, C bf16 or f32, fp32 compute; beta = 0 means C is not
//   read (NaN there does not propagate). The rejections are cuBLAS's: negative sizes or leading
//   dimensions too small are CUBLAS_STATUS_INVALID_VALUE, other types CUBLAS_STATUS_NOT_SUPPORTED.
//   An operand that reaches outside the device allocations (a wrong ld, offset or size on the
//   host side) is CUBLAS_STATUS_EXECUTION_FAILED, where a GPU would fault or read garbage.
#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <dlfcn.h>

#include <cuda_bf16.h>

#define COA_API extern "C" __attribute__((visibility("default")))

typedef int cublasStatus_t;

namespace {

enum : int {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum : int { OP_N = 0, OP_T = 1, OP_C = 2 };
enum : int { R_32F = 0, R_16BF = 14 };
enum : int { COMPUTE_32F = 68, COMPUTE_32F_PEDANTIC = 69, COMPUTE_32F_FAST_16BF = 75 };

struct Handle {
    void* stream = nullptr;
    int pointer_mode = 0;  // host
    int math_mode = 0;
};

std::mutex error_mu;
std::unordered_map<std::thread::id, std::string>& last_errors() {
    static std::unordered_map<std::thread::id, std::string> m;
    return m;
}

cublasStatus_t fail(cublasStatus_t s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t fail(cublasStatus_t s, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> g(error_mu);
    last_errors()[std::this_thread::get_id()] = std::string("emulated cuBLAS: ") + buf;
    return s;
}

// The emulated driver's allocation check (same process; soname libcuda.so).
bool allocated(const void* p, std::size_t bytes) {
    using Fn = int (*)(const void*, std::size_t);
    static Fn fn = [] {
        void* h = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
        return h ? reinterpret_cast<Fn>(dlsym(h, "coa_emu_allocated")) : nullptr;
    }();
    return !fn || fn(p, bytes);
}

// bf16 bits <-> f32 with the kernels' conversions (round to nearest even; NaN stays NaN).
float bf16_to_f32(std::uint16_t h) { return __bfloat162float(__nv_bfloat16{h}); }
std::uint16_t f32_to_bf16(float f) { return __float2bfloat16_rn(f).x; }

// Bytes spanned by a column-major operand of `rows` x `cols` elements with leading dimension ld.
std::size_t extent(int rows, int cols, int ld, std::size_t elem) {
    if (rows == 0 || cols == 0) return 0;
    return (std::size_t(cols - 1) * std::size_t(ld) + std::size_t(rows)) * elem;
}

}  // namespace

COA_API cublasStatus_t cublasCreate_v2(void** handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new Handle();
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasDestroy_v2(void* handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete static_cast<Handle*>(handle);
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasSetStream_v2(void* handle, void* stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    static_cast<Handle*>(handle)->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasGetStream_v2(void* handle, void** stream) {
    if (!handle || !stream) return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = static_cast<Handle*>(handle)->stream;
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasSetPointerMode_v2(void* handle, int mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "only host pointer mode (alpha and beta on the host) is emulated");
    static_cast<Handle*>(handle)->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasGetPointerMode_v2(void* handle, int* mode) {
    if (!handle || !mode) return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = static_cast<Handle*>(handle)->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasSetMathMode(void* handle, int mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    static_cast<Handle*>(handle)->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
COA_API cublasStatus_t cublasSetWorkspace_v2(void* handle, void*, std::size_t) {
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
COA_API cublasStatus_t cublasGetVersion_v2(void*, int* v) {
    if (!v) return CUBLAS_STATUS_INVALID_VALUE;
    *v = 130000;
    return CUBLAS_STATUS_SUCCESS;
}

COA_API cublasStatus_t cublasGemmEx(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* A,
                                    int atype, int lda, const void* B, int btype, int ldb, const void* beta, void* C, int ctype,
                                    int ldc, int compute, int /*algo*/) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const bool ta = transa != OP_N, tb = transb != OP_N;
    if ((transa != OP_N && transa != OP_T && transa != OP_C) || (transb != OP_N && transb != OP_T && transb != OP_C))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "gemm: transa %d / transb %d is not N, T or C", transa, transb);
    if (m < 0 || n < 0 || k < 0) return fail(CUBLAS_STATUS_INVALID_VALUE, "gemm: negative size m %d n %d k %d", m, n, k);
    if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "gemm: leading dimensions lda %d ldb %d ldc %d too small for op(A) %dx%d (%s), op(B) %dx%d (%s), C %dx%d",
                    lda, ldb, ldc, m, k, ta ? "T" : "N", k, n, tb ? "T" : "N", m, n);
    if (atype != R_16BF || btype != R_16BF || (ctype != R_16BF && ctype != R_32F))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "gemm: types A %d B %d C %d; the emulator has bf16 A and B with bf16 or f32 C", atype, btype, ctype);
    if (compute != COMPUTE_32F && compute != COMPUTE_32F_PEDANTIC && compute != COMPUTE_32F_FAST_16BF)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "gemm: compute type %d; the emulator computes in f32", compute);
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, "gemm: alpha or beta is NULL");
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    const std::size_t csize = ctype == R_32F ? 4 : 2;
    const std::size_t ea = extent(ta ? k : m, ta ? m : k, lda, 2), eb = extent(tb ? n : k, tb ? k : n, ldb, 2),
                      ec = extent(m, n, ldc, csize);
    if ((k > 0 && (!allocated(A, ea) || !allocated(B, eb))) || !allocated(C, ec))
        return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                    "gemm m %d n %d k %d (A %s lda %d, B %s ldb %d, ldc %d): an operand reaches outside its device allocation "
                    "(A %zu bytes from %p, B %zu from %p, C %zu from %p)",
                    m, n, k, ta ? "T" : "N", lda, tb ? "T" : "N", ldb, ldc, ea, A, eb, B, ec, C);
    // op(A) as rows [m][k] and op(B) as columns [n][k], in f32 (bf16 converts exactly).
    const auto* a = static_cast<const std::uint16_t*>(A);
    const auto* b = static_cast<const std::uint16_t*>(B);
    std::vector<float> ar(std::size_t(m) * k), bc(std::size_t(n) * k);
    for (int i = 0; i < m; ++i)
        for (int l = 0; l < k; ++l) ar[std::size_t(i) * k + l] = bf16_to_f32(ta ? a[l + std::size_t(i) * lda] : a[i + std::size_t(l) * lda]);
    for (int j = 0; j < n; ++j)
        for (int l = 0; l < k; ++l) bc[std::size_t(j) * k + l] = bf16_to_f32(tb ? b[j + std::size_t(l) * ldb] : b[l + std::size_t(j) * ldb]);
    auto columns = [&](int j0, int j1) {
        for (int j = j0; j < j1; ++j) {
            const float* bj = &bc[std::size_t(j) * k];
            for (int i = 0; i < m; ++i) {
                const float* ai = &ar[std::size_t(i) * k];
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int l = 0;
                for (; l + 8 <= k; l += 8)
                    for (int q = 0; q < 8; ++q) acc[q] += ai[l + q] * bj[l + q];
                float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                for (; l < k; ++l) sum += ai[l] * bj[l];
                const std::size_t at = i + std::size_t(j) * ldc;
                if (ctype == R_32F) {
                    float* c = static_cast<float*>(C);
                    c[at] = be == 0.f ? al * sum : al * sum + be * c[at];
                } else {
                    auto* c = static_cast<std::uint16_t*>(C);
                    c[at] = f32_to_bf16(be == 0.f ? al * sum : al * sum + be * bf16_to_f32(c[at]));
                }
            }
        }
    };
    const double work = double(m) * n * std::max(k, 1);
    const unsigned threads = work < 4e6 ? 1u : std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
    if (threads == 1) {
        columns(0, n);
    } else {
        std::vector<std::thread> pool;
        const int per = (n + int(threads) - 1) / int(threads);
        for (unsigned t = 0; t < threads; ++t) {
            const int j0 = int(t) * per, j1 = std::min(n, j0 + per);
            if (j0 < j1) pool.emplace_back(columns, j0, j1);
        }
        for (auto& th : pool) th.join();
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The detailed message of the calling thread's last failed call (empty if none).
COA_API const char* coa_emu_blas_last_error() {
    std::lock_guard<std::mutex> g(error_mu);
    auto it = last_errors().find(std::this_thread::get_id());
    return it == last_errors().end() ? "" : it->second.c_str();
}
