// The emulated CUDA device's execution engine: worker threads run the blocks of a launch; each
// block's threads are fibers on one worker, switched cooperatively (see runtime.h). This file
// holds the fibers and their scheduler, block barriers, warp collectives (shuffles, votes,
// ldmatrix, mma.sync), cp.async, shared memory, the kernel registry and the launch queue.
//
// What a GPU would refuse ends the launch with an error instead of undefined behaviour: a
// misaligned ldmatrix / cp.async address, one outside shared memory, a warp collective that some
// lanes of its mask skip (they returned, or wait elsewhere), mismatched collectives in one warp,
// and a deadlock (every live thread waits and none can be released). With the memory checks on
// (runtime.h; COA_EMU_CHECKS, or coa_emu_set_checks per calling thread) also: an access outside
// device allocations and shared memory, a race between blocks of a launch, a shared-memory access
// another thread's access to the same address conflicts with in one barrier interval, and a
// __syncthreads that only some threads of a block reach.
//
// Shared memory: `__shared__` variables are thread-local (one worker runs one block at a time)
// and `extern __shared__` arrays are `smem_raw` below. This module defines no other thread-local
// variable, so its thread-local block is exactly the shared memory, which is poisoned with 0xff
// bytes (NaN as bf16 and f32) before every block: a read before a write shows up in the output.
#include <algorithm>
#include <cctype>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu.h"
#include "runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// The dynamic shared memory of the block this OS thread runs (`extern __shared__ ... smem_raw[]`).
alignas(16) thread_local unsigned char smem_raw[coa_emu::kSharedPerBlockOptin];
// A block-scope `extern thread_local` declaration (how the kernels' `extern __shared__` reads)
// makes g++ call the variable's thread-local init function without checking that one exists;
// smem_raw needs no initialisation, so its init function is empty.
extern "C" void coa_emu_smem_raw_tls_init() __asm__("_ZTH8smem_raw");
extern "C" void coa_emu_smem_raw_tls_init() {}

namespace coa_emu {

// ---- registry -----------------------------------------------------------------------------------

namespace {
std::vector<const Kernel*>& kernel_list() {
    static std::vector<const Kernel*> v;
    return v;
}
std::vector<const Field*>& field_list() {
    static std::vector<const Field*> v;
    return v;
}
}  // namespace

void register_kernel(const Kernel* k) { kernel_list().push_back(k); }
void register_field(const Field* f) { field_list().push_back(f); }

const Kernel* find_kernel(const char* module, const char* name) {
    for (const Kernel* k : kernel_list())
        if (std::strcmp(k->module, module) == 0 && std::strcmp(k->name, name) == 0) return k;
    return nullptr;
}

bool module_exists(const char* module) {
    for (const Kernel* k : kernel_list())
        if (std::strcmp(k->module, module) == 0) return true;
    return false;
}

const Field* struct_field(const char* strct, int index) {
    int i = 0;
    for (const Field* f : field_list()) {
        if (std::strcmp(f->strct, strct) != 0) continue;
        if (i++ == index) return f;
    }
    return nullptr;
}

// ---- schedule settings --------------------------------------------------------------------------

const char* order_name(Order o) {
    switch (o) {
        case Order::Forward: return "forward";
        case Order::Reverse: return "reverse";
        case Order::Random: return "random";
        case Order::MaxDrift: return "max-drift";
    }
    return "?";
}

bool parse_order(const char* text, Schedule* out) {
    std::string s(text);
    Schedule r{Order::Forward, 0x9e3779b97f4a7c15ull};
    if (s == "forward") r.order = Order::Forward;
    else if (s == "reverse") r.order = Order::Reverse;
    else if (s == "max-drift") r.order = Order::MaxDrift;
    else if (s == "random") r.order = Order::Random;
    else if (s.rfind("random:", 0) == 0) {
        char* end = nullptr;
        r.order = Order::Random;
        r.seed = std::strtoull(s.c_str() + 7, &end, 10);
        if (end == s.c_str() + 7 || *end != 0) return false;
    } else {
        return false;
    }
    *out = r;
    return true;
}

namespace {
std::mutex schedule_mu;
std::unordered_map<std::thread::id, Schedule>& caller_schedules() {
    static std::unordered_map<std::thread::id, Schedule> m;
    return m;
}
Schedule env_schedule() {
    static const Schedule s = [] {
        Schedule r{Order::Forward, 0x9e3779b97f4a7c15ull};
        const char* e = std::getenv("COA_EMU_ORDER");
        if (e && *e && !parse_order(e, &r)) {
            std::fprintf(stderr, "coa emulated device: COA_EMU_ORDER=%s is not one of forward, reverse, random, random:SEED, max-drift; using forward\n", e);
        }
        return r;
    }();
    return s;
}
}  // namespace

namespace {
std::unordered_map<std::thread::id, bool>& caller_checks() {
    static std::unordered_map<std::thread::id, bool> m;
    return m;
}
bool env_checks() {
    static const bool on = [] {
        const char* e = std::getenv("COA_EMU_CHECKS");
        return !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
    }();
    return on;
}
}  // namespace

bool checks_for_caller() {
    std::lock_guard<std::mutex> g(schedule_mu);
    auto it = caller_checks().find(std::this_thread::get_id());
    return it == caller_checks().end() ? env_checks() : it->second;
}
void set_checks_for_caller(int on) {
    std::lock_guard<std::mutex> g(schedule_mu);
    if (on < 0) caller_checks().erase(std::this_thread::get_id());
    else caller_checks()[std::this_thread::get_id()] = on != 0;
}

Schedule schedule_for_caller() {
    std::lock_guard<std::mutex> g(schedule_mu);
    auto it = caller_schedules().find(std::this_thread::get_id());
    return it == caller_schedules().end() ? env_schedule() : it->second;
}
void set_schedule_for_caller(Schedule s) {
    std::lock_guard<std::mutex> g(schedule_mu);
    caller_schedules()[std::this_thread::get_id()] = s;
}
void clear_schedule_for_caller() {
    std::lock_guard<std::mutex> g(schedule_mu);
    caller_schedules().erase(std::this_thread::get_id());
}

// ---- fibers -------------------------------------------------------------------------------------

namespace {

struct Block;
struct Launch;

enum class State : std::uint8_t { NotStarted, Ready, Running, AtBarrier, InCollective, Returned };

struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    int bytes;
};

#if defined(__x86_64__)
struct Context {
    void* sp = nullptr;
};
#else
struct Context {
    ucontext_t uc;
};
#endif

// One GPU thread. Lives at the bottom of its fiber span; `vars` must stay the first member
// (here() finds it from the stack address).
struct Fiber {
    ThreadVars vars;
    Block* block = nullptr;
    unsigned tid = 0, lane = 0, warp = 0;
    State state = State::NotStarted;
    Context ctx;
    std::vector<Copy> open_copies;                 // cp.async issued since the last commit
    std::deque<std::vector<Copy>> pending_groups;  // committed, not yet waited for
};
static_assert(offsetof(Fiber, vars) == 0, "here() reads ThreadVars at the span base");

enum class Op : std::uint8_t { None, Sync, Shfl, Ballot, Ldmatrix, LdmatrixTrans, Mma };

const char* op_name(Op op) {
    switch (op) {
        case Op::Sync: return "__syncwarp";
        case Op::Shfl: return "__shfl*_sync";
        case Op::Ballot: return "__ballot_sync/__any_sync/__all_sync";
        case Op::Ldmatrix: return "ldmatrix";
        case Op::LdmatrixTrans: return "ldmatrix.trans";
        case Op::Mma: return "mma.sync";
        default: return "?";
    }
}

// The exchange of one warp: operands in, results out, one slot per lane.
struct WarpExchange {
    unsigned arrived = 0, mask = 0;
    std::uint32_t syncs = 0;  // __syncwarp calls completed (orders shared memory within the warp)
    Op op = Op::None;
    // shuffles and votes
    std::uint64_t value[32];
    int arg[32], width[32];
    Shfl kind[32];
    std::uint64_t result[32];
    // ldmatrix
    const unsigned char* row[32];
    unsigned frag[32][4];
    // mma
    unsigned a[32][4], b[32][2];
    float c[32][4], d[32][4];
};

// Runnable threads of a block, in the order of the launch's schedule.
struct ReadyQueue {
    Order order = Order::Forward;
    std::uint64_t rng = 1;
    Fiber* ring[kMaxThreadsPerBlock];
    unsigned head = 0, count = 0;
    std::uint64_t bits[kMaxThreadsPerBlock / 64];
    Fiber** fibers = nullptr;

    void reset(Order o, std::uint64_t seed, Fiber** all) {
        order = o;
        rng = seed | 1;
        head = count = 0;
        std::memset(bits, 0, sizeof bits);
        fibers = all;
    }
    std::uint64_t next_random() {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        return rng * 0x2545f4914f6cdd1dull;
    }
    void push(Fiber* f) {
        if (order == Order::Random || order == Order::MaxDrift) {
            bits[f->tid / 64] |= 1ull << (f->tid % 64);
            ++count;
        } else {
            ring[(head + count++) % kMaxThreadsPerBlock] = f;
        }
    }
    Fiber* pop() {
        if (count == 0) return nullptr;
        if (order == Order::Forward || order == Order::Reverse) {
            Fiber* f = ring[head];
            head = (head + 1) % kMaxThreadsPerBlock;
            --count;
            return f;
        }
        unsigned pick = 0;
        if (order == Order::MaxDrift) {
            unsigned w = 0;
            while (bits[w] == 0) ++w;
            pick = w * 64 + __builtin_ctzll(bits[w]);
        } else {
            std::uint64_t k = next_random() % count;
            for (unsigned w = 0;; ++w) {
                const unsigned n = __builtin_popcountll(bits[w]);
                if (k < n) {
                    std::uint64_t m = bits[w];
                    for (std::uint64_t j = 0; j < k; ++j) m &= m - 1;
                    pick = w * 64 + __builtin_ctzll(m);
                    break;
                }
                k -= n;
            }
        }
        bits[pick / 64] &= ~(1ull << (pick % 64));
        --count;
        return fibers[pick];
    }
};

struct Launch {
    const Kernel* kernel;
    void** params;
    dim3 grid, block;
    unsigned dyn_smem;
    Schedule schedule;
    bool checks = true;        // the memory checks (runtime.h)
    const std::vector<struct SharedVar>* shared_vars = nullptr;  // the kernel's static __shared__ variables, if known
    std::uint32_t stamp = 0;   // this launch's mark in the global-memory shadow
    std::uint64_t n_blocks;
    std::uint64_t perm_a = 1, perm_c = 0;  // Order::Random: block i runs as (a i + c) mod n
    // guarded by the pool's mutex
    std::uint64_t next = 0, done = 0;
    // the first failure
    std::atomic<bool> failed{false};
    std::mutex error_mu;
    int code = 0;
    std::string message;

    void record(int c, const std::string& m) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!failed.load()) {
            code = c;
            message = m;
            failed.store(true);
        }
    }
    // The i-th block to run, as a linear index (x fastest).
    std::uint64_t block_at(std::uint64_t i) const {
        switch (schedule.order) {
            case Order::Reverse: return n_blocks - 1 - i;
            case Order::Random: return (perm_a * i + perm_c) % n_blocks;
            default: return i;
        }
    }
};

// The OS thread's memory for running blocks: fiber spans and warp exchanges, allocated once.
struct Worker {
    unsigned char* spans = nullptr;
    bool prepared[kMaxThreadsPerBlock] = {};
    WarpExchange warps[kMaxThreadsPerBlock / kWarpSize];
    // This module's thread-local block (all of a block's shared memory) on this thread.
    unsigned char* tls_begin = nullptr;
    unsigned char* tls_end = nullptr;
    bool tls_known = false;
    // The memory checks: a shadow entry per 2-byte granule of the thread-local block (shared
    // memory), stamped with the barrier interval (`epoch`, advanced at each block start and
    // __syncthreads); recently used device allocations.
    struct SharedEntry* shared_shadow = nullptr;
    std::uint32_t epoch = 0;
    struct Region {
        std::uintptr_t begin = 0, end = 0;
        std::uint64_t* shadow = nullptr;  // null: not device memory (this library's own data)
    } regions[8];
    unsigned next_region = 0, last_region = 0;
    std::uint64_t region_generation = ~0ull;

    Fiber* fiber(unsigned i) {
        unsigned char* base = spans + std::size_t(i) * kFiberSpan;
        if (!prepared[i]) {
            new (base) Fiber();
            const long page = sysconf(_SC_PAGESIZE);
            const std::size_t desc = (sizeof(Fiber) + page - 1) / page * page;
            mprotect(base + desc, page, PROT_NONE);  // guard page: a stack overflow faults
            prepared[i] = true;
        }
        return reinterpret_cast<Fiber*>(base);
    }
};

struct Block {
    Launch* launch = nullptr;
    Worker* worker = nullptr;
    unsigned n = 0, live = 0, at_barrier = 0, returned = 0;
    Fiber* fibers[kMaxThreadsPerBlock];
    ReadyQueue ready;
    Context scheduler;
    bool failed = false;
    uint3 idx;
    // Shared memory: the dynamic part, and this module's thread-local block around it.
    unsigned char* dyn = nullptr;
    std::size_t dyn_bytes = 0;
    std::uint16_t agent = 0;  // the block in the global-memory shadow (1-based)
    const void* barrier_site = nullptr;  // where the threads at the barrier wait, and the first of them
    const Fiber* barrier_first = nullptr;
};

// The fiber that is running on this OS thread.
inline Fiber* current() { return reinterpret_cast<Fiber*>(const_cast<ThreadVars*>(here())); }

// ---- context switching --------------------------------------------------------------------------

#if defined(__x86_64__)
extern "C" void coa_emu_switch(void** save_sp, void* load_sp);
extern "C" void coa_emu_fiber_start();
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save_sp, and resumes the context whose stack pointer is load_sp.
asm(R"(
    .text
    .p2align 4
    .type coa_emu_switch,@function
coa_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size coa_emu_switch,.-coa_emu_switch

    .p2align 4
    .type coa_emu_fiber_start,@function
coa_emu_fiber_start:
    movq %r12, %rdi
    call coa_emu_fiber_main
    ud2
    .size coa_emu_fiber_start,.-coa_emu_fiber_start
)");

void switch_to(Context* from, Context* to) { coa_emu_switch(&from->sp, to->sp); }

void make_context(Fiber* f) {
    auto* sp = reinterpret_cast<std::uint64_t*>(reinterpret_cast<unsigned char*>(f) + kFiberSpan);
    *--sp = 0;  // keeps the stack 16-byte aligned at coa_emu_fiber_start's call
    *--sp = 0;
    *--sp = reinterpret_cast<std::uint64_t>(&coa_emu_fiber_start);  // returned to by the first switch
    *--sp = 0;                                      // rbp
    *--sp = 0;                                      // rbx
    *--sp = reinterpret_cast<std::uint64_t>(f);     // r12: the fiber, passed on to fiber_main
    *--sp = 0;                                      // r13
    *--sp = 0;                                      // r14
    *--sp = 0;                                      // r15
    *--sp = 0x1f80ull | (0x037full << 32);          // default MXCSR, x87 control word
    f->ctx.sp = sp;
}
#else
void switch_to(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }

extern "C" void coa_emu_fiber_main(void* fiber);
void fiber_entry(unsigned hi, unsigned lo) {
    coa_emu_fiber_main(reinterpret_cast<void*>((std::uintptr_t(hi) << 32) | lo));
}

void make_context(Fiber* f) {
    getcontext(&f->ctx.uc);
    const long page = sysconf(_SC_PAGESIZE);
    const std::size_t desc = (sizeof(Fiber) + page - 1) / page * page + page;
    f->ctx.uc.uc_stack.ss_sp = reinterpret_cast<unsigned char*>(f) + desc;
    f->ctx.uc.uc_stack.ss_size = kFiberSpan - desc;
    f->ctx.uc.uc_link = nullptr;
    const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(f);
    makecontext(&f->ctx.uc, reinterpret_cast<void (*)()>(fiber_entry), 2, unsigned(p >> 32), unsigned(p));
}
#endif

// Back to the block's scheduler; returns when the scheduler resumes this fiber.
void yield(Fiber* f) { switch_to(&f->ctx, &f->block->scheduler); }

// ---- messages -----------------------------------------------------------------------------------

std::string where(const Fiber* f) {
    char buf[256];
    const Block& b = *f->block;
    std::snprintf(buf, sizeof buf, "%s, block (%u,%u,%u), thread (%u,%u,%u)", b.launch->kernel->name, b.idx.x,
                  b.idx.y, b.idx.z, f->vars.thread_idx.x, f->vars.thread_idx.y, f->vars.thread_idx.z);
    return buf;
}

std::string hex(unsigned mask) {
    char m[16];
    std::snprintf(m, sizeof m, "0x%08x", mask);
    return m;
}

std::string lanes(unsigned mask) {
    std::string s;
    for (unsigned l = 0; l < 32;) {
        if (!(mask >> l & 1)) {
            ++l;
            continue;
        }
        unsigned e = l;
        while (e + 1 < 32 && (mask >> (e + 1) & 1)) ++e;
        if (!s.empty()) s += ",";
        s += e == l ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e);
        l = e + 1;
    }
    return s.empty() ? "none" : s;
}

[[noreturn]] void fail_fiber(Fiber* f, int code, const std::string& what) {
    Block& b = *f->block;
    b.launch->record(code, "emulated device: " + where(f) + ": " + what);
    b.failed = true;
    f->state = State::Returned;
    yield(f);
    __builtin_unreachable();
}

// ---- shared memory ------------------------------------------------------------------------------

bool in_shared(const Block& b, const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    if (c >= b.dyn && c + n <= b.dyn + b.dyn_bytes) return true;
    // static __shared__ variables: the thread-local block outside smem_raw
    const Worker& w = *b.worker;
    const unsigned char* raw_end = smem_raw + kSharedPerBlockOptin;
    if (c >= w.tls_begin && c + n <= smem_raw) return true;
    if (c >= raw_end && c + n <= w.tls_end) return true;
    return false;
}

void poison_shared(Block& b) {
    const Worker& w = *b.worker;
    if (w.tls_begin && w.tls_begin < smem_raw) std::memset(w.tls_begin, 0xff, smem_raw - w.tls_begin);
    unsigned char* raw_end = smem_raw + kSharedPerBlockOptin;
    if (w.tls_end > raw_end) std::memset(raw_end, 0xff, w.tls_end - raw_end);
    std::memset(b.dyn, 0xff, b.dyn_bytes);
}

// The static __shared__ variables: this library's thread-local symbols other than smem_raw (from
// its ELF symbol table), as offsets in its thread-local block, with the function declaring each.
struct SharedVar {
    std::size_t begin, end;
    std::string owner, name;  // e.g. "neighbour_read", "neighbour_read::slot"
};
std::vector<SharedVar>* all_shared_vars = nullptr;  // null: unknown (no symbol table)
std::once_flag shared_vars_once;

// "void attn_fwd_impl<64, 64>(AttnParams const&)" -> "attn_fwd_impl"; "neighbour_read" -> itself.
std::string function_name(const std::string& s) {
    std::size_t end = s.find_first_of("<(");
    if (end == std::string::npos) end = s.size();
    std::size_t begin = end;
    while (begin > 0 && (std::isalnum(static_cast<unsigned char>(s[begin - 1])) || s[begin - 1] == '_')) --begin;
    return s.substr(begin, end - begin);
}

void load_shared_vars(const char* path, std::size_t smem_raw_offset) {
    std::call_once(shared_vars_once, [&] {
        std::vector<unsigned char> bytes;
        if (FILE* f = path ? std::fopen(path, "rb") : nullptr) {
            unsigned char buf[1 << 16];
            for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
            std::fclose(f);
        }
        auto in = [&](std::uint64_t off, std::uint64_t n) { return off <= bytes.size() && n <= bytes.size() - off; };
        if (!in(0, sizeof(Elf64_Ehdr))) return;
        const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes.data());
        if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return;
        if (!in(eh->e_shoff, std::uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr))) return;
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes.data() + eh->e_shoff);
        auto vars = std::make_unique<std::vector<SharedVar>>();
        bool raw_seen = false;
        for (unsigned i = 0; i < eh->e_shnum; ++i) {
            if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
            const Elf64_Shdr& strtab = sh[sh[i].sh_link];
            if (!in(sh[i].sh_offset, sh[i].sh_size) || !in(strtab.sh_offset, strtab.sh_size)) return;
            const auto* sym = reinterpret_cast<const Elf64_Sym*>(bytes.data() + sh[i].sh_offset);
            const char* names = reinterpret_cast<const char*>(bytes.data() + strtab.sh_offset);
            for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
                if (ELF64_ST_TYPE(sym[k].st_info) != STT_TLS || sym[k].st_size == 0 || sym[k].st_name >= strtab.sh_size) continue;
                const std::string mangled(names + sym[k].st_name, strnlen(names + sym[k].st_name, strtab.sh_size - sym[k].st_name));
                if (mangled == "smem_raw") {
                    raw_seen = sym[k].st_value == smem_raw_offset;  // the table describes this block
                    continue;
                }
                int status = 0;
                char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
                const std::string name = status == 0 && d ? d : mangled;
                std::free(d);
                const std::size_t sep = name.rfind("::");
                const std::string owner = function_name(sep == std::string::npos ? name : name.substr(0, sep));
                vars->push_back(SharedVar{std::size_t(sym[k].st_value), std::size_t(sym[k].st_value + sym[k].st_size), owner, name});
            }
        }
        if (raw_seen) all_shared_vars = vars.release();
    });
}

// The static __shared__ variables kernel `k` may use (those of the functions build.rs found it
// reaches), or null when the symbol table is unknown.
const std::vector<SharedVar>* shared_vars_of(const Kernel& k) {
    if (!all_shared_vars) return nullptr;
    static std::mutex mu;
    static auto* by_kernel = new std::map<const Kernel*, std::vector<SharedVar>>();
    std::lock_guard<std::mutex> g(mu);
    auto it = by_kernel->find(&k);
    if (it != by_kernel->end()) return &it->second;
    std::vector<SharedVar> mine;
    const std::string owners = std::string(" ") + (k.shared_owners ? k.shared_owners : "") + " ";
    for (const SharedVar& v : *all_shared_vars)
        if (owners.find(" " + v.owner + " ") != std::string::npos) mine.push_back(v);
    std::vector<SharedVar>& slot = (*by_kernel)[&k];
    slot = std::move(mine);
    return &slot;
}

// This module's thread-local block on the calling thread (found through the loader).
void find_tls_block(Worker& w) {
    volatile unsigned char touch = smem_raw[0];  // allocates the block on this thread
    (void)touch;
    struct Query {
        const void* inside;
        unsigned char* begin;
        std::size_t size;
        const char* path;
    } q{reinterpret_cast<const void*>(&find_tls_block), nullptr, 0, nullptr};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
            auto* q = static_cast<Query*>(data);
            const auto addr = reinterpret_cast<std::uintptr_t>(q->inside);
            bool mine = false;
            std::size_t tls = 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const auto& ph = info->dlpi_phdr[i];
                const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
                if (ph.p_type == PT_LOAD && addr >= lo && addr < lo + ph.p_memsz) mine = true;
                if (ph.p_type == PT_TLS) tls = ph.p_memsz;
            }
            if (!mine) return 0;
            q->begin = static_cast<unsigned char*>(info->dlpi_tls_data);
            q->size = tls;
            q->path = info->dlpi_name;
            return 1;
        },
        &q);
    if (q.begin && smem_raw >= q.begin && smem_raw + kSharedPerBlockOptin <= q.begin + q.size) {
        w.tls_begin = q.begin;
        w.tls_end = q.begin + q.size;
        w.tls_known = true;
        load_shared_vars(q.path, std::size_t(smem_raw - q.begin));
    } else {
        // Not found: static shared variables are not poisoned (and not recognised as shared
        // memory by ldmatrix / cp.async); the dynamic part is.
        w.tls_begin = w.tls_end = smem_raw;
    }
}


// ---- memory checks (runtime.h) ------------------------------------------------------------------

// Set when the first launch starts. Before it, instrumented code runs only as the kernel files'
// static initialisers, on an ordinary thread: there is no fiber to attribute an access to.
std::atomic<bool> kernels_running{false};

enum class Access : std::uint8_t { Read, Write, Atomic };

// The shadow of one 2-byte granule: the launch (global memory) or barrier interval (shared
// memory) it was last accessed in, the agent (block or thread, 1-based) that wrote it, with
// kAtomic if by atomics (kMany: atomics of several agents), and the agent that read it (kMany:
// several). A stale stamp reads as untouched, so nothing is cleared between launches.
constexpr std::uint16_t kAtomic = 0x8000, kMany = 0xffff;
struct Entry {
    std::uint32_t stamp;
    std::uint16_t w, r;
};
std::uint64_t pack(Entry e) { return std::uint64_t(e.stamp) << 32 | std::uint64_t(e.w) << 16 | e.r; }
Entry unpack(std::uint64_t v) { return Entry{std::uint32_t(v >> 32), std::uint16_t(v >> 16), std::uint16_t(v)}; }

// An earlier access that one conflicts with: its agent (0 for several) and kind.
struct Conflict {
    std::uint16_t agent;
    Access kind;
};

// Applies an access of kind `k` by agent `x` to `e`; false (and the earlier access) on a conflict.
inline __attribute__((always_inline)) bool apply(Entry& e, std::uint16_t x, Access k, Conflict* c) {
    const bool w_atomic = (e.w & kAtomic) != 0;
    const std::uint16_t w_agent = e.w == kMany ? 0 : std::uint16_t(e.w & ~kAtomic);
    const bool other_writer = e.w != 0 && (e.w == kMany || w_agent != x);
    const bool other_reader = e.r != 0 && e.r != x;
    const Conflict writer{w_agent, w_atomic ? Access::Atomic : Access::Write};
    const Conflict reader{e.r == kMany ? std::uint16_t(0) : e.r, Access::Read};
    switch (k) {
        case Access::Read:
            if (other_writer) return *c = writer, false;
            e.r = (e.r == 0 || e.r == x) ? x : kMany;
            return true;
        case Access::Write:
            if (other_writer) return *c = writer, false;
            if (other_reader) return *c = reader, false;
            e.w = x;
            return true;
        case Access::Atomic:
            if (other_writer && !w_atomic) return *c = writer, false;
            if (other_reader) return *c = reader, false;
            e.w = (e.w == 0 || w_agent == x) && e.w != kMany ? std::uint16_t(kAtomic | x) : kMany;
            return true;
    }
    return true;
}

const char* verb(Access k) { return k == Access::Read ? "reads" : k == Access::Write ? "writes" : "atomically updates"; }
const char* past(Access k) { return k == Access::Read ? "read" : k == Access::Write ? "wrote" : "updated atomically"; }

std::string thread_name(const Block& b, unsigned tid) {
    const dim3 d = b.launch->block;
    char buf[64];
    std::snprintf(buf, sizeof buf, "thread (%u,%u,%u)", tid % d.x, tid / d.x % d.y, tid / (d.x * d.y));
    return buf;
}

std::string block_name(const Launch& l, std::uint16_t agent) {
    const std::uint64_t i = agent - 1u;  // exact below 0x7ffe blocks, else one of those equal mod 0x7ffe
    char buf[64];
    std::snprintf(buf, sizeof buf, "block (%u,%u,%u)", unsigned(i % l.grid.x), unsigned(i / l.grid.x % l.grid.y),
                  unsigned(i / (std::uint64_t(l.grid.x) * l.grid.y)));
    return buf;
}

struct SharedEntry {
    std::uint64_t e;              // Entry, stamped with the worker's epoch; agents are threads
    std::uint32_t w_sync, r_sync;  // the writer's / reader's warp's __syncwarp count at the access
};

// Where a shared address is, for messages.
std::string shared_place(const Block& b, std::uintptr_t a) {
    const auto raw = reinterpret_cast<std::uintptr_t>(smem_raw);
    char buf[96];
    if (a >= raw && a < raw + kSharedPerBlockOptin)
        std::snprintf(buf, sizeof buf, "byte %zu of the dynamic shared memory (%zu bytes)", std::size_t(a - raw), b.dyn_bytes);
    else
        std::snprintf(buf, sizeof buf, "static shared memory (byte %zu of the block's shared variables)",
                      std::size_t(a - reinterpret_cast<std::uintptr_t>(b.worker->tls_begin)));
    return buf;
}

void shared_access(Fiber* f, std::uintptr_t a, std::size_t n, Access k) {
    Block& b = *f->block;
    Worker& w = *b.worker;
    const auto raw = reinterpret_cast<std::uintptr_t>(smem_raw), raw_end = raw + kSharedPerBlockOptin;
    const auto tls_end = reinterpret_cast<std::uintptr_t>(w.tls_end);
    const bool dynamic = a + n > raw && a < raw_end;
    auto what = [&] {  // for messages only: built on failure, not on every access
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s %zu bytes at ", verb(k), n);
        return std::string(buf);
    };
    if ((dynamic && (a < raw || a + n > raw + b.dyn_bytes)) || a + n > tls_end) {
        fail_fiber(f, kErrIllegalAddress, what() + shared_place(b, a) + ": outside the block's shared memory" +
                                              (dynamic ? " (past the dynamic shared memory the launch gave)" : ""));
    }
    if (!dynamic && b.launch->shared_vars) {
        // Static: inside one of the kernel's own __shared__ variables (another kernel's, or the
        // padding between them, is an overrun). `near`: the variable the access starts at or past.
        const std::size_t off = a - reinterpret_cast<std::uintptr_t>(w.tls_begin);
        const SharedVar* near = nullptr;
        bool inside = false;
        for (const SharedVar& v : *b.launch->shared_vars) {
            inside = inside || (off >= v.begin && off + n <= v.end);
            if (v.begin <= off && (!near || v.begin > near->begin)) near = &v;
        }
        if (!inside) {
            std::string s = what() + shared_place(b, a) + ": outside the kernel's static __shared__ variables";
            if (near)
                s += " (byte " + std::to_string(off - near->begin) + " of `" + near->name + "`, " +
                     std::to_string(near->end - near->begin) + " bytes)";
            fail_fiber(f, kErrIllegalAddress, s);
        }
    }
    const std::uint16_t x = std::uint16_t(f->tid + 1);
    const auto base = reinterpret_cast<std::uintptr_t>(w.tls_begin);
    for (std::uintptr_t g = (a - base) >> 1, last = (a + n - 1 - base) >> 1; g <= last; ++g) {
        SharedEntry& s = w.shared_shadow[g];
        Entry e = unpack(s.e);
        if (e.stamp != w.epoch) e = Entry{w.epoch, 0, 0};
        // A __syncwarp since another lane of this warp accessed it orders the two accesses.
        const std::uint32_t syncs = w.warps[f->warp].syncs;
        auto synced = [&](std::uint16_t agent, std::uint32_t at) { return (agent - 1u) / kWarpSize == f->warp && at != syncs; };
        if (e.w && e.w != kMany && !(e.w & kAtomic) && synced(e.w, s.w_sync)) e.w = 0;
        if (e.r && e.r != kMany && synced(e.r, s.r_sync)) e.r = 0;
        Conflict c;
        if (!apply(e, x, k, &c)) {
            const std::string other = c.agent ? thread_name(b, c.agent - 1u) : std::string("other threads");
            char buf[64];
            std::snprintf(buf, sizeof buf, "shared memory race: %s %zu bytes at ", verb(k), n);
            fail_fiber(f, kErrLaunchFailed, buf + shared_place(b, a) + " that " + other + " " + past(c.kind) +
                                                " since the last __syncthreads (a missing barrier)");
        }
        if (k == Access::Read) s.r_sync = syncs;
        else s.w_sync = syncs;
        s.e = pack(e);
    }
}

// Device allocations (driver.cpp registers them) and their shadows.
struct Allocation {
    std::size_t bytes;
    std::uint64_t* shadow;  // an Entry per 2-byte granule, stamped with the launch
    std::size_t shadow_bytes;
};
std::mutex allocation_mu;
std::map<std::uintptr_t, Allocation>& allocation_map() {
    static auto* m = new std::map<std::uintptr_t, Allocation>();
    return *m;
}
std::atomic<std::uint64_t> allocation_generation{0};  // changes at every allocation and free

// The loaded object segment holding `a` (this library's constant data, say), or false.
bool image_segment(std::uintptr_t a, Worker::Region* out) {
    struct Q {
        std::uintptr_t a;
        Worker::Region* out;
        bool found;
    } q{a, out, false};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
            auto* q = static_cast<Q*>(data);
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const auto& ph = info->dlpi_phdr[i];
                const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
                if (ph.p_type == PT_LOAD && q->a >= lo && q->a < lo + ph.p_memsz) {
                    *q->out = Worker::Region{lo, lo + ph.p_memsz, nullptr};
                    q->found = true;
                    return 1;
                }
            }
            return 0;
        },
        &q);
    return q.found;
}

[[noreturn]] void outside_allocations(Fiber* f, std::uintptr_t a, std::size_t n, Access k) {
    char buf[256];
    int len = std::snprintf(buf, sizeof buf, "%s %zu bytes at 0x%llx, outside every device allocation", verb(k), n,
                            (unsigned long long)a);
    {
        std::lock_guard<std::mutex> g(allocation_mu);
        auto& m = allocation_map();
        auto it = m.upper_bound(a);
        if (it != m.begin()) {
            --it;
            if (a >= it->first && a < it->first + it->second.bytes + kAllocationGuard + 256)
                std::snprintf(buf + len, sizeof buf - len, " (%zu bytes into the allocation at 0x%llx of %zu bytes)",
                              std::size_t(a - it->first), (unsigned long long)it->first, it->second.bytes);
        }
    }
    fail_fiber(f, kErrIllegalAddress, buf);
}

void global_access(Fiber* f, std::uintptr_t a, std::size_t n, Access k) {
    Block& b = *f->block;
    Worker& w = *b.worker;
    // The region of the previous access first: a kernel's accesses mostly stay in one buffer.
    const Worker::Region* r = &w.regions[w.last_region];
    if (!(a >= r->begin && a < r->end)) {
        r = nullptr;
        for (unsigned i = 0; i < sizeof w.regions / sizeof w.regions[0]; ++i)
            if (a >= w.regions[i].begin && a < w.regions[i].end) {
                r = &w.regions[i];
                w.last_region = i;
                break;
            }
    }
    if (!r) {
        Worker::Region found;
        bool ok = false;
        {
            std::lock_guard<std::mutex> g(allocation_mu);
            auto& m = allocation_map();
            auto it = m.upper_bound(a);
            if (it != m.begin()) {
                --it;
                if (a < it->first + it->second.bytes) {
                    found = Worker::Region{it->first, it->first + it->second.bytes, it->second.shadow};
                    ok = true;
                }
            }
        }
        if (!ok) ok = image_segment(a, &found);
        if (!ok) {
            if (!w.tls_known) return;  // static shared memory not located: cannot tell
            outside_allocations(f, a, n, k);
        }
        w.last_region = w.next_region++ % (sizeof w.regions / sizeof w.regions[0]);
        w.regions[w.last_region] = found;
        r = &w.regions[w.last_region];
    }
    if (a + n > r->end) outside_allocations(f, a + n - 1, n, k);
    if (!r->shadow) return;
    const Launch& l = *b.launch;
    for (std::uintptr_t g = (a - r->begin) >> 1, last = (a + n - 1 - r->begin) >> 1; g <= last; ++g) {
        // Blocks run on several workers: the entry is read and written whole (a lost shadow update
        // can hide a race, never invent one).
        const std::uint64_t old = __atomic_load_n(r->shadow + g, __ATOMIC_RELAXED);
        Entry e = unpack(old);
        if (e.stamp != l.stamp) e = Entry{l.stamp, 0, 0};
        Conflict c;
        if (!apply(e, b.agent, k, &c)) {
            const std::string other = c.agent ? block_name(l, c.agent) : std::string("other blocks");
            char buf[200];
            std::snprintf(buf, sizeof buf, "race between blocks of one launch: %s %zu bytes at 0x%llx (byte %zu of the allocation at 0x%llx) that ",
                          verb(k), n, (unsigned long long)a, std::size_t(a - r->begin), (unsigned long long)r->begin);
            fail_fiber(f, kErrLaunchFailed, buf + other + " " + past(c.kind) +
                                                " (blocks are not ordered within a launch: use atomics for both, or separate launches)");
        }
        const std::uint64_t now = pack(e);
        if (now != old) __atomic_store_n(r->shadow + g, now, __ATOMIC_RELAXED);
    }
}

// Every instrumented load and store of kernel code, and the emulated loads and stores (ldmatrix,
// cp.async, atomics).
inline void check(const void* p, std::size_t n, Access k) {
    if (!kernels_running.load(std::memory_order_relaxed)) return;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const ThreadVars* vars = here();
    if ((a & ~std::uintptr_t(kFiberSpan - 1)) == reinterpret_cast<std::uintptr_t>(vars)) return;  // its own stack
    Fiber* f = reinterpret_cast<Fiber*>(const_cast<ThreadVars*>(vars));
    Block& b = *f->block;
    if (!b.launch->checks || n == 0) return;
    const Worker& w = *b.worker;
    if (a >= reinterpret_cast<std::uintptr_t>(w.tls_begin) && a < reinterpret_cast<std::uintptr_t>(w.tls_end)) {
        shared_access(f, a, n, k);
    } else {
        global_access(f, a, n, k);
    }
}

// ---- barriers and exits -------------------------------------------------------------------------

// Releases `mask`'s lanes of warp `warp` (or, for a barrier, every thread at it) in schedule order.
void release(Block& b, unsigned first, unsigned count, State waiting, unsigned lane_mask) {
    auto one = [&](unsigned t) {
        Fiber* f = b.fibers[t];
        if (f->state == waiting && (lane_mask >> (t % 32) & 1)) {
            f->state = State::Ready;
            b.ready.push(f);
        }
    };
    if (b.ready.order == Order::Reverse) {
        for (unsigned t = first + count; t-- > first;) one(t);
    } else {
        for (unsigned t = first; t < first + count; ++t) one(t);
    }
}

void release_barrier(Block& b) {
    b.at_barrier = 0;
    ++b.worker->epoch;  // a new barrier interval for the shared-memory race check
    release(b, 0, b.n, State::AtBarrier, 0xffffffffu);
}

void perform(const Copy& c) {
    std::memcpy(c.dst, c.src, c.bytes);
    std::memset(c.dst + c.bytes, 0, 16 - c.bytes);
}

void finish_copies(Fiber* f, std::size_t keep_groups) {
    while (f->pending_groups.size() > keep_groups) {
        for (const Copy& c : f->pending_groups.front()) perform(c);
        f->pending_groups.pop_front();
    }
}

unsigned warp_size_of(const Block& b, unsigned warp) { return std::min(kWarpSize, b.n - warp * kWarpSize); }

[[noreturn]] void thread_return(Fiber* f) {
    Block& b = *f->block;
    // Copies still in flight land anyway (the hardware completes them).
    if (!f->open_copies.empty()) f->pending_groups.push_back(std::move(f->open_copies));
    f->open_copies.clear();
    finish_copies(f, 0);
    const WarpExchange& w = b.worker->warps[f->warp];
    if (w.arrived && (w.mask >> f->lane & 1)) {
        fail_fiber(f, kErrLaunchFailed,
                   std::string("returned while lanes ") + lanes(w.arrived) + " of its warp wait for it in " +
                       op_name(w.op) + " (mask " + hex(w.mask) + "): a warp collective that some lanes of its mask skip");
    }
    if (b.at_barrier > 0 && b.launch->checks) {
        // On a GPU a barrier some threads skip is undefined (it may hang or release early).
        fail_fiber(f, kErrLaunchFailed,
                   "returned while " + std::to_string(b.at_barrier) + " thread(s) of its block wait at __syncthreads: a barrier "
                   "that only some threads of the block reach");
    }
    f->state = State::Returned;
    --b.live;
    ++b.returned;
    if (b.at_barrier > 0 && b.at_barrier == b.live) release_barrier(b);
    yield(f);
    __builtin_unreachable();
}

}  // namespace

extern "C" [[noreturn]] void coa_emu_fiber_main(void* p) {
    Fiber* f = static_cast<Fiber*>(p);
    const Launch& l = *f->block->launch;
    l.kernel->invoke(l.params);
    thread_return(f);
}

// ---- the device API (runtime.h) -----------------------------------------------------------------

void fail(int code, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fail_fiber(current(), code, buf);
}

void sync_threads() {
    Fiber* f = current();
    Block& b = *f->block;
    // The call site: a GPU has one barrier per block, so threads at two different __syncthreads
    // would release each other; that is a barrier each of them reaches with only some threads.
    const void* site = __builtin_return_address(0);
    if (b.launch->checks) {
        if (b.returned)
            fail_fiber(f, kErrLaunchFailed,
                       "__syncthreads after " + std::to_string(b.returned) + " thread(s) of its block returned: a barrier that "
                       "only some threads of the block reach");
        if (b.at_barrier && b.barrier_site != site) {
            const Fiber* o = b.barrier_first;
            char buf[160];
            std::snprintf(buf, sizeof buf, "__syncthreads at code address %p while thread (%u,%u,%u) waits at another one (%p)",
                          site, o->vars.thread_idx.x, o->vars.thread_idx.y, o->vars.thread_idx.z, b.barrier_site);
            fail_fiber(f, kErrLaunchFailed, std::string(buf) + ": a barrier that only some threads of the block reach");
        }
    }
    if (b.at_barrier == 0) {
        b.barrier_site = site;
        b.barrier_first = f;
    }
    f->state = State::AtBarrier;
    if (++b.at_barrier == b.live) release_barrier(b);
    yield(f);
}

namespace {

void compute(Block& b, WarpExchange& w, unsigned warp);

// Deposits this lane's operands (already in `w`) and waits until every lane of `mask` has.
void arrive(Fiber* f, Op op, unsigned mask) {
    Block& b = *f->block;
    WarpExchange& w = b.worker->warps[f->warp];
    const unsigned bit = 1u << f->lane;
    const unsigned size = warp_size_of(b, f->warp);
    const unsigned exists = size == 32 ? 0xffffffffu : (1u << size) - 1;
    if (!(mask & bit))
        fail_fiber(f, kErrLaunchFailed, std::string(op_name(op)) + " with mask " + hex(mask) + ", which does not include the calling lane");
    if (mask & ~exists)
        fail_fiber(f, kErrLaunchFailed, std::string(op_name(op)) + " with mask " + hex(mask) + " names lanes " +
                                            lanes(mask & ~exists) + ", which this block does not have");
    if (w.arrived == 0) {
        w.op = op;
        w.mask = mask;
    } else if (w.op != op || w.mask != mask) {
        fail_fiber(f, kErrLaunchFailed,
                   std::string(op_name(op)) + " (mask " + hex(mask) + ") while lanes " + lanes(w.arrived) + " of its warp wait in " +
                       op_name(w.op) + " (mask " + hex(w.mask) + "): divergent warp collectives");
    }
    if (b.returned) {
        for (unsigned l = 0; l < size; ++l) {
            if ((mask >> l & 1) && b.fibers[f->warp * 32 + l]->state == State::Returned)
                fail_fiber(f, kErrLaunchFailed,
                           std::string(op_name(op)) + " waits for lane " + std::to_string(l) +
                               ", which has returned: a warp collective that some lanes of its mask skip");
        }
    }
    w.arrived |= bit;
    f->state = State::InCollective;
    if (w.arrived == w.mask) {
        if (op == Op::Sync) ++w.syncs;
        compute(b, w, f->warp);
        w.arrived = 0;
        release(b, f->warp * 32, size, State::InCollective, w.mask);
    }
    yield(f);
}

std::uint32_t load32(const unsigned char* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
std::uint16_t load16(const unsigned char* p) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
float bf16_lo(unsigned u) {
    const std::uint32_t x = u << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
float bf16_hi(unsigned u) {
    const std::uint32_t x = u & 0xffff0000u;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

void compute(Block& b, WarpExchange& w, unsigned warp) {
    switch (w.op) {
        case Op::Sync:
        case Op::None: break;
        case Op::Ballot: {
            unsigned vote = 0;
            for (unsigned l = 0; l < 32; ++l)
                if ((w.mask >> l & 1) && w.value[l]) vote |= 1u << l;
            for (unsigned l = 0; l < 32; ++l) w.result[l] = vote;
            break;
        }
        case Op::Shfl: {
            for (unsigned l = 0; l < 32; ++l) {
                if (!(w.mask >> l & 1)) continue;
                const int width = w.width[l], arg = w.arg[l];
                const int seg = int(l) & ~(width - 1), end = seg + width;
                int src = int(l);
                switch (w.kind[l]) {
                    case Shfl::Idx: src = seg + (arg & (width - 1)); break;
                    case Shfl::Up: src = int(l) - arg < seg ? int(l) : int(l) - arg; break;
                    case Shfl::Down: src = int(l) + arg >= end ? int(l) : int(l) + arg; break;
                    case Shfl::Xor: src = (int(l) ^ arg) >= end ? int(l) : (int(l) ^ arg); break;
                }
                if (src < 0 || src >= 32 || !(w.mask >> src & 1)) {
                    Fiber* f = b.fibers[warp * 32 + l];
                    fail_fiber(f, kErrLaunchFailed, "__shfl*_sync reads lane " + std::to_string(src) + ", which is not in the mask");
                }
                w.result[l] = w.value[src];
            }
            break;
        }
        case Op::Ldmatrix:
        case Op::LdmatrixTrans: {
            // Four 8x8 b16 matrices; lanes 8i..8i+7 gave the row addresses of matrix i. Lane l
            // receives, of matrix i, row l/4, columns 2(l%4) and 2(l%4)+1; with .trans, column l/4,
            // rows 2(l%4) and 2(l%4)+1 (the transpose).
            for (unsigned l = 0; l < 32; ++l) {
                for (unsigned i = 0; i < 4; ++i) {
                    if (w.op == Op::Ldmatrix) {
                        w.frag[l][i] = load32(w.row[8 * i + l / 4] + 4 * (l % 4));
                    } else {
                        const unsigned lo = load16(w.row[8 * i + 2 * (l % 4)] + 2 * (l / 4));
                        const unsigned hi = load16(w.row[8 * i + 2 * (l % 4) + 1] + 2 * (l / 4));
                        w.frag[l][i] = lo | hi << 16;
                    }
                }
            }
            break;
        }
        case Op::Mma: {
            // m16n8k16, A row-major 16x16, B column-major 16x8, C/D 16x8 f32. With g = lane/4 and
            // t = lane%4: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 =
            // A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; c0,c1 = C[g][2t..2t+1],
            // c2,c3 = C[g+8][2t..2t+1] (each register's low half is the lower column / row).
            float A[16][16], B[16][8], C[16][8];
            for (unsigned l = 0; l < 32; ++l) {
                const unsigned g = l / 4, t = l % 4;
                const unsigned rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
                for (unsigned r = 0; r < 4; ++r) {
                    A[rows[r]][cols[r]] = bf16_lo(w.a[l][r]);
                    A[rows[r]][cols[r] + 1] = bf16_hi(w.a[l][r]);
                }
                for (unsigned r = 0; r < 2; ++r) {
                    B[2 * t + 8 * r][g] = bf16_lo(w.b[l][r]);
                    B[2 * t + 8 * r + 1][g] = bf16_hi(w.b[l][r]);
                }
                C[g][2 * t] = w.c[l][0];
                C[g][2 * t + 1] = w.c[l][1];
                C[g + 8][2 * t] = w.c[l][2];
                C[g + 8][2 * t + 1] = w.c[l][3];
            }
            float D[16][8];
            for (unsigned i = 0; i < 16; ++i)
                for (unsigned j = 0; j < 8; ++j) {
                    float acc = 0.f;  // bf16 x bf16 products are exact in f32
                    for (unsigned k = 0; k < 16; ++k) acc += A[i][k] * B[k][j];
                    D[i][j] = acc + C[i][j];
                }
            for (unsigned l = 0; l < 32; ++l) {
                const unsigned g = l / 4, t = l % 4;
                w.d[l][0] = D[g][2 * t];
                w.d[l][1] = D[g][2 * t + 1];
                w.d[l][2] = D[g + 8][2 * t];
                w.d[l][3] = D[g + 8][2 * t + 1];
            }
            break;
        }
    }
}

WarpExchange& exchange_of(Fiber* f) { return f->block->worker->warps[f->warp]; }

void check_full_warp(Fiber* f, const char* what) {
    if (warp_size_of(*f->block, f->warp) != 32)
        fail_fiber(f, kErrLaunchFailed, std::string(what) + " needs all 32 lanes of the warp, and this warp has " +
                                            std::to_string(warp_size_of(*f->block, f->warp)));
}

}  // namespace

std::uint64_t shfl(Shfl kind, unsigned mask, std::uint64_t value, int arg, int width) {
    Fiber* f = current();
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail_fiber(f, kErrLaunchFailed, "__shfl*_sync width " + std::to_string(width) + " is not a power of two up to 32");
    WarpExchange& w = exchange_of(f);
    // Another lane may be mid-way in a different collective: arrive() reports that before the
    // slot is used, and a slot is only overwritten once its previous result has been read.
    w.value[f->lane] = value;
    w.arg[f->lane] = arg;
    w.width[f->lane] = width;
    w.kind[f->lane] = kind;
    arrive(f, Op::Shfl, mask);
    return w.result[f->lane];
}

void sync_warp(unsigned mask) { arrive(current(), Op::Sync, mask); }

unsigned ballot(unsigned mask, int pred) {
    Fiber* f = current();
    WarpExchange& w = exchange_of(f);
    w.value[f->lane] = pred != 0;
    arrive(f, Op::Ballot, mask);
    return unsigned(w.result[f->lane]);
}

void ldmatrix_x4(bool trans, const void* row, unsigned out[4]) {
    Fiber* f = current();
    check_full_warp(f, "ldmatrix");
    auto addr = [&] {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%p", row);
        return std::string(buf);
    };
    if (reinterpret_cast<std::uintptr_t>(row) % 16)
        fail_fiber(f, kErrMisaligned, "ldmatrix row address " + addr() + " is not 16-byte aligned");
    if (!in_shared(*f->block, row, 16))
        fail_fiber(f, kErrIllegalAddress, "ldmatrix row address " + addr() + " is not in the block's shared memory");
    check(row, 16, Access::Read);
    WarpExchange& w = exchange_of(f);
    w.row[f->lane] = static_cast<const unsigned char*>(row);
    arrive(f, trans ? Op::LdmatrixTrans : Op::Ldmatrix, 0xffffffffu);
    std::memcpy(out, w.frag[f->lane], sizeof(unsigned) * 4);
}

void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    Fiber* f = current();
    check_full_warp(f, "mma.sync");
    WarpExchange& w = exchange_of(f);
    std::memcpy(w.a[f->lane], a, sizeof(unsigned) * 4);
    std::memcpy(w.b[f->lane], b, sizeof(unsigned) * 2);
    std::memcpy(w.c[f->lane], c, sizeof(float) * 4);
    arrive(f, Op::Mma, 0xffffffffu);
    std::memcpy(d, w.d[f->lane], sizeof(float) * 4);
}

void cp_async16(void* shared_dst, const void* global_src, int bytes) {
    Fiber* f = current();
    auto where_ = [&] {
        char buf[64];
        std::snprintf(buf, sizeof buf, "(to %p from %p)", shared_dst, global_src);
        return std::string(buf);
    };
    if (reinterpret_cast<std::uintptr_t>(shared_dst) % 16 || reinterpret_cast<std::uintptr_t>(global_src) % 16)
        fail_fiber(f, kErrMisaligned, "cp.async of 16 bytes " + where_() + ": both addresses must be 16-byte aligned");
    if (!in_shared(*f->block, shared_dst, 16))
        fail_fiber(f, kErrIllegalAddress, "cp.async " + where_() + ": the destination is not in the block's shared memory");
    if (bytes < 0 || bytes > 16)
        fail_fiber(f, kErrLaunchFailed, "cp.async source size " + std::to_string(bytes) + " is outside 0..16");
    // The copy is the issuing thread's: its write of the destination counts now, whenever it lands.
    check(shared_dst, 16, Access::Write);
    check(global_src, std::size_t(bytes), Access::Read);
    const Copy c{static_cast<unsigned char*>(shared_dst), static_cast<const unsigned char*>(global_src), bytes};
    // When the copy lands is a schedule choice too: at its wait (the latest the hardware may: a
    // read before the wait sees old data) in forward and reverse order; at issue (the earliest: a
    // buffer refilled while another warp still reads it shows) in max-drift order; either, at
    // random, in random order.
    Block& b = *f->block;
    const Order order = b.ready.order;
    if (order == Order::MaxDrift || (order == Order::Random && (b.ready.next_random() & 1))) {
        perform(c);
    } else {
        f->open_copies.push_back(c);
    }
}

void cp_async_commit() {
    Fiber* f = current();
    f->pending_groups.push_back(std::move(f->open_copies));
    f->open_copies.clear();
}

void cp_async_wait(int pending_groups) {
    Fiber* f = current();
    finish_copies(f, std::size_t(pending_groups < 0 ? 0 : pending_groups));
}

void atomic_access(const void* p, std::size_t bytes) { check(p, bytes, Access::Atomic); }

void register_allocation(void* p, std::size_t bytes) {
    const std::size_t shadow_bytes = (bytes / 2 + 1) * sizeof(std::uint64_t);
    void* shadow = mmap(nullptr, shadow_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::lock_guard<std::mutex> g(allocation_mu);
    // Without a shadow (address space exhausted) the bounds are still checked, races are not.
    allocation_map()[reinterpret_cast<std::uintptr_t>(p)] =
        Allocation{bytes, shadow == MAP_FAILED ? nullptr : static_cast<std::uint64_t*>(shadow), shadow_bytes};
    ++allocation_generation;
}

bool unregister_allocation(void* p) {
    std::lock_guard<std::mutex> g(allocation_mu);
    auto& m = allocation_map();
    auto it = m.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == m.end()) return false;
    if (it->second.shadow) munmap(it->second.shadow, it->second.shadow_bytes);
    m.erase(it);
    ++allocation_generation;
    return true;
}

bool allocated(const void* p, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> g(allocation_mu);
    auto& m = allocation_map();
    auto it = m.upper_bound(a);
    if (it == m.begin()) return false;
    --it;
    return a + n <= it->first + it->second.bytes;
}

unsigned shared_offset(const void* p) {
    Fiber* f = current();
    const Block& b = *f->block;
    const auto* c = static_cast<const unsigned char*>(p);
    if (c >= smem_raw && c < smem_raw + kSharedPerBlockOptin) return unsigned(c - smem_raw);
    if (in_shared(b, p, 1)) return kSharedPerBlockOptin + unsigned(c - b.worker->tls_begin);
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", p);
    fail_fiber(f, kErrIllegalAddress, std::string("__cvta_generic_to_shared of ") + addr + ", which is not shared memory");
}

// ---- running a block ----------------------------------------------------------------------------

namespace {

std::string deadlock_report(const Block& b) {
    std::string s = "deadlock: every thread that has not returned waits, and none can be released:";
    unsigned barrier = 0;
    for (unsigned t = 0; t < b.n; ++t) barrier += b.fibers[t]->state == State::AtBarrier;
    if (barrier) s += " " + std::to_string(barrier) + " thread(s) wait at __syncthreads;";
    for (unsigned w = 0; w * 32 < b.n; ++w) {
        const WarpExchange& x = b.worker->warps[w];
        if (!x.arrived) continue;
        unsigned at_barrier = 0, returned = 0;
        for (unsigned l = 0; l < warp_size_of(b, w); ++l) {
            const State st = b.fibers[w * 32 + l]->state;
            if ((x.mask >> l & 1) && !(x.arrived >> l & 1)) {
                if (st == State::AtBarrier) at_barrier |= 1u << l;
                if (st == State::Returned) returned |= 1u << l;
            }
        }
        s += " warp " + std::to_string(w) + ": lanes " + lanes(x.arrived) + " wait in " + op_name(x.op) +
             " for lanes " + lanes(x.mask & ~x.arrived);
        if (at_barrier) s += " (lanes " + lanes(at_barrier) + " of them wait at __syncthreads)";
        s += ";";
    }
    s += " (block of " + std::to_string(b.n) + " threads, " + std::to_string(b.returned) + " returned)";
    return s;
}

void run_block(Worker& w, Launch& l, std::uint64_t linear) {
    Block b;
    b.launch = &l;
    b.worker = &w;
    b.n = l.block.x * l.block.y * l.block.z;
    b.live = b.n;
    b.idx = uint3{unsigned(linear % l.grid.x), unsigned(linear / l.grid.x % l.grid.y),
                  unsigned(linear / (std::uint64_t(l.grid.x) * l.grid.y))};
    b.dyn = smem_raw;
    b.dyn_bytes = l.dyn_smem;
    b.agent = std::uint16_t(linear % (kAtomic - 2) + 1);
    ++w.epoch;  // the block's first barrier interval
    if (w.region_generation != allocation_generation.load()) {
        // allocations came or went since this worker cached some: forget them all
        for (Worker::Region& r : w.regions) r = Worker::Region{};
        w.region_generation = allocation_generation.load();
    }
    poison_shared(b);
    for (unsigned i = 0; i < b.n / 32 + 1 && i < kMaxThreadsPerBlock / 32; ++i) {
        w.warps[i].arrived = 0;
        w.warps[i].op = Op::None;
    }
    b.ready.reset(l.schedule.order, l.schedule.seed ^ (linear * 0x9e3779b97f4a7c15ull), b.fibers);
    for (unsigned t = 0; t < b.n; ++t) {
        Fiber* f = w.fiber(t);
        f->vars.thread_idx = uint3{t % l.block.x, t / l.block.x % l.block.y, t / (l.block.x * l.block.y)};
        f->vars.block_idx = b.idx;
        f->vars.block_dim = l.block;
        f->vars.grid_dim = l.grid;
        f->block = &b;
        f->tid = t;
        f->lane = t % 32;
        f->warp = t / 32;
        f->state = State::NotStarted;
        f->open_copies.clear();
        f->pending_groups.clear();
        b.fibers[t] = f;
    }
    if (b.ready.order == Order::Reverse) {
        for (unsigned t = b.n; t-- > 0;) b.ready.push(b.fibers[t]);
    } else {
        for (unsigned t = 0; t < b.n; ++t) b.ready.push(b.fibers[t]);
    }
    while (!b.failed && !l.failed.load(std::memory_order_relaxed)) {
        Fiber* f = b.ready.pop();
        if (!f) break;
        if (f->state == State::NotStarted) make_context(f);
        f->state = State::Running;
        switch_to(&b.scheduler, &f->ctx);
    }
    if (!b.failed && !l.failed.load() && b.returned < b.n) {
        char head[160];
        std::snprintf(head, sizeof head, "emulated device: %s, block (%u,%u,%u): ", l.kernel->name, b.idx.x, b.idx.y, b.idx.z);
        l.record(kErrLaunchFailed, head + deadlock_report(b));
    }
}

// ---- the worker pool ----------------------------------------------------------------------------

struct Pool {
    std::mutex mu;
    std::condition_variable work, finished;
    std::deque<Launch*> jobs;
    unsigned threads = 0;

    void start(unsigned n) {
        threads = n;
        for (unsigned i = 0; i < n; ++i) std::thread([this] { serve(); }).detach();
    }

    void serve() {
        // Large allocations, once per worker: fiber spans (reserved, touched as used).
        auto* w = new Worker();
        void* mem = mmap(nullptr, kFiberSpan * (kMaxThreadsPerBlock + 1), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) {
            std::fprintf(stderr, "coa emulated device: cannot reserve fiber stacks\n");
            std::abort();
        }
        const auto base = (reinterpret_cast<std::uintptr_t>(mem) + kFiberSpan - 1) & ~(std::uintptr_t)(kFiberSpan - 1);
        w->spans = reinterpret_cast<unsigned char*>(base);
        find_tls_block(*w);
        // The shared-memory shadow: an entry per 2 bytes of the thread-local block (reserved,
        // touched as used).
        const std::size_t shadow_bytes = ((w->tls_end - w->tls_begin) / 2 + 1) * sizeof(SharedEntry);
        void* shadow = mmap(nullptr, shadow_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (shadow == MAP_FAILED) {
            std::fprintf(stderr, "coa emulated device: cannot reserve the shared-memory shadow\n");
            std::abort();
        }
        w->shared_shadow = static_cast<SharedEntry*>(shadow);
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
            work.wait(lk, [this] { return !jobs.empty(); });
            Launch* l = jobs.front();
            const std::uint64_t i = l->next++;
            if (l->next >= l->n_blocks) jobs.pop_front();  // its last block is taken
            lk.unlock();
            if (!l->failed.load()) run_block(*w, *l, l->block_at(i));
            lk.lock();
            if (++l->done == l->n_blocks) finished.notify_all();
        }
    }

    void run(Launch& l) {
        std::unique_lock<std::mutex> lk(mu);
        jobs.push_back(&l);
        work.notify_all();
        finished.wait(lk, [&] { return l.done == l.n_blocks; });
    }
};

Pool& pool() {
    static Pool* p = [] {
        auto* q = new Pool();
        q->start(worker_threads());
        return q;
    }();
    return *p;
}

}  // namespace

unsigned worker_threads() {
    static const unsigned n = [] {
        if (const char* e = std::getenv("COA_EMU_THREADS")) {
            const long v = std::strtol(e, nullptr, 10);
            if (v >= 1 && v <= 256) return unsigned(v);
            std::fprintf(stderr, "coa emulated device: COA_EMU_THREADS=%s is not 1..256; using the CPUs available\n", e);
        }
        cpu_set_t set;
        unsigned cpus = 1;
        if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = unsigned(CPU_COUNT(&set));
        return std::max(1u, std::min(cpus, 16u));
    }();
    return n;
}

int launch(const Kernel& k, dim3 grid, dim3 block, unsigned dyn_smem, void** params, std::string* message) {
    Launch l;
    l.kernel = &k;
    l.params = params;
    l.grid = grid;
    l.block = block;
    l.dyn_smem = dyn_smem;
    l.schedule = schedule_for_caller();
    l.checks = checks_for_caller();
    l.shared_vars = shared_vars_of(k);
    static std::atomic<std::uint32_t> launches{0};
    l.stamp = ++launches;
    if (l.stamp == 0) l.stamp = ++launches;  // 0 is never a launch's
    kernels_running.store(true);
    l.n_blocks = std::uint64_t(grid.x) * grid.y * grid.z;
    if (l.schedule.order == Order::Random && l.n_blocks > 1) {
        // A seeded affine permutation of 0..n-1: a multiplier coprime with n.
        std::uint64_t a = l.schedule.seed % l.n_blocks;
        while (a == 0 || std::gcd(a, l.n_blocks) != 1) a = (a + 1) % l.n_blocks;
        l.perm_a = a;
        l.perm_c = (l.schedule.seed >> 17) % l.n_blocks;
    }
    pool().run(l);
    if (l.failed.load()) {
        *message = l.message;
        return l.code;
    }
    return 0;
}

}  // namespace coa_emu

// ---- the hooks -fsanitize=thread calls (kernels/*.cu only; no libtsan is linked) -------------------

#define COA_EMU_TSAN_HOOKS(n)                                                                                    \
    extern "C" void __tsan_read##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Read); }                    \
    extern "C" void __tsan_write##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Write); }                  \
    extern "C" void __tsan_unaligned_read##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Read); }          \
    extern "C" void __tsan_unaligned_write##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Write); }        \
    extern "C" void __tsan_volatile_read##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Read); }           \
    extern "C" void __tsan_volatile_write##n(void* p) { coa_emu::check(p, n, coa_emu::Access::Write); }
COA_EMU_TSAN_HOOKS(1)
COA_EMU_TSAN_HOOKS(2)
COA_EMU_TSAN_HOOKS(4)
COA_EMU_TSAN_HOOKS(8)
COA_EMU_TSAN_HOOKS(16)
extern "C" void __tsan_read_range(void* p, unsigned long n) { coa_emu::check(p, n, coa_emu::Access::Read); }
extern "C" void __tsan_write_range(void* p, unsigned long n) { coa_emu::check(p, n, coa_emu::Access::Write); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
