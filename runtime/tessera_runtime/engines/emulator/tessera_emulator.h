// CPU emulation of the CUDA features Tessera's generated kernels use: what
// both the kernels' translation unit (through tessera_emulator_api.h) and
// the emulator's core (tessera_emulator.cpp) see.
#ifndef TESSERA_EMULATOR_H
#define TESSERA_EMULATOR_H

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define TESSERA_EMULATED_PTX 1
#define TESSERA_SMEM_BYTES 232448

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
extern dim3 blockIdx, blockDim, gridDim;
extern dim3* tessera_thread_index;  // the running CUDA thread's, set per switch
#define threadIdx (*tessera_thread_index)
extern unsigned char tessera_smem[TESSERA_SMEM_BYTES];

using std::exp;
using std::log;
using std::sqrt;
using std::tanh;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline uint32_t tessera_shared_address(const void* p) {
  return uint32_t(static_cast<const unsigned char*>(p) - tessera_smem);
}

// The core's implementations (below in the core, from the PTX ISA).
void tessera_emu_syncthreads();
void tessera_emu_syncwarp();
uint64_t tessera_emu_shfl_xor(uint64_t bits, int mask);
void tessera_emu_named_barrier_sync(unsigned id, unsigned count);
void tessera_emu_named_barrier_arrive(unsigned id, unsigned count);
void tessera_emu_cp_async16(void* smem, const void* gmem);
void tessera_emu_cp_async_commit();
void tessera_emu_cp_async_wait(int n);
void tessera_emu_fence_proxy_async();
void tessera_emu_ldmatrix(uint32_t* r, const void* smem, bool trans);
void tessera_emu_mma(float* d, const uint32_t* a, const uint32_t* b, bool bf16);
void tessera_emu_wgmma(float* d, uint64_t a, const uint32_t* a_regs, uint64_t b, int n, bool bf16,
                       bool mn_major_b);
void tessera_emu_wgmma_commit();
void tessera_emu_wgmma_wait(int n);
void tessera_emu_mbarrier_init(uint64_t* bar, unsigned count);
void tessera_emu_mbarrier_expect_tx(uint64_t* bar, unsigned bytes);
void tessera_emu_mbarrier_arrive(uint64_t* bar);
void tessera_emu_mbarrier_wait(uint64_t* bar, unsigned parity);
void tessera_emu_tma_load(void* dst, const void* map, int rank, const int* c, uint64_t* bar);
int tessera_emu_my_pe();
int tessera_emu_n_pes();
void tessera_emu_putmem(void* dest, const void* src, size_t bytes, int pe);
void tessera_emu_getmem(void* dest, const void* src, size_t bytes, int pe);
void tessera_emu_memory_fence();
void tessera_emu_signal_op(uint64_t* sig, uint64_t value, int op, int pe);
uint64_t tessera_emu_signal_wait_until(uint64_t* sig, int cmp, uint64_t value);

// NVSHMEM's constants (its device API below, for sources that include nvshmem.h).
#define NVSHMEM_SIGNAL_SET 0
#define NVSHMEM_SIGNAL_ADD 5
enum {
  NVSHMEM_CMP_EQ,
  NVSHMEM_CMP_NE,
  NVSHMEM_CMP_GT,
  NVSHMEM_CMP_GE,
  NVSHMEM_CMP_LT,
  NVSHMEM_CMP_LE
};

#endif  // TESSERA_EMULATOR_H
