// cuda_emu's runtime: memory, streams and events, the kernel scheduler
// (fibers, barriers, warp operations) and the cuBLAS calls, on the CPU.
// See README.md for what it checks and what it cannot.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuemu_int.h"

#include <algorithm>
#include <atomic>
#include <execinfo.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

// Fibers switch by a few instructions of our own on x86-64 (glibc's
// swapcontext makes a sigprocmask system call at every switch, and a block
// switches at each barrier and warp operation of each thread); under
// AddressSanitizer, which follows stacks through swapcontext only, and on
// other machines, by ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASM_SWITCH 1
// Saves the callee-saved registers, MXCSR and the x87 control word on the
// current stack, stores the stack pointer in *save and resumes the stack at
// next (whose top holds the same, then a return address).
extern "C" void cuemu_switch(void **save, void *next);
asm(R"(
    .text
    .globl cuemu_switch
    .type cuemu_switch, @function
cuemu_switch:
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
    .size cuemu_switch, .-cuemu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

std::mutex g_lock; // one kernel or runtime call at a time (shared memory is static)
cudaError_t g_last = cudaSuccess;
std::map<uintptr_t, size_t> g_mem; // device allocations: start -> bytes
size_t g_live = 0, g_peak = 0; // bytes allocated now, and at most
std::atomic<uint64_t> g_waits{0}; // cuemu_host_waits
std::atomic<uint64_t> g_ops{0};   // cuemu_device_ops
std::mutex g_ops_lock;            // g_by_name
std::map<std::string, uint64_t> g_by_name;

// CUEMU_STATS=1: the counts of host waits and device operations, and the
// peak of cudaMalloc's live bytes, printed as the process ends;
// CUEMU_STATS=trace: also the return addresses of the calls behind each
// wait (for addr2line), as it happens; CUEMU_STATS=ops: also the operations
// by name, most first. CUEMU_TRACE_OP=NAME prints the return addresses
// behind each operation of that name (a kernel's, or cudaMemcpyAsync,
// cublasGemmEx, ...).
struct stats_at_exit {
    ~stats_at_exit() {
        const char *e = std::getenv("CUEMU_STATS");
        if (!e) return;
        std::fprintf(stderr, "cuda_emu: %llu host waits, %llu device operations\n",
                     (unsigned long long)g_waits.load(), (unsigned long long)g_ops.load());
        std::fprintf(stderr, "cuda_emu: %zu bytes of device memory at the peak\n", g_peak);
        std::vector<std::pair<uint64_t, std::string>> v;
        for (auto &kv : g_by_name)
            v.push_back({kv.second, kv.first});
        std::sort(v.begin(), v.end(), [](auto &a, auto &b) { return a.first > b.first; });
        for (auto &p : v)
            std::fprintf(stderr, "cuda_emu: %10llu %s\n", (unsigned long long)p.first,
                         p.second.c_str());
    }
} g_stats_at_exit;

// One operation queued for the device (a kernel, a cuBLAS call, an
// asynchronous copy or memset): each is a host API call and a command in a
// GPU's stream, whatever its size.
void note_op(const char *name) {
    g_ops++;
    const char *e = std::getenv("CUEMU_STATS");
    if (e && !std::strcmp(e, "ops")) {
        std::lock_guard<std::mutex> g(g_ops_lock);
        g_by_name[name]++;
    }
    const char *t = std::getenv("CUEMU_TRACE_OP"); // the callers of one operation
    if (t && !std::strcmp(t, name)) {
        void *pc[8];
        int n = backtrace(pc, 8);
        backtrace_symbols_fd(pc + 1, n - 1, 2);
        std::fprintf(stderr, "--\n");
    }
}

void note_wait() {
    g_waits++;
    const char *e = std::getenv("CUEMU_STATS");
    if (e && !std::strcmp(e, "trace")) {
        void *pc[8];
        int n = backtrace(pc, 8);
        backtrace_symbols_fd(pc + 1, n - 1, 2);
        std::fprintf(stderr, "--\n");
    }
}

[[noreturn]] void die(const char *fmt, const char *a, const char *b = "") {
    std::fprintf(stderr, "cuda_emu: ");
    std::fprintf(stderr, fmt, a, b);
    std::fprintf(stderr, "\n");
    std::abort();
}

// ---- the kernel scheduler ----
enum fstate { F_RUN, F_BAR, F_WARP, F_DONE };
struct fiber {
#ifdef CUEMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    fstate st;
    dim3 tid;
    unsigned mask;
    uint64_t offer, result;
    int src;
};
const size_t STACK = 256 * 1024;
std::vector<fiber> g_fib;
std::vector<char *> g_stacks;
#ifdef CUEMU_ASM_SWITCH
void *g_sched_sp;
#else
ucontext_t g_sched;
#endif
int g_cur;
const std::function<void()> *g_body;
const char *g_kernel;

void fiber_main() {
    (*g_body)();
    g_fib[g_cur].st = F_DONE;
#ifdef CUEMU_ASM_SWITCH
    void *dead;
    cuemu_switch(&dead, g_sched_sp); // never resumed
    __builtin_unreachable();
#endif
    // ucontext: uc_link returns to the scheduler
}

void yield_to_sched() {
#ifdef CUEMU_ASM_SWITCH
    cuemu_switch(&g_fib[g_cur].sp, g_sched_sp);
#else
    swapcontext(&g_fib[g_cur].ctx, &g_sched);
#endif
}

// Thread i's fiber, ready to start fiber_main on stack st.
void fiber_start(fiber &f, char *st) {
#ifdef CUEMU_ASM_SWITCH
    // what cuemu_switch pops: control words, r15, r14, r13, r12, rbx, rbp, then
    // the return address; fiber_main is entered with rsp = 8 mod 16, as after a call
    uintptr_t top = ((uintptr_t)st + STACK) & ~(uintptr_t)15;
    uint64_t *p = (uint64_t *)(top - 8 - 8 * 8);
    uint32_t mxcsr = 0x1f80;
    uint16_t fpucw = 0x037f;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    p[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
    for (int k = 1; k <= 6; k++)
        p[k] = 0;
    p[7] = (uint64_t)(uintptr_t)fiber_main;
    f.sp = p;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = st;
    f.ctx.uc_stack.ss_size = STACK;
    f.ctx.uc_link = &g_sched;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

const char *state_name(fstate s) {
    return s == F_RUN    ? "running"
           : s == F_BAR  ? "__syncthreads"
           : s == F_WARP ? "warp op"
                         : "exited";
}

[[noreturn]] void block_error(const char *why, int n) {
    std::fprintf(stderr, "cuda_emu: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads: %s\n",
                 g_kernel, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, n,
                 why);
    for (int i = 0; i < n; i++)
        if (i < 64 || g_fib[i].st == F_WARP)
            std::fprintf(stderr, "  thread %d: %s (mask %08x)\n", i, state_name(g_fib[i].st),
                         g_fib[i].mask);
    std::abort();
}

void run_block(int n) {
    while ((int)g_fib.size() < n) {
        g_fib.emplace_back();
        char *st = (char *)mmap(nullptr, STACK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (st == MAP_FAILED) die("%s%s", "no memory for a fiber stack", "");
        g_stacks.push_back(st);
    }
    for (int i = 0; i < n; i++) {
        fiber &f = g_fib[i];
        f.st = F_RUN;
        f.mask = 0;
        f.tid = dim3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
        fiber_start(f, g_stacks[i]);
    }
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (g_fib[i].st != F_RUN) continue;
            g_cur = i;
            threadIdx = g_fib[i].tid;
#ifdef CUEMU_ASM_SWITCH
            cuemu_switch(&g_sched_sp, g_fib[i].sp);
#else
            swapcontext(&g_sched, &g_fib[i].ctx);
#endif
        }
        // every thread now waits at a barrier or has exited
        int live = 0, at_bar = 0;
        bool resolved = false;
        for (int w = 0; w * 32 < n; w++) {
            int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
            for (int i = lo; i < hi; i++) {
                if (g_fib[i].st != F_WARP) continue;
                unsigned m = g_fib[i].mask;
                bool ready = true;
                for (int l = 0; l < 32; l++) {
                    if (!(m >> l & 1u)) continue;
                    if (lo + l >= n)
                        block_error("a warp operation names a lane past the block's last thread",
                                    n);
                    fstate s = g_fib[lo + l].st;
                    if (s == F_DONE)
                        block_error("a warp operation waits for a lane that has exited", n);
                    if (s == F_BAR)
                        block_error("a warp operation waits for a lane at __syncthreads", n);
                    if (g_fib[lo + l].mask != m)
                        block_error("lanes of one warp operation name different masks", n);
                }
                if (!ready) continue;
                for (int l = 0; l < 32; l++) {
                    if (!(m >> l & 1u)) continue;
                    fiber &f = g_fib[lo + l];
                    f.result = f.src >= 0 ? g_fib[lo + f.src].offer : 0;
                    f.st = F_RUN;
                    f.mask = 0;
                }
                resolved = true;
            }
        }
        for (int i = 0; i < n; i++) {
            live += g_fib[i].st != F_DONE;
            at_bar += g_fib[i].st == F_BAR;
        }
        if (!live) return;
        if (resolved) continue;
        if (at_bar == live) {
            for (int i = 0; i < n; i++)
                if (g_fib[i].st == F_BAR) g_fib[i].st = F_RUN;
            continue;
        }
        block_error("deadlock: no thread can go on", n);
    }
}

} // namespace

// The device allocation holding [p, p + n), or die: a copy or memset that
// leaves its allocation is what compute-sanitizer would report.
void cuemu_check_range(const void *p, size_t n, const char *what) {
    if (!n || !p) return;
    uintptr_t a = (uintptr_t)p;
    std::lock_guard<std::mutex> g(g_lock);
    auto it = g_mem.upper_bound(a);
    if (it == g_mem.begin()) return; // not device memory: host (pinned or not)
    --it;
    if (a >= it->first + it->second) return; // host memory
    if (a + n > it->first + it->second) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%zu bytes at offset %zu of a %zu-byte allocation", n,
                      (size_t)(a - it->first), it->second);
        die("%s: %s", what, buf);
    }
}

namespace cuemu {

int lane() {
    return g_cur % 32;
}

void syncthreads() {
    g_fib[g_cur].st = F_BAR;
    yield_to_sched();
}

uint64_t warp_op(unsigned mask, uint64_t offer, int src) {
    fiber &f = g_fib[g_cur];
    if (!(mask >> (g_cur % 32) & 1u))
        die("kernel %s: %s", g_kernel, "a warp operation whose mask leaves out the calling lane");
    f.st = F_WARP;
    f.mask = mask;
    f.offer = offer;
    f.src = src;
    yield_to_sched();
    return g_fib[g_cur].result;
}

void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
            const std::function<void()> &body) {
    (void)s;
    std::lock_guard<std::mutex> g(g_lock);
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.z > 64 || !grid.x || !grid.y || !grid.z ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 || shmem > 48 * 1024) {
        std::fprintf(stderr,
                     "cuda_emu: kernel %s: invalid launch configuration: grid (%u,%u,%u), block "
                     "(%u,%u,%u), %zu bytes of dynamic shared memory\n",
                     name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem);
        g_last = cudaErrorInvalidConfiguration;
        return;
    }
    note_op(name);
    g_kernel = name;
    g_body = &body;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                run_block((int)threads);
            }
}

} // namespace cuemu

// ---- the runtime API ----
extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
        return "device not ready";
    default:
        return "unknown error";
    }
}
cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::mutex> g(g_lock);
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    return g_last;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    std::lock_guard<std::mutex> g(g_lock);
    *tot = (size_t)16 << 30;
    *fr = *tot > g_live ? *tot - g_live : 0;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    void *m = nullptr; // 256-byte aligned, as cudaMalloc's (wmma tiles need 32)
    if (posix_memalign(&m, 256, bytes ? bytes : 1)) return cudaErrorMemoryAllocation;
    std::memset(m, 0xff, bytes); // garbage, as cudaMalloc's: NaN floats, -1 ints
    std::lock_guard<std::mutex> g(g_lock);
    g_mem[(uintptr_t)m] = bytes;
    g_live += bytes;
    if (g_live > g_peak) g_peak = g_live;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = std::malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    note_wait();
    std::lock_guard<std::mutex> g(g_lock);
    auto it = g_mem.find((uintptr_t)p);
    if (it == g_mem.end()) return cudaErrorInvalidValue;
    g_live -= it->second;
    g_mem.erase(it);
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    std::free(p);
    return cudaSuccess;
}
static cudaError_t copy(void *dst, const void *src, size_t bytes, const char *to,
                        const char *from) {
    cuemu_check_range(dst, bytes, to);
    cuemu_check_range(src, bytes, from);
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    (void)kind;
    note_wait();
    return copy(dst, src, bytes, "cudaMemcpy destination", "cudaMemcpy source");
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
    (void)kind;
    (void)s;
    note_op("cudaMemcpyAsync");
    return copy(dst, src, bytes, "cudaMemcpyAsync destination", "cudaMemcpyAsync source");
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
    (void)kind;
    (void)s;
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    note_op("cudaMemcpy2DAsync");
    for (size_t r = 0; r < height; r++) {
        cuemu_check_range((char *)dst + r * dpitch, width, "cudaMemcpy2DAsync destination row");
        cuemu_check_range((const char *)src + r * spitch, width, "cudaMemcpy2DAsync source row");
        std::memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    cuemu_check_range(p, bytes, "cudaMemset");
    if (bytes) std::memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    (void)s;
    note_op("cudaMemsetAsync");
    return cudaMemset(p, value, bytes);
}

struct cuemu_stream {
    unsigned flags;
};
// An event is the NCCL work queued on its stream when it was recorded
// (kernels and copies complete at their call; collectives may not).
struct cuemu_event {
    unsigned flags;
    cudaStream_t stream;
    uint64_t upto;
};
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new cuemu_stream{flags};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    cuemu_nccl_wait(s, UINT64_MAX, true);
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    note_wait();
    cuemu_nccl_wait(s, UINT64_MAX, true);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    note_wait();
    cuemu_nccl_wait(nullptr, UINT64_MAX, true);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)s;
    (void)flags;
    return e ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, 0);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new cuemu_event{flags, nullptr, 0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidValue;
    e->stream = s;
    e->upto = cuemu_nccl_issued(s);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidValue;
    return cuemu_nccl_wait(e->stream, e->upto, false) ? cudaSuccess : cudaErrorNotReady;
}

size_t cuemu_live_bytes(void) {
    std::lock_guard<std::mutex> g(g_lock);
    return g_live;
}
uint64_t cuemu_host_waits(void) {
    return g_waits.load();
}
uint64_t cuemu_device_ops(void) {
    return g_ops.load();
}

// ---- cuBLAS ----
struct cuemu_blas {
    cudaStream_t stream;
    cublasMath_t math;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new cuemu_blas{nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}

static float bf16_round(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) { // inf, nan
        if (u & 0x7fffffu) u |= 0x400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
    }
    u &= 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

cublasStatus_t cublasSgemv(cublasHandle_t h, cublasOperation_t t, int m, int n, const float *alpha,
                           const float *A, int lda, const float *x, int incx, const float *beta,
                           float *y, int incy) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || lda < (m > 1 ? m : 1) || !incx || !incy)
        return CUBLAS_STATUS_INVALID_VALUE;
    note_op("cublasSgemv");
    int ny = t == CUBLAS_OP_N ? m : n, nx = t == CUBLAS_OP_N ? n : m;
    for (int i = 0; i < ny; i++) {
        double s = 0;
        for (int j = 0; j < nx; j++) {
            float a =
                t == CUBLAS_OP_N ? A[(size_t)i + (size_t)j * lda] : A[(size_t)j + (size_t)i * lda];
            s += (double)a * x[(long)j * incx];
        }
        float *yi = &y[(long)i * incy];
        *yi = *beta == 0.0f ? (float)(*alpha * s) : (float)(*alpha * s + (double)*beta * *yi);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm1(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc, bool bf16) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? A[(size_t)i + (size_t)p * lda]
                                            : A[(size_t)p + (size_t)i * lda];
                float b = tb == CUBLAS_OP_N ? B[(size_t)p + (size_t)j * ldb]
                                            : B[(size_t)j + (size_t)p * ldb];
                if (bf16) {
                    a = bf16_round(a);
                    b = bf16_round(b);
                }
                s += (double)a * b;
            }
            float *c = &C[(size_t)i + (size_t)j * ldc];
            // beta 0: C is not read (it may hold NaN), as cuBLAS documents
            *c = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + (double)beta * *c);
        }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm_check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                 int m, int n, int k, int lda, int ldb, int ldc, cudaDataType_t at,
                                 cudaDataType_t bt, cudaDataType_t ct,
                                 cublasComputeType_t compute) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
        compute != CUBLAS_COMPUTE_32F_FAST_16BF && compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    cublasStatus_t st = gemm_check(h, ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, compute);
    if (st) return st;
    note_op("cublasGemmEx");
    return gemm1(ta, tb, m, n, k, *(const float *)alpha, (const float *)A, lda, (const float *)B,
                 ldb, *(const float *)beta, (float *)C, ldc,
                 compute == CUBLAS_COMPUTE_32F_FAST_16BF);
}

// cuBLAS reads a batched product's pointer arrays on the device: one that is
// not inside a device allocation (a host array) stops the program, as a
// GPU would fault on it.
static void check_device_array(const void *p, int count, const char *what) {
    uintptr_t a = (uintptr_t)p;
    {
        std::lock_guard<std::mutex> g(g_lock);
        auto it = g_mem.upper_bound(a);
        if (it == g_mem.begin() || a >= std::prev(it)->first + std::prev(it)->second)
            die("%s: %s", what, "not device memory (cuBLAS reads the pointer arrays on the GPU)");
    }
    cuemu_check_range(p, (size_t)count * sizeof(void *), what);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha, const void *const A[],
                                   cudaDataType at, int lda, const void *const B[], cudaDataType bt,
                                   int ldb, const void *beta, void *const C[], cudaDataType ct,
                                   int ldc, int count, cublasComputeType_t compute,
                                   cublasGemmAlgo_t algo) {
    (void)algo;
    cublasStatus_t st = gemm_check(h, ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, compute);
    if (st) return st;
    if (count < 0 || (count > 0 && (!A || !B || !C))) return CUBLAS_STATUS_INVALID_VALUE;
    if (count > 0) {
        check_device_array(A, count, "cublasGemmBatchedEx: the A pointers");
        check_device_array(B, count, "cublasGemmBatchedEx: the B pointers");
        check_device_array(C, count, "cublasGemmBatchedEx: the C pointers");
    }
    note_op("cublasGemmBatchedEx");
    for (int b = 0; b < count; b++)
        gemm1(ta, tb, m, n, k, *(const float *)alpha, (const float *)A[b], lda, (const float *)B[b],
              ldb, *(const float *)beta, (float *)C[b], ldc,
              compute == CUBLAS_COMPUTE_32F_FAST_16BF);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType_t at,
                                          int lda, long long sa, const void *B, cudaDataType_t bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, long long sc, int count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    cublasStatus_t st = gemm_check(h, ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, compute);
    if (st) return st;
    if (count < 0) return CUBLAS_STATUS_INVALID_VALUE;
    note_op("cublasGemmStridedBatchedEx");
    for (int b = 0; b < count; b++)
        gemm1(ta, tb, m, n, k, *(const float *)alpha, (const float *)A + b * sa, lda,
              (const float *)B + b * sb, ldb, *(const float *)beta, (float *)C + b * sc, ldc,
              compute == CUBLAS_COMPUTE_32F_FAST_16BF);
    return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt: the descriptors keep what is set; the product is gemm1's ----
static std::atomic<int> g_lt_refuse{0}; // cuemu_lt_refuse: 1 pedantic, 2 every compute type
void cuemu_lt_refuse(int pedantic, int all) {
    g_lt_refuse = all ? 2 : pedantic ? 1 : 0;
}
struct cuemu_lt {
    int unused;
};
struct cuemu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epilogue;
    const float *bias;
};
struct cuemu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cuemu_lt_pref {
    uint64_t workspace;
    uint32_t align[4];
};
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new cuemu_lt{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    *d = new cuemu_lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                           nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
// buf holds size bytes for attr: INVALID_VALUE when size is not the attribute's
} // extern "C"
template <class T> static cublasStatus_t lt_set(T *dst, const void *buf, size_t size) {
    if (!buf || size != sizeof *dst) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(dst, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" {
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return lt_set(&d->ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return lt_set(&d->tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        return lt_set(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return lt_set(&d->bias, buf, size);
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    *l = nullptr;
    if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cuemu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new cuemu_lt_pref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    if (!p) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return lt_set(&p->workspace, buf, size);
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        return lt_set(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
    return CUBLAS_STATUS_INVALID_VALUE;
}
// The product's m, n, k from the layouts, or INVALID_VALUE when they do not fit together.
static cublasStatus_t lt_shape(const cuemu_lt_desc *d, const cuemu_lt_layout *a,
                               const cuemu_lt_layout *b, const cuemu_lt_layout *c,
                               const cuemu_lt_layout *dl, int *m, int *n, int *k) {
    if (!d || !a || !b || !c || !dl) return CUBLAS_STATUS_NOT_INITIALIZED;
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols,
             ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols,
             bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (ak != bk || c->rows != am || c->cols != bn || dl->rows != am || dl->cols != bn ||
        am > INT32_MAX || bn > INT32_MAX || ak > INT32_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    *m = (int)am, *n = (int)bn, *k = (int)ak;
    return CUBLAS_STATUS_SUCCESS;
}
static bool lt_types_ok(const cuemu_lt_desc *d, const cuemu_lt_layout *a, const cuemu_lt_layout *b,
                        const cuemu_lt_layout *c, const cuemu_lt_layout *dl) {
    return d->scale == CUDA_R_32F && a->type == CUDA_R_32F && b->type == CUDA_R_32F &&
           c->type == CUDA_R_32F && dl->type == CUDA_R_32F &&
           (d->compute == CUBLAS_COMPUTE_32F || d->compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
            d->compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
            d->compute == CUBLAS_COMPUTE_32F_FAST_TF32) &&
           (d->epilogue == CUBLASLT_EPILOGUE_DEFAULT || d->epilogue == CUBLASLT_EPILOGUE_BIAS);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned) {
    *returned = 0;
    if (!h || !p) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested <= 0) return CUBLAS_STATUS_INVALID_VALUE;
    int m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dl, &m, &n, &k);
    if (st) return st;
    if (!lt_types_ok(d, a, b, c, dl) || g_lt_refuse == 2 ||
        (g_lt_refuse == 1 && d->compute == CUBLAS_COMPUTE_32F_PEDANTIC))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].algo.data[0] = 1; // the one algorithm: gemm1
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace, (void)workspace_bytes, (void)stream;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    int m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dl, &m, &n, &k);
    if (st) return st;
    if (!lt_types_ok(d, a, b, c, dl)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!algo || algo->data[0] != 1 || (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias))
        return CUBLAS_STATUS_INVALID_VALUE;
    note_op("cublasLtMatmul");
    float al = *(const float *)alpha, be = *(const float *)beta;
    const float *Af = (const float *)A, *Bf = (const float *)B, *Cf = (const float *)C;
    float *Df = (float *)D;
    bool bf16 = d->compute == CUBLAS_COMPUTE_32F_FAST_16BF;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int q = 0; q < k; q++) {
                float x = d->ta == CUBLAS_OP_N ? Af[(size_t)i + (size_t)q * a->ld]
                                               : Af[(size_t)q + (size_t)i * a->ld];
                float y = d->tb == CUBLAS_OP_N ? Bf[(size_t)q + (size_t)j * b->ld]
                                               : Bf[(size_t)j + (size_t)q * b->ld];
                if (bf16) x = bf16_round(x), y = bf16_round(y);
                s += (double)x * y;
            }
            double r = al * s;
            if (be != 0.0f) r += (double)be * Cf[(size_t)i + (size_t)j * c->ld];
            if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) r += d->bias[i];
            Df[(size_t)i + (size_t)j * dl->ld] = (float)r;
        }
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
