// cuda_emu's own test: what it computes (warp shuffles, __syncthreads, the
// cuBLAS products and their bf16 rounding, wmma tiles, NCCL at one rank) against direct
// answers, and that what CUDA leaves undefined stops the program instead of
// passing (a lane gone before a full-mask shuffle, a barrier some threads
// never reach, a launch beyond the grid limits). Prints one line per check;
// exits 1 on the first that fails. Built and run by make test (CUDA=emu).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <nccl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

static int g_failed;
static void check(bool ok, const char *what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) g_failed = 1;
}

__global__ static void warp_sums(float *out, const float *in) {
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v; // every lane: its warp's sum
}

__global__ static void block_sum(float *out, const float *in, int n) {
    __shared__ float s[128];
    float v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += in[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = 64; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.y] = s[0];
}

__global__ static void lane_leaves(float *out) {
    if (threadIdx.x == 7) return; // the bug: lane 7 misses the shuffle
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ static void half_barrier(float *out) {
    if (threadIdx.x < 64) __syncthreads(); // threads 64.. never arrive, then exit
    out[threadIdx.x] = 1;
}

__global__ static void split_barrier(float *out) {
    if (threadIdx.x < 16) // half the warp at a full-mask shuffle ...
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else // ... the other half at a barrier: neither can go on
        __syncthreads();
}

__global__ static void nothing(float *) {}

// d = a b + d on one 16 x 16 x 16 bf16 tile: a row-major, b col-major (col)
// or row-major, d row-major
__global__ static void wmma_tile(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                                 int col) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fc, d, 16, wmma::mem_row_major);
    if (col) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, b, 16);
        wmma::mma_sync(fc, fa, fb, fc);
    } else {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, b, 16);
        wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

// Runs f in a child process; true when the child died by abort().
template <class F> static bool aborts(F f) {
    std::fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        freopen("/dev/null", "w", stderr);
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static float bf16(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    float *d = nullptr, *o = nullptr, h[256], r[256];
    cudaMalloc((void **)&d, sizeof h);
    cudaMalloc((void **)&o, sizeof h);
    for (int i = 0; i < 256; i++)
        h[i] = (float)(i % 13) - 6.0f;
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);

    warp_sums<<<2, 128>>>(o, d);
    cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost);
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int w = 0; w < 8; w++) {
        float s = 0;
        for (int l = 0; l < 32; l++)
            s += h[w * 32 + l];
        for (int l = 0; l < 32; l++)
            ok = ok && r[w * 32 + l] == s;
    }
    check(ok, "a butterfly of __shfl_xor_sync gives every lane its warp's sum");

    block_sum<<<dim3(1, 3), 128>>>(o, d, 256);
    cudaMemcpy(r, o, 3 * sizeof(float), cudaMemcpyDeviceToHost);
    float s = 0;
    for (int i = 0; i < 256; i++)
        s += h[i];
    check(r[0] == s && r[1] == s && r[2] == s, "a shared-memory tree over __syncthreads, 3 blocks");

    float *fresh = nullptr, probe = 0;
    cudaMalloc((void **)&fresh, 64);
    cudaMemcpy(&probe, fresh + 5, 4, cudaMemcpyDeviceToHost); // never written: garbage
    check(std::isnan(probe), "fresh device memory reads as NaN");
    cudaFree(fresh);

    check(aborts([&] { lane_leaves<<<1, 32>>>(o); }),
          "a lane that returns before a full-mask shuffle stops the program");
    check(aborts([&] { split_barrier<<<1, 32>>>(o); }),
          "half a warp at a shuffle, half at __syncthreads: stops the program");
    check(aborts([&] { warp_sums<<<1, 48>>>(o, d); }),
          "a full-mask shuffle in a partial warp (48 threads) stops the program");
    half_barrier<<<1, 128>>>(o); // the emulator's choice: exited threads do not hold a barrier up
    check(cudaGetLastError() == cudaSuccess, "__syncthreads after some threads exited completes");

    uint64_t ops0 = cuemu_device_ops();
    nothing<<<dim3(1, 70000), 32>>>(o);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 70000 is refused at launch");
    check(cuemu_device_ops() == ops0, "a refused launch is not counted as a device operation");
    nothing<<<3, 32>>>(o);
    cudaMemsetAsync(o, 0, 4, nullptr);
    cudaMemcpyAsync(o + 1, o, 4, cudaMemcpyDeviceToDevice, nullptr);
    cudaMemcpy(o + 1, o, 4, cudaMemcpyDeviceToDevice); // a wait, not a queued operation
    check(cuemu_device_ops() == ops0 + 3,
          "a launch, an async memset and an async copy: 3 operations");
    nothing<<<1, 2048>>>(o);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads a block are refused");
    check(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");

    // C (3x2) = A^T (A stored 4x3, lda 5) B (4x2, ldb 4), column-major; beta 0 ignores NaN in C
    cublasHandle_t bl;
    cublasCreate(&bl);
    float A[15], B[8], C[6], want[6];
    for (int i = 0; i < 15; i++)
        A[i] = 0.1f * (float)i + 1.0f / 3.0f;
    for (int i = 0; i < 8; i++)
        B[i] = 1.0f - 0.37f * (float)i;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double t = 0;
            for (int k = 0; k < 4; k++)
                t += (double)A[k + i * 5] * B[k + j * 4];
            want[i + j * 3] = (float)(2.0 * t);
        }
    float *dA, *dB, *dC, alpha = 2, beta = 0;
    cudaMalloc((void **)&dA, sizeof A);
    cudaMalloc((void **)&dB, sizeof B);
    cudaMalloc((void **)&dC, sizeof C);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    uint64_t ops1 = cuemu_device_ops();
    cublasStatus_t st = cublasGemmEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 4, &alpha, dA, CUDA_R_32F,
                                     5, dB, CUDA_R_32F, 4, &beta, dC, CUDA_R_32F, 3,
                                     CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
    check(cuemu_device_ops() == ops1 + 1, "a cuBLAS call is one device operation");
    cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
    check(st == CUBLAS_STATUS_SUCCESS && std::memcmp(C, want, sizeof C) == 0,
          "cublasGemmEx, A transposed, lda > rows, beta 0 over NaN");
    st = cublasGemmEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 4, &alpha, dA, CUDA_R_32F, 3, dB,
                      CUDA_R_32F, 4, &beta, dC, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F_PEDANTIC,
                      CUBLAS_GEMM_DEFAULT);
    check(st == CUBLAS_STATUS_INVALID_VALUE, "lda smaller than op(A)'s stored rows is refused");
    st = cublasGemmEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 4, &alpha, dA, CUDA_R_32F, 5, dB,
                      CUDA_R_32F, 4, &beta, dC, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F_FAST_16BF,
                      CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
    double t = 0;
    for (int k = 0; k < 4; k++)
        t += (double)bf16(A[k]) * bf16(B[k]);
    check(st == CUBLAS_STATUS_SUCCESS && C[0] == (float)(2.0 * t) && C[0] != want[0],
          "FAST_16BF rounds the inputs to bf16");

    // the pointer-array batched product: entry 0 the product above, entry 1 the same A
    // against B's second column only (n 1 of C's 2: C1 = want's second column)
    float *dC1, hC1[3];
    cudaMalloc((void **)&dC1, 3 * sizeof(float));
    const void *hAs[2] = {dA, dA}, *hBs[2] = {dB, dB + 4};
    void *hCs[2] = {dC, dC1};
    const void **dAs, **dBs;
    void **dCs;
    cudaMalloc((void **)&dAs, sizeof hAs);
    cudaMalloc((void **)&dBs, sizeof hBs);
    cudaMalloc((void **)&dCs, sizeof hCs);
    cudaMemcpy(dAs, hAs, sizeof hAs, cudaMemcpyHostToDevice);
    cudaMemcpy(dBs, hBs, sizeof hBs, cudaMemcpyHostToDevice);
    cudaMemcpy(dCs, hCs, sizeof hCs, cudaMemcpyHostToDevice);
    cudaMemset(dC, 0xff, sizeof C);
    ops1 = cuemu_device_ops();
    st = cublasGemmBatchedEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, 3, 1, 4, &alpha, dAs, CUDA_R_32F, 5, dBs,
                             CUDA_R_32F, 4, &beta, dCs, CUDA_R_32F, 3, 2,
                             CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
    check(cuemu_device_ops() == ops1 + 1, "a batched product is one device operation");
    cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
    cudaMemcpy(hC1, dC1, sizeof hC1, cudaMemcpyDeviceToHost);
    check(st == CUBLAS_STATUS_SUCCESS && std::memcmp(C, want, 3 * sizeof(float)) == 0 &&
              std::memcmp(hC1, want + 3, sizeof hC1) == 0,
          "cublasGemmBatchedEx: each entry its own pointers");
    cudaFree(dAs);
    cudaFree(dBs);
    cudaFree(dCs);
    cudaFree(dC1);

    // cuBLASLt: the same product with a bias per row of C in the epilogue
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t md;
    cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F);
    int32_t opT = CUBLAS_OP_T;
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &epi, 2) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "cuBLASLt: an attribute of the wrong size is refused");
    cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT);
    cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    float bias[3] = {0.5f, -1.25f, 3.0f}, *dbias;
    cudaMalloc((void **)&dbias, sizeof bias);
    cudaMemcpy(dbias, bias, sizeof bias, cudaMemcpyHostToDevice);
    cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias);
    cublasLtMatrixLayout_t la, lb, lc, lbad;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 4, 3, 5);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 4, 2, 4);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 3, 2, 3);
    check(cublasLtMatrixLayoutCreate(&lbad, CUDA_R_32F, 4, 2, 3) == CUBLAS_STATUS_INVALID_VALUE,
          "cuBLASLt: a leading dimension below the rows is refused");
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t hr;
    int got = 0;
    st = cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, 1, &hr, &got);
    check(st == CUBLAS_STATUS_SUCCESS && got == 1 && hr.state == CUBLAS_STATUS_SUCCESS,
          "cuBLASLt: the heuristic gives an algorithm for fp32");
    check(cublasLtMatmulAlgoGetHeuristic(lt, md, lb, lb, lc, lc, pref, 1, &hr, &got) ==
                  CUBLAS_STATUS_INVALID_VALUE &&
              got == 0,
          "cuBLASLt: layouts that do not make the product are refused");
    cudaMemset(dC, 0xff, sizeof C);
    ops1 = cuemu_device_ops();
    st = cublasLtMatmul(lt, md, &alpha, dA, la, dB, lb, &beta, dC, lc, dC, lc, &hr.algo, nullptr, 0,
                        nullptr);
    check(cuemu_device_ops() == ops1 + 1, "cuBLASLt: a product is one device operation");
    cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
    bool same = st == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double u = 0;
            for (int k = 0; k < 4; k++)
                u += (double)A[k + i * 5] * B[k + j * 4];
            same = same && C[i + j * 3] == (float)(2.0 * u + bias[i]);
        }
    check(same, "cuBLASLt: the bias epilogue adds bias[row] before the one rounding, beta 0 "
                "over NaN");
    cublasLtMatrixLayout_t l16;
    cublasLtMatrixLayoutCreate(&l16, CUDA_R_16BF, 4, 3, 5);
    check(cublasLtMatmulAlgoGetHeuristic(lt, md, l16, lb, lc, lc, pref, 1, &hr, &got) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "cuBLASLt: a type the emulator does not compute is NOT_SUPPORTED");
    cublasLtMatrixLayoutDestroy(l16);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(md);
    cublasLtDestroy(lt);
    cudaFree(dbias);

    // warp matrix functions: a bf16 tile product against the direct one
    // (small integers: every sum exact), b in either layout; then what a GPU
    // would not take: a tile 2 bytes off its 32-byte alignment, half a warp
    {
        __nv_bfloat16 ha[256], hb[256];
        float hc[256], want[2][256];
        for (int i = 0; i < 256; i++) {
            ha[i] = __float2bfloat16((float)(i * 7 % 11) - 5.0f);
            hb[i] = __float2bfloat16((float)(i * 5 % 9) - 4.0f);
            hc[i] = (float)(i % 3);
        }
        for (int col = 0; col < 2; col++)
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 16; n++) {
                    float s = hc[m * 16 + n];
                    for (int k = 0; k < 16; k++)
                        s += __bfloat162float(ha[m * 16 + k]) *
                             __bfloat162float(hb[col ? n * 16 + k : k * 16 + n]);
                    want[col][m * 16 + n] = s;
                }
        __nv_bfloat16 *da = nullptr, *db = nullptr;
        cudaMalloc((void **)&da, sizeof ha + 64);
        cudaMalloc((void **)&db, sizeof hb);
        cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
        cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
        for (int col = 0; col < 2; col++) {
            cudaMemcpy(o, hc, sizeof hc, cudaMemcpyHostToDevice);
            wmma_tile<<<1, 32>>>(o, da, db, col);
            cudaMemcpy(r, o, sizeof r, cudaMemcpyDeviceToHost);
            check(cudaGetLastError() == cudaSuccess && std::memcmp(r, want[col], sizeof r) == 0,
                  col ? "wmma: a b + c, b column-major" : "wmma: a b + c, b row-major");
        }
        check(aborts([&] {
                  wmma_tile<<<1, 32>>>(o, da + 1, db, 0);
                  cudaDeviceSynchronize();
              }),
              "wmma: a tile off its 32-byte alignment stops the program");
        check(aborts([&] {
                  wmma_tile<<<1, 16>>>(o, da, db, 0);
                  cudaDeviceSynchronize();
              }),
              "wmma: half a warp stops the program");
        cudaFree(da);
        cudaFree(db);
    }

    // NCCL at one rank
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t c2;
    check(ncclCommInitRankConfig(&c2, 2, id, 0, &cfg) != ncclSuccess, "NCCL: two ranks refused");
    ncclComm_t c;
    ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
    cudaMemset(o, 0, sizeof h);
    ncclGroupStart();
    ncclSend(d, 10, ncclFloat32, 0, c, nullptr);
    ncclRecv(o, 10, ncclFloat32, 0, c, nullptr);
    ncclResult_t nr = ncclGroupEnd();
    cudaMemcpy(r, o, 11 * sizeof(float), cudaMemcpyDeviceToHost);
    check(nr == ncclSuccess && std::memcmp(r, h, 10 * sizeof(float)) == 0 && r[10] == 0,
          "NCCL: a grouped send and receive to oneself");
    ncclGroupStart();
    ncclSend(d, 10, ncclFloat32, 0, c, nullptr);
    ncclRecv(o, 12, ncclFloat32, 0, c, nullptr);
    check(ncclGroupEnd() == ncclInvalidUsage, "NCCL: a receive of another count than its send");
    check(ncclRecv(o, 4, ncclFloat32, 0, c, nullptr) == ncclInvalidUsage,
          "NCCL: a receive with no send (it would hang) is refused");
    ncclCommDestroy(c);
    cublasDestroy(bl);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(d);
    cudaFree(o);
    check(cuemu_live_bytes() == 0, "every allocation freed");
    return g_failed;
}
