// spate_emu.h: the CUDA dialect of Spate's kernels, implemented for the host CPU.
//
// The emulated backend compiles the very same `.cu` sources that NVRTC compiles, as C++17,
// with this header included first. It exists so that every kernel runs in CI, where there is
// no GPU. It is built for fidelity, not speed:
//
// - Every CUDA thread of a block is a fiber with its own stack. All fibers of a block run on
//   one OS thread and are switched only at barriers (`__syncthreads`, warp operations), so a
//   kernel that relies on implicit warp lock-step, or forgets a barrier between a shared-memory
//   write and a read by another thread, computes a wrong answer here as it can on a GPU.
//   The scheduler alternates the order in which it resumes threads, so a race whose outcome
//   depends on thread order shows up in one direction or the other; with a seed (strict
//   mode, SPATE_EMU_STRICT) it resumes them in a random order at every barrier instead.
// - Blocks run concurrently on several OS threads (which the Rust runtime provides, see
//   `run_workers`), so global-memory atomics are real atomics. With a seed, blocks are taken
//   in a random order, so a kernel that assumes block i runs before block i + 1 fails.
// - Barrier misuse is an error, not a hang: a thread that exits while others wait at
//   `__syncthreads`, warp operations whose lanes disagree, and partial-mask warp operations
//   are reported with the kernel's name.
// - A fault (an out-of-bounds or freed address, caught by the runtime's guard pages) or the
//   runtime's watchdog stops the block through `abort_from_signal`, with a message.
//
// What kernels may use is documented in docs/dev/kernels.md ("The dialect"). This header is
// embedded into the Spate binary and also used to compile generated kernels at run time.

#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ---------------------------------------------------------------------------------------------
// Types and qualifiers

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
// The build script preprocesses every kernel once with SPATE_EMU_SCAN_BOUNDS to learn each
// entry's launch bounds, which the runtime then enforces at launch as a GPU does.
#if defined(SPATE_EMU_SCAN_BOUNDS)
#define __launch_bounds__(...) spate_emu_bounds_mark(__VA_ARGS__)
#else
#define __launch_bounds__(...)
#endif
#define __constant__
#define __align__(n) alignas(n)
// Shared memory is per block. All fibers of a block run on one OS thread and a worker runs one
// block at a time, so a thread-local static is exactly one copy per running block.
#define __shared__ static thread_local

// The launch record the Rust runtime passes (`LaunchArgs` in backend/emulated/grid.rs; keep
// the two in step).
extern "C" {
// 112 bytes on LP64; `LaunchArgs` in grid.rs asserts the same.
struct spate_emu_launch {
    unsigned dims[7];  // grid x y z, block x y z, dynamic shared memory bytes
    void** params;
    char* err;
    unsigned long errlen;
    unsigned long long seed;  // 0: deterministic order; else random block and thread order
    unsigned workers;
    void* runner;
    void (*run_workers)(void* runner, unsigned workers, void (*work)(void*), void* arg);
    void (*abort_block)(const char* message);  // filled in by run_grid
    // Fiber stacks from the process's pool, shared by every kernel module: `count` slots of
    // `guard` bytes (no access) then `stack` bytes; null when they cannot be mapped.
    void* (*acquire_stacks)(unsigned long count, unsigned long stack, unsigned long guard);
    void (*release_stacks)(void* base, unsigned long count, unsigned long stack, unsigned long guard);
};
}

namespace spate_emu {

// ---------------------------------------------------------------------------------------------
// Launch state

enum ThreadState : int { kRunnable, kWaitBlock, kWaitWarp, kDone };

struct Fiber {
    void* sp = nullptr;
    uint3 tid{0, 0, 0};
    unsigned linear = 0;
    ThreadState state = kRunnable;
};

// One pending warp operation: every lane deposits its operand, the last lane to arrive
// computes every lane's result.
struct Warp {
    unsigned arrived = 0;
    int op[32];
    int width[32];
    int arg[32];
    unsigned mask[32];
    unsigned long long value[32];
    unsigned long long result[32];
};

enum WarpOp : int { kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp };

struct Launch;

struct Block {
    const Launch* launch = nullptr;
    uint3 idx{0, 0, 0};
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    unsigned live = 0;
    unsigned barrier_arrived = 0;
    int barrier_count = 0;  // __syncthreads_count accumulator
    int barrier_result = 0;
    void* sched_sp = nullptr;
    unsigned char* dyn_shared = nullptr;
    bool failed = false;
    char error[512] = {0};
    std::vector<unsigned> order;  // resumption order of one round
};

struct Launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem_bytes;
    void (*invoke)(void**);
    void** params;
    const char* name;
    unsigned long long seed;
};

inline thread_local Block* tls_block = nullptr;
inline thread_local Fiber* tls_fiber = nullptr;
// True only while this thread executes a fiber (kernel code or the dialect's functions), where
// a signal handler may leave the fiber through abort_from_signal.
inline thread_local volatile sig_atomic_t tls_in_kernel = 0;
// An abort that arrived while the thread was in the scheduler, picked up at its next step
// (the message is copied: the signal handler's buffer is not ours to keep).
inline thread_local volatile sig_atomic_t tls_pending_abort = 0;
inline thread_local char tls_pending_message[512];

// splitmix64: the seeded random orders.
inline unsigned long long mix(unsigned long long& state) {
    unsigned long long z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------
// Context switching

constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kGuardBytes = 4096;

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *from and resumes the context whose stack pointer is `to`.
// `static` gives each translation unit its own copy, so the header stays self-contained.
__attribute__((naked, noinline)) static void switch_stack(void** /*from*/, void* /*to*/) {
    __asm__ volatile(
        "pushq %rbp\n\t"
        "pushq %rbx\n\t"
        "pushq %r12\n\t"
        "pushq %r13\n\t"
        "pushq %r14\n\t"
        "pushq %r15\n\t"
        "subq $8, %rsp\n\t"
        "stmxcsr (%rsp)\n\t"
        "fnstcw 4(%rsp)\n\t"
        "movq %rsp, (%rdi)\n\t"
        "movq %rsi, %rsp\n\t"
        "ldmxcsr (%rsp)\n\t"
        "fldcw 4(%rsp)\n\t"
        "addq $8, %rsp\n\t"
        "popq %r15\n\t"
        "popq %r14\n\t"
        "popq %r13\n\t"
        "popq %r12\n\t"
        "popq %rbx\n\t"
        "popq %rbp\n\t"
        "ret\n\t");
}
#endif

[[noreturn]] inline void fiber_main();

inline void to_scheduler() {
    tls_in_kernel = 0;
#if defined(__x86_64__)
    switch_stack(&tls_fiber->sp, tls_block->sched_sp);
#else
    swapcontext(static_cast<ucontext_t*>(tls_fiber->sp), static_cast<ucontext_t*>(tls_block->sched_sp));
#endif
    tls_in_kernel = 1;
}

// Records the first error of the block and leaves the fiber for good.
[[noreturn]] inline void fail(const char* fmt, const char* detail, unsigned a = 0, unsigned b = 0) {
    Block* blk = tls_block;
    if (!blk->failed) {
        blk->failed = true;
        std::snprintf(blk->error, sizeof(blk->error), fmt, detail, a, b);
    }
    tls_fiber->state = kDone;
    to_scheduler();
    __builtin_unreachable();
}

// Stacks for one block's fibers, with a guard page below each so an overflow faults instead of
// corrupting a neighbour. A worker leases them from the Rust runtime's pool for one launch: a
// pool kept per OS thread held two mappings per stack for every stream's thread that ever ran
// a kernel, and a query with scores of streams ran out of the kernel's limit on mappings
// (vm.max_map_count).
struct StackLease {
    unsigned char* base = nullptr;
    size_t count = 0;
    void (*release_fn)(void*, unsigned long, unsigned long, unsigned long) = nullptr;
#if !defined(__x86_64__)
    std::vector<ucontext_t> contexts;
#endif

    bool acquire(const spate_emu_launch* a, size_t n) {
        void* p = a->acquire_stacks(n, kStackBytes, kGuardBytes);
        if (p == nullptr) return false;
        base = static_cast<unsigned char*>(p);
        count = n;
        release_fn = a->release_stacks;
#if !defined(__x86_64__)
        contexts.resize(n);
#endif
        return true;
    }
    unsigned char* stack_top(size_t i) const { return base + (i + 1) * (kStackBytes + kGuardBytes); }
    ~StackLease() {
        if (base) release_fn(base, count, kStackBytes, kGuardBytes);
    }
};

// The lease of the launch this thread is running blocks for.
inline thread_local StackLease* tls_stacks = nullptr;

#if !defined(__x86_64__)
inline thread_local ucontext_t tls_sched_context;
#endif

inline void prepare_fiber(Fiber& f, size_t i) {
#if defined(__x86_64__)
    // Build the frame switch_stack pops: MXCSR/FPU word, six callee-saved registers, the entry
    // address `ret` jumps to, and a fake return address so the entry sees an ABI-aligned stack.
    uintptr_t top = reinterpret_cast<uintptr_t>(tls_stacks->stack_top(i)) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                                // fake return address of fiber_main
    *--sp = reinterpret_cast<uint64_t>(&fiber_main);          // popped by `ret`
    for (int r = 0; r < 6; ++r) *--sp = 0;                    // rbp rbx r12 r13 r14 r15
    uint32_t mxcsr;
    uint16_t fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    --sp;
    std::memcpy(reinterpret_cast<unsigned char*>(sp), &mxcsr, 4);
    std::memcpy(reinterpret_cast<unsigned char*>(sp) + 4, &fpucw, 2);
    f.sp = sp;
#else
    ucontext_t* ctx = &tls_stacks->contexts[i];
    getcontext(ctx);
    ctx->uc_stack.ss_sp = tls_stacks->stack_top(i) - kStackBytes;
    ctx->uc_stack.ss_size = kStackBytes;
    ctx->uc_link = nullptr;
    makecontext(ctx, reinterpret_cast<void (*)()>(&fiber_main), 0);
    f.sp = ctx;
#endif
}

inline void resume(Block& blk, Fiber& f) {
    tls_fiber = &f;
#if defined(__x86_64__)
    switch_stack(&blk.sched_sp, f.sp);
#else
    swapcontext(static_cast<ucontext_t*>(blk.sched_sp), static_cast<ucontext_t*>(f.sp));
#endif
    tls_fiber = nullptr;
}

[[noreturn]] inline void fiber_main() {
    tls_in_kernel = 1;
    Block* blk = tls_block;
    blk->launch->invoke(blk->launch->params);
    tls_fiber->state = kDone;
    blk->live--;
    to_scheduler();
    __builtin_unreachable();
}

// Runs one block to completion. Returns false (with blk.error set) on a kernel error.
inline bool run_block(Block& blk) {
    const Launch& l = *blk.launch;
    size_t n = size_t(l.block[0]) * l.block[1] * l.block[2];
    blk.fibers.assign(n, Fiber{});
    blk.warps.assign((n + 31) / 32, Warp{});
    blk.live = unsigned(n);
    blk.barrier_arrived = 0;
    blk.barrier_count = 0;
    for (size_t i = 0; i < n; ++i) {
        Fiber& f = blk.fibers[i];
        f.linear = unsigned(i);
        f.tid = uint3{unsigned(i % l.block[0]), unsigned((i / l.block[0]) % l.block[1]),
                      unsigned(i / (size_t(l.block[0]) * l.block[1]))};
        prepare_fiber(f, i);
    }
#if !defined(__x86_64__)
    blk.sched_sp = &tls_sched_context;
#endif
    tls_block = &blk;
    bool forward = true;
    // With a seed, every round resumes the runnable threads in a fresh random order.
    unsigned long long rng = l.seed ^ (0x632be59bd9b4e019ull * (1 + blk.idx.x + 65536ull * (blk.idx.y + 65536ull * blk.idx.z)));
    std::vector<unsigned>& order = blk.order;
    order.resize(n);
    for (size_t k = 0; k < n; ++k) order[k] = unsigned(k);
    while (blk.live > 0 && !blk.failed) {
        bool ran = false;
        if (l.seed != 0) {
            for (size_t k = n; k > 1; --k) std::swap(order[k - 1], order[mix(rng) % k]);
        }
        for (size_t k = 0; k < n && !blk.failed; ++k) {
            if (tls_pending_abort) {
                tls_pending_abort = 0;
                blk.failed = true;
                std::snprintf(blk.error, sizeof(blk.error), "%s", tls_pending_message);
                break;
            }
            size_t i = l.seed != 0 ? order[k] : (forward ? k : n - 1 - k);
            Fiber& f = blk.fibers[i];
            if (f.state == kRunnable) {
                resume(blk, f);
                ran = true;
            }
        }
        forward = !forward;
        if (!ran && blk.live > 0 && !blk.failed) {
            unsigned at_block = 0, at_warp = 0, done = 0;
            for (const Fiber& f : blk.fibers) {
                at_block += f.state == kWaitBlock;
                at_warp += f.state == kWaitWarp;
                done += f.state == kDone;
            }
            blk.failed = true;
            std::snprintf(blk.error, sizeof(blk.error),
                          "deadlock: %u thread(s) wait at __syncthreads and %u at a warp operation, "
                          "but %u thread(s) of the block already exited; every thread of a block "
                          "must reach every barrier, and all 32 lanes every warp operation",
                          at_block, at_warp, done);
        }
    }
    tls_block = nullptr;
    return !blk.failed;
}

// Called by the runtime's signal handlers (a fault, the watchdog). In kernel code it leaves the
// fiber for good with `message` as the block's error; anywhere else it leaves a note that the
// scheduler picks up at its next step, and returns.
inline void abort_from_signal(const char* message) {
    if (tls_in_kernel && tls_block != nullptr && tls_fiber != nullptr) {
        Block* blk = tls_block;
        if (!blk->failed) {
            blk->failed = true;
            std::snprintf(blk->error, sizeof(blk->error), "%s (thread (%u,%u,%u))", message,
                          tls_fiber->tid.x, tls_fiber->tid.y, tls_fiber->tid.z);
        }
        tls_fiber->state = kDone;
        to_scheduler();
        __builtin_unreachable();
    }
    if (!tls_pending_abort) {
        std::snprintf(tls_pending_message, sizeof(tls_pending_message), "%s", message);
        tls_pending_abort = 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Barriers and warp operations

inline int block_barrier(int predicate) {
    Block* blk = tls_block;
    Fiber* f = tls_fiber;
    blk->barrier_count += predicate != 0;
    if (++blk->barrier_arrived == blk->fibers.size()) {
        blk->barrier_result = blk->barrier_count;
        blk->barrier_count = 0;
        blk->barrier_arrived = 0;
        for (Fiber& o : blk->fibers)
            if (o.state == kWaitBlock) o.state = kRunnable;
        // Yield anyway so that the next phase starts in the scheduler's order, not this
        // thread's.
        to_scheduler();
    } else {
        f->state = kWaitBlock;
        to_scheduler();
    }
    return blk->barrier_result;
}

inline int src_lane(int op, int lane, int arg, int width) {
    int base = lane & ~(width - 1);
    switch (op) {
        case kShfl: return base + (arg & (width - 1));
        case kShflUp: return (lane - base) >= arg ? lane - arg : lane;
        case kShflDown: return (lane - base) + arg < width ? lane + arg : lane;
        case kShflXor: {
            int s = lane ^ arg;
            return (s & ~(width - 1)) == base ? s : lane;
        }
        default: return lane;
    }
}

inline void complete_warp(Warp& w) {
    for (int lane = 1; lane < 32; ++lane) {
        if (w.op[lane] != w.op[0] || w.width[lane] != w.width[0])
            fail("%s: divergent warp operations: lane %u called warp intrinsic #%u while lane 0 "
                 "called another; all 32 lanes must reach the same one",
                 tls_block->launch->name, unsigned(lane), unsigned(w.op[lane]));
    }
    int op = w.op[0];
    if (op == kBallot || op == kAny || op == kAll) {
        unsigned long long bits = 0;
        for (int lane = 0; lane < 32; ++lane)
            if (w.value[lane]) bits |= 1ull << lane;
        unsigned long long r = op == kBallot ? bits : op == kAny ? (bits != 0) : (bits == 0xffffffffull);
        for (int lane = 0; lane < 32; ++lane) w.result[lane] = r;
    } else if (op != kSyncWarp) {
        for (int lane = 0; lane < 32; ++lane) w.result[lane] = w.value[src_lane(op, lane, w.arg[lane], w.width[lane])];
    }
}

inline unsigned long long warp_exchange(int op, unsigned mask, unsigned long long value, int arg, int width) {
    Block* blk = tls_block;
    Fiber* f = tls_fiber;
    if (mask != 0xffffffffu)
        fail("%s: warp operation with mask 0x%x; the dialect supports only full-warp masks "
             "(0xffffffff)",
             blk->launch->name, mask);
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
        fail("%s: warp shuffle width %u is not a power of two up to 32", blk->launch->name, unsigned(width));
    Warp& w = blk->warps[f->linear / 32];
    unsigned lane = f->linear % 32;
    w.op[lane] = op;
    w.width[lane] = width;
    w.arg[lane] = arg;
    w.mask[lane] = mask;
    w.value[lane] = value;
    if (++w.arrived == 32) {
        w.arrived = 0;
        complete_warp(w);
        unsigned first = f->linear - lane;
        for (unsigned i = first; i < first + 32; ++i)
            if (blk->fibers[i].state == kWaitWarp) blk->fibers[i].state = kRunnable;
        to_scheduler();
    } else {
        f->state = kWaitWarp;
        to_scheduler();
    }
    return w.result[lane];
}

template <typename T>
inline unsigned long long to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T>
inline T from_bits(unsigned long long b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

// ---------------------------------------------------------------------------------------------
// Grid execution

template <typename... A, size_t... I>
inline void call_unpacked(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}

template <typename... A>
inline void call_with_params(void (*f)(A...), void** p) {
    call_unpacked(f, p, std::index_sequence_for<A...>{});
}

template <typename... A>
inline unsigned param_sizes(void (*)(A...), unsigned* sizes, unsigned max) {
    unsigned s[] = {unsigned(sizeof(A))..., 0u};
    unsigned n = unsigned(sizeof...(A));
    for (unsigned i = 0; i < n && i < max; ++i) sizes[i] = s[i];
    return n;
}

// What the workers of one grid share.
struct Grid {
    Launch launch{};
    const spate_emu_launch* args = nullptr;
    size_t threads = 0;
    size_t blocks = 0;
    std::vector<unsigned> order;  // with a seed: the order blocks are taken in
    unsigned long long stride = 1, start = 0;  // a seeded order for grids too large to list
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::atomic<bool> error_taken{false};
    char first_error[768] = {0};

    size_t block_at(size_t i) const {
        if (launch.seed == 0) return i;
        if (!order.empty()) return order[i];
        return size_t((start + stride * (unsigned long long)i) % blocks);
    }
};

inline void grid_worker(void* arg) {
    Grid& g = *static_cast<Grid*>(arg);
    const Launch& l = g.launch;
    // An abort left over from an earlier launch on this thread is not this one's.
    tls_pending_abort = 0;
    struct ClearOnExit {
        ~ClearOnExit() { tls_pending_abort = 0; }
    } clear_on_exit;
    StackLease stacks;
    if (!stacks.acquire(g.args, g.threads)) {
        if (!g.error_taken.exchange(true))
            std::snprintf(g.first_error, sizeof(g.first_error), "%s: could not map %zu fiber stacks", l.name,
                          g.threads);
        g.failed = true;
        return;
    }
    tls_stacks = &stacks;
    struct Unlease {
        ~Unlease() { tls_stacks = nullptr; }
    } unlease;
    std::vector<unsigned char> dyn(std::max<size_t>(l.shared_mem_bytes, 16) + 64);
    unsigned char* dyn_aligned =
        reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dyn.data()) + 63) & ~uintptr_t(63));
    Block blk;
    blk.launch = &l;
    blk.dyn_shared = dyn_aligned;
    for (;;) {
        if (g.failed.load(std::memory_order_relaxed)) return;
        size_t i = g.next.fetch_add(1);
        if (i >= g.blocks) return;
        size_t b = g.block_at(i);
        blk.idx = uint3{unsigned(b % l.grid[0]), unsigned((b / l.grid[0]) % l.grid[1]),
                        unsigned(b / (size_t(l.grid[0]) * l.grid[1]))};
        blk.failed = false;
        blk.error[0] = 0;
        // Shared memory starts as garbage on a GPU; make that visible to kernels that forget
        // to initialise the dynamic part.
        std::memset(blk.dyn_shared, 0xcd, l.shared_mem_bytes);
        if (!run_block(blk)) {
            if (!g.error_taken.exchange(true))
                std::snprintf(g.first_error, sizeof(g.first_error), "block (%u,%u,%u): %s", blk.idx.x, blk.idx.y,
                              blk.idx.z, blk.error);
            g.failed = true;
            return;
        }
    }
}

inline unsigned long long gcd(unsigned long long a, unsigned long long b) {
    while (b) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// Runs a whole grid. Returns 0 on success; otherwise writes the first error to `a->err`.
inline int run_grid(spate_emu_launch* a, void (*invoke)(void**), const char* name) {
    Grid g;
    Launch& l = g.launch;
    for (int i = 0; i < 3; ++i) {
        l.grid[i] = a->dims[i];
        l.block[i] = a->dims[3 + i];
    }
    l.shared_mem_bytes = a->dims[6];
    l.invoke = invoke;
    l.params = a->params;
    l.name = name;
    l.seed = a->seed;
    g.args = a;
    g.threads = size_t(l.block[0]) * l.block[1] * l.block[2];
    g.blocks = size_t(l.grid[0]) * l.grid[1] * l.grid[2];
    if (g.threads == 0 || g.threads > 1024 || g.threads % 32 != 0) {
        std::snprintf(a->err, a->errlen, "%s: block of %zu threads; the dialect needs 32 to 1024 threads, a multiple of 32",
                      name, g.threads);
        return 1;
    }
    if (g.blocks == 0) return 0;
    if (l.seed != 0) {
        unsigned long long rng = l.seed;
        if (g.blocks <= (size_t(1) << 20)) {
            g.order.resize(g.blocks);
            for (size_t i = 0; i < g.blocks; ++i) g.order[i] = unsigned(i);
            for (size_t k = g.blocks; k > 1; --k) std::swap(g.order[k - 1], g.order[mix(rng) % k]);
        } else {
            g.start = mix(rng) % g.blocks;
            do g.stride = 1 + mix(rng) % g.blocks;
            while (gcd(g.stride, g.blocks) != 1);
        }
    }
    a->abort_block = &abort_from_signal;
    unsigned workers = unsigned(std::min<size_t>(std::max(1u, a->workers), g.blocks));
    a->run_workers(a->runner, workers, &grid_worker, &g);
    if (g.failed) {
        std::snprintf(a->err, a->errlen, "%s", g.first_error);
        return 1;
    }
    return 0;
}

static_assert(sizeof(spate_emu_launch) == 112 && offsetof(spate_emu_launch, abort_block) == 88,
              "spate_emu_launch must match LaunchArgs in kernels/src/backend/emulated/grid.rs");

}  // namespace spate_emu

// ---------------------------------------------------------------------------------------------
// The CUDA built-ins

#define threadIdx (::spate_emu::tls_fiber->tid)
#define blockIdx (::spate_emu::tls_block->idx)
#define blockDim (*reinterpret_cast<const dim3*>(::spate_emu::tls_block->launch->block))
#define gridDim (*reinterpret_cast<const dim3*>(::spate_emu::tls_block->launch->grid))
#define warpSize 32

static_assert(sizeof(dim3) == 3 * sizeof(unsigned), "dim3 must alias unsigned[3]");

// Dynamic shared memory: `SPATE_DYNAMIC_SHARED(T, name)` declares `T* name`.
#define SPATE_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::spate_emu::tls_block->dyn_shared)

inline void __syncthreads() { ::spate_emu::block_barrier(0); }
inline int __syncthreads_count(int p) { return ::spate_emu::block_barrier(p); }
inline int __syncthreads_or(int p) { return ::spate_emu::block_barrier(p) != 0; }
inline int __syncthreads_and(int p) { return ::spate_emu::block_barrier(p) == int(blockDim.x * blockDim.y * blockDim.z); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::spate_emu::warp_exchange(::spate_emu::kSyncWarp, mask, 0, 0, 32); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { ::spate_emu::fail("%s: __trap() called", ::spate_emu::tls_block->launch->name); }

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ::spate_emu::from_bits<T>(::spate_emu::warp_exchange(::spate_emu::kShfl, mask, ::spate_emu::to_bits(v), src, width));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::spate_emu::from_bits<T>(::spate_emu::warp_exchange(::spate_emu::kShflUp, mask, ::spate_emu::to_bits(v), int(delta), width));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::spate_emu::from_bits<T>(::spate_emu::warp_exchange(::spate_emu::kShflDown, mask, ::spate_emu::to_bits(v), int(delta), width));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::spate_emu::from_bits<T>(::spate_emu::warp_exchange(::spate_emu::kShflXor, mask, ::spate_emu::to_bits(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int p) {
    return unsigned(::spate_emu::warp_exchange(::spate_emu::kBallot, mask, p != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int p) { return int(::spate_emu::warp_exchange(::spate_emu::kAny, mask, p != 0, 0, 32)); }
inline int __all_sync(unsigned mask, int p) { return int(::spate_emu::warp_exchange(::spate_emu::kAll, mask, p != 0, 0, 32)); }

// Atomics: blocks run on several OS threads, so these are real atomic operations.
template <typename T>
inline T spate_emu_atomic_rmw_cas(T* addr, T (*f)(T, T), T v) {
    T old;
    __atomic_load(addr, &old, __ATOMIC_RELAXED);
    for (;;) {
        T desired = f(old, v);
        if (__atomic_compare_exchange(addr, &old, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return old;
    }
}

#define SPATE_EMU_INT_ATOMICS(T)                                                                             \
    inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }                       \
    inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }                   \
    inline T atomicMin(T* a, T v) {                                                                          \
        return spate_emu_atomic_rmw_cas<T>(a, [](T x, T y) { return y < x ? y : x; }, v);                    \
    }                                                                                                        \
    inline T atomicMax(T* a, T v) {                                                                          \
        return spate_emu_atomic_rmw_cas<T>(a, [](T x, T y) { return y > x ? y : x; }, v);                    \
    }                                                                                                        \
    inline T atomicCAS(T* a, T compare, T v) {                                                               \
        __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
        return compare;                                                                                      \
    }

SPATE_EMU_INT_ATOMICS(int)
SPATE_EMU_INT_ATOMICS(unsigned int)
SPATE_EMU_INT_ATOMICS(long long)
SPATE_EMU_INT_ATOMICS(unsigned long long)
#undef SPATE_EMU_INT_ATOMICS

inline float atomicAdd(float* a, float v) {
    return spate_emu_atomic_rmw_cas<float>(a, [](float x, float y) { return x + y; }, v);
}
inline double atomicAdd(double* a, double v) {
    return spate_emu_atomic_rmw_cas<double>(a, [](double x, double y) { return x + y; }, v);
}
inline float atomicExch(float* a, float v) {
    float old;
    __atomic_exchange(a, &v, &old, __ATOMIC_SEQ_CST);
    return old;
}

// Bit tricks and reinterpretation.
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((unsigned long long)a * b >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
template <typename T>
inline T __ldg(const T* p) { return *p; }

// CUDA device code has global min/max overloads for arithmetic types.
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
inline T max(T a, T b) { return a < b ? b : a; }

// Exports a kernel to the emulated backend. Under NVRTC the prelude defines it as nothing.
// It generates the two C entry points the Rust launcher calls: one runs the grid with the
// packed parameters, the other reports the parameter sizes so every launch is checked.
#define SPATE_EXPORT(name)                                                                              \
    extern "C" int spate_emu_launch_##name(::spate_emu_launch* launch) {                                  \
        return ::spate_emu::run_grid(                                                                     \
            launch, [](void** p) { ::spate_emu::call_with_params(name, p); }, #name);                     \
    }                                                                                                     \
    extern "C" unsigned spate_emu_params_##name(unsigned* sizes, unsigned max) {                          \
        return ::spate_emu::param_sizes(name, sizes, max);                                                \
    }
