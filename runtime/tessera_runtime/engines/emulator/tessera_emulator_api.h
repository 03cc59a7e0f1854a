// What a kernel calls: CUDA's built-ins, the functions tessera_ptx.cuh
// declares for the emulator, and NVSHMEM's device API, each a call into the
// core (tessera_emulator.cpp, compiled once), so a kernel source compiles
// with this little text. cuda_emulator.py puts a kernel source after it.
#ifndef TESSERA_EMULATOR_API_H
#define TESSERA_EMULATOR_API_H

#include "tessera_emulator.h"

inline void __syncthreads() { tessera_emu_syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { tessera_emu_syncwarp(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = tessera_emu_shfl_xor(bits, mask);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
inline void tessera_named_barrier_sync(unsigned id, unsigned count) {
  tessera_emu_named_barrier_sync(id, count);
}
inline void tessera_named_barrier_arrive(unsigned id, unsigned count) {
  tessera_emu_named_barrier_arrive(id, count);
}
inline void tessera_cp_async16(void* smem, const void* gmem) { tessera_emu_cp_async16(smem, gmem); }
inline void tessera_cp_async_commit() { tessera_emu_cp_async_commit(); }
template <int N> inline void tessera_cp_async_wait() { tessera_emu_cp_async_wait(N); }
inline void tessera_fence_proxy_async() { tessera_emu_fence_proxy_async(); }
inline void tessera_ldmatrix_x4(uint32_t* r, const void* s) { tessera_emu_ldmatrix(r, s, false); }
inline void tessera_ldmatrix_x4_trans(uint32_t* r, const void* s) {
  tessera_emu_ldmatrix(r, s, true);
}
inline void tessera_mma_bf16(float* d, const uint32_t* a, const uint32_t* b) {
  tessera_emu_mma(d, a, b, true);
}
inline void tessera_mma_f16(float* d, const uint32_t* a, const uint32_t* b) {
  tessera_emu_mma(d, a, b, false);
}
template <int N, int MnMajorB> inline void tessera_wgmma_bf16(float* d, uint64_t a, uint64_t b) {
  tessera_emu_wgmma(d, a, nullptr, b, N, true, MnMajorB != 0);
}
template <int N, int MnMajorB> inline void tessera_wgmma_f16(float* d, uint64_t a, uint64_t b) {
  tessera_emu_wgmma(d, a, nullptr, b, N, false, MnMajorB != 0);
}
template <int N, int MnMajorB>
inline void tessera_wgmma_rs_bf16(float* d, const uint32_t* a, uint64_t b) {
  tessera_emu_wgmma(d, 0, a, b, N, true, MnMajorB != 0);
}
template <int N, int MnMajorB>
inline void tessera_wgmma_rs_f16(float* d, const uint32_t* a, uint64_t b) {
  tessera_emu_wgmma(d, 0, a, b, N, false, MnMajorB != 0);
}
inline void tessera_wgmma_fence() {}
template <int N> inline void tessera_wgmma_fence_operands(float*) {}
inline void tessera_wgmma_commit() { tessera_emu_wgmma_commit(); }
template <int N> inline void tessera_wgmma_wait() { tessera_emu_wgmma_wait(N); }
inline void tessera_mbarrier_init(uint64_t* bar, unsigned count) {
  tessera_emu_mbarrier_init(bar, count);
}
inline void tessera_fence_barrier_init() {}
inline void tessera_mbarrier_expect_tx(uint64_t* bar, unsigned bytes) {
  tessera_emu_mbarrier_expect_tx(bar, bytes);
}
inline void tessera_mbarrier_arrive(uint64_t* bar) { tessera_emu_mbarrier_arrive(bar); }
inline void tessera_mbarrier_wait(uint64_t* bar, unsigned parity) {
  tessera_emu_mbarrier_wait(bar, parity);
}
inline void tessera_tma_load_2d(void* d, const void* m, int c0, int c1, uint64_t* b) {
  const int c[] = {c0, c1};
  tessera_emu_tma_load(d, m, 2, c, b);
}
inline void tessera_tma_load_3d(void* d, const void* m, int c0, int c1, int c2, uint64_t* b) {
  const int c[] = {c0, c1, c2};
  tessera_emu_tma_load(d, m, 3, c, b);
}
inline void tessera_tma_load_4d(void* d, const void* m, int c0, int c1, int c2, int c3,
                                uint64_t* b) {
  const int c[] = {c0, c1, c2, c3};
  tessera_emu_tma_load(d, m, 4, c, b);
}
inline void tessera_tma_load_5d(void* d, const void* m, int c0, int c1, int c2, int c3, int c4,
                                uint64_t* b) {
  const int c[] = {c0, c1, c2, c3, c4};
  tessera_emu_tma_load(d, m, 5, c, b);
}
// The register budget is the hardware's business.
template <int N> inline void tessera_setmaxnreg_inc() {}
template <int N> inline void tessera_setmaxnreg_dec() {}

inline int nvshmem_my_pe() { return tessera_emu_my_pe(); }
inline int nvshmem_n_pes() { return tessera_emu_n_pes(); }
inline void nvshmemx_putmem_nbi_block(void* dest, const void* src, size_t bytes, int pe) {
  tessera_emu_putmem(dest, src, bytes, pe);
}
inline void nvshmemx_getmem_nbi_block(void* dest, const void* src, size_t bytes, int pe) {
  tessera_emu_getmem(dest, src, bytes, pe);
}
inline void nvshmem_fence() { tessera_emu_memory_fence(); }
inline void nvshmem_quiet() { tessera_emu_memory_fence(); }
inline void nvshmemx_signal_op(uint64_t* sig, uint64_t value, int op, int pe) {
  tessera_emu_signal_op(sig, value, op, pe);
}
inline uint64_t nvshmem_signal_wait_until(uint64_t* sig, int cmp, uint64_t value) {
  return tessera_emu_signal_wait_until(sig, cmp, value);
}

#endif  // TESSERA_EMULATOR_API_H
