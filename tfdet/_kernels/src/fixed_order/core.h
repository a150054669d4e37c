// The shared core: operand views, packing, the micro-kernels of every vector
// path and their choice, the tiling, scratch memory, and the driver that
// computes a batch of products over output tiles (ComputeProducts).
//
// Part of tfdet's fixed-order library: included once, by
// fixed_order_products.cc, into its one translation unit (the library is one
// TensorFlow op library, built from that file; see its header for the bits).
#ifndef TFDET_KERNELS_FIXED_ORDER_CORE_H_
#define TFDET_KERNELS_FIXED_ORDER_CORE_H_

#if defined(__x86_64__) || defined(__i386__)
#define TFDET_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define TFDET_NEON 1
#include <arm_neon.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/matmul_bcast.h"
#include "tensorflow/core/util/work_sharder.h"

#include "../runtime_floor.h"

namespace tfdet {
namespace {

using int64 = std::int64_t;

constexpr int64 kMR = 6;    // rows of the micro-tile
constexpr int64 kNR = 16;   // columns of the micro-tile (two AVX2 vectors)
constexpr int64 kKC = 256;  // K per packed block (cache, never the bits)

// A matrix read through strides: element (r, c) is data[r * rows + c * cols].
struct View {
  const float* data;
  int64 rows;
  int64 cols;
  float at(int64 r, int64 c) const { return data[r * rows + c * cols]; }
};

#ifdef TFDET_X86
// Eight floats from each of eight rows (row i's at rows[i] + x) written as
// their transpose: the rows' x-th floats at dst, the (x + 1)-th at dst +
// ldd, and so on, stored in that order, so that where ldd < 8 each store's
// last floats are overwritten by the next one's.
__attribute__((target("avx2"))) void Transpose8x8(const float* const* rows,
                                                  int64 x, float* dst,
                                                  int64 ldd) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + x);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  __m256 columns[8];
  for (int i = 0; i < 4; ++i) {
    columns[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    columns[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, columns[i]);
}
#endif  // TFDET_X86

bool CpuHasAvx2Fma();

// Whether packing may use the AVX2 transposes: wherever the CPU has AVX2,
// whatever TFDET_FIXED_ORDER_ISA asks of the micro-kernels, since packing
// copies and never computes, so the transposes give the scalar loops'
// panels. They replace a scalar copy per element, which cost as much as a
// recurrent layer's whole product (2-core AMD EPYC Zen 5, 64x512 @
// (128x512)^T: 59 us a call, 41 without packing B) and 15% of a 4096x512 @
// 512x512 product's time (A).
bool PackWithAvx2() {
  static const bool avx2 = CpuHasAvx2Fma();
  return avx2;
}

// Rows [i0, i0 + kMR) of a, columns [k0, k0 + kc), as one panel: for each
// k, the panel's kMR rows side by side (zeros past m).
void PackRows(const View& a, int64 m, int64 i0, int64 k0, int64 kc,
              float* dst) {
  const int64 rows = std::min(kMR, m - i0);
  if (rows < kMR) std::memset(dst, 0, sizeof(float) * kMR * kc);
  if (a.cols == 1) {
    int64 done = 0;  // terms packed by the vector transpose
#ifdef TFDET_X86
    if (PackWithAvx2() && rows == kMR) {
      // Eight rows read, the last twice; each group's eighth store spills
      // two floats into the next term's slots, so the last term (which
      // has no next inside the panel) is left to the loop below.
      const float* sources[8];
      for (int64 i = 0; i < 8; ++i)
        sources[i] = a.data + (i0 + std::min(i, kMR - 1)) * a.rows + k0;
      done = ((kc - 1) / 8) * 8;
      for (int64 x = 0; x < done; x += 8)
        Transpose8x8(sources, x, dst + x * kMR, kMR);
    }
#endif
    for (int64 r = 0; r < rows; ++r) {
      const float* src = a.data + (i0 + r) * a.rows + k0;
      for (int64 x = done; x < kc; ++x) dst[x * kMR + r] = src[x];
    }
  } else {
    int64 x = 0;
    if (a.rows == 1 && rows == kMR && i0 + 8 <= a.cols) {
      // A term's rows lie side by side: eight floats copied a term (a
      // vector's load and store), the next term's copy overwriting the two
      // beyond this one's six; the last term is left to the loop below.
      for (; x + 1 < kc; ++x)
        std::memcpy(dst + x * kMR, a.data + i0 + (k0 + x) * a.cols,
                    8 * sizeof(float));
    }
    for (; x < kc; ++x) {
      const float* src = a.data + i0 * a.rows + (k0 + x) * a.cols;
      for (int64 r = 0; r < rows; ++r) dst[x * kMR + r] = src[r * a.rows];
    }
  }
}

// Columns [j0, j0 + kNR) of b, rows [k0, k0 + kc), as one panel: for each
// k, the panel's kNR columns side by side (zeros past n).
void PackColumns(const View& b, int64 n, int64 j0, int64 k0, int64 kc,
                 float* dst) {
  const int64 cols = std::min(kNR, n - j0);
  if (cols < kNR) std::memset(dst, 0, sizeof(float) * kNR * kc);
  if (b.cols == 1) {
    for (int64 x = 0; x < kc; ++x)
      std::memcpy(dst + x * kNR, b.data + (k0 + x) * b.rows + j0,
                  sizeof(float) * cols);
    return;
  }
  int64 done = 0;  // terms packed by the vector transpose
#ifdef TFDET_X86
  if (PackWithAvx2() && b.rows == 1 && cols == kNR) {
    // Columns read along memory (b transposed, as dA = dC @ B^T reads B).
    const float* sources[kNR];
    for (int64 c = 0; c < kNR; ++c) sources[c] = b.data + (j0 + c) * b.cols + k0;
    done = kc - kc % 8;
    for (int64 x = 0; x < done; x += 8)
      for (int64 c = 0; c < kNR; c += 8)
        Transpose8x8(sources + c, x, dst + x * kNR + c, kNR);
  }
#endif
  for (int64 c = 0; c < cols; ++c) {
    const float* src = b.data + (j0 + c) * b.cols + k0 * b.rows;
    for (int64 x = done; x < kc; ++x) dst[x * kNR + c] = src[x * b.rows];
  }
}

// A zero term for every row that reads none: a run is at most a K block.
constexpr float kZeros[kKC] = {};

// Terms [x, x + run) of kMR rows, from each row's source (kZeros where a
// row reads none), into a panel: for each term, the kMR rows side by side.
// Eight terms at a time by the vector transpose where the CPU has AVX2,
// the rest row by row within a term. The transpose's last store spills
// two floats past its eighth term: into this run's next term, or, where
// `more` (the panel's terms go on after this run, and are packed later),
// past the run; otherwise the last term is left to the loop.
void Interleave(const float* const* sources, int64 run, bool more,
                float* dst) {
  int64 c = 0;
#ifdef TFDET_X86
  if (PackWithAvx2() && run >= 8) {
    const float* eight[8];
    for (int64 i = 0; i < 8; ++i) eight[i] = sources[std::min(i, kMR - 1)];
    const int64 vectors = more ? run : run - 1;
    for (; c + 8 <= vectors; c += 8) Transpose8x8(eight, c, dst + c * kMR, kMR);
  }
#endif
  for (dst += c * kMR; c < run; ++c, dst += kMR)
    for (int64 r = 0; r < kMR; ++r) dst[r] = sources[r][c];
}

// c (kMR x kNR, row stride ldc) = (accumulate ? c : 0) + a-panel x b-panel,
// each element one FMA chain over k in order. The b-panel's rows (one per
// k) lie ldb floats apart: kNR where it was packed, B's own row stride
// where the kernel reads B in place.
using MicroKernel = void (*)(int64 kc, const float* a, const float* b,
                             int64 ldb, float* c, int64 ldc, bool accumulate);

// Two micro-tiles side by side, b0's columns then b1's (kMR x 2 kNR, row
// stride ldc), each element one FMA chain over k in order.
using PairKernel = void (*)(int64 kc, const float* a, const float* b0,
                            const float* b1, int64 ldb, float* c, int64 ldc,
                            bool accumulate);

void ScalarKernel(int64 kc, const float* a, const float* b, int64 ldb,
                  float* c, int64 ldc, bool accumulate) {
  for (int64 r = 0; r < kMR; ++r) {
    for (int64 j = 0; j < kNR; ++j) {
      float acc = accumulate ? c[r * ldc + j] : 0.0f;
      for (int64 k = 0; k < kc; ++k)
        acc = std::fma(a[k * kMR + r], b[k * ldb + j], acc);
      c[r * ldc + j] = acc;
    }
  }
}

#ifdef TFDET_X86
// A micro-tile's sums in AVX2 registers: kMR rows of two 8-lane vectors,
// each lane one element's chain over k in order. The kernels below differ
// only in where they find A's kMR values of each term.
struct Avx2Sums {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;

  __attribute__((target("avx2,fma"), always_inline)) inline void Start(
      const float* c, int64 ldc, bool accumulate) {
    if (accumulate) {
      c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
      c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
      c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
      c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
      c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
      c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    } else {
      c00 = c01 = c10 = c11 = c20 = c21 = _mm256_setzero_ps();
      c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
  }
  // One term: row r's value a_r times b's 16 columns.
  __attribute__((target("avx2,fma"), always_inline)) inline void Add(
      const float* b, float a0, float a1, float a2, float a3, float a4,
      float a5) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = _mm256_loadu_ps(b + 8);
    __m256 x;
    x = _mm256_set1_ps(a0);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_set1_ps(a1);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_set1_ps(a2);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_set1_ps(a3);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_set1_ps(a4);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_set1_ps(a5);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  __attribute__((target("avx2,fma"), always_inline)) inline void Store(
      float* c, int64 ldc) const {
    _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
    _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
  }
};

// The micro-tile over a packed A panel (term k's values at a + k kMR).
__attribute__((target("avx2,fma"))) void Avx2Kernel(int64 kc, const float* a,
                                                     const float* b, int64 ldb,
                                                     float* c, int64 ldc,
                                                     bool accumulate) {
  Avx2Sums sums;
  sums.Start(c, ldc, accumulate);
  for (int64 k = 0; k < kc; ++k, a += kMR, b += ldb)
    sums.Add(b, a[0], a[1], a[2], a[3], a[4], a[5]);
  sums.Store(c, ldc);
}

// The micro-tile with each of A's rows read where it lies, a tap at a time
// (as Avx512PairKernelRows, below, reads them for a pair).
__attribute__((target("avx2,fma"))) void Avx2KernelRows(
    int64 kc, const float* const* rows, int64 first, int64 tap_terms,
    const float* b, int64 ldb, float* c, int64 ldc, bool accumulate) {
  Avx2Sums sums;
  sums.Start(c, ldc, accumulate);
  for (int64 k = 0; k < kc; rows += kMR, first = 0) {
    const int64 run = std::min(tap_terms - first, kc - k);
    const float* a0 = rows[0] + first;
    const float* a1 = rows[1] + first;
    const float* a2 = rows[2] + first;
    const float* a3 = rows[3] + first;
    const float* a4 = rows[4] + first;
    const float* a5 = rows[5] + first;
    for (int64 x = 0; x < run; ++x, b += ldb)
      sums.Add(b, a0[x], a1[x], a2[x], a3[x], a4[x], a5[x]);
    k += run;
  }
  sums.Store(c, ldc);
}

// Two micro-tiles' sums side by side (kMR x 2 kNR), b0's columns then
// b1's, with one AVX-512 vector per micro-tile row: twice the AVX2 kernel's
// work per instruction, each lane still one element's chain over k in
// order, and vfmadd231ps rounds each lane as the AVX2 and scalar fma do.
// The pair kernels below differ only in where they find A's kMR values of
// each term.
struct Avx512PairSums {
  __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;

  __attribute__((target("avx512f"), always_inline)) inline void Start(
      const float* c, int64 ldc, bool accumulate) {
    if (accumulate) {
      c00 = _mm512_loadu_ps(c + 0 * ldc), c01 = _mm512_loadu_ps(c + 0 * ldc + 16);
      c10 = _mm512_loadu_ps(c + 1 * ldc), c11 = _mm512_loadu_ps(c + 1 * ldc + 16);
      c20 = _mm512_loadu_ps(c + 2 * ldc), c21 = _mm512_loadu_ps(c + 2 * ldc + 16);
      c30 = _mm512_loadu_ps(c + 3 * ldc), c31 = _mm512_loadu_ps(c + 3 * ldc + 16);
      c40 = _mm512_loadu_ps(c + 4 * ldc), c41 = _mm512_loadu_ps(c + 4 * ldc + 16);
      c50 = _mm512_loadu_ps(c + 5 * ldc), c51 = _mm512_loadu_ps(c + 5 * ldc + 16);
    } else {
      c00 = c01 = c10 = c11 = c20 = c21 = _mm512_setzero_ps();
      c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_ps();
    }
  }
  // One term: row r's value a_r times b0's and b1's 16 columns.
  __attribute__((target("avx512f"), always_inline)) inline void Add(
      const float* b0, const float* b1, float a0, float a1, float a2,
      float a3, float a4, float a5) {
    const __m512 v0 = _mm512_loadu_ps(b0);
    const __m512 v1 = _mm512_loadu_ps(b1);
    __m512 x;
    x = _mm512_set1_ps(a0);
    c00 = _mm512_fmadd_ps(x, v0, c00), c01 = _mm512_fmadd_ps(x, v1, c01);
    x = _mm512_set1_ps(a1);
    c10 = _mm512_fmadd_ps(x, v0, c10), c11 = _mm512_fmadd_ps(x, v1, c11);
    x = _mm512_set1_ps(a2);
    c20 = _mm512_fmadd_ps(x, v0, c20), c21 = _mm512_fmadd_ps(x, v1, c21);
    x = _mm512_set1_ps(a3);
    c30 = _mm512_fmadd_ps(x, v0, c30), c31 = _mm512_fmadd_ps(x, v1, c31);
    x = _mm512_set1_ps(a4);
    c40 = _mm512_fmadd_ps(x, v0, c40), c41 = _mm512_fmadd_ps(x, v1, c41);
    x = _mm512_set1_ps(a5);
    c50 = _mm512_fmadd_ps(x, v0, c50), c51 = _mm512_fmadd_ps(x, v1, c51);
  }
  __attribute__((target("avx512f"), always_inline)) inline void Store(
      float* c, int64 ldc) const {
    _mm512_storeu_ps(c + 0 * ldc, c00), _mm512_storeu_ps(c + 0 * ldc + 16, c01);
    _mm512_storeu_ps(c + 1 * ldc, c10), _mm512_storeu_ps(c + 1 * ldc + 16, c11);
    _mm512_storeu_ps(c + 2 * ldc, c20), _mm512_storeu_ps(c + 2 * ldc + 16, c21);
    _mm512_storeu_ps(c + 3 * ldc, c30), _mm512_storeu_ps(c + 3 * ldc + 16, c31);
    _mm512_storeu_ps(c + 4 * ldc, c40), _mm512_storeu_ps(c + 4 * ldc + 16, c41);
    _mm512_storeu_ps(c + 5 * ldc, c50), _mm512_storeu_ps(c + 5 * ldc + 16, c51);
  }
};

// The pair over terms whose kMR values lie side by side at `term(k)`.
template <typename Terms>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Pair(
    int64 kc, Terms term, const float* b0, const float* b1, int64 ldb,
    float* c, int64 ldc, bool accumulate) {
  Avx512PairSums sums;
  sums.Start(c, ldc, accumulate);
  for (int64 k = 0; k < kc; ++k) {
    const float* a = term(k);
    sums.Add(b0, b1, a[0], a[1], a[2], a[3], a[4], a[5]);
    b0 += ldb;
    b1 += ldb;
  }
  sums.Store(c, ldc);
}

// The pair kernel over a packed A panel (term k's values at a + k kMR).
__attribute__((target("avx512f"))) void Avx512PairKernel(
    int64 kc, const float* a, const float* b0, const float* b1, int64 ldb,
    float* c, int64 ldc, bool accumulate) {
  Avx512Pair(kc, [a](int64 k) { return a + k * kMR; }, b0, b1, ldb, c, ldc,
             accumulate);
}

// The pair kernel over a packed A panel's first R rows (R < kMR: the last
// micro-row of an m that is no multiple of kMR), straight into C's R rows:
// the full kernel would compute the panel's zero rows too, and its output
// would need a copy (a recurrent step's 32 rows are 5 micro-rows and 2 rows:
// a ninth of its product was rows of zeros). The same chains, lane for lane.
template <int R>
__attribute__((target("avx512f"))) void Avx512PairKernelFewRows(
    int64 kc, const float* a, const float* b0, const float* b1, int64 ldb,
    float* c, int64 ldc, bool accumulate) {
  __m512 s0[R], s1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    s0[r] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    s1[r] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64 k = 0; k < kc; ++k, a += kMR, b0 += ldb, b1 += ldb) {
    const __m512 v0 = _mm512_loadu_ps(b0);
    const __m512 v1 = _mm512_loadu_ps(b1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r]);
      s0[r] = _mm512_fmadd_ps(x, v0, s0[r]);
      s1[r] = _mm512_fmadd_ps(x, v1, s1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, s0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, s1[r]);
  }
}

// The few-rows pair kernel for `rows` (1 to kMR - 1) rows.
void Avx512PairKernelShort(int64 rows, int64 kc, const float* a,
                           const float* b0, const float* b1, int64 ldb,
                           float* c, int64 ldc, bool accumulate) {
  static constexpr PairKernel kByRows[kMR] = {
      nullptr, Avx512PairKernelFewRows<1>, Avx512PairKernelFewRows<2>,
      Avx512PairKernelFewRows<3>, Avx512PairKernelFewRows<4>,
      Avx512PairKernelFewRows<5>};
  kByRows[rows](kc, a, b0, b1, ldb, c, ldc, accumulate);
}

// The pair kernel with A read where it lies: term k's kMR values at a[k] +
// offset (a filter gradient's channels of one pixel at one tap), instead of
// in a packed panel. The same chains, lane for lane.
__attribute__((target("avx512f"))) void Avx512PairKernelIndirect(
    int64 kc, const float* const* a, int64 offset, const float* b0,
    const float* b1, int64 ldb, float* c, int64 ldc, bool accumulate) {
  Avx512Pair(kc, [a, offset](int64 k) { return a[k] + offset; }, b0, b1, ldb,
             c, ldc, accumulate);
}

// The pair kernel with each of A's kMR rows read where it lies, a tap at a
// time: the terms are taps of `tap_terms` each (a convolution's channels
// at one filter tap), row r's terms of the t-th tap a run at rows[t kMR +
// r] (a pixel's channels; zeros where the row reads padding), the first
// tap from its term `first` on. The same chains as the packed panel's,
// term for term, without the copy into it.
__attribute__((target("avx512f"))) void Avx512PairKernelRows(
    int64 kc, const float* const* rows, int64 first, int64 tap_terms,
    const float* b0, const float* b1, int64 ldb, float* c, int64 ldc,
    bool accumulate) {
  Avx512PairSums sums;
  sums.Start(c, ldc, accumulate);
  for (int64 k = 0; k < kc; rows += kMR, first = 0) {
    const int64 run = std::min(tap_terms - first, kc - k);
    const float* a0 = rows[0] + first;
    const float* a1 = rows[1] + first;
    const float* a2 = rows[2] + first;
    const float* a3 = rows[3] + first;
    const float* a4 = rows[4] + first;
    const float* a5 = rows[5] + first;
    for (int64 x = 0; x < run; ++x) {
      sums.Add(b0, b1, a0[x], a1[x], a2[x], a3[x], a4[x], a5[x]);
      b0 += ldb;
      b1 += ldb;
    }
    k += run;
  }
  sums.Store(c, ldc);
}
#endif  // TFDET_X86

#ifdef TFDET_NEON
// The micro-tile in NEON registers: kMR rows of four 4-lane vectors, 24
// accumulators of the 32 registers, one output element per lane.
void NeonKernel(int64 kc, const float* a, const float* b, int64 ldb, float* c,
                int64 ldc, bool accumulate) {
  float32x4_t acc[kMR][4];
  for (int64 r = 0; r < kMR; ++r)
    for (int64 v = 0; v < 4; ++v)
      acc[r][v] = accumulate ? vld1q_f32(c + r * ldc + 4 * v) : vdupq_n_f32(0.0f);
  for (int64 k = 0; k < kc; ++k) {
    const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);
    const float32x4_t b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
    for (int64 r = 0; r < kMR; ++r) {
      const float32x4_t x = vdupq_n_f32(a[r]);
      acc[r][0] = vfmaq_f32(acc[r][0], x, b0);
      acc[r][1] = vfmaq_f32(acc[r][1], x, b1);
      acc[r][2] = vfmaq_f32(acc[r][2], x, b2);
      acc[r][3] = vfmaq_f32(acc[r][3], x, b3);
    }
    a += kMR;
    b += ldb;
  }
  for (int64 r = 0; r < kMR; ++r)
    for (int64 v = 0; v < 4; ++v) vst1q_f32(c + r * ldc + 4 * v, acc[r][v]);
}
#endif  // TFDET_NEON

bool CpuHasAvx2Fma() {
#ifdef TFDET_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// Whether the CPU, and the operating system's saved state, have AVX-512
// (libgcc's check reads both).
bool CpuHasAvx512() {
#ifdef TFDET_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// A pair kernel reading A where it lies (see Avx512PairKernelIndirect).
using IndirectPairKernel = void (*)(int64 kc, const float* const* a,
                                    int64 offset, const float* b0,
                                    const float* b1, int64 ldb, float* c,
                                    int64 ldc, bool accumulate);

// A pair kernel reading each of A's rows where it lies, a tap at a time
// (see Avx512PairKernelRows).
using RowsPairKernel = void (*)(int64 kc, const float* const* rows,
                                int64 first, int64 tap_terms, const float* b0,
                                const float* b1, int64 ldb, float* c,
                                int64 ldc, bool accumulate);

// The same for one micro-tile (see Avx2KernelRows).
using RowsKernel = void (*)(int64 kc, const float* const* rows, int64 first,
                            int64 tap_terms, const float* b, int64 ldb,
                            float* c, int64 ldc, bool accumulate);

// A pair kernel over a packed panel's first `rows` rows (see
// Avx512PairKernelFewRows).
using ShortPairKernel = void (*)(int64 rows, int64 kc, const float* a,
                                 const float* b0, const float* b1, int64 ldb,
                                 float* c, int64 ldc, bool accumulate);

// The micro-kernels of a call: `single` for one micro-tile, and `pair`,
// where the CPU has a wider vector, for two side by side (null otherwise);
// `indirect` and `pair_rows`, the pair reading A in place, and
// `short_pair`, the pair over fewer rows than a micro-tile's (null where
// there is no pair); `single_rows`, the single reading A in place (null
// where the path has none: scalar and NEON pack).
struct MicroKernels {
  MicroKernel single;
  PairKernel pair;
  const char* name;  // "avx512", "avx2", "neon" or "scalar"
  IndirectPairKernel indirect = nullptr;
  RowsPairKernel pair_rows = nullptr;
  ShortPairKernel short_pair = nullptr;
  RowsKernel single_rows = nullptr;
};

// The micro-kernels of this process: the widest vectors the CPU has (AVX-512
// pairs, AVX2), unless TFDET_FIXED_ORDER_ISA asks for a narrower path,
// "avx2" or "scalar" (read at each call, so a test can compare the paths in
// one process). Every path gives the same bits.
MicroKernels ChooseKernels() {
  static const bool avx2 = CpuHasAvx2Fma();
  static const bool avx512 = avx2 && CpuHasAvx512();
  const char* variable = std::getenv("TFDET_FIXED_ORDER_ISA");
  const std::string wanted = variable == nullptr ? "" : variable;
  if (wanted == "scalar") return {ScalarKernel, nullptr, "scalar"};
#ifdef TFDET_X86
  if (avx512 && wanted != "avx2")
    return {Avx2Kernel,           Avx512PairKernel,      "avx512",
            Avx512PairKernelIndirect, Avx512PairKernelRows, Avx512PairKernelShort,
            Avx2KernelRows};
  if (avx2)
    return {Avx2Kernel, nullptr, "avx2", nullptr, nullptr, nullptr,
            Avx2KernelRows};
#endif
#ifdef TFDET_NEON
  return {NeonKernel, nullptr, "neon"};
#endif
  return {ScalarKernel, nullptr, "scalar"};
}

// The output tiles. Each element's chain is the same in any tile, so the
// tiling may follow the pool size and the vector path without changing a
// bit. First the tiles as large as the cache allows (16 x 16 micro-tiles,
// 96 x 256, so packing is amortized over many products), cut evenly until
// each thread has about two. Where that leaves threads idle for a round
// (35 tiles over 16 threads: ResNet-50's 512 x 256 x 2304 products ran at
// 11.7 threads' speed), the tile size of 16 x 16 down to 2 x 2 micro-tiles
// whose rounds over the threads (ceil(tasks / threads)) times its tile's
// cost is least, if that finishes a tenth sooner. A tile's cost: its
// micro-tiles (a pair path computes an odd one in a pair's time) and half
// a micro-tile for each of its micro-rows and micro-columns (packing A's
// rows, a micro-kernel call's start). The tenth keeps the first tiles,
// measured at 2 threads for many releases, wherever they keep the threads
// busy (175 of the zoo's 177 calls at a pool of 2): the cost is a model,
// not measured on many cores; at 2 the least cost everywhere timed 0.99-
// 1.05x the first tiles, within the noise of a shared 2-core AMD EPYC
// Zen 4 (`benchmarks/step_time_ab.py --calls`).
struct Tiling {
  int64 tm, tn, row_tiles, col_tiles;
  Tiling(int64 batch, int64 m, int64 n, int64 threads, bool pairs) {
    const int64 micro_rows = (m + kMR - 1) / kMR;
    const int64 micro_cols = (n + kNR - 1) / kNR;
    int64 rows_each = 0, cols_each = 0;
    // Each side's micro-tiles in tiles of at most `most`, cut evenly: the
    // tiles' count and each one's micro-tiles.
    auto cut = [](int64 micro, int64 most, int64* count, int64* each) {
      *count = std::max<int64>(1, (micro + most - 1) / most);
      *each = (micro + *count - 1) / *count;
    };
    auto finish = [&](int64 rows, int64 cols) {  // in half micro-tiles
      const int64 tasks =
          batch * ((micro_rows + rows - 1) / rows) * ((micro_cols + cols - 1) / cols);
      const int64 paired = pairs ? (cols + 1) / 2 * 2 : cols;
      return (tasks + threads - 1) / threads * (2 * rows * paired + rows + cols);
    };
    cut(micro_rows, 16, &row_tiles, &rows_each);
    cut(micro_cols, 16, &col_tiles, &cols_each);
    while (batch * row_tiles * col_tiles < 2 * threads) {
      // Cut the side whose tiles are longer, down to 2 micro-tiles.
      if (cols_each >= rows_each && cols_each > 2) {
        ++col_tiles;
      } else if (rows_each > 2) {
        ++row_tiles;
      } else {
        break;
      }
      rows_each = (micro_rows + row_tiles - 1) / row_tiles;
      cols_each = (micro_cols + col_tiles - 1) / col_tiles;
    }
    if (threads > 1) {
      const int64 first = finish(rows_each, cols_each);
      int64 best = first;
      for (int64 most_rows = 16; most_rows >= 2; --most_rows) {
        for (int64 most_cols = 16; most_cols >= 2; --most_cols) {
          int64 r, rows, c, cols;
          cut(micro_rows, most_rows, &r, &rows);
          cut(micro_cols, most_cols, &c, &cols);
          const int64 time = finish(rows, cols);
          if (10 * time <= 9 * first && time < best) {
            best = time;
            rows_each = rows, cols_each = cols;
          }
        }
      }
    }
    tm = rows_each * kMR;
    tn = cols_each * kNR;
    row_tiles = (m + tm - 1) / tm;
    col_tiles = (n + tn - 1) / tn;
  }
};

// Memory for packed panels, 64-byte aligned, grown as needed.
class Scratch {
 public:
  // Null where the memory cannot be had (the caller says so to
  // TensorFlow, as its own ops do, rather than writing through null).
  float* Get(int64 floats) {
    if (floats > size_) {
      // Whole 64-byte lines, as aligned_alloc wants.
      const int64 bytes = ((std::max<int64>(floats, 1) * 4 + 63) / 64) * 64;
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      size_ = data_ != nullptr ? floats : 0;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64 size_ = 0;
};

// The process's scratch blocks, lent to one call at a time. A fresh
// allocation of a large block costs its page faults at every call, and a
// block kept by each op would hold every layer's packed panels at once;
// the pool keeps as many blocks as calls ever ran at the same time.
class ScratchLease {
 public:
  ScratchLease() {
    std::lock_guard<std::mutex> lock(Mutex());
    auto& free = Free();
    if (free.empty()) {
      scratch_ = std::make_unique<Scratch>();
    } else {
      scratch_ = std::move(free.back());
      free.pop_back();
    }
  }
  ~ScratchLease() {
    std::lock_guard<std::mutex> lock(Mutex());
    Free().push_back(std::move(scratch_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch* get() { return scratch_.get(); }

 private:
  static std::mutex& Mutex() {
    static auto* mutex = new std::mutex;
    return *mutex;
  }
  static std::vector<std::unique_ptr<Scratch>>& Free() {
    static auto* free = new std::vector<std::unique_ptr<Scratch>>;
    return *free;
  }
  std::unique_ptr<Scratch> scratch_;
};

// A block of floats aligned for the micro-kernel's aligned loads (`data`
// null where the memory cannot be had).
struct AlignedFloats {
  explicit AlignedFloats(int64 floats)
      : data(static_cast<float*>(std::aligned_alloc(
            64, ((std::max<int64>(floats, 1) * 4 + 63) / 64) * 64))) {}
  ~AlignedFloats() { std::free(data); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data;
};

// One micro-tile (mr x nr of its kMR x kNR real) at `out`, or with `b1` a
// pair of them (mr x nr of kMR x 2 kNR): in place, or on a full-size copy
// at an edge.
void ComputeMicroTile(const MicroKernels& kernels, int64 kc,
                      const float* a_panel, const float* b_panel,
                      const float* b1_panel, int64 ldb, float* out, int64 n,
                      int64 mr, int64 nr, bool accumulate) {
  const int64 width = b1_panel == nullptr ? kNR : 2 * kNR;
  auto run = [&](float* c, int64 ldc) {
    if (b1_panel == nullptr) {
      kernels.single(kc, a_panel, b_panel, ldb, c, ldc, accumulate);
    } else {
      kernels.pair(kc, a_panel, b_panel, b1_panel, ldb, c, ldc, accumulate);
    }
  };
  if (mr == kMR && nr == width) {
    run(out, n);
    return;
  }
  if (b1_panel != nullptr && nr == width && kernels.short_pair != nullptr) {
    kernels.short_pair(mr, kc, a_panel, b_panel, b1_panel, ldb, out, n,
                       accumulate);
    return;
  }
  alignas(64) float edge[kMR * 2 * kNR];
  if (accumulate)
    for (int64 x = 0; x < mr; ++x)
      std::memcpy(edge + x * width, out + x * n, sizeof(float) * nr);
  run(edge, width);
  for (int64 x = 0; x < mr; ++x)
    std::memcpy(out + x * n, edge + x * width, sizeof(float) * nr);
}

// Whether operands say where each of A's rows reads its terms, a tap at a
// time (a convolution's rows are positions, whose terms at one filter tap
// are a run of channels in one pixel), so that packing, or the micro-kernel
// itself, reads them there:
//   int64 TermsPerTap() const;  // the terms of a tap (the channels)
//   void RowSources(int64 i0, int64 first_tap, int64 taps,
//                   const float* zeros, const float** at) const;
//       // at[t kMR + r]: where row i0 + r's terms of tap first_tap + t
//       // start (`zeros`, TermsPerTap() floats, where the row reads
//       // padding or lies past m)
template <typename Operands, typename = void>
struct ReadsARows : std::false_type {};
template <typename Operands>
struct ReadsARows<Operands, std::void_t<decltype(&Operands::RowSources)>>
    : std::true_type {};

// Terms [first, first + kc) of the taps whose sources are at `rows` (kMR
// a tap, as RowSources gives them) as one packed kMR x kc panel.
void PackFromSources(const float* const* rows, int64 first, int64 tap_terms,
                     int64 kc, const float* zeros, float* dst) {
  for (int64 k = 0; k < kc; rows += kMR, first = 0) {
    const int64 run = std::min(tap_terms - first, kc - k);
    const float* sources[kMR];
    // kZeros holds a run (at most a K block); `zeros` a whole tap.
    for (int64 r = 0; r < kMR; ++r)
      sources[r] = rows[r] == zeros ? kZeros : rows[r] + first;
    Interleave(sources, run, k + run < kc, dst + k * kMR);
    k += run;
  }
}

// The taps that terms [k0, k0 + kc) span, tap_terms a tap: the first one,
// how many, and the first one's first term.
struct TapSpan {
  int64 first_tap, taps, first;
  TapSpan(int64 k0, int64 kc, int64 tap_terms)
      : first_tap(k0 / tap_terms),
        taps((k0 + kc - 1) / tap_terms - k0 / tap_terms + 1),
        first(k0 % tap_terms) {}
};

// Rows [i0, i0 + kMR) of operands that say where their rows read, terms
// [k0, k0 + kc), as a packed panel.
template <typename Operands>
void PackRowsFromSources(const Operands& operands, int64 i0, int64 k0,
                         int64 kc, float* dst) {
  const int64 tap_terms = operands.TermsPerTap();
  const TapSpan span(k0, kc, tap_terms);
  const float* sources[(kKC + 1) * kMR];
  operands.RowSources(i0, span.first_tap, span.taps, kZeros, sources);
  PackFromSources(sources, span.first, tap_terms, kc, kZeros, dst);
}

// Where a tile's B panels lie, columns j0.. on: read in place from B (k x
// n, row-major) where `in_place` is B, else packed (each panel k x kNR).
// At(k0, column): the panel of the tile's `column`-th column from term k0.
struct BPanels {
  const float* in_place;
  const float* packed;
  int64 n, k, j0;
  int64 ldb() const { return in_place != nullptr ? n : kNR; }
  const float* At(int64 k0, int64 column) const {
    if (in_place != nullptr) return in_place + k0 * n + j0 + column;
    return packed + ((j0 + column) / kNR) * kNR * k + k0 * kNR;
  }
};

// Whether operands pack a tile's rows of A at once (`PackATile`), rather
// than one micro-panel at a time (`PackA`).
template <typename Operands, typename = void>
struct PacksTiles : std::false_type {};
template <typename Operands>
struct PacksTiles<Operands, std::void_t<decltype(&Operands::PackATile)>>
    : std::true_type {};

// Rows [i0, i0 + rows) of product `p`'s A, terms [k0, k0 + kc), as the
// tile's micro-panels at a_block (each kMR x kc).
template <typename Operands>
void PackTileRows(const Operands& operands, int64 p, int64 i0, int64 rows,
                  int64 k0, int64 kc, float* a_block) {
  if constexpr (PacksTiles<Operands>::value) {
    operands.PackATile(p, i0, rows, k0, kc, a_block);
  } else if constexpr (ReadsARows<Operands>::value) {
    for (int64 r = 0; r < rows; r += kMR)
      PackRowsFromSources(operands, i0 + r, k0, kc, a_block + r * kc);
  } else {
    for (int64 r = 0; r < rows; r += kMR)
      operands.PackA(p, i0 + r, k0, kc, a_block + r * kc);
  }
}

// Which packed B each product reads. Operands whose products share a B (a
// broadcast batch: `tf.matmul` of (N, m, k) by (k, n) is N products of one
// B) say so, and each distinct B is packed once:
//   int64 BSlots() const;            // how many distinct Bs
//   int64 BSlot(int64 product) const;  // the one `product` reads
//   int64 BOwner(int64 slot) const;    // a product that reads it
// Others pack one B per product. Packing copies values, so which copy a
// product reads cannot change a bit.
template <typename Operands, typename = void>
struct SharesB : std::false_type {};
template <typename Operands>
struct SharesB<Operands, std::void_t<decltype(&Operands::BSlots)>>
    : std::true_type {};

template <typename Operands>
int64 BSlots(const Operands& operands, int64 batch) {
  if constexpr (SharesB<Operands>::value) return operands.BSlots();
  return batch;
}
template <typename Operands>
int64 BSlot(const Operands& operands, int64 p) {
  if constexpr (SharesB<Operands>::value) return operands.BSlot(p);
  return p;
}
template <typename Operands>
int64 BOwner(const Operands& operands, int64 slot) {
  if constexpr (SharesB<Operands>::value) return operands.BOwner(slot);
  return slot;
}

// The status of a call whose memory could not be had: TensorFlow's own
// error for it, which Python raises as `tf.errors.ResourceExhaustedError`.
tensorflow::Status OutOfMemory(int64 floats) {
  return tensorflow::errors::ResourceExhausted(
      "tfdet's fixed-order kernel could not allocate ", floats * 4,
      " bytes of scratch memory for its packed operands");
}

// Tile (i0.., j0..) of product `p` through `kernels`, its chains over terms
// [k_begin, k_end) into `c` (m x n, row-major: the product's output, or a
// K block's partial sums), whose B panels are
// packed in `b_pack` (each k x kNR), or read in place from B (the
// operands' `InPlaceB`), or, with `own_b` (the operands' `PackBInTasks`:
// see ComputeProducts), packed by this call one K
// block at a time into `b_block` (kKC x tn): for
// each K block in order, the tile's rows of A for that block packed (into
// `a_block`, tm x kKC floats, where they stay in cache), then the
// micro-kernel over the tile's micro-tiles, continuing each chain from C.
// Whether operands say where A's terms lie, a group of rows at a time
// (`TapTerms`: a filter gradient's rows of one tap, whose kMR values at a
// term are kMR channels side by side in one pixel), so that the micro-kernel
// may read them there rather than from packed panels:
//   int64 RowsATap() const;  // rows a group has (the channels)
//   void TapTerms(int64 group, int64 k0, int64 kc, const float* zeros,
//                 const float** at) const;  // at[x]: term k0 + x's first
//       // row (`zeros`, RowsATap() floats, where the term reads padding)
template <typename Operands, typename = void>
struct ReadsATerms : std::false_type {};
template <typename Operands>
struct ReadsATerms<Operands, std::void_t<decltype(&Operands::TapTerms)>>
    : std::true_type {};

// A tile whose columns are whole AVX-512 pairs, of operands that say where
// A's terms lie: each micro-row inside one group of rows is read there by
// the indirect pair kernel; only a micro-row that spans two groups (or the
// tile's last, short one) is packed, from the same terms. Packing copied
// every term of a 32-filter gradient once per micro-row for a single pair
// of micro-tiles: 0.3-0.4 of its time (2-core AMD EPYC Zen 4, `perf`). The
// chains are the packed path's, term for term.
template <typename Operands>
void ComputeTileReadingA(const Operands& operands, const MicroKernels& kernels,
                         float* a_block, const BPanels& b, int64 k_begin,
                         int64 k_end, float* c, int64 i0, int64 rows,
                         int64 cols) {
  const int64 group_rows = operands.RowsATap();
  const int64 first = i0 / group_rows, last = (i0 + rows - 1) / group_rows;
  const std::vector<float> zeros(group_rows, 0.0f);
  std::vector<const float*> terms((last - first + 1) * kKC);
  const int64 n = b.n, ldb = b.ldb();
  for (int64 k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int64 kc = std::min(kKC, k_end - k0);
    auto b_panel = [&](int64 column) { return b.At(k0, column); };
    for (int64 group = first; group <= last; ++group)
      operands.TapTerms(group, k0, kc, zeros.data(),
                        terms.data() + (group - first) * kKC);
    for (int64 r = 0; r < rows; r += kMR) {
      const int64 offset = (i0 + r) % group_rows;
      const bool inside = r + kMR <= rows && offset + kMR <= group_rows;
      if (!inside) {
        // Packed from the groups' terms, each row from its own group.
        const int64 real = std::min(kMR, rows - r);
        const float* const* row_terms[kMR];
        int64 row_offset[kMR];
        for (int64 row = 0; row < real; ++row) {
          const int64 i = i0 + r + row;
          row_terms[row] = terms.data() + (i / group_rows - first) * kKC;
          row_offset[row] = i % group_rows;
        }
        float* panel = a_block + r * kc;
        if (real < kMR) std::memset(panel, 0, sizeof(float) * kMR * kc);
        for (int64 x = 0; x < kc; ++x)
          for (int64 row = 0; row < real; ++row)
            panel[x * kMR + row] = row_terms[row][x][row_offset[row]];
      }
      for (int64 q = 0; q < cols; q += 2 * kNR) {
        float* out = c + (i0 + r) * n + b.j0 + q;
        if (inside) {
          kernels.indirect(kc, terms.data() + ((i0 + r) / group_rows - first) * kKC,
                           offset, b_panel(q), b_panel(q + kNR), ldb, out, n,
                           k0 > k_begin);
        } else {
          ComputeMicroTile(kernels, kc, a_block + r * kc, b_panel(q),
                           b_panel(q + kNR), ldb, out, n,
                           std::min(kMR, rows - r), 2 * kNR, k0 > k_begin);
        }
      }
    }
  }
}

// A tile of operands that say where their rows read, on a path with rows
// kernels: each whole micro-row's pairs of micro-tiles, then its single
// micro-tiles, read A from the rows' sources, with no copy. Only a
// micro-row past m's end, and columns short of a micro-tile, are packed,
// from the same sources. Packing had copied each term of the built-in
// CNN's convolutions to feed one or two pairs of micro-tiles. The chains
// are the packed path's, term for term.
template <typename Operands>
void ComputeTileReadingRows(const Operands& operands,
                            const MicroKernels& kernels, float* a_block,
                            const BPanels& b, int64 k_begin, int64 k_end,
                            float* c, int64 i0, int64 rows, int64 cols) {
  const int64 tap_terms = operands.TermsPerTap();
  const std::vector<float> zeros(tap_terms, 0.0f);
  std::vector<const float*> sources((kKC / tap_terms + 2) * kMR);
  const int64 n = b.n, ldb = b.ldb();
  for (int64 k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int64 kc = std::min(kKC, k_end - k0);
    const TapSpan span(k0, kc, tap_terms);
    const bool accumulate = k0 > k_begin;
    auto b_panel = [&](int64 column) { return b.At(k0, column); };
    for (int64 r = 0; r < rows; r += kMR) {
      const int64 real = std::min(kMR, rows - r);
      operands.RowSources(i0 + r, span.first_tap, span.taps, zeros.data(),
                          sources.data());
      float* out = c + (i0 + r) * n + b.j0;
      int64 q = 0;
      if (real == kMR && kernels.pair_rows != nullptr)
        for (; q + 2 * kNR <= cols; q += 2 * kNR)
          kernels.pair_rows(kc, sources.data(), span.first, tap_terms,
                            b_panel(q), b_panel(q + kNR), ldb, out + q, n,
                            accumulate);
      if (real == kMR)
        for (; q + kNR <= cols; q += kNR)
          kernels.single_rows(kc, sources.data(), span.first, tap_terms,
                              b_panel(q), ldb, out + q, n, accumulate);
      if (q == cols) continue;
      PackFromSources(sources.data(), span.first, tap_terms, kc, zeros.data(),
                      a_block);
      while (q < cols) {
        const bool pair = kernels.pair != nullptr && cols - q >= 2 * kNR;
        const int64 width = pair ? 2 * kNR : kNR;
        ComputeMicroTile(kernels, kc, a_block, b_panel(q),
                         pair ? b_panel(q + kNR) : nullptr, ldb, out + q, n,
                         real, std::min(width, cols - q), accumulate);
        q += width;
      }
    }
  }
}

template <typename Operands>
void ComputeTile(const Operands& operands, const MicroKernels& kernels,
                 bool own_b,
                 int64 p, float* a_block, const float* b_pack, float* b_block,
                 int64 m, int64 n, int64 k, int64 k_begin, int64 k_end,
                 float* c, int64 i0, int64 j0, int64 tm, int64 tn) {
  const int64 rows = std::min(tm, m - i0);
  const int64 cols = std::min(tn, n - j0);
  if (k_end == k_begin) {
    for (int64 r = 0; r < rows; ++r)
      std::fill(c + (i0 + r) * n + j0, c + (i0 + r) * n + j0 + cols, 0.0f);
    return;
  }
  const BPanels b{operands.InPlaceB(p), b_pack, n, k, j0};
  if constexpr (ReadsARows<Operands>::value) {
    if (kernels.single_rows != nullptr && !own_b) {
      ComputeTileReadingRows(operands, kernels, a_block, b, k_begin, k_end, c,
                             i0, rows, cols);
      return;
    }
  }
  if constexpr (ReadsATerms<Operands>::value) {
    if (kernels.indirect != nullptr && !own_b && cols % (2 * kNR) == 0 &&
        operands.RowsATap() >= kMR) {
      ComputeTileReadingA(operands, kernels, a_block, b, k_begin, k_end, c, i0,
                          rows, cols);
      return;
    }
  }
  const int64 ldb = b.ldb();
  for (int64 k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int64 kc = std::min(kKC, k_end - k0);
    PackTileRows(operands, p, i0, rows, k0, kc, a_block);
    if (own_b)
      for (int64 q = 0; q < cols; q += kNR)
        operands.PackB(p, j0 + q, k0, kc, b_block + q * kc);
    // Where tasks pack B (own_b), this K block's panels, just packed.
    auto b_panel = [&](int64 q) -> const float* {
      return own_b && b.in_place == nullptr ? b_block + q * kc : b.At(k0, q);
    };
    for (int64 q = 0; q < cols;) {
      // Two whole micro-tiles side by side where the kernels pair them.
      const bool pair = kernels.pair != nullptr && cols - q >= 2 * kNR;
      const int64 width = pair ? 2 * kNR : kNR;
      for (int64 r = 0; r < rows; r += kMR)
        ComputeMicroTile(kernels, kc, a_block + r * kc, b_panel(q),
                         pair ? b_panel(q + kNR) : nullptr, ldb,
                         c + (i0 + r) * n + j0 + q, n,
                         std::min(kMR, rows - r), std::min(width, cols - q),
                         k0 > k_begin);
      q += width;
    }
  }
}

// A long sum's K blocks: a product whose K is 2 x kSplitTerms or more is
// cut into min(kMaxKBlocks, K / kSplitTerms) blocks of equal length (whole
// kKC blocks, the last shorter), each block's chains computed from zero as
// tasks of their own, and each element's partial sums added in block
// order: (((P0 + P1) + P2) + ...). The cut follows K alone, never the pool
// or M (a sample's batch), so the bits stay fixed by the shapes; it gives
// threads work where the output has few tiles and K is long (a filter
// gradient sums over every position of every image: the CNN's 3x3x32 -> 32
// filter gradient, 288 x 32 outputs over 28,800 terms, had 24 tasks at most
// for any pool). Below 2 x kSplitTerms, one block: the chain of the whole K.
constexpr int64 kSplitTerms = 4096;
constexpr int64 kMaxKBlocks = 16;
struct KBlocks {
  int64 count, length;
  explicit KBlocks(int64 k) {
    const int64 wanted =
        k >= 2 * kSplitTerms ? std::min(kMaxKBlocks, k / kSplitTerms) : 1;
    length = std::max<int64>(kKC, ((k + wanted - 1) / wanted + kKC - 1) / kKC * kKC);
    count = std::max<int64>(1, (k + length - 1) / length);
  }
  int64 begin(int64 block) const { return block * length; }
  int64 end(int64 block, int64 k) const {
    return std::min(k, (block + 1) * length);
  }
};

// The threads a call of `work` multiply-adds is split over: the pool's,
// but one per kMinWorkPerThread at most, so that a small product (a
// recurrent layer's, 32x128 @ 128x384 at each time step) runs on the
// calling thread rather than waiting twice on the pool for microseconds of
// work. 2-core AMD EPYC Zen 5, AVX-512 path: 32x128 @ 128x384 27 us on the
// calling thread against 52 us over the pool; 64x256 @ 256x512 (8M) 107
// against 130-169; 128x256 @ 256x512 (16M) 178 against 153-162. The bits
// never follow it (the tiles never change a chain).
constexpr int64 kMinWorkPerThread = int64{1} << 23;
int64 ThreadsFor(int64 work, int64 pool) {
  return std::max<int64>(1, std::min(pool, work / kMinWorkPerThread));
}

// How a call of `batch` products (m x k) @ (k x n) is split over a pool of
// `pool` threads: the threads it uses, its K blocks and its output tiles,
// whose tasks are (K block, product, tile). The kernels' own rule, which
// the TfdetFixedOrderPlan op reports from the shapes alone (for the
// parallelism table and its test): only `blocks` decides any bit.
struct Plan {
  int64 threads;
  KBlocks blocks;
  Tiling tiling;
  int64 tasks;
  Plan(int64 batch, int64 m, int64 n, int64 k, int64 pool, bool pairs)
      : threads(ThreadsFor(batch * m * n * k, pool)),
        blocks(k),
        tiling(batch * blocks.count, m, n, threads, pairs),
        tasks(blocks.count * batch * tiling.row_tiles * tiling.col_tiles) {}
};

// A row-major B of n columns (`data`) where the micro-kernel may read it in
// place: whole micro-tiles (n a multiple of kNR) and rows close enough that
// a K block's rows share pages. Its rows then need no copy; 2-core AMD EPYC
// Zen 5, 2 threads: ResNet-50's 16x16x64 -> 256 1x1 filter gradient at batch
// 64 4.5 -> 2.3 ms, a 4096x512 @ 512x512 product 5.9 -> 5.5, but a 2x2x512
// -> 2048 1x1 forward (8 KiB rows) 1.5 -> 2.0.
constexpr int64 kMaxInPlaceColumns = 512;
const float* InPlace(const float* data, int64 n) {
  return n % kNR == 0 && n <= kMaxInPlaceColumns ? data : nullptr;
}

// Computes `batch` products of one shape, c (m x n) = a (m x k) @ b (k x n):
// packs every B panel once (split over panels; or each task packs its own,
// see ComputeTile), then splits the (product, row tile, column tile) tasks
// over TensorFlow's intra-op pool, each packing its rows of A one K block
// at a time. The micro-kernels are chosen once a call. Packing copies values and
// does no arithmetic, so where, how often and by whom a value is packed
// cannot change a bit. `Operands` says how to pack and where each product
// goes:
//   void PackA(int64 product, int64 i0, int64 k0, int64 kc, float* dst)
//       const;  // rows [i0, i0 + kMR), terms [k0, k0 + kc): kMR x kc
//       // (or PackATile, a tile's rows at once: see PackTileRows; or
//       // RowSources, where each row reads: see ReadsARows)
//   void PackB(int64 product, int64 j0, int64 k0, int64 kc, float* dst)
//       const;  // terms [k0, k0 + kc), columns [j0, j0 + kNR): kc x kNR
//   float* Output(int64 product) const;  // m x n, row-major
//   bool PackBInTasks() const;  // whether each task packs its B blocks
//   const float* InPlaceB(int64 product) const;  // B as k x n, row-major,
//       // where the micro-kernel reads it in place (see InPlace; null where
//       // B is packed)
template <typename Operands>
void ComputeProducts(tensorflow::OpKernelContext* context,
                     const Operands& operands, int64 batch, int64 m, int64 n,
                     int64 k) {
  if (batch == 0 || m == 0 || n == 0) return;
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  const MicroKernels kernels = ChooseKernels();
  const Plan plan(batch, m, n, k, workers->num_threads, kernels.pair != nullptr);
  const int64 threads = plan.threads;
  const KBlocks& blocks = plan.blocks;
  const Tiling& tiling = plan.tiling;
  const int64 per_product = tiling.row_tiles * tiling.col_tiles;
  const bool in_place_b = operands.InPlaceB(0) != nullptr;
  const bool own_b = !in_place_b && operands.PackBInTasks();
  const int64 b_panels = own_b || in_place_b ? 0 : (n + kNR - 1) / kNR;
  const int64 b_size = b_panels * kNR * k;
  const int64 slots = BSlots(operands, batch);
  ScratchLease scratch;
  float* b_pack = scratch.get()->Get(slots * b_size);
  if (b_pack == nullptr && slots * b_size > 0) {
    context->SetStatus(OutOfMemory(slots * b_size));
    return;
  }
  // The partial sums of every K block after the first (the first goes
  // straight into the output), each m x n.
  const int64 partial_size = (blocks.count - 1) * batch * m * n;
  AlignedFloats partials(partial_size);
  if (partials.data == nullptr) {
    context->SetStatus(OutOfMemory(partial_size));
    return;
  }
  auto sums_of = [&](int64 p, int64 block) -> float* {
    return block == 0 ? operands.Output(p)
                      : partials.data + ((block - 1) * batch + p) * m * n;
  };
  auto pack_b = [&](int64 slot, int64 panel) {
    operands.PackB(BOwner(operands, slot), panel * kNR, 0, k,
                   b_pack + slot * b_size + panel * kNR * k);
  };
  // A shard whose own blocks could not be had stops, and the call fails.
  std::atomic<int64> missing{0};
  // Each shard's own A block, and B block where tasks pack B. A task is
  // (K block, product, row tile, column tile).
  auto compute = [&](int64 begin, int64 end, bool pack_own_b) {
    AlignedFloats a_block(tiling.tm * kKC);
    AlignedFloats b_block(own_b ? tiling.tn * kKC : 0);
    if (a_block.data == nullptr || b_block.data == nullptr) {
      missing = tiling.tm * kKC + (own_b ? tiling.tn * kKC : 0);
      return;
    }
    for (int64 task = begin; task < end; ++task) {
      const int64 block = task / (batch * per_product);
      const int64 p = task / per_product % batch;
      const int64 tile = task % per_product;
      if (pack_own_b)
        for (int64 panel = 0; panel < b_panels; ++panel) pack_b(p, panel);
      ComputeTile(operands, kernels, own_b, p, a_block.data,
                  b_pack + BSlot(operands, p) * b_size, b_block.data, m, n, k,
                  blocks.begin(block), blocks.end(block, k), sums_of(p, block),
                  (tile / tiling.col_tiles) * tiling.tm,
                  (tile % tiling.col_tiles) * tiling.tn, tiling.tm, tiling.tn);
    }
  };
  const int64 tasks = plan.tasks;
  if (per_product == 1 && slots == batch && blocks.count == 1) {
    // Small products, one tile each, each its own B: one pass over the
    // pool, each task packing its own product's B panels and computing it.
    tensorflow::Shard(
        threads, workers->workers, batch,
        std::max<int64>(1, m * n * k),
        [&](int64 begin, int64 end) { compute(begin, end, true); });
  } else {
    if (b_panels > 0) {
      tensorflow::Shard(threads, workers->workers, slots * b_panels,
                        std::max<int64>(1, 16 * k), [&](int64 begin, int64 end) {
                          for (int64 unit = begin; unit < end; ++unit)
                            pack_b(unit / b_panels, unit % b_panels);
                        });
    }
    tensorflow::Shard(
        threads, workers->workers, tasks,
        std::max<int64>(1, tiling.tm * tiling.tn * blocks.length),
        [&](int64 begin, int64 end) { compute(begin, end, false); });
  }
  if (missing > 0) {
    context->SetStatus(OutOfMemory(missing));
    return;
  }
  if (blocks.count == 1) return;
  // Each element's partial sums, added in block order.
  tensorflow::Shard(
      threads, workers->workers, batch * m, std::max<int64>(1, n * blocks.count),
      [&](int64 begin, int64 end) {
        for (int64 row = begin; row < end; ++row) {
          const int64 p = row / m, offset = (row % m) * n;
          float* out = operands.Output(p) + offset;
          for (int64 block = 1; block < blocks.count; ++block) {
            const float* partial = sums_of(p, block) + offset;
            for (int64 j = 0; j < n; ++j) out[j] += partial[j];
          }
        }
      });
}

}  // namespace
}  // namespace tfdet

#endif  // TFDET_KERNELS_FIXED_ORDER_CORE_H_
