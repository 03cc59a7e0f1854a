// What every translation unit of an emitted CPU kernel library includes
// (tessera_compiler/codegen/build.py compiles them with -I at this folder):
// the number formats, a vectorizable exp and tanh, and the register-blocked
// float dot. Everything is static inline: each unit has its own copy.
#ifndef TESSERA_CPU_H
#define TESSERA_CPU_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#define TESSERA_FN static
#include "tessera_numerics.h"

// float exp and tanh the compiler can vectorize (glibc's expf/tanhf are calls
// it cannot), accurate to about 1.5 ulp (Cephes polynomials): a GELU or
// softmax kernel is otherwise dominated by scalar libm calls. IEEE edge cases
// (inf, -inf, nan, overflow, underflow) are kept by the final selects. The
// polynomials use explicit fused multiply-adds: -ffp-contract=off forbids the
// compiler's own, and an explicit fmaf rounds once on every machine (a call
// where the CPU lacks FMA, same bits), so results stay machine-independent
// (their speed against the fused-FMA form: bench/results/docstring-timings-moved-2026-12-02.md).
// tanh(|x|) = (1 - e) / (1 + e), e = exp(-2|x|) in (0, 1]: no overflow, and
// no cancellation where it is used (|x| >= 0.625).
// Below -103.972 the result is 0 (the last select), so such an x (a masked
// score's -inf) is evaluated at 0 instead: scaling the polynomial down to a
// subnormal there costs a microcode assist per lane on x86, for a value the
// select throws away (bench/results/cpu-attention-2026-12-03.md). Results
// are the same bits.
static inline float tessera_exp(float x) {
  float c = x < -103.972f ? 0.0f : (x > 89.0f ? 89.0f : x);
  float n = __builtin_rintf(c * 1.44269504088896341f);
  float r = __builtin_fmaf(n, 2.12194440e-4f, __builtin_fmaf(n, -0.693359375f, c));
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r + 1.0f);
  int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float y = p * __builtin_bit_cast(float, b1) * __builtin_bit_cast(float, b2);
  y = x > 88.7228394f ? INFINITY : y;
  y = x < -103.972f ? 0.0f : y;
  return x != x ? x : y;
}
static inline float tessera_tanh(float x) {
  float a = x < 0 ? -x : x;
  float z = x * x;
  float q = __builtin_fmaf(__builtin_fmaf(-5.70498872745e-3f, z, 2.06390887954e-2f), z,
                           -5.37397155531e-2f);
  q = __builtin_fmaf(__builtin_fmaf(q, z, 1.33314422036e-1f), z, -3.33332819422e-1f);
  float small = __builtin_fmaf(q * z, x, x);
  float e = tessera_exp(-2.0f * a);
  float big = (1.0f - e) / (1.0f + e);
  big = x < 0 ? -big : big;
  return a < 0.625f ? small : (x != x ? x : big);
}

// r[M x N] += a[M x K] b[K x N] for float tiles (f32 and bf16), row-major.
// The plain i-k-j loop over a small constant shape is fully unrolled by
// GCC 12 and then SLP-vectorized into shuffles: about 3 GFLOP/s for the
// 16x32x16 dots of short-sequence attention, against about 60 for this one
// (Zen 3, AVX2). Here an MR x 8*NR block of r stays in vector registers for
// the whole k loop; every element still sums k = 0..K-1 in order.
// The lanes' vector types, by lane count. aligned(4): loads and stores of
// any float address (a typedef passed as a template argument would lose
// that attribute and turn them into aligned moves).
template <int L> struct tessera_lanes;
template <> struct tessera_lanes<8> {
  typedef float type __attribute__((vector_size(32), aligned(4), may_alias));
};
#ifdef __AVX512F__
// With AVX-512 the block's columns go 16 to a register: half the
// instructions per k for the same accumulators (each element's sum is the
// same sequence of rounded products and adds, so the same bits).
template <> struct tessera_lanes<16> {
  typedef float type __attribute__((vector_size(64), aligned(4), may_alias));
};
#endif
template <int L, int MR, int NR>
static inline void tessera_dot_block(const float* a, const float* b, float* r, int64_t K,
                                     int64_t N) {
  typedef typename tessera_lanes<L>::type V;
  V c[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) c[i][q] = *(const V*)&r[i * N + L * q];
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    V bv[NR];
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) bv[q] = *(const V*)&b[k * N + L * q];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float av = a[i * K + k];
#pragma GCC unroll 8
      for (int q = 0; q < NR; ++q) c[i][q] += av * bv[q];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int q = 0; q < NR; ++q) *(V*)&r[i * N + L * q] = c[i][q];
}
template <int MR>
static inline void tessera_dot_rows(const float* a, const float* b, float* r, int64_t K,
                                    int64_t N) {
  int64_t j = 0;
#ifdef __AVX512F__
  for (; j + 32 <= N; j += 32) tessera_dot_block<16, MR, 2>(a, b + j, r + j, K, N);
  for (; j + 16 <= N; j += 16) tessera_dot_block<16, MR, 1>(a, b + j, r + j, K, N);
#else
  for (; j + 16 <= N; j += 16) tessera_dot_block<8, MR, 2>(a, b + j, r + j, K, N);
#endif
  for (; j + 8 <= N; j += 8) tessera_dot_block<8, MR, 1>(a, b + j, r + j, K, N);
  for (; j < N; ++j)
    for (int i = 0; i < MR; ++i)
      for (int64_t k = 0; k < K; ++k) r[i * N + j] += a[i * K + k] * b[k * N + j];
}
static inline void tessera_dot(const float* a, const float* b, float* r, int64_t M, int64_t K,
                               int64_t N) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) tessera_dot_rows<4>(a + i * K, b, r + i * N, K, N);
  switch (M - i) {
    case 3: tessera_dot_rows<3>(a + i * K, b, r + i * N, K, N); break;
    case 2: tessera_dot_rows<2>(a + i * K, b, r + i * N, K, N); break;
    case 1: tessera_dot_rows<1>(a + i * K, b, r + i * N, K, N); break;
  }
}

#endif  // TESSERA_CPU_H
