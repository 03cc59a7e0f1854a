"""Runs generated CUDA kernels on the CPU, for testing without a GPU.

The CUDA source the emitter produces is compiled as C++ together with a shim
that gives every CUDA thread of a block its own `std::thread`:
`__syncthreads()` is a barrier over the block (named barriers, `bar.sync` /
`bar.arrive` with a thread count, too), the warp-level instructions
the tensor-core main loop uses (`ldmatrix`, `mma.sync.m16n8k16`) and
`__shfl_xor_sync` exchange data between the 32 threads of a warp through a
barrier. Each instruction is implemented from its definition in the PTX
ISA (fragment layouts, wgmma's shared-memory matrix descriptors and
128-byte swizzle included), independently of the emitter, so a kernel that
computes the right answer here indexes its tiles, fragments, swizzled
buffers and pipeline stages correctly.

Asynchronous operations complete as LATE as the PTX ISA allows, not at
issue: a thread's `cp.async` copies happen when it waits for their commit
group (`cp.async.wait_group`; until then the destination holds NaNs), and
its `wgmma.mma_async` operations read shared memory and update its
accumulator registers when it waits for their group (`wgmma.wait_group`). A kernel that reuses a pipeline slot
before the wait that protects it therefore computes with the wrong data
here, as it could on a GPU. The emulator says nothing about speed, cannot
check proxy fences (`fence.proxy.async`), and cannot catch races that a
real GPU's timing would expose beyond what the waits and barriers order.

    lib = EmulatedKernels(cuda_source)
    lib.launch("kernel_name", [a, b, out], grid=(4,), block=(256,), shared_bytes=56832)

The `cuda-emulated` engine (`emulated_cuda.py`) runs whole GPU bundles this way.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path


import numpy as np

from .. import env
from ..env import cache_dir
from . import EngineError
from .tensor_maps import TensorMaps, emulated_tensor_map


_SHIM = r"""
// CPU emulation of the CUDA features Tessera's generated kernels use.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define TESSERA_EMULATED_PTX 1

struct dim3 { unsigned x = 1, y = 1, z = 1; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
alignas(1024) unsigned char tessera_smem[232448];
// Seconds a wait (mbarrier, named barrier, NVSHMEM signal) spins before the
// emulator gives up on it: TESSERA_EMULATOR_WAIT_S, set when the library loads.
static double tessera_wait_s = 120.0;
extern "C" void tessera_emulator_wait(double seconds) { tessera_wait_s = seconds; }

using std::exp; using std::tanh; using std::log; using std::sqrt;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

struct Warp {
  std::barrier<> bar{32};
  const void* addr[32];
  uint32_t a[32][4], b[32][2];
  uint64_t word[32];
};
static std::barrier<>* block_barrier;
static Warp* warps;
static thread_local int lane_id;
static thread_local Warp* my_warp;

inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { my_warp->bar.arrive_and_wait(); }

// Named barriers (bar.sync / bar.arrive ID, COUNT; ID 0 is __syncthreads'):
// a barrier completes when COUNT threads have arrived; bar.sync arrives and
// waits for that, bar.arrive only arrives. A wait nobody completes (within
// tessera_wait_s), or arrivals still pending when the block ends, stop the process with a
// message.
struct NamedBarrier { unsigned arrived = 0, count = 0; uint64_t generation = 0; };
static std::mutex named_lock;
static std::condition_variable named_done;
static NamedBarrier named_barriers[16];
static uint64_t named_arrive_locked(unsigned id, unsigned count) {   // the phase it joined
  if (id == 0 || id >= 16 || count == 0 || count % 32 || count > blockDim.x) {
    std::fprintf(stderr, "named barrier emulation: barrier %u of %u threads in a block of %u\n",
                 id, count, blockDim.x);
    std::abort();
  }
  NamedBarrier& b = named_barriers[id];
  if (b.arrived && b.count != count) {
    std::fprintf(stderr, "named barrier emulation: barrier %u used with %u and %u threads\n", id,
                 b.count, count);
    std::abort();
  }
  b.count = count;
  const uint64_t phase = b.generation;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.generation;
    named_done.notify_all();
  }
  return phase;
}
inline void tessera_named_barrier_arrive(unsigned id, unsigned count) {
  std::lock_guard<std::mutex> g(named_lock);
  named_arrive_locked(id, count);
}
inline void tessera_named_barrier_sync(unsigned id, unsigned count) {
  std::unique_lock<std::mutex> g(named_lock);
  const uint64_t phase = named_arrive_locked(id, count);
  if (!named_done.wait_for(g, std::chrono::duration<double>(tessera_wait_s),
                           [&] { return named_barriers[id].generation != phase; })) {
    std::fprintf(stderr, "named barrier emulation: thread %u waited %.0f s on barrier %u (%u of "
                 "%u arrivals)\n", threadIdx.x, tessera_wait_s, id, named_barriers[id].arrived,
                 count);
    std::abort();
  }
}

template <typename T> T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  uint64_t bits = 0; std::memcpy(&bits, &v, sizeof(T));
  my_warp->word[lane_id] = bits;
  my_warp->bar.arrive_and_wait();
  bits = my_warp->word[lane_id ^ mask];
  my_warp->bar.arrive_and_wait();
  T r; std::memcpy(&r, &bits, sizeof(T)); return r;
}

// Asynchronous work of one thread, in commit groups (oldest first) plus the
// group still open; wait<N> completes all but the N newest committed groups.
template <typename Op> struct AsyncGroups {
  std::deque<std::vector<Op>> committed;
  std::vector<Op> open;
  void commit() { committed.push_back(std::move(open)); open.clear(); }
  template <typename Run> void wait(size_t n, Run run) {
    while (committed.size() > n) {
      for (Op& op : committed.front()) run(op);
      committed.pop_front();
    }
  }
};

// cp.async writes shared memory through the generic proxy; wgmma reads its
// operands through the async proxy, which sees those writes only after the
// writing thread's fence.proxy.async (then a barrier orders them for the
// other threads). Each 16-byte chunk of shared memory records the thread
// (+1) whose landed copy to it is not fenced yet, and each thread the
// chunks it has to fence; wgmma checks its operands' chunks at issue.
static std::atomic<uint16_t> smem_unfenced[sizeof(tessera_smem) / 16];
static thread_local std::vector<uint32_t> my_unfenced;
inline void tessera_fence_proxy_async() {
  for (uint32_t chunk : my_unfenced) {
    uint16_t me = uint16_t(threadIdx.x + 1);
    smem_unfenced[chunk].compare_exchange_strong(me, 0);
  }
  my_unfenced.clear();
}

struct CpAsync { void* dst; const void* src; };
static thread_local AsyncGroups<CpAsync> cp_async;
// The destination reads as NaN from issue until the copy lands at its wait:
// a read of a slot too early, or a refill of a slot still being read, shows.
inline void tessera_cp_async16(void* smem, const void* gmem) {
  std::memset(smem, 0xff, 16);
  cp_async.open.push_back({smem, gmem});
}
inline void tessera_cp_async_commit() { cp_async.commit(); }
template <int N> inline void tessera_cp_async_wait() {
  cp_async.wait(N, [](CpAsync& c) {
    std::memcpy(c.dst, c.src, 16);
    const uint32_t chunk = uint32_t(static_cast<unsigned char*>(c.dst) - tessera_smem) / 16;
    smem_unfenced[chunk].store(uint16_t(threadIdx.x + 1));
    my_unfenced.push_back(chunk);
  });
}

static inline uint32_t pack16(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// ldmatrix.m8n8.x4.b16: lanes 8j..8j+7 give the row addresses of matrix j;
// lane t receives, in register j, row t/4, elements 2(t%4) and 2(t%4)+1 of
// matrix j (transposed: column t/4, rows 2(t%4) and 2(t%4)+1).
static void ldmatrix(uint32_t* r, const void* smem, bool trans) {
  Warp& w = *my_warp;
  w.addr[lane_id] = smem;
  w.bar.arrive_and_wait();
  for (int j = 0; j < 4; ++j) {
    uint16_t e[2];
    for (int i = 0; i < 2; ++i) {
      const int row = trans ? 2 * (lane_id % 4) + i : lane_id / 4;
      const int col = trans ? lane_id / 4 : 2 * (lane_id % 4) + i;
      e[i] = static_cast<const uint16_t*>(w.addr[8 * j + row])[col];
    }
    r[j] = pack16(e[0], e[1]);
  }
  w.bar.arrive_and_wait();
}
inline void tessera_ldmatrix_x4(uint32_t* r, const void* s) { ldmatrix(r, s, false); }
inline void tessera_ldmatrix_x4_trans(uint32_t* r, const void* s) { ldmatrix(r, s, true); }

static inline float half_bits_to_float(uint16_t h, bool bf16) {
  if (bf16) { uint32_t b = uint32_t(h) << 16; float f; std::memcpy(&f, &b, 4); return f; }
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v = exp == 0 ? std::ldexp(float(man), -24)
          : exp == 31 ? (man ? NAN : INFINITY) : std::ldexp(float(man | 1024), int(exp) - 25);
  return sign ? -v : v;
}

// mma.sync.m16n8k16.row.col.f32: with g = lane/4, t = lane%4, lane holds
// A regs {(g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, B regs
// {(k 2t.., n g), (k 2t+8.., n g)}, and C/D {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
// The 16 x 16 A operand whose fragments the warp's lanes put in `w.a`.
static void warp_a_tile(const Warp& w, bool bf16, float A[16][16]) {
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = half_bits_to_float(uint16_t(w.a[l][0] >> (16 * h)), bf16);
      A[g + 8][2 * t + h] = half_bits_to_float(uint16_t(w.a[l][1] >> (16 * h)), bf16);
      A[g][2 * t + 8 + h] = half_bits_to_float(uint16_t(w.a[l][2] >> (16 * h)), bf16);
      A[g + 8][2 * t + 8 + h] = half_bits_to_float(uint16_t(w.a[l][3] >> (16 * h)), bf16);
    }
  }
}
static void mma(float* d, const uint32_t* a, const uint32_t* b, bool bf16) {
  Warp& w = *my_warp;
  for (int i = 0; i < 4; ++i) w.a[lane_id][i] = a[i];
  for (int i = 0; i < 2; ++i) w.b[lane_id][i] = b[i];
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  warp_a_tile(w, bf16, A);
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      B[2 * t + h][g] = half_bits_to_float(uint16_t(w.b[l][0] >> (16 * h)), bf16);
      B[2 * t + 8 + h][g] = half_bits_to_float(uint16_t(w.b[l][1] >> (16 * h)), bf16);
    }
  }
  w.bar.arrive_and_wait();
  const int g = lane_id / 4, t = lane_id % 4;
  for (int q = 0; q < 4; ++q) {
    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    float s = d[q];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[q] = s;
  }
}
inline void tessera_mma_bf16(float* d, const uint32_t* a, const uint32_t* b) { mma(d, a, b, true); }
inline void tessera_mma_f16(float* d, const uint32_t* a, const uint32_t* b) { mma(d, a, b, false); }

// wgmma.mma_async.m64nNk16.f32: A K-major in shared memory or in
// registers, B in shared memory, N-major (a K x N tile, `mn_major`) or
// K-major (an N x K tile). A matrix descriptor holds the start address,
// leading and stride byte offsets (LBO, SBO; bits 0-13, 16-29, 32-45, each
// >> 4), the base offset (49-51) and the swizzle mode (62-63). The 128-byte
// swizzle's canonical layouts, in bf16 elements with T = 8:
//   K-major:  ((8,m),(T,2k)):((8T,SBO),(1,T))        (row mn, column k)
//   MN-major: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))   (column mn, row k)
// after which address bits 4-6 are XORed with bits 7-9 (Swizzle<3,4,3>).
inline uint32_t tessera_shared_address(const void* p) {
  return uint32_t(static_cast<const unsigned char*>(p) - tessera_smem);
}
static uint32_t wgmma_address(uint64_t desc, int mn, int k, bool mn_major) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 62) != 1 || ((desc >> 49) & 7)) {
    std::fprintf(stderr, "wgmma emulation: only the 128-byte swizzle with base offset 0 is "
                 "emulated (descriptor %#llx)\n", (unsigned long long)desc);
    std::abort();
  }
  uint32_t at = mn_major ? start + (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128
                         : start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2;
  return at ^ ((at >> 7) & 7) << 4;
}
static float wgmma_element(uint64_t desc, int mn, int k, bool mn_major, bool bf16) {
  uint16_t h; std::memcpy(&h, tessera_smem + wgmma_address(desc, mn, k, mn_major), 2);
  return half_bits_to_float(h, bf16);
}
// A wgmma operand element the async proxy may not see yet (see smem_unfenced).
static void check_fenced(uint64_t desc, int mn, int k, bool mn_major, const char* operand) {
  const uint32_t at = wgmma_address(desc, mn, k, mn_major);
  if (const uint16_t writer = smem_unfenced[at / 16].load()) {
    std::fprintf(stderr, "wgmma emulation: thread %u's wgmma reads its %s operand at shared "
                 "byte %u, which thread %u's cp.async wrote with no fence.proxy.async since: "
                 "the async proxy need not see it\n", threadIdx.x, operand, at, writer - 1);
    std::abort();
  }
}

// D (64 x N, f32) += A (64 x 16) x B (16 x N) for the warpgroup: thread t of
// the group holds, for n-block j, d[4j + q] at row 16(t/32) + (t%32)/4 + 8(q/2),
// column 8j + 2(t%4) + q%2 (the mma.sync accumulator layout, per warp). With
// A in registers, warp w holds rows 16w..16w+15 as mma.sync's A fragment;
// the thread's rows (g, g + 8) are gathered from its quad at issue, and its
// own registers must still hold them when the operation completes.
struct Wgmma {
  float* d; uint64_t a, b; int n; bool bf16, mn_major_b;
  const uint32_t* a_regs; uint32_t a_issued[4]; float a_rows[2][16];
};
static thread_local AsyncGroups<Wgmma> wgmma_async;
static void run_wgmma(Wgmma& op) {
  const int t = threadIdx.x % 128, row0 = 16 * (t / 32) + (t % 32) / 4, col0 = 2 * (t % 4);
  if (op.a_regs && std::memcmp(op.a_regs, op.a_issued, sizeof op.a_issued)) {
    std::fprintf(stderr, "wgmma emulation: thread %u changed the A registers of a wgmma before "
                 "waiting for it\n", threadIdx.x);
    std::abort();
  }
  for (int j = 0; j < op.n / 8; ++j)
    for (int q = 0; q < 4; ++q) {
      const int row = row0 + 8 * (q >> 1), col = 8 * j + col0 + (q & 1);
      float s = op.d[4 * j + q];
      for (int k = 0; k < 16; ++k)
        s += (op.a_regs ? op.a_rows[q >> 1][k] : wgmma_element(op.a, row, k, false, op.bf16))
             * wgmma_element(op.b, col, k, op.mn_major_b, op.bf16);
      op.d[4 * j + q] = s;
    }
}
static void issue_wgmma(Wgmma op) {
  if (blockDim.x % 128) {
    std::fprintf(stderr, "wgmma emulation: a block of %u threads is not whole warpgroups\n",
                 blockDim.x);
    std::abort();
  }
  // The operand elements this thread's part of the result reads.
  const int t = threadIdx.x % 128, row0 = 16 * (t / 32) + (t % 32) / 4, col0 = 2 * (t % 4);
  for (int k = 0; k < 16; ++k) {
    for (int h = 0; h < 2 && !op.a_regs; ++h) check_fenced(op.a, row0 + 8 * h, k, false, "A");
    for (int j = 0; j < op.n / 8; ++j)
      for (int h = 0; h < 2; ++h) check_fenced(op.b, 8 * j + col0 + h, k, op.mn_major_b, "B");
  }
  if (op.a_regs) {
    Warp& w = *my_warp;
    for (int i = 0; i < 4; ++i) w.a[lane_id][i] = op.a_issued[i] = op.a_regs[i];
    w.bar.arrive_and_wait();
    float A[16][16];
    warp_a_tile(w, op.bf16, A);
    w.bar.arrive_and_wait();
    std::memcpy(op.a_rows[0], A[lane_id / 4], sizeof op.a_rows[0]);
    std::memcpy(op.a_rows[1], A[lane_id / 4 + 8], sizeof op.a_rows[1]);
  }
  wgmma_async.open.push_back(op);
}
template <int N, int MnMajorB> inline void tessera_wgmma_bf16(float* d, uint64_t a, uint64_t b) {
  issue_wgmma({d, a, b, N, true, MnMajorB != 0, nullptr, {}, {}});
}
template <int N, int MnMajorB> inline void tessera_wgmma_f16(float* d, uint64_t a, uint64_t b) {
  issue_wgmma({d, a, b, N, false, MnMajorB != 0, nullptr, {}, {}});
}
template <int N, int MnMajorB>
inline void tessera_wgmma_rs_bf16(float* d, const uint32_t* a, uint64_t b) {
  issue_wgmma({d, 0, b, N, true, MnMajorB != 0, a, {}, {}});
}
template <int N, int MnMajorB>
inline void tessera_wgmma_rs_f16(float* d, const uint32_t* a, uint64_t b) {
  issue_wgmma({d, 0, b, N, false, MnMajorB != 0, a, {}, {}});
}
inline void tessera_wgmma_fence() {}
template <int N> inline void tessera_wgmma_fence_operands(float*) {}
inline void tessera_wgmma_commit() { wgmma_async.commit(); }
template <int N> inline void tessera_wgmma_wait() { wgmma_async.wait(N, run_wgmma); }

// The tensor memory accelerator. A tensor map here is the emulator's own
// record (EmulatedTensorMap, written by `emulated_tensor_map`): the global
// tensor's base, rank, sizes and byte strides (innermost first) and the box
// one copy moves. A copy writes the box densely (innermost fastest) from
// its destination, out-of-bounds elements as 0, with the 128-byte swizzle
// applied to the shared-memory address (bits 4-6 ^= bits 7-9).
struct EmulatedTensorMap {
  uint64_t base; uint32_t rank, elt_bytes; uint64_t dims[5], strides[5]; uint32_t box[5];
};
static_assert(sizeof(EmulatedTensorMap) <= 128, "a tensor map is 128 bytes");
struct TmaCopy { void* dst; const EmulatedTensorMap* map; int c[5]; };
static size_t box_bytes(const EmulatedTensorMap& m) {
  size_t n = m.elt_bytes;
  for (uint32_t d = 0; d < m.rank; ++d) n *= m.box[d];
  return n;
}
static size_t run_tma(const TmaCopy& copy) {
  const EmulatedTensorMap& m = *copy.map;
  const size_t n = box_bytes(m) / m.elt_bytes;
  const uint32_t dst = tessera_shared_address(copy.dst);
  for (size_t e = 0; e < n; ++e) {
    size_t rest = e, src = 0; bool inside = true;
    for (uint32_t d = 0; d < m.rank; ++d) {
      const int64_t at = int64_t(copy.c[d]) + int64_t(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && at >= 0 && uint64_t(at) < m.dims[d];
      src += uint64_t(at) * m.strides[d];
    }
    uint32_t to = dst + uint32_t(e * m.elt_bytes);
    to ^= ((to >> 7) & 7) << 4;
    smem_unfenced[to / 16].store(0);          // the async proxy's own write
    if (inside) std::memcpy(tessera_smem + to, reinterpret_cast<const unsigned char*>(m.base) + src,
                            m.elt_bytes);
    else std::memset(tessera_smem + to, 0, m.elt_bytes);
  }
  return n * m.elt_bytes;
}

// mbarriers: a phase completes when its expected arrivals have all arrived
// and the bytes they announced (expect_tx) have landed. Copies land when a
// thread first waits on a phase whose arrivals are in and whose copies
// cover the announced bytes (as late as PTX allows; their destinations
// read as NaN until then). Copies of more bytes than announced, a barrier
// used before its init, or a wait nobody satisfies (tessera_wait_s) stop the
// process with a message instead of hanging as a GPU would.
struct Mbarrier { int expected = 0, pending = 0; unsigned phase = 0; int64_t tx = 0;
                  std::vector<TmaCopy> copies; };
static std::mutex mbarrier_lock;
static std::map<const void*, Mbarrier> mbarriers;     // this block's, by address
static Mbarrier& mbarrier_at(const void* bar, const char* use) {
  auto it = mbarriers.find(bar);
  if (it == mbarriers.end()) {
    std::fprintf(stderr, "mbarrier emulation: %s on shared byte %u before mbarrier.init\n", use,
                 tessera_shared_address(bar));
    std::abort();
  }
  return it->second;
}
inline void tessera_mbarrier_init(uint64_t* bar, unsigned count) {
  std::lock_guard<std::mutex> g(mbarrier_lock);
  Mbarrier& b = mbarriers[bar];
  b = Mbarrier{}; b.expected = b.pending = int(count);
}
inline void tessera_fence_barrier_init() {}
static void arrive_locked(Mbarrier& b) {     // with mbarrier_lock held
  if (--b.pending < 0) {
    std::fprintf(stderr, "mbarrier emulation: more arrivals than the barrier's count\n");
    std::abort();
  }
}
inline void tessera_mbarrier_expect_tx(uint64_t* bar, unsigned bytes) {
  std::lock_guard<std::mutex> g(mbarrier_lock);
  Mbarrier& b = mbarrier_at(bar, "arrive.expect_tx");
  b.tx += bytes;
  arrive_locked(b);
}
inline void tessera_mbarrier_arrive(uint64_t* bar) {
  std::lock_guard<std::mutex> g(mbarrier_lock);
  arrive_locked(mbarrier_at(bar, "arrive"));
}
static void tma_load(void* dst, const void* map, std::initializer_list<int> c, uint64_t* bar) {
  std::lock_guard<std::mutex> g(mbarrier_lock);
  Mbarrier& b = mbarrier_at(bar, "cp.async.bulk.tensor");
  TmaCopy copy{dst, static_cast<const EmulatedTensorMap*>(map), {}};
  if (c.size() != copy.map->rank) {
    std::fprintf(stderr, "TMA emulation: %zu coordinates for a rank-%u tensor map\n", c.size(),
                 copy.map->rank);
    std::abort();
  }
  std::copy(c.begin(), c.end(), copy.c);
  std::memset(dst, 0xff, box_bytes(*copy.map));
  b.copies.push_back(copy);
}
inline void tessera_tma_load_2d(void* d, const void* m, int c0, int c1, uint64_t* b) {
  tma_load(d, m, {c0, c1}, b);
}
inline void tessera_tma_load_3d(void* d, const void* m, int c0, int c1, int c2, uint64_t* b) {
  tma_load(d, m, {c0, c1, c2}, b);
}
inline void tessera_tma_load_4d(void* d, const void* m, int c0, int c1, int c2, int c3, uint64_t* b) {
  tma_load(d, m, {c0, c1, c2, c3}, b);
}
inline void tessera_tma_load_5d(void* d, const void* m, int c0, int c1, int c2, int c3, int c4,
                                uint64_t* b) {
  tma_load(d, m, {c0, c1, c2, c3, c4}, b);
}
// The register budget is the hardware's business.
template <int N> inline void tessera_setmaxnreg_inc() {}
template <int N> inline void tessera_setmaxnreg_dec() {}
inline void tessera_mbarrier_wait(uint64_t* bar, unsigned parity) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mbarrier_lock);
      Mbarrier& b = mbarrier_at(bar, "try_wait.parity");
      if ((b.phase & 1) != (parity & 1)) return;      // that phase has completed
      int64_t issued = 0;
      for (const TmaCopy& c : b.copies) issued += int64_t(box_bytes(*c.map));
      if (issued > b.tx) {
        std::fprintf(stderr, "mbarrier emulation: copies of %lld bytes on a phase that announced "
                     "%lld\n", (long long)issued, (long long)b.tx);
        std::abort();
      }
      // Complete once every arrival is in and the copies cover the bytes
      // announced (the issuing thread may still be issuing them).
      if (b.pending == 0 && issued == b.tx) {
        for (const TmaCopy& c : b.copies) run_tma(c);
        b.copies.clear();
        b.tx = 0; ++b.phase; b.pending = b.expected;
        return;
      }
      if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(tessera_wait_s)) {
        std::fprintf(stderr, "mbarrier emulation: thread %u waited %.0f s for phase parity %u of "
                     "the barrier at shared byte %u: %d arrivals missing, %lld of %lld bytes "
                     "issued\n", threadIdx.x, tessera_wait_s, parity, tessera_shared_address(bar),
                     b.pending,
                     (long long)issued, (long long)b.tx);
        std::abort();
      }
    }
    std::this_thread::yield();
  }
}
"""

# NVSHMEM's device API for kernels that include nvshmem.h. PEs are the
# processes of the job; the symmetric heap is one shared file mapping that
# every PE maps whole, PE p's heap at `base + p * heap_bytes`, so a local
# symmetric address becomes a peer's by moving it p - my_pe heaps over
# (`SymmetricHeap` in emulated_cuda.py sets it up). A put or a get is a copy
# by one thread of the block; signals are atomics on the shared mapping; a wait
# spins, and gives up (aborting the process with a message) after
# TESSERA_EMULATOR_WAIT_S seconds (default 120) rather than hang.
_NVSHMEM_SHIM = r"""
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#define NVSHMEM_SIGNAL_SET 0
#define NVSHMEM_SIGNAL_ADD 5
enum { NVSHMEM_CMP_EQ, NVSHMEM_CMP_NE, NVSHMEM_CMP_GT, NVSHMEM_CMP_GE, NVSHMEM_CMP_LT,
       NVSHMEM_CMP_LE };
static unsigned char* tessera_heap_base = nullptr;
static uint64_t tessera_heap_bytes = 0;
static int tessera_pe = 0, tessera_npes = 1;

extern "C" void tessera_nvshmem_attach(void* base, uint64_t heap_bytes, int pe, int npes) {
  tessera_heap_base = static_cast<unsigned char*>(base);
  tessera_heap_bytes = heap_bytes; tessera_pe = pe; tessera_npes = npes;
}

static unsigned char* tessera_on_pe(const void* local, int pe) {
  const unsigned char* mine = tessera_heap_base + uint64_t(tessera_pe) * tessera_heap_bytes;
  const unsigned char* at = static_cast<const unsigned char*>(local);
  if (!tessera_heap_base || at < mine || at >= mine + tessera_heap_bytes || pe < 0 ||
      pe >= tessera_npes) {
    std::fprintf(stderr, "NVSHMEM emulation: PE %d addressed PE %d of %d at %p, which is not "
                 "on its symmetric heap\n", tessera_pe, pe, tessera_npes, local);
    std::abort();
  }
  return tessera_heap_base + uint64_t(pe) * tessera_heap_bytes + (at - mine);
}

inline int nvshmem_my_pe() { return tessera_pe; }
inline int nvshmem_n_pes() { return tessera_npes; }
inline void nvshmemx_putmem_nbi_block(void* dest, const void* src, size_t bytes, int pe) {
  if (threadIdx.x == 0) std::memcpy(tessera_on_pe(dest, pe), src, bytes);
}
inline void nvshmemx_getmem_nbi_block(void* dest, const void* src, size_t bytes, int pe) {
  if (threadIdx.x == 0) std::memcpy(dest, tessera_on_pe(src, pe), bytes);
}
inline void nvshmem_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void nvshmem_quiet() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void nvshmemx_signal_op(uint64_t* sig, uint64_t value, int op, int pe) {
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(tessera_on_pe(sig, pe)));
  if (op == NVSHMEM_SIGNAL_SET) word.store(value, std::memory_order_release);
  else word.fetch_add(value, std::memory_order_acq_rel);
}
inline uint64_t nvshmem_signal_wait_until(uint64_t* sig, int cmp, uint64_t value) {
  std::atomic_ref<uint64_t> word(*sig);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t v = word.load(std::memory_order_acquire);
    const bool done = cmp == NVSHMEM_CMP_EQ ? v == value : cmp == NVSHMEM_CMP_NE ? v != value
                    : cmp == NVSHMEM_CMP_GT ? v > value : cmp == NVSHMEM_CMP_GE ? v >= value
                    : cmp == NVSHMEM_CMP_LT ? v < value : v <= value;
    if (done) return v;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
        > tessera_wait_s) {
      std::fprintf(stderr, "NVSHMEM emulation: PE %d (block %u) waited %.0f s for signal word "
                   "%p (value %llu, waiting for %d against %llu); a peer never signalled\n",
                   tessera_pe, blockIdx.x, tessera_wait_s, (void*)sig, (unsigned long long)v,
                   cmp, (unsigned long long)value);
      std::abort();
    }
    std::this_thread::yield();
  }
}
"""

_LAUNCHER = r"""
extern "C" int tessera_emulate(void* fn, int nargs, void** args, const unsigned* grid,
                               unsigned threads) {
  if (threads % 32 && threads > 32) return 1;       // partial warps only for tiny blocks
  gridDim = dim3{grid[0], grid[1], grid[2]};
  blockDim = dim3{threads, 1, 1};
  const unsigned nwarps = (threads + 31) / 32;
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        std::barrier<> bar(threads);
        std::vector<Warp> ws(nwarps);
        block_barrier = &bar;
        warps = ws.data();
        std::memset(tessera_smem, 0xff, sizeof(tessera_smem));   // no stale data by luck
        for (auto& chunk : smem_unfenced) chunk.store(0);
        mbarriers.clear();
        for (auto& b : named_barriers) b = NamedBarrier{};
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([=] {
            threadIdx = dim3{t, 0, 0};
            blockIdx = dim3{x, y, z};
            lane_id = t % 32;
            my_warp = &warps[t / 32];
            switch (nargs) {
#define TESSERA_CASE(N, ...) case N: reinterpret_cast<void (*)(__VA_ARGS__)>(fn)(TESSERA_ARGS_##N); break;
              TESSERA_CASES
            }
            // An exited thread no longer holds up the block's barriers.
            block_barrier->arrive_and_drop();
          });
        for (auto& th : pool) th.join();
        for (unsigned id = 0; id < 16; ++id)
          if (named_barriers[id].arrived) {
            std::fprintf(stderr, "named barrier emulation: barrier %u has %u of %u arrivals "
                         "pending at the end of block (%u, %u, %u)\n", id,
                         named_barriers[id].arrived, named_barriers[id].count, x, y, z);
            std::abort();
          }
      }
  return 0;
}
"""

_MAX_ARGS = 128


def _launcher() -> str:
    lines = []
    for n in range(1, _MAX_ARGS + 1):
        lines.append(f"#define TESSERA_ARGS_{n} " + ", ".join(f"args[{i}]" for i in range(n)))
    cases = " ".join(f"TESSERA_CASE({n}, {', '.join(['void*'] * n)})" for n in range(1, _MAX_ARGS + 1))
    return "\n".join(lines) + "\n#define TESSERA_CASES " + cases + "\n" + _LAUNCHER


class EmulatedKernels:
    """The kernels of a CUDA source compiled for CPU emulation."""

    def __init__(self, cuda_source: str, defines=()):
        """Compiles `cuda_source` with the emulation shim; `defines` are
        preprocessor names defined first (TESSERA_EMULATE_NO_WGMMA runs
        the plain-sm_90 branch of wgmma kernels)."""
        self.uses_nvshmem = "#include <nvshmem.h>" in cuda_source
        if self.uses_nvshmem:
            cuda_source = _NVSHMEM_SHIM + "\n".join(
                line for line in cuda_source.splitlines()
                if line not in ("#include <nvshmem.h>", "#include <nvshmemx.h>"))
        source = (_SHIM + "".join(f"#define {d} 1\n" for d in defines) + cuda_source + "\n"
                  + _launcher())
        key = hashlib.sha256(source.encode()).hexdigest()[:24]
        target = cache_dir("emulated") / f"{key}.so"
        cxx = env.host_compiler()
        # The ranks of a job build the same library: one compiles while the
        # others sleep on the lock, then load its file (each compiling its
        # own copy at once took N times the g++ time on shared cores).
        with open(target.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                self._compile(cxx, source, target)
        self._lib = ctypes.CDLL(str(target))
        self._tensor_maps: dict = {}
        self._lib.tessera_emulator_wait.argtypes = [ctypes.c_double]
        self._lib.tessera_emulator_wait(env.number("TESSERA_EMULATOR_WAIT_S"))
        self._lib.tessera_emulate.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_void_p),
                                              ctypes.POINTER(ctypes.c_uint), ctypes.c_uint]

    @staticmethod
    def _compile(cxx: str | None, source: str, target: Path) -> None:
        if not cxx:
            raise EngineError("CUDA emulation compiles kernels with a C++20 compiler: "
                              "install g++ or set CXX")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "emulated.cpp"
            src.write_text(source)
            out = Path(tmp) / "emulated.so"
            proc = subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC",
                                   "-pthread", "-w", str(src), "-o", str(out)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise EngineError("compiling CUDA kernels for CPU emulation failed:\n"
                                  + proc.stderr[-4000:])
            os.replace(out, target)

    def attach_symmetric_heap(self, base: int, heap_bytes: int, pe: int, n_pes: int) -> None:
        """Points the NVSHMEM emulation at the job's shared heap mapping
        (address `base`, `heap_bytes` per PE) as PE `pe` of `n_pes`."""
        self._lib.tessera_nvshmem_attach.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                                     ctypes.c_int, ctypes.c_int]
        self._lib.tessera_nvshmem_attach(base, heap_bytes, pe, n_pes)

    def launch(self, kernel: str, buffers, grid, block, shared_bytes: int = 0,
               tensor_maps=()) -> None:
        """Runs `kernel` over `grid` blocks of `block` threads on C-contiguous
        numpy `buffers` (written in place). `tensor_maps` are the launch
        record's (see tensor_maps.py): their buffer is passed last."""
        for i, b in enumerate(buffers):
            if not isinstance(b, np.ndarray) or not b.flags.c_contiguous:
                raise EngineError(f"buffer {i} of kernel {kernel} must be a C-contiguous numpy array")
        if tensor_maps:
            maps = self._tensor_maps.get(kernel)
            if maps is None:       # one per kernel: its maps are cached per argument addresses
                maps = self._tensor_maps[kernel] = TensorMaps(
                    tensor_maps, emulated_tensor_map, lambda a: a.ctypes.data,
                    lambda blob: np.frombuffer(blob, np.uint8).copy())
            buffers = list(buffers) + [maps.for_args(buffers)]
        threads = int(np.prod(block))
        if len(buffers) > _MAX_ARGS:
            raise EngineError(f"kernel {kernel} takes {len(buffers)} buffers; the emulator "
                              f"supports {_MAX_ARGS}")
        fn = ctypes.cast(getattr(self._lib, kernel), ctypes.c_void_p)
        args = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        dims = (ctypes.c_uint * 3)(*(list(grid) + [1, 1, 1])[:3])
        if self._lib.tessera_emulate(fn, len(buffers), args, dims, threads) != 0:
            raise EngineError(f"kernel {kernel}: blocks of {threads} threads must be whole warps")
