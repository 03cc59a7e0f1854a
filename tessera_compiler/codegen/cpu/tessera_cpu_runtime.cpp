// The runtime part of every emitted CPU kernel library: functions with
// external linkage, defined once per library (the OpenMP team that runs the
// kernels' grids, the engine's GEMM on it, the row gathers, box copies and
// range checks). The same in every library, so build.py compiles it once
// (at install: build.prebuild_cpu_runtime) and links its object.
#include <pthread.h>

#include "tessera_cpu.h"
#ifdef _OPENMP
#include <omp.h>
#endif
// Set in a child forked from a process whose team ran: libgomp's threads
// are not in the child, and its first parallel region there would hang,
// so a forked child runs every launch on its one thread.
static int tessera_forked = 0;
static void tessera_mark_forked() { tessera_forked = 1; }
__attribute__((constructor)) static void tessera_watch_forks() {
  pthread_atfork(nullptr, nullptr, tessera_mark_forked);
}
static inline int tessera_team_size(int threads) { return tessera_forked ? 1 : threads; }
// [begin, end) of `grid` items for this member of an OpenMP team: contiguous
// slices in thread order, the same split for every call.
static inline void tessera_thread_slice(int64_t grid, int64_t* begin, int64_t* end) {
#ifdef _OPENMP
  const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
#else
  const int64_t t = 0, n = 1;
#endif
  *begin = grid * t / n;
  *end = grid * (t + 1) / n;
}
// pids [0, grid) of a kernel (its NAME__slice) in slices over the team.
typedef void (*tessera_slice_fn)(void**, int64_t, int64_t);
extern "C" void tessera_parallel(tessera_slice_fn slice, void** args, int64_t grid, int threads) {
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t begin, end;
    tessera_thread_slice(grid, &begin, &end);
    slice(args, begin, end);
  }
}
// The CPU engine's f32 GEMMs (the library routine matmul): numpy's OpenBLAS
// sgemm, called one-threaded by each member of the same OpenMP team the
// kernels use (the calling thread is one of them). One pool: OpenBLAS's own
// workers would spin on the core the team needs after every GEMM (a team
// member then waits a scheduler slice).
typedef void (*tessera_sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float*,
                                 int64_t, const float*, int64_t, float, float*, int64_t);
typedef int (*tessera_blas_threads_fn)(int);
static tessera_sgemm_fn tessera_sgemm;
static tessera_blas_threads_fn tessera_blas_threads;
// cblas_sgemm with 64-bit integers and openblas_set_num_threads_local.
extern "C" void tessera_use_sgemm(void* sgemm, void* set_threads) {
  tessera_sgemm = (tessera_sgemm_fn)sgemm;
  tessera_blas_threads = (tessera_blas_threads_fn)set_threads;
}
// C[M,N] = op(A) op(B), row-major, op = transpose where asked (A stored
// K x M, B stored N x K). C is cut into `pieces` blocks of rows (of columns
// unless `by_rows`), each one sgemm call; the pieces depend on the shape
// only, so the bits do not depend on the team's size (sgemm's own depend on
// M and N). Every block packs the operand it does not cut again.
//
// With an `epilogue` (a kernel's NAME__slice and its arguments; by rows
// only), the team member that wrote a block of rows runs the kernel's
// programs covering them (`rows` rows each) while they are in cache; where
// a block is not whole programs, the team runs them all after a barrier.
static void tessera_gemm_blocks(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                const float* a, const float* b, float* c, int64_t pieces,
                                int threads, bool by_rows, tessera_slice_fn epilogue, void** args,
                                int64_t rows) {
  const int64_t extent = by_rows ? M : N;
  const int64_t piece = ((extent + pieces - 1) / pieces + 15) / 16 * 16;
  const int64_t count = (extent + piece - 1) / piece;
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const int ta = trans_a ? 112 : 111, tb = trans_b ? 112 : 111;  // CblasTrans, CblasNoTrans
  const bool per_block = epilogue && piece % rows == 0;
  // openblas_set_num_threads_local sets OpenBLAS's one (process-wide)
  // thread count and returns the previous: set here, before the team
  // starts, and restored after it, never by two threads at once.
  const int saved = tessera_blas_threads(1);
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t first, last;
    tessera_thread_slice(count, &first, &last);
    for (int64_t p = first; p < last; ++p) {
      const int64_t lo = p * piece, n = extent - lo < piece ? extent - lo : piece;
      if (by_rows)
        tessera_sgemm(101, ta, tb, n, N, K, 1.0f, a + (trans_a ? lo : lo * K), lda, b, ldb, 0.0f,
                      c + lo * N, N);
      else
        tessera_sgemm(101, ta, tb, M, n, K, 1.0f, a, lda, b + (trans_b ? lo * K : lo), ldb, 0.0f,
                      c + lo, N);
      if (per_block) epilogue(args, lo / rows, (lo + n) / rows);
    }
    if (epilogue && !per_block) {
#pragma omp barrier
      tessera_thread_slice(M / rows, &first, &last);
      epilogue(args, first, last);
    }
  }
  tessera_blas_threads(saved);
}
// Rows when N < M, or N = M with B not transposed; else columns (packing
// B^T costs more: ~15% less time for 256 x 256 x 128 with B^T cut by columns).
extern "C" void tessera_gemm_f32(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                 const float* a, const float* b, float* c, int64_t pieces,
                                 int threads) {
  tessera_gemm_blocks(trans_a, trans_b, M, N, K, a, b, c, pieces, threads,
                      M > N || (M == N && !trans_b), nullptr, nullptr, 1);
}
// The GEMM by rows, then `epilogue` over the programs of [0, M / rows) as
// each block of rows is written (tessera-fuse-gemm-epilogues).
extern "C" void tessera_gemm_f32_then(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                      const float* a, const float* b, float* c, int64_t pieces,
                                      int threads, tessera_slice_fn epilogue, void** args,
                                      int64_t rows) {
  tessera_gemm_blocks(trans_a, trans_b, M, N, K, a, b, c, pieces, threads, true, epilogue, args,
                      rows);
}
// Embedding rows on a table's block (a vocab-parallel rank's: global rows
// [first, first + rows) of `total`), float32 rows of `width`, int32 ids,
// both called as (rows in, ids, n, width, first, total, rows out, rows).
// Both return the position of the first id outside [0, total) having
// written nothing, else -1. Why in C: the host's numpy versions take ~10
// calls each (masks, sort, reduceat), ~0.3 ms of a w128 dp x tp rank's step.
//
// out[i] = table[ids[i] - first]; -0.0 where another rank holds the row
// (x + -0.0 == x for every x, so the sum over the ranks is exactly the row).
extern "C" int64_t tessera_gather_rows_f32(const float* table, const int32_t* ids, int64_t n,
                                           int64_t width, int64_t first, int64_t total, float* out,
                                           int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= total) return i;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (int64_t)ids[i] - first;
    float* o = out + i * width;
    if (r >= 0 && r < rows) {
      std::memcpy(o, table + r * width, width * sizeof(float));
    } else {
      for (int64_t j = 0; j < width; ++j) o[j] = -0.0f;
    }
  }
  return -1;
}
// out[r] = the sum of the updates[i] with ids[i] - first == r, 0 for rows no
// id names, summed as the host's stable sort and np.add.reduceat sum a run:
// the first update plus the in-order sum of the others (the same bits for
// every split of the table).
extern "C" int64_t tessera_scatter_add_rows_f32(const float* updates, const int32_t* ids, int64_t n,
                                                int64_t width, int64_t first, int64_t total,
                                                float* out, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= total) return i;
  std::memset(out, 0, rows * width * sizeof(float));
  // Per row: -2 no update yet, -1 one (in out), k >= 0 the others' sum is
  // rest[k * width, (k + 1) * width).
  std::vector<int64_t> slot(rows, -2);
  std::vector<float> rest;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (int64_t)ids[i] - first;
    if (r < 0 || r >= rows) continue;
    const float* u = updates + i * width;
    if (slot[r] == -2) {
      std::memcpy(out + r * width, u, width * sizeof(float));
      slot[r] = -1;
    } else if (slot[r] == -1) {
      slot[r] = (int64_t)rest.size() / width;
      rest.insert(rest.end(), u, u + width);
    } else {
      float* t = rest.data() + slot[r] * width;
      for (int64_t j = 0; j < width; ++j) t[j] += u[j];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (slot[r] < 0) continue;
    float* o = out + r * width;
    const float* t = rest.data() + slot[r] * width;
    for (int64_t j = 0; j < width; ++j) o[j] += t[j];
  }
  return -1;
}
// The library's transpose, slice and pad as one call: dst = src over a box
// of `extent` (rank <= 8) with byte strides per side, a pad first zeroing
// the `zero` bytes of its whole destination from `zero_from`. The innermost
// dimension is one memcpy where both sides are contiguous along it; the
// box's rows (every index but the innermost) are split over the team. Why in
// C: numpy copies a transposed view on one thread, and a w512 step's 32 head
// transposes (4 MiB each) took 17 ms.
static void tessera_copy_rows(const char* src, char* dst, int64_t rank, const int64_t* extent,
                              const int64_t* src_strides, const int64_t* dst_strides, int64_t item,
                              int64_t first, int64_t last) {
  const int64_t inner = extent[rank - 1], s_in = src_strides[rank - 1],
                d_in = dst_strides[rank - 1];
  int64_t index[8] = {0};
  for (int64_t d = rank - 2, r = first; d >= 0; --d) {  // the first row's index
    index[d] = r % extent[d];
    r /= extent[d];
    src += index[d] * src_strides[d];
    dst += index[d] * dst_strides[d];
  }
  for (int64_t r = first; r < last; ++r) {
    if (s_in == item && d_in == item)
      std::memcpy(dst, src, inner * item);
    else if (item == 4)  // a constant size: one move
      for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * d_in, src + j * s_in, 4);
    else
      for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * d_in, src + j * s_in, item);
    for (int64_t d = rank - 2; d >= 0; --d) {  // the next row
      src += src_strides[d];
      dst += dst_strides[d];
      if (++index[d] < extent[d]) break;
      src -= extent[d] * src_strides[d];
      dst -= extent[d] * dst_strides[d];
      index[d] = 0;
    }
  }
}
extern "C" void tessera_copy_box(const char* src, char* dst, int64_t rank, const int64_t* extent,
                                 const int64_t* src_strides, const int64_t* dst_strides,
                                 int64_t item, char* zero_from, int64_t zero, int threads) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < rank; ++d) rows *= extent[d];
  if (tessera_team_size(threads) <= 1) {  // no team to start for a small copy
    if (zero) std::memset(zero_from, 0, zero);
    tessera_copy_rows(src, dst, rank, extent, src_strides, dst_strides, item, 0, rows);
    return;
  }
#pragma omp parallel num_threads(tessera_team_size(threads))
  {
    int64_t first, last;
    if (zero) {
      tessera_thread_slice(zero, &first, &last);
      std::memset(zero_from + first, 0, last - first);
#pragma omp barrier
    }
    tessera_thread_slice(rows, &first, &last);
    tessera_copy_rows(src, dst, rank, extent, src_strides, dst_strides, item, first, last);
  }
}
// A value check (tgraph.check_range; the CPU engine's `check_range`): the
// position of the first of x[0, n) outside [low, high) that is not
// `allowed`, else -1. In U's arithmetic (mod 2^bits) an element is in range
// iff x - low < high - low, one comparison; the caller passes 0 < high -
// low < 2^bits (and `allowed` = low for none). Whole blocks of 4096 are
// OR-reduced first (a loop with no exit and a constant trip count, which
// GCC's -O2 vectorizes) and only a block holding a failing element is
// searched; the tail is searched directly.
template <typename T, typename U>
static int64_t tessera_first_outside(const T* x, int64_t n, int64_t low, int64_t high,
                                     int64_t allowed) {
  const U lo = (U)low, span = (U)((U)high - (U)low);
  const T other = (T)allowed;
  int64_t start = 0;
  for (; start + 4096 <= n; start += 4096) {
    const T* b = x + start;
    U bad = 0;
    for (int64_t i = 0; i < 4096; ++i) bad |= (U)((U)((U)b[i] - lo) >= span) & (U)(b[i] != other);
    if (bad) break;
  }
  for (int64_t i = start; i < n; ++i)
    if ((U)((U)x[i] - lo) >= span && x[i] != other) return i;
  return -1;
}
extern "C" int64_t tessera_check_range_i32(const int32_t* x, int64_t n, int64_t low, int64_t high,
                                           int64_t allowed) {
  return tessera_first_outside<int32_t, uint32_t>(x, n, low, high, allowed);
}
extern "C" int64_t tessera_check_range_i64(const int64_t* x, int64_t n, int64_t low, int64_t high,
                                           int64_t allowed) {
  return tessera_first_outside<int64_t, uint64_t>(x, n, low, high, allowed);
}
