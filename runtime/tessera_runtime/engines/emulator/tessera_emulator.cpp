// The emulator's machinery: compiled once per cache (an emulated/*.o) and
// linked with each kernel source, which sees only tessera_emulator.h and
// tessera_emulator_api.h. How it runs a block (fibers, waits completing
// asynchronous work as late as the PTX ISA allows) is told in
// cuda_emulator.py's docstring.
#include "tessera_emulator.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

dim3 blockIdx, blockDim, gridDim;
dim3* tessera_thread_index;
alignas(1024) unsigned char tessera_smem[TESSERA_SMEM_BYTES];
// Seconds a wait (barrier, mbarrier, NVSHMEM signal) lasts before the
// emulator gives up on it: TESSERA_EMULATOR_WAIT_S, set when the library loads.
static double tessera_wait_s = 120.0;
extern "C" void tessera_emulator_wait(double seconds) { tessera_wait_s = seconds; }

// Asynchronous work of one thread, in commit groups (oldest first) plus the
// group still open; wait<N> completes all but the N newest committed groups.
template <typename Op> struct AsyncGroups {
  std::deque<std::vector<Op>> committed;
  std::vector<Op> open;
  void commit() {
    committed.push_back(std::move(open));
    open.clear();
  }
  template <typename Run> void wait(size_t n, Run run) {
    while (committed.size() > n) {
      for (Op& op : committed.front()) run(op);
      committed.pop_front();
    }
  }
};
struct CpAsync {
  void* dst;
  const void* src;
};
// A wgmma in flight (see issue_wgmma).
struct Wgmma {
  float* d;
  uint64_t a, b;
  int n;
  bool bf16, mn_major_b;
  const uint32_t* a_regs;
  uint32_t a_issued[4];
  float a_rows[2][16];
};

// Every CUDA thread of a block is a fiber (a ucontext with its own stack)
// on the launching OS thread, run round-robin until it waits: a barrier or
// a wait switches to the next fiber. 256 OS threads per block waking each
// other through futexes on 2 cores cost 4.4x more per barrier.
struct Warp;
struct CudaThread {
  ucontext_t context;
  dim3 index;
  int lane = 0;
  Warp* warp = nullptr;
  bool done = false;
  AsyncGroups<CpAsync> cp_async;
  AsyncGroups<Wgmma> wgmma_async;
  std::vector<uint32_t> unfenced;  // shared-memory chunks it has to fence (see below)
};
static CudaThread* tessera_me;  // the fiber running now
static ucontext_t tessera_scheduler;
// Set by whatever lets a waiting fiber go on (an arrival, a completed
// wait, a fiber's end); a round of the block's fibers without it only
// waits for other processes (NVSHMEM signals), and the scheduler sleeps.
static bool tessera_progress;

static void tessera_yield() { swapcontext(&tessera_me->context, &tessera_scheduler); }
// Yields until `done()`; after tessera_wait_s seconds `fail()` reports
// and the process stops (a GPU would hang).
template <typename Done, typename Fail> static void tessera_wait_until(Done done, Fail fail) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(tessera_wait_s)) {
      fail();
      std::abort();
    }
    tessera_yield();
  }
  tessera_progress = true;
}

// A barrier of `expected` fibers; one that ends drops out of its block's.
struct FiberBarrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
  void complete_if_full() {
    if (arrived && arrived >= expected) {
      arrived = 0;
      ++generation;
    }
  }
  void drop() {
    --expected;
    complete_if_full();
    tessera_progress = true;
  }
  void arrive_and_wait(const char* what) {
    const uint64_t phase = generation;
    ++arrived;
    complete_if_full();
    tessera_progress = true;
    tessera_wait_until([&] { return generation != phase; },
                       [&] {
                         std::fprintf(stderr,
                                      "%s emulation: thread %u of block %u waited %.0f s (%u of %u "
                                      "arrivals)\n",
                                      what, threadIdx.x, blockIdx.x, tessera_wait_s, arrived,
                                      expected);
                       });
  }
};

struct Warp {
  FiberBarrier bar;
  const void* addr[32];
  uint32_t a[32][4], b[32][2];
  uint64_t word[32];
};
static FiberBarrier block_barrier;

void tessera_emu_syncthreads() { block_barrier.arrive_and_wait("__syncthreads"); }
void tessera_emu_syncwarp() { tessera_me->warp->bar.arrive_and_wait("__syncwarp"); }

// Named barriers (bar.sync / bar.arrive ID, COUNT; ID 0 is __syncthreads'):
// a barrier completes when COUNT threads have arrived; bar.sync arrives and
// waits for that, bar.arrive only arrives. A wait nobody completes (within
// tessera_wait_s), or arrivals still pending when the block ends, stop the process with a
// message.
struct NamedBarrier {
  unsigned arrived = 0, count = 0;
  uint64_t generation = 0;
};
static NamedBarrier named_barriers[16];
static uint64_t named_arrive(unsigned id, unsigned count) {  // the phase it joined
  if (id == 0 || id >= 16 || count == 0 || count % 32 || count > blockDim.x) {
    std::fprintf(stderr, "named barrier emulation: barrier %u of %u threads in a block of %u\n", id,
                 count, blockDim.x);
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
  tessera_progress = true;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.generation;
  }
  return phase;
}
void tessera_emu_named_barrier_arrive(unsigned id, unsigned count) { named_arrive(id, count); }
void tessera_emu_named_barrier_sync(unsigned id, unsigned count) {
  const uint64_t phase = named_arrive(id, count);
  tessera_wait_until([&] { return named_barriers[id].generation != phase; },
                     [&] {
                       std::fprintf(
                           stderr,
                           "named barrier emulation: thread %u waited %.0f s on barrier %u (%u of "
                           "%u arrivals)\n",
                           threadIdx.x, tessera_wait_s, id, named_barriers[id].arrived, count);
                     });
}

uint64_t tessera_emu_shfl_xor(uint64_t bits, int mask) {
  Warp& w = *tessera_me->warp;
  const int lane = tessera_me->lane;
  w.word[lane] = bits;
  w.bar.arrive_and_wait("__shfl_xor_sync");
  bits = w.word[lane ^ mask];
  w.bar.arrive_and_wait("__shfl_xor_sync");
  return bits;
}

// cp.async writes shared memory through the generic proxy; wgmma reads its
// operands through the async proxy, which sees those writes only after the
// writing thread's fence.proxy.async (then a barrier orders them for the
// other threads). Each 16-byte chunk of shared memory records the thread
// (+1) whose landed copy to it is not fenced yet, and each thread the
// chunks it has to fence; wgmma checks its operands' chunks at issue.
static uint16_t smem_unfenced[sizeof(tessera_smem) / 16];
void tessera_emu_fence_proxy_async() {
  for (uint32_t chunk : tessera_me->unfenced)
    if (smem_unfenced[chunk] == uint16_t(threadIdx.x + 1)) smem_unfenced[chunk] = 0;
  tessera_me->unfenced.clear();
}

// The destination reads as NaN from issue until the copy lands at its wait:
// a read of a slot too early, or a refill of a slot still being read, shows.
void tessera_emu_cp_async16(void* smem, const void* gmem) {
  std::memset(smem, 0xff, 16);
  tessera_me->cp_async.open.push_back({smem, gmem});
}
void tessera_emu_cp_async_commit() { tessera_me->cp_async.commit(); }
void tessera_emu_cp_async_wait(int n) {
  tessera_me->cp_async.wait(size_t(n), [](CpAsync& c) {
    std::memcpy(c.dst, c.src, 16);
    const uint32_t chunk = uint32_t(static_cast<unsigned char*>(c.dst) - tessera_smem) / 16;
    smem_unfenced[chunk] = uint16_t(threadIdx.x + 1);
    tessera_me->unfenced.push_back(chunk);
  });
}

static inline uint32_t pack16(uint16_t lo, uint16_t hi) {
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// ldmatrix.m8n8.x4.b16: lanes 8j..8j+7 give the row addresses of matrix j;
// lane t receives, in register j, row t/4, elements 2(t%4) and 2(t%4)+1 of
// matrix j (transposed: column t/4, rows 2(t%4) and 2(t%4)+1).
void tessera_emu_ldmatrix(uint32_t* r, const void* smem, bool trans) {
  Warp& w = *tessera_me->warp;
  w.addr[tessera_me->lane] = smem;
  w.bar.arrive_and_wait("warp instruction");
  for (int j = 0; j < 4; ++j) {
    uint16_t e[2];
    for (int i = 0; i < 2; ++i) {
      const int row = trans ? 2 * (tessera_me->lane % 4) + i : tessera_me->lane / 4;
      const int col = trans ? tessera_me->lane / 4 : 2 * (tessera_me->lane % 4) + i;
      e[i] = static_cast<const uint16_t*>(w.addr[8 * j + row])[col];
    }
    r[j] = pack16(e[0], e[1]);
  }
  w.bar.arrive_and_wait("warp instruction");
}

static inline float half_bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    uint32_t b = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v = exp == 0    ? std::ldexp(float(man), -24)
            : exp == 31 ? (man ? NAN : INFINITY)
                        : std::ldexp(float(man | 1024), int(exp) - 25);
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
void tessera_emu_mma(float* d, const uint32_t* a, const uint32_t* b, bool bf16) {
  Warp& w = *tessera_me->warp;
  for (int i = 0; i < 4; ++i) w.a[tessera_me->lane][i] = a[i];
  for (int i = 0; i < 2; ++i) w.b[tessera_me->lane][i] = b[i];
  w.bar.arrive_and_wait("warp instruction");
  float A[16][16], B[16][8];
  warp_a_tile(w, bf16, A);
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      B[2 * t + h][g] = half_bits_to_float(uint16_t(w.b[l][0] >> (16 * h)), bf16);
      B[2 * t + 8 + h][g] = half_bits_to_float(uint16_t(w.b[l][1] >> (16 * h)), bf16);
    }
  }
  w.bar.arrive_and_wait("warp instruction");
  const int g = tessera_me->lane / 4, t = tessera_me->lane % 4;
  for (int q = 0; q < 4; ++q) {
    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    float s = d[q];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[q] = s;
  }
}

// wgmma.mma_async.m64nNk16.f32: A K-major in shared memory or in
// registers, B in shared memory, N-major (a K x N tile, `mn_major`) or
// K-major (an N x K tile). A matrix descriptor holds the start address,
// leading and stride byte offsets (LBO, SBO; bits 0-13, 16-29, 32-45, each
// >> 4), the base offset (49-51) and the swizzle mode (62-63). The 128-byte
// swizzle's canonical layouts, in bf16 elements with T = 8:
//   K-major:  ((8,m),(T,2k)):((8T,SBO),(1,T))        (row mn, column k)
//   MN-major: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))   (column mn, row k)
// after which address bits 4-6 are XORed with bits 7-9 (Swizzle<3,4,3>).
static uint32_t wgmma_address(uint64_t desc, int mn, int k, bool mn_major) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 62) != 1 || ((desc >> 49) & 7)) {
    std::fprintf(stderr,
                 "wgmma emulation: only the 128-byte swizzle with base offset 0 is "
                 "emulated (descriptor %#llx)\n",
                 (unsigned long long)desc);
    std::abort();
  }
  uint32_t at = mn_major ? start + (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128
                         : start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2;
  return at ^ ((at >> 7) & 7) << 4;
}
static float wgmma_element(uint64_t desc, int mn, int k, bool mn_major, bool bf16) {
  uint16_t h;
  std::memcpy(&h, tessera_smem + wgmma_address(desc, mn, k, mn_major), 2);
  return half_bits_to_float(h, bf16);
}
// A wgmma operand element the async proxy may not see yet (see smem_unfenced).
static void check_fenced(uint64_t desc, int mn, int k, bool mn_major, const char* operand) {
  const uint32_t at = wgmma_address(desc, mn, k, mn_major);
  if (const uint16_t writer = smem_unfenced[at / 16]) {
    std::fprintf(stderr,
                 "wgmma emulation: thread %u's wgmma reads its %s operand at shared "
                 "byte %u, which thread %u's cp.async wrote with no fence.proxy.async since: "
                 "the async proxy need not see it\n",
                 threadIdx.x, operand, at, writer - 1);
    std::abort();
  }
}

// D (64 x N, f32) += A (64 x 16) x B (16 x N) for the warpgroup: thread t of
// the group holds, for n-block j, d[4j + q] at row 16(t/32) + (t%32)/4 + 8(q/2),
// column 8j + 2(t%4) + q%2 (the mma.sync accumulator layout, per warp). With
// A in registers, warp w holds rows 16w..16w+15 as mma.sync's A fragment;
// the thread's rows (g, g + 8) are gathered from its quad at issue, and its
// own registers must still hold them when the operation completes.
static void run_wgmma(Wgmma& op) {
  const int t = threadIdx.x % 128, row0 = 16 * (t / 32) + (t % 32) / 4, col0 = 2 * (t % 4);
  if (op.a_regs && std::memcmp(op.a_regs, op.a_issued, sizeof op.a_issued)) {
    std::fprintf(stderr,
                 "wgmma emulation: thread %u changed the A registers of a wgmma before "
                 "waiting for it\n",
                 threadIdx.x);
    std::abort();
  }
  for (int j = 0; j < op.n / 8; ++j)
    for (int q = 0; q < 4; ++q) {
      const int row = row0 + 8 * (q >> 1), col = 8 * j + col0 + (q & 1);
      float s = op.d[4 * j + q];
      for (int k = 0; k < 16; ++k)
        s += (op.a_regs ? op.a_rows[q >> 1][k] : wgmma_element(op.a, row, k, false, op.bf16)) *
             wgmma_element(op.b, col, k, op.mn_major_b, op.bf16);
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
    Warp& w = *tessera_me->warp;
    for (int i = 0; i < 4; ++i) w.a[tessera_me->lane][i] = op.a_issued[i] = op.a_regs[i];
    w.bar.arrive_and_wait("warp instruction");
    float A[16][16];
    warp_a_tile(w, op.bf16, A);
    w.bar.arrive_and_wait("warp instruction");
    std::memcpy(op.a_rows[0], A[tessera_me->lane / 4], sizeof op.a_rows[0]);
    std::memcpy(op.a_rows[1], A[tessera_me->lane / 4 + 8], sizeof op.a_rows[1]);
  }
  tessera_me->wgmma_async.open.push_back(op);
}
void tessera_emu_wgmma(float* d, uint64_t a, const uint32_t* a_regs, uint64_t b, int n, bool bf16,
                       bool mn_major_b) {
  issue_wgmma({d, a, b, n, bf16, mn_major_b, a_regs, {}, {}});
}
void tessera_emu_wgmma_commit() { tessera_me->wgmma_async.commit(); }
void tessera_emu_wgmma_wait(int n) { tessera_me->wgmma_async.wait(size_t(n), run_wgmma); }

// The tensor memory accelerator. A tensor map here is the emulator's own
// record (EmulatedTensorMap, written by `emulated_tensor_map`): the global
// tensor's base, rank, sizes and byte strides (innermost first) and the box
// one copy moves. A copy writes the box densely (innermost fastest) from
// its destination, out-of-bounds elements as 0, with the 128-byte swizzle
// applied to the shared-memory address (bits 4-6 ^= bits 7-9).
struct EmulatedTensorMap {
  uint64_t base;
  uint32_t rank, elt_bytes;
  uint64_t dims[5], strides[5];
  uint32_t box[5];
};
static_assert(sizeof(EmulatedTensorMap) <= 128, "a tensor map is 128 bytes");
struct TmaCopy {
  void* dst;
  const EmulatedTensorMap* map;
  int c[5];
};
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
    size_t rest = e, src = 0;
    bool inside = true;
    for (uint32_t d = 0; d < m.rank; ++d) {
      const int64_t at = int64_t(copy.c[d]) + int64_t(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && at >= 0 && uint64_t(at) < m.dims[d];
      src += uint64_t(at) * m.strides[d];
    }
    uint32_t to = dst + uint32_t(e * m.elt_bytes);
    to ^= ((to >> 7) & 7) << 4;
    smem_unfenced[to / 16] = 0;  // the async proxy's own write
    if (inside)
      std::memcpy(tessera_smem + to, reinterpret_cast<const unsigned char*>(m.base) + src,
                  m.elt_bytes);
    else
      std::memset(tessera_smem + to, 0, m.elt_bytes);
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
struct Mbarrier {
  int expected = 0, pending = 0;
  unsigned phase = 0;
  int64_t tx = 0;
  std::vector<TmaCopy> copies;
};
static std::map<const void*, Mbarrier> mbarriers;  // this block's, by address
static Mbarrier& mbarrier_at(const void* bar, const char* use) {
  auto it = mbarriers.find(bar);
  if (it == mbarriers.end()) {
    std::fprintf(stderr, "mbarrier emulation: %s on shared byte %u before mbarrier.init\n", use,
                 tessera_shared_address(bar));
    std::abort();
  }
  return it->second;
}
void tessera_emu_mbarrier_init(uint64_t* bar, unsigned count) {
  Mbarrier& b = mbarriers[bar];
  b = Mbarrier{};
  b.expected = b.pending = int(count);
}
static void arrive(Mbarrier& b) {
  tessera_progress = true;
  if (--b.pending < 0) {
    std::fprintf(stderr, "mbarrier emulation: more arrivals than the barrier's count\n");
    std::abort();
  }
}
void tessera_emu_mbarrier_expect_tx(uint64_t* bar, unsigned bytes) {
  Mbarrier& b = mbarrier_at(bar, "arrive.expect_tx");
  b.tx += bytes;
  arrive(b);
}
void tessera_emu_mbarrier_arrive(uint64_t* bar) { arrive(mbarrier_at(bar, "arrive")); }
void tessera_emu_tma_load(void* dst, const void* map, int rank, const int* c, uint64_t* bar) {
  Mbarrier& b = mbarrier_at(bar, "cp.async.bulk.tensor");
  TmaCopy copy{dst, static_cast<const EmulatedTensorMap*>(map), {}};
  if (uint32_t(rank) != copy.map->rank) {
    std::fprintf(stderr, "TMA emulation: %d coordinates for a rank-%u tensor map\n", rank,
                 copy.map->rank);
    std::abort();
  }
  std::copy(c, c + rank, copy.c);
  std::memset(dst, 0xff, box_bytes(*copy.map));
  b.copies.push_back(copy);
}
void tessera_emu_mbarrier_wait(uint64_t* bar, unsigned parity) {
  int64_t issued = 0;
  tessera_wait_until(
      [&] {
        Mbarrier& b = mbarrier_at(bar, "try_wait.parity");
        if ((b.phase & 1) != (parity & 1)) return true;  // that phase has completed
        issued = 0;
        for (const TmaCopy& c : b.copies) issued += int64_t(box_bytes(*c.map));
        if (issued > b.tx) {
          std::fprintf(stderr,
                       "mbarrier emulation: copies of %lld bytes on a phase that announced "
                       "%lld\n",
                       (long long)issued, (long long)b.tx);
          std::abort();
        }
        // Complete once every arrival is in and the copies cover the bytes
        // announced (the issuing thread may still be issuing them).
        if (b.pending != 0 || issued != b.tx) return false;
        for (const TmaCopy& c : b.copies) run_tma(c);
        b.copies.clear();
        b.tx = 0;
        ++b.phase;
        b.pending = b.expected;
        return true;
      },
      [&] {
        std::fprintf(stderr,
                     "mbarrier emulation: thread %u waited %.0f s for phase parity %u of "
                     "the barrier at shared byte %u: %d arrivals missing, %lld of %lld bytes "
                     "issued\n",
                     threadIdx.x, tessera_wait_s, parity, tessera_shared_address(bar),
                     mbarriers[bar].pending, (long long)issued, (long long)mbarriers[bar].tx);
      });
}

// NVSHMEM's device API for kernels that include nvshmem.h (the API header's
// nvshmem_*). PEs are the processes of the job; the symmetric heap is one
// shared file mapping that every PE maps whole, PE p's heap at `base + p *
// heap_bytes`, so a local symmetric address becomes a peer's by moving it
// p - my_pe heaps over (`SymmetricHeap` in emulated_cuda.py sets it up). A
// put or a get is a copy by one thread of the block; signals are atomics on
// the shared mapping; a wait yields to the block's other threads until the
// word changes, and gives up (aborting the process with a message) after
// TESSERA_EMULATOR_WAIT_S seconds (default 120) rather than hang.
static unsigned char* tessera_heap_base = nullptr;
static uint64_t tessera_heap_bytes = 0;
static int tessera_pe = 0, tessera_npes = 1;

extern "C" void tessera_nvshmem_attach(void* base, uint64_t heap_bytes, int pe, int npes) {
  tessera_heap_base = static_cast<unsigned char*>(base);
  tessera_heap_bytes = heap_bytes;
  tessera_pe = pe;
  tessera_npes = npes;
}

static unsigned char* tessera_on_pe(const void* local, int pe) {
  const unsigned char* mine = tessera_heap_base + uint64_t(tessera_pe) * tessera_heap_bytes;
  const unsigned char* at = static_cast<const unsigned char*>(local);
  if (!tessera_heap_base || at < mine || at >= mine + tessera_heap_bytes || pe < 0 ||
      pe >= tessera_npes) {
    std::fprintf(stderr,
                 "NVSHMEM emulation: PE %d addressed PE %d of %d at %p, which is not "
                 "on its symmetric heap\n",
                 tessera_pe, pe, tessera_npes, local);
    std::abort();
  }
  return tessera_heap_base + uint64_t(pe) * tessera_heap_bytes + (at - mine);
}

int tessera_emu_my_pe() { return tessera_pe; }
int tessera_emu_n_pes() { return tessera_npes; }
void tessera_emu_putmem(void* dest, const void* src, size_t bytes, int pe) {
  if (threadIdx.x == 0) std::memcpy(tessera_on_pe(dest, pe), src, bytes);
}
void tessera_emu_getmem(void* dest, const void* src, size_t bytes, int pe) {
  if (threadIdx.x == 0) std::memcpy(dest, tessera_on_pe(src, pe), bytes);
}
void tessera_emu_memory_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
void tessera_emu_signal_op(uint64_t* sig, uint64_t value, int op, int pe) {
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(tessera_on_pe(sig, pe)));
  if (op == NVSHMEM_SIGNAL_SET)
    word.store(value, std::memory_order_release);
  else
    word.fetch_add(value, std::memory_order_acq_rel);
}
// A wait yields to the block's other fibers; while all of them wait on
// peers the scheduler sleeps between rounds.
uint64_t tessera_emu_signal_wait_until(uint64_t* sig, int cmp, uint64_t value) {
  std::atomic_ref<uint64_t> word(*sig);
  uint64_t v = 0;
  tessera_wait_until(
      [&] {
        v = word.load(std::memory_order_acquire);
        return cmp == NVSHMEM_CMP_EQ   ? v == value
               : cmp == NVSHMEM_CMP_NE ? v != value
               : cmp == NVSHMEM_CMP_GT ? v > value
               : cmp == NVSHMEM_CMP_GE ? v >= value
               : cmp == NVSHMEM_CMP_LT ? v < value
                                       : v <= value;
      },
      [&] {
        std::fprintf(stderr,
                     "NVSHMEM emulation: PE %d (block %u) waited %.0f s for signal word "
                     "%p (value %llu, waiting for %d against %llu); a peer never signalled\n",
                     tessera_pe, blockIdx.x, tessera_wait_s, (void*)sig, (unsigned long long)v, cmp,
                     (unsigned long long)value);
      });
  return v;
}

// Fiber stacks, kept for the next launch: each is mapped on demand with a
// guard page below it, so a kernel overflowing one faults instead of
// overwriting its neighbour.
static constexpr size_t kFiberStackBytes = 512 * 1024, kGuardBytes = 4096;
static std::vector<unsigned char*> fiber_stacks;
static unsigned char* fiber_stack(unsigned t) {
  while (fiber_stacks.size() <= t) {
    void* p = mmap(nullptr, kFiberStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "CUDA emulation: no memory for thread %zu's stack\n",
                   fiber_stacks.size());
      std::abort();
    }
    mprotect(p, kGuardBytes, PROT_NONE);
    fiber_stacks.push_back(static_cast<unsigned char*>(p) + kGuardBytes);
  }
  return fiber_stacks[t];
}

static void* kernel_fn;
static int kernel_nargs;
static void** kernel_args;
// The kernel called with kernel_args[0, N): a function of N pointers.
template <size_t... I> static void call_kernel(std::index_sequence<I...>) {
  using Kernel = void (*)(decltype((void)I, (void*)nullptr)...);
  reinterpret_cast<Kernel>(kernel_fn)(kernel_args[I]...);
}
template <size_t... N> static void call_kernel_of(int nargs, std::index_sequence<N...>) {
  ((nargs == int(N) + 1 ? call_kernel(std::make_index_sequence<N + 1>{}) : void()), ...);
}
// The most buffers a kernel may take (cuda_emulator.py asks).
static constexpr int kMaxArgs = 128;
extern "C" int tessera_emulator_max_args() { return kMaxArgs; }
static void fiber_main() {
  call_kernel_of(kernel_nargs, std::make_index_sequence<kMaxArgs>{});
  // An exited thread no longer holds up the block's barriers.
  block_barrier.drop();
  tessera_me->done = true;
}  // returns to the scheduler (uc_link)

// Thread t's context, to start at fiber_main on its own stack. A function
// of its own: getcontext returns twice (to GCC), which would keep the
// caller's loop indices from registers (-Wclobbered).
__attribute__((noinline)) static void start_fiber(CudaThread& th, unsigned t) {
  getcontext(&th.context);
  th.context.uc_stack.ss_sp = fiber_stack(t);
  th.context.uc_stack.ss_size = kFiberStackBytes;
  th.context.uc_link = &tessera_scheduler;
  makecontext(&th.context, fiber_main, 0);
}

extern "C" int tessera_emulate(void* fn, int nargs, void** launch_args, const unsigned* grid,
                               unsigned threads) {
  if (threads % 32 && threads > 32) return 1;  // partial warps only for tiny blocks
  gridDim = dim3{grid[0], grid[1], grid[2]};
  blockDim = dim3{threads, 1, 1};
  kernel_fn = fn;
  kernel_nargs = nargs;
  kernel_args = launch_args;
  const unsigned nwarps = (threads + 31) / 32;
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        blockIdx = dim3{x, y, z};
        block_barrier = FiberBarrier{threads};
        std::vector<Warp> warps(nwarps);
        for (unsigned w = 0; w < nwarps; ++w)
          warps[w].bar.expected = std::min(32u, threads - 32 * w);
        std::memset(tessera_smem, 0xff, sizeof(tessera_smem));  // no stale data by luck
        std::memset(smem_unfenced, 0, sizeof(smem_unfenced));
        mbarriers.clear();
        for (auto& b : named_barriers) b = NamedBarrier{};
        std::vector<CudaThread> block(threads);
        for (unsigned t = 0; t < threads; ++t) {
          CudaThread& th = block[t];
          th.index = dim3{t, 0, 0};
          th.lane = int(t % 32);
          th.warp = &warps[t / 32];
          start_fiber(th, t);
        }
        // Round-robin until every thread has ended; a round in which none
        // moved (all wait on other processes) sleeps a little, then longer.
        unsigned live = threads, idle_rounds = 0;
        while (live) {
          tessera_progress = false;
          for (CudaThread& th : block) {
            if (th.done) continue;
            tessera_me = &th;
            tessera_thread_index = &th.index;
            swapcontext(&tessera_scheduler, &th.context);
            if (th.done) --live;
          }
          if (tessera_progress)
            idle_rounds = 0;
          else if (++idle_rounds < 64)
            std::this_thread::yield();
          else
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        for (unsigned id = 0; id < 16; ++id)
          if (named_barriers[id].arrived) {
            std::fprintf(stderr,
                         "named barrier emulation: barrier %u has %u of %u arrivals "
                         "pending at the end of block (%u, %u, %u)\n",
                         id, named_barriers[id].arrived, named_barriers[id].count, x, y, z);
            std::abort();
          }
      }
  return 0;
}
