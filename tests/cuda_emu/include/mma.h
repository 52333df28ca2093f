/* cuda_emu: the warp matrix functions (nvcuda::wmma) Refinery's kernels use,
 * for bf16 16 x 16 x 16 tiles with a float accumulator (C++ only).
 *
 * A GPU spreads a fragment over the warp's lanes in a layout CUDA leaves
 * unspecified, so correct code only loads, stores, fills and multiplies
 * fragments, or applies one operation to all of x[]. Here every lane holds
 * the whole tile (row-major, num_elements = rows x columns): such code
 * computes the same. Each call is a warp operation of all 32 lanes, as on a
 * GPU (the emulator stops a divergent or partial warp), which also orders
 * the lanes' shared-memory writes before the tile is read; a tile not
 * 32-byte aligned, or a leading dimension not a multiple of 16 bytes, stops
 * the program. mma_sync adds the exact products (a bf16 product is exact in
 * float) to c in double and rounds once. */
#ifndef RF_CUDA_EMU_MMA_H
#define RF_CUDA_EMU_MMA_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h" // cuemu_kernel.h after the runtime types

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: 16 x 16 x 16 tiles only");
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    T x[num_elements];
};

namespace detail {
inline void converge() {
    (void)cuemu::warp_op(0xffffffffu, 0, -1);
}
// wmma's rules for a tile in memory: 256-bit aligned, and a leading
// dimension of a multiple of 16 bytes; a GPU faults or reads garbage else
inline void check_tile(const void *p, unsigned ldm, size_t elem, const char *what) {
    if ((uintptr_t)p % 32 || (ldm * elem) % 16) {
        std::fprintf(stderr,
                     "cuda_emu: wmma %s of a tile at %p (ldm %u): needs 32-byte alignment "
                     "and a leading dimension of a multiple of 16 bytes\n",
                     what, p, ldm);
        std::abort();
    }
}
inline float to_float(float v) {
    return v;
}
inline float to_float(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
} // namespace detail

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v) {
    detail::converge();
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = (T)v;
}

// matrix_a / matrix_b: the layout is the fragment's
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator's load takes a layout");
    detail::converge();
    detail::check_tile(p, ldm, sizeof(T), "load");
    typedef fragment<Use, M, N, K, T, L> F;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] =
                std::is_same<L, row_major>::value ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l) {
    detail::converge();
    detail::check_tile(p, ldm, sizeof(float), "load");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l) {
    detail::converge();
    detail::check_tile(p, ldm, sizeof(float), "store");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) =
                f.x[r * 16 + c];
}

template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    detail::converge();
    // The lanes of a warp follow one another on the emulator's one thread,
    // each with the same tiles: the last product is kept and reused when a
    // lane's inputs are the same bytes (the result cannot differ).
    struct last_t {
        bool valid;
        T a[256], b[256];
        float c[256], d[256];
    };
    static thread_local last_t last; // a host thread runs a warp's lanes in turn
    if (last.valid && !std::memcmp(last.a, a.x, sizeof last.a) &&
        !std::memcmp(last.b, b.x, sizeof last.b) && !std::memcmp(last.c, c.x, sizeof last.c)) {
        std::memcpy(d.x, last.d, sizeof last.d);
        return;
    }
    float r[256];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double s = c.x[m * 16 + n];
            for (int k = 0; k < 16; k++)
                s += (double)detail::to_float(a.x[m * 16 + k]) * detail::to_float(b.x[k * 16 + n]);
            r[m * 16 + n] = (float)s;
        }
    std::memcpy(last.a, a.x, sizeof last.a);
    std::memcpy(last.b, b.x, sizeof last.b);
    std::memcpy(last.c, c.x, sizeof last.c);
    std::memcpy(last.d, r, sizeof r);
    last.valid = true;
    std::memcpy(d.x, r, sizeof r);
}
} // namespace wmma
} // namespace nvcuda

#endif
