// What every generated CUDA source starts with (prelude.py pastes it, its
// quoted includes inlined, so that a source stands alone for NVRTC, nvcc
// and the CPU emulator): the fixed-width types (NVRTC has no host headers),
// the number formats the C++ printer shares, and the PTX wrappers.
#ifndef TESSERA_PRELUDE_CUH
#define TESSERA_PRELUDE_CUH

#ifdef __CUDACC_RTC__
// NVRTC has no host C++ headers; its math functions and memcpy are built in.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#endif

#define TESSERA_FN __device__
#include "../cpu/tessera_numerics.h"

// Two floats as the bf16 pair of one mma operand register (first in the low half).
__device__ inline uint32_t tessera_pack_bf16(float lo, float hi) {
  return (uint32_t)float_to_bf16(lo) | ((uint32_t)float_to_bf16(hi) << 16);
}

#include "tessera_ptx.cuh"

#endif  // TESSERA_PRELUDE_CUH
