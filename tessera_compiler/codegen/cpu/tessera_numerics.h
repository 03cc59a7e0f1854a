// Number formats stored as bits, the row-segment test and dropout's random
// words: what the CPU
// kernels (tessera_cpu.h) and the CUDA kernels (cuda/tessera_prelude.cuh)
// share. TESSERA_FN qualifies each function: `static` on the CPU,
// `__device__` on a GPU; NVRTC has no host headers, so this header includes
// none (the includer provides memcpy and the fixed-width integers).
#ifndef TESSERA_NUMERICS_H
#define TESSERA_NUMERICS_H

#ifndef TESSERA_FN
#error "define TESSERA_FN (static or __device__) before including tessera_numerics.h"
#endif

// bfloat16 <-> float by bit manipulation (round to nearest even), so the
// generated code needs no compiler support for a bf16 type.
TESSERA_FN inline float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
TESSERA_FN inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);  // nan
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
TESSERA_FN inline float bf16_round(float f) { return bf16_to_float(float_to_bf16(f)); }

// FP8 e4m3 (OCP "fn": bias 7, no infinities, S.1111.111 the only NaN, 448 the
// largest finite) <-> float by bit manipulation, rounding to nearest even as
// ml_dtypes does: a magnitude that rounds past 448 (inf included) is NaN.
TESSERA_FN inline float f8e4m3_to_float(uint8_t h) {
  const uint32_t e = (h >> 3) & 15u, m = h & 7u;
  float v;
  if (e == 15u && m == 7u) {
    const uint32_t nan_bits = 0x7fc00000u;
    memcpy(&v, &nan_bits, 4);
  } else if (e == 0u) {
    v = (float)m * 0.001953125f;  // m * 2^-9
  } else {
    const uint32_t bits = ((e + 120u) << 23) | (m << 20);
    memcpy(&v, &bits, 4);
  }
  return (h & 0x80u) ? -v : v;
}
TESSERA_FN inline uint8_t float_to_f8e4m3(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x7f800000u) return sign | 0x7fu;  // nan, inf
  if (mag < 0x3c800000u) {                      // below 2^-6: subnormal
    // a * 2^9 (exact) to the nearest integer, ties to even: adding 2^23
    // leaves no fraction bits (no libm call: NVRTC has no host builtins).
    float a;
    memcpy(&a, &mag, 4);
    const float q = (a * 512.0f + 8388608.0f) - 8388608.0f;
    return sign | (uint8_t)q;  // 8 is 2^-6, a normal
  }
  const uint32_t r = mag + 0x7ffffu + ((mag >> 20) & 1u);  // to 3 mantissa bits, even
  const uint32_t e = (r >> 23) - 120u, m = (r >> 20) & 7u;
  if (e > 15u || (e == 15u && m == 7u)) return sign | 0x7fu;  // past 448
  return sign | (uint8_t)((e << 3) | m);
}
TESSERA_FN inline float f8e4m3_round(float f) { return f8e4m3_to_float(float_to_f8e4m3(f)); }

// A kernel with `row_segments`: whether the `tile_rows` rows from `first` lie
// past the segments of their block (`per_block` sizes at block `first /
// height`); a band reaching into the next block runs.
TESSERA_FN inline bool tessera_past_segments(const int32_t* sizes, int64_t per_block,
                                             int64_t height, int64_t first, int64_t tile_rows) {
  const int64_t block = first / height;
  if ((first + tile_rows - 1) / height != block) return false;
  int64_t used = 0;
  for (int64_t s = 0; s < per_block; ++s) used += sizes[block * per_block + s];
  return first - block * height >= used;
}

// Philox-4x32-10 (Random123): word `index % 4` of the block `index / 4`, the
// counter (block, step) and the key `seed` as 32-bit halves. The runtime's
// tgraph.dropout draws the same words (tessera_runtime/random.py); the tests
// hold both to Random123's published answers and to each other.
TESSERA_FN inline uint32_t philox_word(uint64_t seed, uint64_t step, uint64_t index) {
  const uint64_t block = index >> 2;
  uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32);
  uint32_t c2 = (uint32_t)step, c3 = (uint32_t)(step >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  const uint32_t lane = (uint32_t)(index & 3u);
  return lane == 0u ? c0 : lane == 1u ? c1 : lane == 2u ? c2 : c3;
}

// Whether dropout keeps element `index`: its word's top 24 bits at least
// `threshold` (round(p * 2^24)).
TESSERA_FN inline bool dropout_keeps(uint64_t seed, uint64_t step, uint64_t index,
                                     uint32_t threshold) {
  return (philox_word(seed, step, index) >> 8) >= threshold;
}

#endif  // TESSERA_NUMERICS_H
