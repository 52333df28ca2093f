// cuda_emu's runtime: memory, streams and events, the kernel scheduler
// (fibers, barriers, warp operations) and the cuBLAS calls, on the CPU.
// See README.md for what it checks and what it cannot.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

std::mutex g_lock; // one kernel or runtime call at a time (shared memory is static)
cudaError_t g_last = cudaSuccess;
std::map<uintptr_t, size_t> g_mem; // device allocations: start -> bytes
size_t g_live = 0;

[[noreturn]] void die(const char *fmt, const char *a, const char *b = "") {
    std::fprintf(stderr, "cuda_emu: ");
    std::fprintf(stderr, fmt, a, b);
    std::fprintf(stderr, "\n");
    std::abort();
}

// The device allocation holding [p, p + n), or die: a copy or memset that
// leaves its allocation is what compute-sanitizer would report.
void check_range(const void *p, size_t n, const char *what) {
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

// ---- the kernel scheduler ----
enum fstate { F_RUN, F_BAR, F_WARP, F_DONE };
struct fiber {
    ucontext_t ctx;
    fstate st;
    dim3 tid;
    unsigned mask;
    uint64_t offer, result;
    int src;
};
const size_t STACK = 256 * 1024;
std::vector<fiber> g_fib;
std::vector<char *> g_stacks;
ucontext_t g_sched;
int g_cur;
const std::function<void()> *g_body;
const char *g_kernel;

void fiber_main() {
    (*g_body)();
    g_fib[g_cur].st = F_DONE; // uc_link returns to the scheduler
}

void yield_to_sched() {
    swapcontext(&g_fib[g_cur].ctx, &g_sched);
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
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks[i];
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &g_sched;
        makecontext(&f.ctx, fiber_main, 0);
    }
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (g_fib[i].st != F_RUN) continue;
            g_cur = i;
            threadIdx = g_fib[i].tid;
            swapcontext(&g_sched, &g_fib[i].ctx);
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
cudaError_t cudaDeviceSynchronize(void) {
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    std::lock_guard<std::mutex> g(g_lock);
    *tot = (size_t)16 << 30;
    *fr = *tot > g_live ? *tot - g_live : 0;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    void *m = std::malloc(bytes ? bytes : 1);
    if (!m) return cudaErrorMemoryAllocation;
    std::memset(m, 0xff, bytes); // garbage, as cudaMalloc's: NaN floats, -1 ints
    std::lock_guard<std::mutex> g(g_lock);
    g_mem[(uintptr_t)m] = bytes;
    g_live += bytes;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = std::malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
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
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    (void)kind;
    check_range(dst, bytes, "cudaMemcpy destination");
    check_range(src, bytes, "cudaMemcpy source");
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
    (void)kind;
    (void)s;
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) {
        check_range((char *)dst + r * dpitch, width, "cudaMemcpy2DAsync destination row");
        check_range((const char *)src + r * spitch, width, "cudaMemcpy2DAsync source row");
        std::memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    check_range(p, bytes, "cudaMemset");
    if (bytes) std::memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    (void)s;
    return cudaMemset(p, value, bytes);
}

struct cuemu_stream {
    unsigned flags;
};
struct cuemu_event {
    unsigned flags;
};
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new cuemu_stream{flags};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
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
    *e = new cuemu_event{flags};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    return e ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    return e ? cudaSuccess : cudaErrorInvalidValue;
}

size_t cuemu_live_bytes(void) {
    std::lock_guard<std::mutex> g(g_lock);
    return g_live;
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
    return gemm1(ta, tb, m, n, k, *(const float *)alpha, (const float *)A, lda, (const float *)B,
                 ldb, *(const float *)beta, (float *)C, ldc,
                 compute == CUBLAS_COMPUTE_32F_FAST_16BF);
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
    for (int b = 0; b < count; b++)
        gemm1(ta, tb, m, n, k, *(const float *)alpha, (const float *)A + b * sa, lda,
              (const float *)B + b * sb, ldb, *(const float *)beta, (float *)C + b * sc, ldc,
              compute == CUBLAS_COMPUTE_32F_FAST_16BF);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

// ---- NCCL, a world of one ----
#include <nccl.h>

#include <deque>
#include <string>

struct cuemu_nccl {
    struct pending {
        const void *buf;
        size_t count;
        ncclDataType_t type;
    };
    std::deque<pending> sends; // sends to oneself not yet received
    std::string last;
};

namespace {
int g_group = 0;                                                // ncclGroupStart depth
std::deque<std::pair<ncclComm_t, cuemu_nccl::pending>> g_recvs; // receives inside a group

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

ncclResult_t fail(ncclComm_t c, const char *why) {
    if (c) c->last = why;
    return ncclInvalidUsage;
}

ncclResult_t copy_op(ncclComm_t c, const void *send, void *recv, size_t count, ncclDataType_t t) {
    if (!c) return ncclInvalidArgument;
    if (count && (!send || !recv)) return fail(c, "NULL buffer");
    size_t n = count * type_size(t);
    check_range(send, n, "nccl send buffer");
    check_range(recv, n, "nccl receive buffer");
    if (n && send != recv) std::memmove(recv, send, n);
    return ncclSuccess;
}

ncclResult_t match(ncclComm_t c, void *recv, size_t count, ncclDataType_t t) {
    if (c->sends.empty()) return fail(c, "a receive from oneself with no send (would hang)");
    cuemu_nccl::pending s = c->sends.front();
    c->sends.pop_front();
    if (s.count != count || s.type != t)
        return fail(c, "a receive whose count or type differs from its send");
    return copy_op(c, s.buf, recv, count, t);
}
} // namespace

extern "C" {
const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : r == ncclInvalidUsage ? "invalid usage" : "error";
}
const char *ncclGetLastError(ncclComm_t comm) {
    return comm ? comm->last.c_str() : "";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    std::memset(id, 0, sizeof *id);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    (void)id;
    (void)config;
    if (nranks != 1 || rank != 0) return ncclInvalidArgument; // the emulator is one process
    *comm = new cuemu_nccl();
    return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    (void)key;
    (void)config;
    if (!comm) return ncclInvalidArgument;
    *newcomm = color == NCCL_SPLIT_NOCOLOR ? nullptr : new cuemu_nccl();
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    return comm->sends.empty() ? ncclSuccess : fail(comm, "finalized with a send never received");
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    delete comm;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    delete comm;
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    if (!comm) return ncclInvalidArgument;
    *state = ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    *count = 1;
    return comm ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    *rank = 0;
    return comm ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    (void)op;
    (void)s;
    return copy_op(comm, send, recv, count, t);
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    (void)op;
    (void)s;
    return copy_op(comm, send, recv, count, t);
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s) {
    (void)s;
    return copy_op(comm, send, recv, count, t);
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t s) {
    (void)s;
    if (root != 0) return fail(comm, "broadcast from a rank that does not exist");
    return copy_op(comm, send, recv, count, t);
}
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    (void)s;
    if (!comm) return ncclInvalidArgument;
    if (peer != 0) return fail(comm, "send to a rank that does not exist");
    comm->sends.push_back({send, count, t});
    return ncclSuccess;
}
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    (void)s;
    if (!comm) return ncclInvalidArgument;
    if (peer != 0) return fail(comm, "receive from a rank that does not exist");
    if (g_group) { // matched at ncclGroupEnd, when the group's sends are all posted
        g_recvs.push_back({comm, {recv, count, t}});
        return ncclSuccess;
    }
    return match(comm, recv, count, t);
}
ncclResult_t ncclGroupStart(void) {
    g_group++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (!g_group) return ncclInvalidUsage;
    if (--g_group) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    while (!g_recvs.empty()) {
        auto q = g_recvs.front();
        g_recvs.pop_front();
        ncclResult_t m = match(q.first, (void *)q.second.buf, q.second.count, q.second.type);
        if (m && !r) r = m;
    }
    return r;
}
} // extern "C"
