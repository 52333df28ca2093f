/* cuda_emu: the bf16 type and its two conversions Refinery's kernels use
 * (C++ only). __float2bfloat16 rounds to nearest, ties to even, as CUDA's
 * does (NaN stays a NaN); __bfloat162float is exact. */
#ifndef RF_CUDA_EMU_BF16_H
#define RF_CUDA_EMU_BF16_H

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) // NaN: keep it one
        return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.bits << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

#endif
