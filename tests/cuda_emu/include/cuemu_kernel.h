/* cuda_emu: what CUDA C++ kernels see (C++ only; included by cuda_runtime.h).
 * tests/cuda_emu/cuemu-cc rewrites every launch kernel<<<grid, block, shmem,
 * stream>>>(args) into cuemu::launcher("kernel", kernel, grid, block, shmem,
 * stream)(args), which runs the grid through cuemu::launch (cuemu.cc). */
#ifndef RF_CUDA_EMU_KERNEL_H
#define RF_CUDA_EMU_KERNEL_H

#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The running thread's coordinates: set by the scheduler at every switch.
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time on one host thread, so a function-static array is
// the block's shared memory (left as the previous block wrote it: CUDA's is
// undefined at block start too).
#define __shared__ static

namespace cuemu {
// Runs body once per thread of the grid; configuration errors become the
// next cudaGetLastError's, as a real launch's.
void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
            const std::function<void()> &body);
void syncthreads();
// A warp operation of the calling lane: blocks until every lane of mask has
// made one, then returns the 8 bytes lane src offered (src < 0: nothing).
uint64_t warp_op(unsigned mask, uint64_t offer, int src);
int lane();

template <class... P> struct launcher_t {
    const char *name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    template <class... A> void operator()(A &&...a) const {
        std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...); // the kernel's conversions
        void (*k)(P...) = kernel;
        launch(name, grid, block, shmem, stream, [&] { std::apply(k, args); });
    }
};
template <class... P>
launcher_t<P...> launcher(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                          size_t shmem = 0, cudaStream_t stream = nullptr) {
    return launcher_t<P...>{name, kernel, grid, block, shmem, stream};
}
} // namespace cuemu

inline void __syncthreads() {
    cuemu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)cuemu::warp_op(mask, 0, -1);
}

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    int me = cuemu::lane(), src = me ^ lane_mask;
    if (src / width != me / width) src = me; // outside the segment: the lane's own value
    uint64_t got = cuemu::warp_op(mask, bits, src);
    T r;
    std::memcpy(&r, &got, sizeof r);
    return r;
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    int me = cuemu::lane(), src = me + (int)delta;
    if (src / width != me / width) src = me;
    uint64_t got = cuemu::warp_op(mask, bits, src);
    T r;
    std::memcpy(&r, &got, sizeof r);
    return r;
}

// Round-to-nearest intrinsics: the host's IEEE operations (the emulator's
// compiler is told not to contract, so plain a * b + c is not fused either).
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
using std::max;
using std::min;

#endif
