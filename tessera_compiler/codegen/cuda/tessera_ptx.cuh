// tessera_ptx.cuh: the PTX instructions Tessera's generated CUDA calls, as
// tessera_* functions.
//
// The CUDA printer (tessera_compiler/codegen/cuda/prelude.py) pastes this
// file into every source it writes, after the fixed-width integer types and
// the bf16 helpers, so that each source stands alone for whichever compiler
// builds it:
//
//   nvcc or NVRTC, sm_90a   every function, as inline PTX;
//   plain sm_90             all but wgmma, TMA, mbarriers and setmaxnreg (no
//                           __CUDA_ARCH_FEAT_SM90_ALL: kernels take their
//                           mma.sync branch);
//   the CPU emulator        TESSERA_EMULATED_PTX: declarations. The runtime's
//                           emulator (tessera_runtime/engines/emulator/)
//                           defines each before this header, from the PTX ISA
//                           and independently of the PTX below; a definition
//                           that does not match its declaration here fails to
//                           compile, a missing one to load.
//
// test/python/test_ptx_header.py compiles it all three ways and checks that
// the printer calls nothing it does not declare.
#ifndef TESSERA_PTX_CUH
#define TESSERA_PTX_CUH

// 2^x on the special-function unit (subnormal results flush to zero).
__device__ __forceinline__ float tessera_ex2(float x) {
#ifdef TESSERA_EMULATED_PTX
  return std::exp2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

#ifdef TESSERA_EMULATED_PTX
// -- the emulator's --------------------------------------------------------
__device__ __forceinline__ void tessera_cp_async16(void* smem, const void* gmem);
__device__ __forceinline__ void tessera_cp_async_commit();
template <int N> __device__ __forceinline__ void tessera_cp_async_wait();
__device__ __forceinline__ void tessera_ldmatrix_x4(uint32_t* r, const void* smem);
__device__ __forceinline__ void tessera_ldmatrix_x4_trans(uint32_t* r, const void* smem);
__device__ __forceinline__ void tessera_mma_bf16(float* d, const uint32_t* a, const uint32_t* b);
__device__ __forceinline__ void tessera_mma_f16(float* d, const uint32_t* a, const uint32_t* b);
__device__ __forceinline__ void tessera_named_barrier_sync(unsigned id, unsigned count);
__device__ __forceinline__ void tessera_named_barrier_arrive(unsigned id, unsigned count);
__device__ __forceinline__ uint32_t tessera_shared_address(const void* p);
__device__ __forceinline__ void tessera_wgmma_fence();
__device__ __forceinline__ void tessera_wgmma_commit();
template <int N> __device__ __forceinline__ void tessera_wgmma_wait();
__device__ __forceinline__ void tessera_fence_proxy_async();
template <int N> __device__ __forceinline__ void tessera_wgmma_fence_operands(float* d);
__device__ __forceinline__ void tessera_mbarrier_init(uint64_t* bar, unsigned count);
__device__ __forceinline__ void tessera_fence_barrier_init();
__device__ __forceinline__ void tessera_mbarrier_expect_tx(uint64_t* bar, unsigned bytes);
__device__ __forceinline__ void tessera_mbarrier_arrive(uint64_t* bar);
__device__ __forceinline__ void tessera_mbarrier_wait(uint64_t* bar, unsigned parity);
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_inc();
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_dec();
__device__ __forceinline__ void tessera_tma_load_2d(void* dst, const void* map, int c0, int c1,
                                                    uint64_t* bar);
__device__ __forceinline__ void tessera_tma_load_3d(void* dst, const void* map, int c0, int c1,
                                                    int c2, uint64_t* bar);
__device__ __forceinline__ void tessera_tma_load_4d(void* dst, const void* map, int c0, int c1,
                                                    int c2, int c3, uint64_t* bar);
__device__ __forceinline__ void tessera_tma_load_5d(void* dst, const void* map, int c0, int c1,
                                                    int c2, int c3, int c4, uint64_t* bar);
#else
// -- sm_80 and later: cp.async, ldmatrix, mma.sync, named barriers ---------
__device__ __forceinline__ void tessera_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void tessera_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void tessera_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
__device__ __forceinline__ void tessera_ldmatrix_x4(uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void tessera_ldmatrix_x4_trans(uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
#define TESSERA_MMA(NAME, TYPE)                                                          \
  __device__ __forceinline__ void NAME(float* d, const uint32_t* a, const uint32_t* b) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 "            \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"        \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));      \
  }
TESSERA_MMA(tessera_mma_bf16, "bf16")
TESSERA_MMA(tessera_mma_f16, "f16")
// Named barrier ID (1..15; 0 is __syncthreads') of COUNT threads: sync
// arrives and waits for all COUNT, arrive only arrives (warpgroups taking
// turns: one waits on its barrier, the other arrives on it).
__device__ __forceinline__ void tessera_named_barrier_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void tessera_named_barrier_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// -- sm_90a: Hopper's warpgroup MMA and its fences --------------------------
__device__ __forceinline__ uint32_t tessera_shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void tessera_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tessera_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void tessera_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Shared memory written by the generic proxy (cp.async, stores), made
// visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void tessera_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma operations that own the registers in between.
template <int N> __device__ __forceinline__ void tessera_wgmma_fence_operands(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// -- sm_90a: the tensor memory accelerator and the mbarriers that count its
// bytes. A tensor map lives in global memory, written by the host before the
// launch.
__device__ __forceinline__ void tessera_mbarrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
               :: "r"(tessera_shared_address(bar)), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the TMA unit).
__device__ __forceinline__ void tessera_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` of copies to complete on the barrier.
__device__ __forceinline__ void tessera_mbarrier_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(tessera_shared_address(bar)), "r"(bytes) : "memory");
}
// One arrival (no bytes).
__device__ __forceinline__ void tessera_mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
               :: "r"(tessera_shared_address(bar)) : "memory");
}
// A warpgroup's per-thread register budget, changed at run time (all its
// threads execute it together).
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void tessera_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
__device__ __forceinline__ uint64_t tessera_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Returns once the barrier's phase of this parity has completed. With
// TESSERA_WAIT_WATCHDOG_NS defined (TargetOptions.wait_watchdog_s), a wait
// that outlasts it traps (the launch fails; no printf: see emit_cuda_kernels).
__device__ __forceinline__ void tessera_mbarrier_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
#ifdef TESSERA_WAIT_WATCHDOG_NS
  const uint64_t start = tessera_globaltimer_ns();
#endif
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(tessera_shared_address(bar)), "r"(parity) : "memory");
#ifdef TESSERA_WAIT_WATCHDOG_NS
    if (!done && tessera_globaltimer_ns() - start > TESSERA_WAIT_WATCHDOG_NS) __trap();
#endif
  } while (!done);
}
__device__ __forceinline__ void tessera_tma_load_2d(void* dst, const void* map, int c0, int c1, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4}], [%2];\n"
               :: "r"(tessera_shared_address(dst)), "l"(map), "r"(tessera_shared_address(bar)),
                  "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tessera_tma_load_3d(void* dst, const void* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4, %5}], [%2];\n"
               :: "r"(tessera_shared_address(dst)), "l"(map), "r"(tessera_shared_address(bar)),
                  "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tessera_tma_load_4d(void* dst, const void* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4, %5, %6}], [%2];\n"
               :: "r"(tessera_shared_address(dst)), "l"(map), "r"(tessera_shared_address(bar)),
                  "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tessera_tma_load_5d(void* dst, const void* map, int c0, int c1, int c2, int c3, int c4, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
               :: "r"(tessera_shared_address(dst)), "l"(map), "r"(tessera_shared_address(bar)),
                  "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // TESSERA_EMULATED_PTX

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(TESSERA_EMULATED_PTX)
// D (64 x N) += A x B with A K-major from a descriptor or (`rs`) from four
// registers, B from a descriptor: MnMajorB 1 for a K x N tile (N
// contiguous), 0 for an N x K tile (K contiguous). `wgmma_wrapper` writes
// the instances a kernel uses.
template <int N, int MnMajorB> __device__ void tessera_wgmma_bf16(float* d, uint64_t a, uint64_t b);
template <int N, int MnMajorB> __device__ void tessera_wgmma_f16(float* d, uint64_t a, uint64_t b);
template <int N, int MnMajorB>
__device__ void tessera_wgmma_rs_bf16(float* d, const uint32_t* a, uint64_t b);
template <int N, int MnMajorB>
__device__ void tessera_wgmma_rs_f16(float* d, const uint32_t* a, uint64_t b);
// A wgmma shared-memory matrix descriptor with the 128-byte swizzle: start
// address, leading and stride byte offsets (each >> 4), swizzle mode 1.
__device__ __forceinline__ uint64_t tessera_wgmma_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  return uint64_t((tessera_shared_address(p) & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16)
       | (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
#endif

#endif  // TESSERA_PTX_CUH
