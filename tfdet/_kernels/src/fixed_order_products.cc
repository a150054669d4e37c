// tfdet's matrix products and convolutions whose bits are fixed by the
// shapes alone.
//
// Every output element C[i][j] is one chain of fused multiply-adds,
//     acc = 0; for k = 0 .. K-1: acc = fma(A[i][k], B[k][j], acc)
// in that order, whatever the thread count, the row count M (a sample's
// batch), the tile the element lands in and the vector width:
//
// - the AVX2 micro-kernel (6x16, BLIS's outer product) and the AVX-512 one
//   (two such micro-tiles side by side, 6x32) keep one output element per
//   accumulator lane, so a lane does exactly the chain above; the scalar
//   micro-kernel does the same chain with std::fma;
// - K is cut into blocks of KC, and each block continues the chain from the
//   value stored in C: a float32 store and reload is exact, and each FMA
//   rounds anyway, so the blocks give the chain's bits;
// - the work is split over output tiles only (never over K), each tile
//   computed by one thread, so the pool size decides who computes a tile,
//   never how;
// - padded rows and columns of the edge tiles are zeros computed beside the
//   real ones and thrown away: they never enter a real element's chain.
//
// A convolution is the same product over its image patches, packed from
// the image directly (no im2col copy in memory beside the packed panels):
// forward, (batch x out_h x out_w) x (filter_h x filter_w x channels) times
// the filter; the input gradient, (batch x height x width) x (filter_h x
// filter_w x filters) of the output gradient, zero where no output reads
// that pixel at that filter tap, times the filter's transpose; the filter
// gradient, (filter_h x filter_w x channels) x (batch x out_h x out_w) of
// the image times the output gradient. So each element's chain runs over
// its terms in an order that the shapes alone fix, and a sample's outputs
// and input gradient do not follow the batch.
//
// The AVX2 and AVX-512 paths are compiled with target attributes and chosen
// by CPUID at run time; on aarch64 the NEON micro-kernel (four 4-lane
// vectors a row, every aarch64 CPU has them) does the same chains with
// vfmaq_f32, which rounds once as std::fma does; the scalar path runs
// elsewhere. TFDET_FIXED_ORDER_ISA set to "avx2" or "scalar" asks for a
// narrower path than the CPU's widest (the tests compare them all).

#if defined(__x86_64__) || defined(__i386__)
#define TFDET_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define TFDET_NEON 1
#include <arm_neon.h>
#endif

#include <algorithm>
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

#include "runtime_floor.h"

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

// c (kMR x kNR, row stride ldc) = (accumulate ? c : 0) + a-panel x b-panel,
// each element one FMA chain over k in order. The b-panel's rows (one per
// k) lie ldb floats apart: kNR where it was packed, B's own row stride
// where the kernel reads B in place.
using MicroKernel = void (*)(int64 kc, const float* a, const float* b,
                             int64 ldb, float* c, int64 ldc, bool accumulate);

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
__attribute__((target("avx2,fma"))) void Avx2Kernel(int64 kc, const float* a,
                                                     const float* b, int64 ldb,
                                                     float* c, int64 ldc,
                                                     bool accumulate) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
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
  for (int64 k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = _mm256_loadu_ps(b + 8);
    __m256 x;
    x = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    a += kMR;
    b += ldb;
  }
  _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

// Two micro-tiles side by side (kMR x 2 kNR), b0's columns then b1's, with
// one AVX-512 vector per micro-tile row: twice the AVX2 kernel's work per
// instruction, each lane still one element's chain over k in order, and
// vfmadd231ps rounds each lane as the AVX2 and scalar fma do.
__attribute__((target("avx512f"))) void Avx512PairKernel(
    int64 kc, const float* a, const float* b0, const float* b1, int64 ldb,
    float* c, int64 ldc, bool accumulate) {
  __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
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
  for (int64 k = 0; k < kc; ++k) {
    const __m512 v0 = _mm512_loadu_ps(b0);
    const __m512 v1 = _mm512_loadu_ps(b1);
    __m512 x;
    x = _mm512_set1_ps(a[0]);
    c00 = _mm512_fmadd_ps(x, v0, c00), c01 = _mm512_fmadd_ps(x, v1, c01);
    x = _mm512_set1_ps(a[1]);
    c10 = _mm512_fmadd_ps(x, v0, c10), c11 = _mm512_fmadd_ps(x, v1, c11);
    x = _mm512_set1_ps(a[2]);
    c20 = _mm512_fmadd_ps(x, v0, c20), c21 = _mm512_fmadd_ps(x, v1, c21);
    x = _mm512_set1_ps(a[3]);
    c30 = _mm512_fmadd_ps(x, v0, c30), c31 = _mm512_fmadd_ps(x, v1, c31);
    x = _mm512_set1_ps(a[4]);
    c40 = _mm512_fmadd_ps(x, v0, c40), c41 = _mm512_fmadd_ps(x, v1, c41);
    x = _mm512_set1_ps(a[5]);
    c50 = _mm512_fmadd_ps(x, v0, c50), c51 = _mm512_fmadd_ps(x, v1, c51);
    a += kMR;
    b0 += ldb;
    b1 += ldb;
  }
  _mm512_storeu_ps(c + 0 * ldc, c00), _mm512_storeu_ps(c + 0 * ldc + 16, c01);
  _mm512_storeu_ps(c + 1 * ldc, c10), _mm512_storeu_ps(c + 1 * ldc + 16, c11);
  _mm512_storeu_ps(c + 2 * ldc, c20), _mm512_storeu_ps(c + 2 * ldc + 16, c21);
  _mm512_storeu_ps(c + 3 * ldc, c30), _mm512_storeu_ps(c + 3 * ldc + 16, c31);
  _mm512_storeu_ps(c + 4 * ldc, c40), _mm512_storeu_ps(c + 4 * ldc + 16, c41);
  _mm512_storeu_ps(c + 5 * ldc, c50), _mm512_storeu_ps(c + 5 * ldc + 16, c51);
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

// Two micro-tiles side by side, b0's columns then b1's (kMR x 2 kNR, row
// stride ldc), each element one FMA chain over k in order.
using PairKernel = void (*)(int64 kc, const float* a, const float* b0,
                            const float* b1, int64 ldb, float* c, int64 ldc,
                            bool accumulate);

// The micro-kernels of a call: `single` for one micro-tile, and `pair`,
// where the CPU has a wider vector, for two side by side (null otherwise).
struct MicroKernels {
  MicroKernel single;
  PairKernel pair;
  const char* name;  // "avx512", "avx2", "neon" or "scalar"
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
    return {Avx2Kernel, Avx512PairKernel, "avx512"};
  if (avx2) return {Avx2Kernel, nullptr, "avx2"};
#endif
#ifdef TFDET_NEON
  return {NeonKernel, nullptr, "neon"};
#endif
  return {ScalarKernel, nullptr, "scalar"};
}

// The output tiles. Each element's chain is the same in any tile, so the
// tiling may follow the pool size without changing a bit: tiles as large
// as the cache allows (so packing is amortized over many products), cut
// evenly until each thread has about two of them.
struct Tiling {
  int64 tm, tn, row_tiles, col_tiles;
  Tiling(int64 batch, int64 m, int64 n, int64 threads) {
    const int64 micro_rows = (m + kMR - 1) / kMR;
    const int64 micro_cols = (n + kNR - 1) / kNR;
    row_tiles = (micro_rows + 15) / 16;  // tm <= 96 rows
    col_tiles = (micro_cols + 15) / 16;  // tn <= 256 columns
    const int64 wanted = 2 * threads;
    while (batch * row_tiles * col_tiles < wanted) {
      // Cut the side whose tiles are longer, down to 2 micro-tiles.
      const int64 rows_each = (micro_rows + row_tiles - 1) / row_tiles;
      const int64 cols_each = (micro_cols + col_tiles - 1) / col_tiles;
      if (cols_each >= rows_each && cols_each > 2) {
        ++col_tiles;
      } else if (rows_each > 2) {
        ++row_tiles;
      } else {
        break;
      }
    }
    tm = ((micro_rows + row_tiles - 1) / row_tiles) * kMR;
    tn = ((micro_cols + col_tiles - 1) / col_tiles) * kNR;
    row_tiles = (m + tm - 1) / tm;
    col_tiles = (n + tn - 1) / tn;
  }
};

// Memory for packed panels, 64-byte aligned, grown as needed.
class Scratch {
 public:
  float* Get(int64 floats) {
    if (floats > size_) {
      // Whole 64-byte lines, as aligned_alloc wants.
      const int64 bytes = ((std::max<int64>(floats, 1) * 4 + 63) / 64) * 64;
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      size_ = floats;
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

// A block of floats aligned for the micro-kernel's aligned loads.
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
  alignas(64) float edge[kMR * 2 * kNR];
  if (accumulate)
    for (int64 x = 0; x < mr; ++x)
      std::memcpy(edge + x * width, out + x * n, sizeof(float) * nr);
  run(edge, width);
  for (int64 x = 0; x < mr; ++x)
    std::memcpy(out + x * n, edge + x * width, sizeof(float) * nr);
}

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
  } else {
    for (int64 r = 0; r < rows; r += kMR)
      operands.PackA(p, i0 + r, k0, kc, a_block + r * kc);
  }
}

// Tile (i0.., j0..) of product `p` through `kernels`, whose B panels are
// packed in `b_pack` (each k x kNR), or read in place from B (the
// operands' `InPlaceB`), or, with `own_b` (the operands' `PackBInTasks`:
// B is the image's patches, too large to pack whole), packed here one K
// block at a time into `b_block` (kKC x tn): for
// each K block in order, the tile's rows of A for that block packed (into
// `a_block`, tm x kKC floats, where they stay in cache), then the
// micro-kernel over the tile's micro-tiles, continuing each chain from C.
template <typename Operands>
void ComputeTile(const Operands& operands, const MicroKernels& kernels,
                 bool own_b,
                 int64 p, float* a_block, const float* b_pack, float* b_block,
                 int64 m, int64 n, int64 k, int64 i0, int64 j0, int64 tm,
                 int64 tn) {
  const int64 rows = std::min(tm, m - i0);
  const int64 cols = std::min(tn, n - j0);
  float* c = operands.Output(p);
  if (k == 0) {
    for (int64 r = 0; r < rows; ++r)
      std::fill(c + (i0 + r) * n + j0, c + (i0 + r) * n + j0 + cols, 0.0f);
    return;
  }
  const float* in_place = operands.InPlaceB(p);
  const int64 ldb = in_place != nullptr ? n : kNR;
  for (int64 k0 = 0; k0 < k; k0 += kKC) {
    const int64 kc = std::min(kKC, k - k0);
    PackTileRows(operands, p, i0, rows, k0, kc, a_block);
    if (own_b)
      for (int64 q = 0; q < cols; q += kNR)
        operands.PackB(p, j0 + q, k0, kc, b_block + q * kc);
    auto b_panel = [&](int64 q) -> const float* {
      if (in_place != nullptr) return in_place + k0 * n + j0 + q;
      return own_b ? b_block + q * kc
                   : b_pack + ((j0 + q) / kNR) * kNR * k + k0 * kNR;
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
                         k0 > 0);
      q += width;
    }
  }
}

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
//       // (or PackATile, a tile's rows at once: see PackTileRows)
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
  const int64 threads = ThreadsFor(batch * m * n * k, workers->num_threads);
  const Tiling tiling(batch, m, n, threads);
  const int64 per_product = tiling.row_tiles * tiling.col_tiles;
  const bool in_place_b = operands.InPlaceB(0) != nullptr;
  const bool own_b = !in_place_b && operands.PackBInTasks();
  const MicroKernels kernels = ChooseKernels();
  const int64 b_panels = own_b || in_place_b ? 0 : (n + kNR - 1) / kNR;
  const int64 b_size = b_panels * kNR * k;
  ScratchLease scratch;
  float* b_pack = scratch.get()->Get(batch * b_size);
  auto pack_b = [&](int64 p, int64 panel) {
    operands.PackB(p, panel * kNR, 0, k, b_pack + p * b_size + panel * kNR * k);
  };
  // Each shard's own A block, and B block where tasks pack B.
  auto compute = [&](int64 begin, int64 end, bool pack_own_b) {
    AlignedFloats a_block(tiling.tm * kKC);
    AlignedFloats b_block(own_b ? tiling.tn * kKC : 0);
    for (int64 task = begin; task < end; ++task) {
      const int64 p = task / per_product;
      const int64 tile = task % per_product;
      if (pack_own_b)
        for (int64 panel = 0; panel < b_panels; ++panel) pack_b(p, panel);
      ComputeTile(operands, kernels, own_b, p, a_block.data, b_pack + p * b_size,
                  b_block.data, m, n, k,
                  (tile / tiling.col_tiles) * tiling.tm,
                  (tile % tiling.col_tiles) * tiling.tn, tiling.tm, tiling.tn);
    }
  };
  if (per_product == 1) {
    // Small products, one tile each: one pass over the pool, each task
    // packing its own product's B panels and computing it.
    tensorflow::Shard(
        threads, workers->workers, batch,
        std::max<int64>(1, m * n * k),
        [&](int64 begin, int64 end) { compute(begin, end, true); });
    return;
  }
  if (b_panels > 0) {
    tensorflow::Shard(threads, workers->workers, batch * b_panels,
                      std::max<int64>(1, 16 * k), [&](int64 begin, int64 end) {
                        for (int64 unit = begin; unit < end; ++unit)
                          pack_b(unit / b_panels, unit % b_panels);
                      });
  }
  tensorflow::Shard(
      threads, workers->workers, batch * per_product,
      std::max<int64>(1, tiling.tm * tiling.tn * k),
      [&](int64 begin, int64 end) { compute(begin, end, false); });
}

// One product of a batch of matrices: c (m x n, row-major) = a @ b.
struct Product {
  View a;
  View b;
  float* c;
};

// Matrices read through strides (a transpose is a stride).
struct Matrices {
  const std::vector<Product>& products;
  int64 m, n, k;
  void PackA(int64 p, int64 i0, int64 k0, int64 kc, float* dst) const {
    PackRows(products[p].a, m, i0, k0, kc, dst);
  }
  void PackB(int64 p, int64 j0, int64 k0, int64 kc, float* dst) const {
    PackColumns(products[p].b, n, j0, k0, kc, dst);
  }
  float* Output(int64 p) const { return products[p].c; }
  bool PackBInTasks() const { return false; }
  const float* InPlaceB(int64 p) const {
    const View& b = products[p].b;
    return b.cols == 1 && b.rows == n ? InPlace(b.data, n) : nullptr;
  }
};

void ComputeMatrixProducts(tensorflow::OpKernelContext* context,
                           const std::vector<Product>& products, int64 m,
                           int64 n, int64 k) {
  ComputeProducts(context, Matrices{products, m, n, k}, products.size(), m, n,
                  k);
}

// A (rows x cols) matrix stored row-major, read as its transpose or not.
View Read(const float* data, int64 rows, int64 cols, bool transpose) {
  return transpose ? View{data, 1, cols} : View{data, cols, 1};
}

class FixedOrderMatMulOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderMatMulOp(tensorflow::OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("transpose_a", &transpose_a_));
    OP_REQUIRES_OK(context, context->GetAttr("transpose_b", &transpose_b_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& a = context->input(0);
    const tensorflow::Tensor& b = context->input(1);
    OP_REQUIRES(context, a.dims() == 2 && b.dims() == 2,
                tensorflow::errors::InvalidArgument(
                    "Expected 2-D matrices. Received: ",
                    a.shape().DebugString(), " and ", b.shape().DebugString()));
    const int64 m = a.dim_size(transpose_a_ ? 1 : 0);
    const int64 k = a.dim_size(transpose_a_ ? 0 : 1);
    const int64 kb = b.dim_size(transpose_b_ ? 1 : 0);
    const int64 n = b.dim_size(transpose_b_ ? 0 : 1);
    OP_REQUIRES(context, k == kb,
                tensorflow::errors::InvalidArgument(
                    "Expected matching inner dimensions. Received: ",
                    a.shape().DebugString(), " and ", b.shape().DebugString()));
    tensorflow::Tensor* c = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {m, n}, &c));
    const std::vector<Product> products = {
        {Read(a.flat<float>().data(), a.dim_size(0), a.dim_size(1),
              transpose_a_),
         Read(b.flat<float>().data(), b.dim_size(0), b.dim_size(1),
              transpose_b_),
         c->flat<float>().data()}};
    ComputeMatrixProducts(context, products, m, n, k);
  }

 private:
  bool transpose_a_ = false;
  bool transpose_b_ = false;
};

class FixedOrderBatchMatMulOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderBatchMatMulOp(tensorflow::OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("adj_x", &adj_x_));
    OP_REQUIRES_OK(context, context->GetAttr("adj_y", &adj_y_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& x = context->input(0);
    const tensorflow::Tensor& y = context->input(1);
    OP_REQUIRES(context, x.dims() >= 2 && y.dims() >= 2,
                tensorflow::errors::InvalidArgument(
                    "Expected tensors of rank 2 or more. Received: ",
                    x.shape().DebugString(), " and ", y.shape().DebugString()));
    const int64 xr = x.dim_size(x.dims() - 2), xc = x.dim_size(x.dims() - 1);
    const int64 yr = y.dim_size(y.dims() - 2), yc = y.dim_size(y.dims() - 1);
    const int64 m = adj_x_ ? xc : xr, k = adj_x_ ? xr : xc;
    const int64 ky = adj_y_ ? yc : yr, n = adj_y_ ? yr : yc;
    OP_REQUIRES(context, k == ky,
                tensorflow::errors::InvalidArgument(
                    "Expected matching inner dimensions. Received: ",
                    x.shape().DebugString(), " and ", y.shape().DebugString()));
    tensorflow::MatMulBCast bcast(x.shape().dim_sizes(), y.shape().dim_sizes());
    OP_REQUIRES(context, bcast.IsValid(),
                tensorflow::errors::InvalidArgument(
                    "Expected broadcastable batch dimensions. Received: ",
                    x.shape().DebugString(), " and ", y.shape().DebugString()));
    tensorflow::TensorShape out_shape = bcast.output_batch_shape();
    out_shape.AddDim(m);
    out_shape.AddDim(n);
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, out_shape, &out));
    const int64 batch = bcast.output_batch_size();
    const float* x_data = x.flat<float>().data();
    const float* y_data = y.flat<float>().data();
    float* out_data = out->flat<float>().data();
    std::vector<Product> products;
    products.reserve(batch);
    for (int64 i = 0; i < batch; ++i) {
      const int64 xi = bcast.IsBroadcastingRequired() ? bcast.x_batch_indices()[i] : i;
      const int64 yi = bcast.IsBroadcastingRequired() ? bcast.y_batch_indices()[i] : i;
      products.push_back({Read(x_data + xi * xr * xc, xr, xc, adj_x_),
                          Read(y_data + yi * yr * yc, yr, yc, adj_y_),
                          out_data + i * m * n});
    }
    ComputeMatrixProducts(context, products, m, n, k);
  }

 private:
  bool adj_x_ = false;
  bool adj_y_ = false;
};

// ---------------------------------------------------------------------------
// Convolutions (NHWC images, HWIO filters, float32).

// What a 2-D convolution is, from its input's and filter's shapes and its
// attributes: sizes, and where each filter tap reads.
struct Geometry {
  int64 batch, height, width, channels;  // the image, NHWC
  int64 filter_h, filter_w, filters;     // the filter, HWIO (channels in)
  int64 out_h, out_w;
  int64 stride_h, stride_w, dilation_h, dilation_w;
  int64 pad_top, pad_left;  // zeros before the first row and column
};

// The attributes every convolution op here takes, as Conv2D's.
class ConvolutionAttributes {
 public:
  explicit ConvolutionAttributes(tensorflow::OpKernelConstruction* context) {
    OP_REQUIRES_OK(context, context->GetAttr("strides", &strides_));
    OP_REQUIRES_OK(context, context->GetAttr("dilations", &dilations_));
    OP_REQUIRES_OK(context, context->GetAttr("padding", &padding_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("explicit_paddings", &explicit_paddings_));
    OP_REQUIRES(
        context,
        strides_.size() == 4 && dilations_.size() == 4 && strides_[0] == 1 &&
            strides_[3] == 1 && dilations_[0] == 1 && dilations_[3] == 1 &&
            strides_[1] > 0 && strides_[2] > 0 && dilations_[1] > 0 &&
            dilations_[2] > 0,
        tensorflow::errors::InvalidArgument(
            "Expected NHWC strides and dilations of 4 positive values, 1 for "
            "the batch and the channels"));
    OP_REQUIRES(context,
                padding_ != "EXPLICIT" || explicit_paddings_.size() == 8,
                tensorflow::errors::InvalidArgument(
                    "Expected 8 explicit paddings. Received: ",
                    explicit_paddings_.size()));
  }

  // The geometry of a convolution of `input` (NHWC) by `filter` (HWIO);
  // false (the context failed) for shapes a convolution cannot have.
  bool Make(tensorflow::OpKernelContext* context,
            const tensorflow::TensorShape& input,
            const tensorflow::TensorShape& filter, Geometry* g) const {
    if (input.dims() != 4 || filter.dims() != 4 ||
        input.dim_size(3) != filter.dim_size(2)) {
      context->CtxFailure(tensorflow::errors::InvalidArgument(
          "Expected a 4-D NHWC input and a 4-D HWIO filter of its channels. "
          "Received: ",
          input.DebugString(), " and ", filter.DebugString()));
      return false;
    }
    g->batch = input.dim_size(0);
    g->height = input.dim_size(1);
    g->width = input.dim_size(2);
    g->channels = input.dim_size(3);
    g->filter_h = filter.dim_size(0);
    g->filter_w = filter.dim_size(1);
    g->filters = filter.dim_size(3);
    g->stride_h = strides_[1];
    g->stride_w = strides_[2];
    g->dilation_h = dilations_[1];
    g->dilation_w = dilations_[2];
    return Axis(context, 1, g->height, g->filter_h, g->stride_h, g->dilation_h,
                &g->out_h, &g->pad_top) &&
           Axis(context, 2, g->width, g->filter_w, g->stride_w, g->dilation_w,
                &g->out_w, &g->pad_left);
  }

 private:
  // One spatial axis: the output size and the zeros before the first
  // input, as TensorFlow computes them for each padding.
  bool Axis(tensorflow::OpKernelContext* context, int dimension, int64 size,
            int64 window, int64 stride, int64 dilation, int64* out,
            int64* before) const {
    const int64 reach = (window - 1) * dilation + 1;
    int64 padded = size;
    if (padding_ == "SAME") {
      *out = (size + stride - 1) / stride;
      const int64 total = std::max<int64>((*out - 1) * stride + reach - size, 0);
      *before = total / 2;
      return true;
    }
    *before = 0;
    if (padding_ == "EXPLICIT") {
      *before = explicit_paddings_[2 * dimension];
      padded += *before + explicit_paddings_[2 * dimension + 1];
    }
    if (padded < reach) {
      context->CtxFailure(tensorflow::errors::InvalidArgument(
          "The filter reaches past the padded input: ", reach, " > ", padded));
      return false;
    }
    *out = (padded - reach) / stride + 1;
    return true;
  }

  std::vector<tensorflow::int32> strides_;
  std::vector<tensorflow::int32> dilations_;
  std::string padding_;
  std::vector<int64_t> explicit_paddings_;
};

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

// The forward convolution as a product: row (image, oh, ow) of the image
// patches times the filter as a (filter_h x filter_w x channels) x filters
// matrix. Each output's chain runs over (tap row, tap column, channel).
struct ForwardOperands {
  Geometry g;
  const float* input;
  const float* filter;
  float* output;
  int64 m() const { return g.batch * g.out_h * g.out_w; }
  int64 k() const { return g.filter_h * g.filter_w * g.channels; }
  void PackA(int64, int64 i0, int64 k0, int64 kc, float* dst) const {
    int64 image[kMR], oh[kMR], ow[kMR];
    const int64 rows = std::min(kMR, m() - i0);
    for (int64 r = 0; r < rows; ++r) {
      const int64 p = i0 + r;
      ow[r] = p % g.out_w, oh[r] = (p / g.out_w) % g.out_h;
      image[r] = p / (g.out_w * g.out_h);
    }
    // Terms k0 .. k0 + kc: a run of channels at each tap.
    for (int64 x = k0; x < k0 + kc;) {
      const int64 tap = x / g.channels, c0 = x % g.channels;
      const int64 run = std::min(g.channels - c0, k0 + kc - x);
      const int64 top = (tap / g.filter_w) * g.dilation_h - g.pad_top;
      const int64 left = (tap % g.filter_w) * g.dilation_w - g.pad_left;
      const float* sources[kMR];
      for (int64 r = 0; r < kMR; ++r) {
        const int64 ih = r < rows ? oh[r] * g.stride_h + top : -1;
        const int64 iw = r < rows ? ow[r] * g.stride_w + left : -1;
        sources[r] =
            (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width)
                ? kZeros
                : input +
                      ((image[r] * g.height + ih) * g.width + iw) * g.channels +
                      c0;
      }
      Interleave(sources, run, x + run < k0 + kc, dst + (x - k0) * kMR);
      x += run;
    }
  }
  void PackB(int64, int64 j0, int64 k0, int64 kc, float* dst) const {
    PackColumns(View{filter, g.filters, 1}, g.filters, j0, k0, kc, dst);
  }
  float* Output(int64) const { return output; }
  bool PackBInTasks() const { return false; }
  // The filter, (filter_h x filter_w x channels) x filters, is B as it lies.
  const float* InPlaceB(int64) const { return InPlace(filter, g.filters); }
};

// The input gradient as a product: row (image, ih, iw) holds, for each tap
// (th, tw), the output gradient at the output position that read this
// pixel through that tap (zeros where none did), times the filter with its
// channels and filters swapped. Each pixel's chain runs over (tap row, tap
// column, filter), zeros included, so its order does not follow the
// stride's phase either.
struct InputGradientOperands {
  Geometry g;
  const float* filter;
  const float* out_backprop;
  float* output;
  int64 m() const { return g.batch * g.height * g.width; }
  int64 k() const { return g.filter_h * g.filter_w * g.filters; }
  void PackA(int64, int64 i0, int64 k0, int64 kc, float* dst) const {
    int64 image[kMR], ih[kMR], iw[kMR];
    const int64 rows = std::min(kMR, m() - i0);
    for (int64 r = 0; r < rows; ++r) {
      const int64 p = i0 + r;
      iw[r] = p % g.width, ih[r] = (p / g.width) % g.height;
      image[r] = p / (g.width * g.height);
    }
    // Terms k0 .. k0 + kc: a run of filters at each tap.
    for (int64 x = k0; x < k0 + kc;) {
      const int64 tap = x / g.filters, o0 = x % g.filters;
      const int64 run = std::min(g.filters - o0, k0 + kc - x);
      const int64 top = g.pad_top - (tap / g.filter_w) * g.dilation_h;
      const int64 left = g.pad_left - (tap % g.filter_w) * g.dilation_w;
      const float* sources[kMR];
      for (int64 r = 0; r < kMR; ++r) {
        sources[r] = kZeros;
        if (r >= rows) continue;
        const int64 h = ih[r] + top, w = iw[r] + left;
        const int64 oh = h / g.stride_h, ow = w / g.stride_w;
        if (h < 0 || h % g.stride_h != 0 || oh >= g.out_h || w < 0 ||
            w % g.stride_w != 0 || ow >= g.out_w)
          continue;
        sources[r] = out_backprop +
                     ((image[r] * g.out_h + oh) * g.out_w + ow) * g.filters + o0;
      }
      Interleave(sources, run, x + run < k0 + kc, dst + (x - k0) * kMR);
      x += run;
    }
  }
  // Columns [j0, j0 + kNR) (input channels), rows [k0, k0 + kc) of the
  // (tap, filter) x channel matrix: filter[th][tw][c][o] at row (th, tw, o),
  // column c.
  void PackB(int64, int64 j0, int64 k0, int64 kc, float* dst) const {
    const int64 cols = std::min(kNR, g.channels - j0);
    if (cols < kNR) std::memset(dst, 0, sizeof(float) * kNR * kc);
    for (int64 x = 0; x < kc; ++x) {
      const int64 tap = (k0 + x) / g.filters, o = (k0 + x) % g.filters;
      const float* s = filter + (tap * g.channels + j0) * g.filters + o;
      for (int64 c = 0; c < cols; ++c) dst[x * kNR + c] = s[c * g.filters];
    }
  }
  float* Output(int64) const { return output; }
  bool PackBInTasks() const { return false; }
  const float* InPlaceB(int64) const { return nullptr; }
};

// Output positions (image, oh, ow) from a flat index k = ((image x out_h)
// + oh) x out_w + ow, walked in order: the terms of a filter gradient's
// chains.
struct OutputPosition {
  int64 image, oh, ow;
  OutputPosition(const Geometry& g, int64 k)
      : image(k / (g.out_w * g.out_h)),
        oh((k / g.out_w) % g.out_h),
        ow(k % g.out_w) {}
  void Next(const Geometry& g) {
    if (++ow == g.out_w) {
      ow = 0;
      if (++oh == g.out_h) oh = 0, ++image;
    }
  }
};

// The filter gradient as a product, transposed: the output gradient read
// as a filters x (batch x out_h x out_w) matrix times the image patches,
// (batch x out_h x out_w) x (filter_h x filter_w x channels), into a
// filters-major buffer that the op then transposes into HWIO. Each
// weight's chain runs over the images, then the output rows and columns,
// in order; with the output gradient as A, its packing reads runs of
// filters, and the patches' packing runs of channels.
struct FilterGradientOperands {
  Geometry g;
  const float* input;
  const float* out_backprop;
  float* transposed;  // filters x (filter_h x filter_w x channels)
  int64 m() const { return g.filters; }
  int64 k() const { return g.batch * g.out_h * g.out_w; }
  int64 n() const { return g.filter_h * g.filter_w * g.channels; }
  void PackA(int64, int64 i0, int64 k0, int64 kc, float* dst) const {
    PackRows(View{out_backprop, 1, g.filters}, g.filters, i0, k0, kc, dst);
  }
  // Columns [j0, j0 + kNR) ((tap, channel)), rows [k0, k0 + kc) (output
  // positions) of the image patches: a run of channels at each tap.
  void PackB(int64, int64 j0, int64 k0, int64 kc, float* dst) const {
    const int64 cols = std::min(kNR, n() - j0);
    if (cols < kNR) std::memset(dst, 0, sizeof(float) * kNR * kc);
    OutputPosition at(g, k0);
    for (int64 x = 0; x < kc; ++x, at.Next(g)) {
      const int64 oh = at.oh, ow = at.ow;
      const float* pixels = input + at.image * g.height * g.width * g.channels;
      for (int64 col = j0; col < j0 + cols;) {
        const int64 tap = col / g.channels, c0 = col % g.channels;
        const int64 run = std::min(g.channels - c0, j0 + cols - col);
        const int64 ih =
            oh * g.stride_h + (tap / g.filter_w) * g.dilation_h - g.pad_top;
        const int64 iw =
            ow * g.stride_w + (tap % g.filter_w) * g.dilation_w - g.pad_left;
        float* d = dst + x * kNR + (col - j0);
        if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width)
          std::memset(d, 0, sizeof(float) * run);
        else
          std::memcpy(d, pixels + (ih * g.width + iw) * g.channels + c0,
                      sizeof(float) * run);
        col += run;
      }
    }
  }
  float* Output(int64) const { return transposed; }
  // The patches packed whole would be a copy of the image per tap: from
  // 4M floats (16 MB) on, each task packs its own K blocks instead (a
  // 32x32x32 layer at batch 64: 30 against 38 ms; a 3-channel one, whose
  // few columns each task would pack again, stays packed once: 12 ms
  // against 20).
  bool PackBInTasks() const { return k() * n() >= (int64{1} << 22); }
  // A 1x1 filter at stride 1 without padding reads each pixel once, at its
  // own position: the image, positions x channels, is B as it lies.
  const float* InPlaceB(int64) const {
    const bool pointwise = g.filter_h == 1 && g.filter_w == 1 &&
                           g.stride_h == 1 && g.stride_w == 1 &&
                           g.pad_top == 0 && g.pad_left == 0 &&
                           g.out_h == g.height && g.out_w == g.width;
    return pointwise ? InPlace(input, g.channels) : nullptr;
  }
};

// The filter gradient as a product in the filter's own layout: the image
// patches read as a (filter_h x filter_w x channels) x (batch x out_h x
// out_w) matrix times the output gradient, (batch x out_h x out_w) x
// filters, straight into the HWIO output. Each weight's chain has the
// transposed form's terms in the same order, each term's product the same
// (a x b is b x a exactly), so both forms give the same bits; this one
// needs no transpose afterwards (a strided pass over the whole gradient)
// and gives the micro-kernel's vectors the filters, so it is taken where
// they fill an AVX-512 pair of micro-tiles.
struct FilterGradientDirectOperands {
  Geometry g;
  const float* input;
  const float* out_backprop;
  float* output;  // HWIO
  int64 m() const { return g.filter_h * g.filter_w * g.channels; }
  int64 k() const { return g.batch * g.out_h * g.out_w; }
  int64 n() const { return g.filters; }
  // Rows [i0, i0 + rows) ((tap, channel)), terms [k0, k0 + kc) (output
  // positions), as the tile's panels (each kMR x kc, the rows of a term
  // side by side, zeros past m): one walk over the positions for the whole
  // tile, each position's pixel read once per tap as a run of channels.
  // Packed panel by panel, each position was found again for every panel,
  // and where a panel spans taps (a 3-channel first layer's all do) the
  // image's bounds were checked value by value: 17% of the built-in CNN's
  // step (2-core AMD EPYC Zen 5).
  void PackATile(int64, int64 i0, int64 rows, int64 k0, int64 kc,
                 float* dst) const {
    if (rows % kMR != 0)
      std::memset(dst + (rows / kMR) * kMR * kc, 0, sizeof(float) * kMR * kc);
    // The rows as runs of channels of one tap each, and each run as pieces
    // that lie side by side in one panel. With fewer channels than a panel
    // has rows (a first layer's 3), whole taps of one filter row form one
    // run where the filter's columns read neighbouring pixels (no column
    // dilation): their channels lie side by side in the image, so the run
    // is read as one span unless the filter row hangs over the image's side.
    const bool span_taps = g.channels < kMR && g.dilation_w == 1;
    struct Run {
      int64 top, left, channel, taps, length;
    };
    struct Piece {
      int64 run, offset, length;  // floats [offset, + length) of the run
      float* slots;               // the first row's slot at term 0
    };
    std::vector<Run> runs;
    std::vector<Piece> pieces;
    int64 longest = 0;
    for (int64 r = 0; r < rows;) {
      const int64 tap = (i0 + r) / g.channels, channel = (i0 + r) % g.channels;
      const int64 column = tap % g.filter_w;
      const int64 taps =
          span_taps && channel == 0
              ? std::max<int64>(1, std::min(g.filter_w - column, (rows - r) / g.channels))
              : 1;
      const int64 length = std::min(taps * g.channels - channel, rows - r);
      runs.push_back({(tap / g.filter_w) * g.dilation_h - g.pad_top,
                      column * g.dilation_w - g.pad_left, channel, taps, length});
      longest = std::max(longest, length);
      for (int64 c = 0; c < length;) {
        const int64 row = r + c;
        const int64 piece = std::min(kMR - row % kMR, length - c);
        pieces.push_back({static_cast<int64>(runs.size()) - 1, c, piece,
                          dst + (row / kMR) * kMR * kc + row % kMR});
        c += piece;
      }
      r += length;
    }
    // A spanning run whose taps partly read padding, assembled tap by tap.
    std::vector<float> partial(span_taps ? runs.size() * longest : 0);
    std::vector<const float*> sources(runs.size());
    OutputPosition at(g, k0);
    for (int64 x = 0; x < kc; ++x, at.Next(g)) {
      const float* pixels = input + at.image * g.height * g.width * g.channels;
      for (size_t i = 0; i < runs.size(); ++i) {
        const Run& run = runs[i];
        const int64 ih = at.oh * g.stride_h + run.top;
        const int64 iw = at.ow * g.stride_w + run.left;
        sources[i] = nullptr;  // padding
        if (ih < 0 || ih >= g.height || iw + run.taps <= 0 || iw >= g.width)
          continue;
        const float* row = pixels + ih * g.width * g.channels;
        if (iw >= 0 && iw + run.taps <= g.width) {
          sources[i] = row + iw * g.channels + run.channel;
          continue;
        }
        float* assembled = partial.data() + i * longest;
        for (int64 t = 0; t < run.taps; ++t) {
          float* d = assembled + t * g.channels;
          if (iw + t < 0 || iw + t >= g.width) {
            std::fill(d, d + g.channels, 0.0f);
          } else {
            std::memcpy(d, row + (iw + t) * g.channels, sizeof(float) * g.channels);
          }
        }
        sources[i] = assembled + run.channel;
      }
      for (const Piece& piece : pieces) {
        float* d = piece.slots + x * kMR;
        if (sources[piece.run] == nullptr) {
          std::fill(d, d + piece.length, 0.0f);
          continue;
        }
        const float* src = sources[piece.run] + piece.offset;
        if (piece.length == kMR) {
          std::memcpy(d, src, sizeof(float) * kMR);
        } else {
          for (int64 c = 0; c < piece.length; ++c) d[c] = src[c];
        }
      }
    }
  }
  void PackB(int64, int64 j0, int64 k0, int64 kc, float* dst) const {
    PackColumns(View{out_backprop, g.filters, 1}, g.filters, j0, k0, kc, dst);
  }
  float* Output(int64) const { return output; }
  // The output gradient packed whole would be its copy: from 4M floats on,
  // each task packs its own K blocks (ResNet-50's 16x16x64 -> 256 1x1 layer
  // at batch 64, 16384 positions: 3.7 against 4.6 ms, 2-core Zen 5).
  bool PackBInTasks() const { return k() * n() >= (int64{1} << 22); }
  // The output gradient, positions x filters, is B as it lies.
  const float* InPlaceB(int64) const { return InPlace(out_backprop, g.filters); }
};

// A TensorShape from a 1-D int32 tensor of 4 sizes (input_sizes,
// filter_sizes), as TensorFlow's gradient ops take them.
bool ShapeFrom(tensorflow::OpKernelContext* context,
               const tensorflow::Tensor& sizes, tensorflow::TensorShape* shape) {
  if (sizes.dims() != 1 || sizes.NumElements() != 4) {
    context->CtxFailure(tensorflow::errors::InvalidArgument(
        "Expected 4 sizes. Received: ", sizes.shape().DebugString()));
    return false;
  }
  const auto values = sizes.flat<tensorflow::int32>();
  for (int i = 0; i < 4; ++i) {
    if (values(i) < 0) {
      context->CtxFailure(
          tensorflow::errors::InvalidArgument("Expected sizes of 0 or more."));
      return false;
    }
    shape->AddDim(values(i));
  }
  return true;
}

// The output gradient must have the forward output's shape.
bool MatchesOutput(tensorflow::OpKernelContext* context, const Geometry& g,
                   const tensorflow::Tensor& out_backprop) {
  const tensorflow::TensorShape expected(
      {g.batch, g.out_h, g.out_w, g.filters});
  if (out_backprop.shape() != expected) {
    context->CtxFailure(tensorflow::errors::InvalidArgument(
        "Expected an output gradient of shape ", expected.DebugString(),
        ". Received: ", out_backprop.shape().DebugString()));
    return false;
  }
  return true;
}

class FixedOrderConv2DOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderConv2DOp(tensorflow::OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    const tensorflow::Tensor& filter = context->input(1);
    Geometry g;
    if (!attributes_.Make(context, input.shape(), filter.shape(), &g)) return;
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, {g.batch, g.out_h, g.out_w, g.filters}, &output));
    const ForwardOperands operands{g, input.flat<float>().data(),
                                   filter.flat<float>().data(),
                                   output->flat<float>().data()};
    ComputeProducts(context, operands, 1, operands.m(), g.filters,
                    operands.k());
  }

 private:
  ConvolutionAttributes attributes_;
};

class FixedOrderConv2DBackpropInputOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderConv2DBackpropInputOp(
      tensorflow::OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& filter = context->input(1);
    const tensorflow::Tensor& out_backprop = context->input(2);
    tensorflow::TensorShape input_shape;
    if (!ShapeFrom(context, context->input(0), &input_shape)) return;
    Geometry g;
    if (!attributes_.Make(context, input_shape, filter.shape(), &g)) return;
    if (!MatchesOutput(context, g, out_backprop)) return;
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input_shape, &output));
    const InputGradientOperands operands{g, filter.flat<float>().data(),
                                         out_backprop.flat<float>().data(),
                                         output->flat<float>().data()};
    ComputeProducts(context, operands, 1, operands.m(), g.channels,
                    operands.k());
  }

 private:
  ConvolutionAttributes attributes_;
};

class FixedOrderConv2DBackpropFilterOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderConv2DBackpropFilterOp(
      tensorflow::OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    const tensorflow::Tensor& out_backprop = context->input(2);
    tensorflow::TensorShape filter_shape;
    if (!ShapeFrom(context, context->input(1), &filter_shape)) return;
    Geometry g;
    if (!attributes_.Make(context, input.shape(), filter_shape, &g)) return;
    if (!MatchesOutput(context, g, out_backprop)) return;
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, filter_shape, &output));
    float* out = output->flat<float>().data();
    // Filters that fill a pair of micro-tiles: the filter's own layout;
    // fewer: filters-major, which vectorizes over (tap, channel) instead,
    // then transposed. The same bits either way.
    if (g.filters >= 2 * kNR) {
      const FilterGradientDirectOperands operands{
          g, input.flat<float>().data(), out_backprop.flat<float>().data(), out};
      ComputeProducts(context, operands, 1, operands.m(), g.filters,
                      operands.k());
      return;
    }
    std::vector<float> transposed(g.filters * g.filter_h * g.filter_w *
                                  g.channels);
    const FilterGradientOperands operands{g, input.flat<float>().data(),
                                          out_backprop.flat<float>().data(),
                                          transposed.data()};
    const int64 weights = operands.n();
    ComputeProducts(context, operands, 1, g.filters, weights, operands.k());
    for (int64 o = 0; o < g.filters; ++o)
      for (int64 w = 0; w < weights; ++w)
        out[w * g.filters + o] = transposed[o * weights + w];
  }

 private:
  ConvolutionAttributes attributes_;
};

// ---------------------------------------------------------------------------
// The filter gradient of a depthwise convolution (one filter per channel):
// weight (tap, channel) is one chain of FMAs over the output positions
// (image, row, column) in order, of the input value that the tap reads
// there (a position whose tap reads padding adds no term) times the output
// gradient. A vector's lanes are channels, each lane its own chain, so the
// AVX-512, AVX2 and scalar paths give the same bits; the work is split over
// (filter row, block of channels) only, never over the positions.
// TensorFlow's own kernel gives each thread a share of the images and adds
// the shares.

constexpr int64 kDepthwiseLanes = 16;  // the channels of a task's chains
constexpr int64 kDepthwiseColumns = 8;  // filter columns the vector paths take

// What one task computes: filter row `row`, every column of it, `lanes`
// channels from c0. Each output position's gradient is read once for all
// the row's taps, so the gradient is read filter_h times in all, not once
// per tap.
struct DepthwiseTask {
  const Geometry& g;
  const float* x;
  const float* dy;
  int64 row, c0, lanes;
};

// The input row that filter row `row` reads at output row oh (of image
// `image`), as the offset of its first pixel; false where it reads padding.
inline bool DepthwiseRow(const Geometry& g, int64 row, int64 image, int64 oh,
                         int64* row_offset) {
  const int64 ih = oh * g.stride_h + row * g.dilation_h - g.pad_top;
  if (ih < 0 || ih >= g.height) return false;
  *row_offset = (image * g.height + ih) * g.width;
  return true;
}

// The task's channels of the output gradient at output position (image,
// oh, ow).
inline const float* DepthwiseGradient(const DepthwiseTask& t, int64 image,
                                      int64 oh, int64 ow) {
  const Geometry& g = t.g;
  return t.dy + ((image * g.out_h + oh) * g.out_w + ow) * g.channels + t.c0;
}

// The input column that filter column `column` reads at output column ow;
// -1 where it reads padding.
inline int64 DepthwiseColumn(const Geometry& g, int64 ow, int64 column) {
  const int64 iw = ow * g.stride_w + column * g.dilation_w - g.pad_left;
  return iw < 0 || iw >= g.width ? -1 : iw;
}

// One task's chains, each lane with std::fma (any filter width).
void DepthwiseScalar(const DepthwiseTask& t, float* out) {
  const Geometry& g = t.g;
  std::vector<float> acc(g.filter_w * kDepthwiseLanes, 0.0f);
  int64 row_offset;
  for (int64 image = 0; image < g.batch; ++image)
    for (int64 oh = 0; oh < g.out_h; ++oh) {
      if (!DepthwiseRow(g, t.row, image, oh, &row_offset)) continue;
      for (int64 ow = 0; ow < g.out_w; ++ow) {
        const float* b = DepthwiseGradient(t, image, oh, ow);
        for (int64 column = 0; column < g.filter_w; ++column) {
          const int64 iw = DepthwiseColumn(g, ow, column);
          if (iw < 0) continue;
          const float* a = t.x + (row_offset + iw) * g.channels + t.c0;
          float* sum = acc.data() + column * kDepthwiseLanes;
          for (int64 l = 0; l < t.lanes; ++l) sum[l] = std::fma(a[l], b[l], sum[l]);
        }
      }
    }
  for (int64 column = 0; column < g.filter_w; ++column)
    std::memcpy(out + column * g.channels, acc.data() + column * kDepthwiseLanes,
                t.lanes * sizeof(float));
}

#ifdef TFDET_X86
// The same chains for kDepthwiseLanes channels, two 8-lane FMAs a term.
// kWidth > 0: the filter's width known when compiled (3, the common one),
// so the accumulators stay in registers; 0: g.filter_w.
template <int kWidth>
__attribute__((target("avx2,fma"))) void DepthwiseAvx2(const DepthwiseTask& t,
                                                       float* out) {
  const Geometry& g = t.g;
  const int64 width = kWidth > 0 ? kWidth : g.filter_w;
  __m256 low[kDepthwiseColumns], high[kDepthwiseColumns];
  for (int64 column = 0; column < width; ++column)
    low[column] = high[column] = _mm256_setzero_ps();
  int64 row_offset;
  for (int64 image = 0; image < g.batch; ++image)
    for (int64 oh = 0; oh < g.out_h; ++oh) {
      if (!DepthwiseRow(g, t.row, image, oh, &row_offset)) continue;
      for (int64 ow = 0; ow < g.out_w; ++ow) {
        const float* b = DepthwiseGradient(t, image, oh, ow);
        const __m256 b_low = _mm256_loadu_ps(b), b_high = _mm256_loadu_ps(b + 8);
        for (int64 column = 0; column < width; ++column) {
          const int64 iw = DepthwiseColumn(g, ow, column);
          if (iw < 0) continue;
          const float* a = t.x + (row_offset + iw) * g.channels + t.c0;
          low[column] = _mm256_fmadd_ps(_mm256_loadu_ps(a), b_low, low[column]);
          high[column] =
              _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), b_high, high[column]);
        }
      }
    }
  for (int64 column = 0; column < width; ++column) {
    _mm256_storeu_ps(out + column * g.channels, low[column]);
    _mm256_storeu_ps(out + column * g.channels + 8, high[column]);
  }
}

// The same chains for kDepthwiseLanes channels, one 16-lane FMA a term
// (kWidth as DepthwiseAvx2's).
template <int kWidth>
__attribute__((target("avx512f"))) void DepthwiseAvx512(const DepthwiseTask& t,
                                                        float* out) {
  const Geometry& g = t.g;
  const int64 width = kWidth > 0 ? kWidth : g.filter_w;
  __m512 acc[kDepthwiseColumns];
  for (int64 column = 0; column < width; ++column)
    acc[column] = _mm512_setzero_ps();
  int64 row_offset;
  for (int64 image = 0; image < g.batch; ++image)
    for (int64 oh = 0; oh < g.out_h; ++oh) {
      if (!DepthwiseRow(g, t.row, image, oh, &row_offset)) continue;
      for (int64 ow = 0; ow < g.out_w; ++ow) {
        const __m512 b = _mm512_loadu_ps(DepthwiseGradient(t, image, oh, ow));
        for (int64 column = 0; column < width; ++column) {
          const int64 iw = DepthwiseColumn(g, ow, column);
          if (iw < 0) continue;
          acc[column] = _mm512_fmadd_ps(
              _mm512_loadu_ps(t.x + (row_offset + iw) * g.channels + t.c0), b,
              acc[column]);
        }
      }
    }
  for (int64 column = 0; column < width; ++column)
    _mm512_storeu_ps(out + column * g.channels, acc[column]);
}

// A 3x3 filter's three rows in one task (t.row is 0): each position's
// gradient is read once for the nine taps, their accumulators in registers.
// The same chains as three DepthwiseAvx512<3> tasks, so the same bits.
__attribute__((target("avx512f"))) void DepthwiseAvx512Whole3x3(
    const DepthwiseTask& t, float* out) {
  const Geometry& g = t.g;
  __m512 acc[9];
  for (int tap = 0; tap < 9; ++tap) acc[tap] = _mm512_setzero_ps();
  for (int64 image = 0; image < g.batch; ++image)
    for (int64 oh = 0; oh < g.out_h; ++oh) {
      int64 row_offset[3];
      bool row_read[3];
      for (int row = 0; row < 3; ++row)
        row_read[row] = DepthwiseRow(g, row, image, oh, &row_offset[row]);
      for (int64 ow = 0; ow < g.out_w; ++ow) {
        const __m512 b = _mm512_loadu_ps(DepthwiseGradient(t, image, oh, ow));
        for (int column = 0; column < 3; ++column) {
          const int64 iw = DepthwiseColumn(g, ow, column);
          if (iw < 0) continue;
          for (int row = 0; row < 3; ++row) {
            if (!row_read[row]) continue;
            acc[row * 3 + column] = _mm512_fmadd_ps(
                _mm512_loadu_ps(t.x + (row_offset[row] + iw) * g.channels + t.c0),
                b, acc[row * 3 + column]);
          }
        }
      }
    }
  for (int tap = 0; tap < 9; ++tap)
    _mm512_storeu_ps(out + tap * g.channels, acc[tap]);
}
#endif

class FixedOrderDepthwiseBackpropFilterOp : public tensorflow::OpKernel {
 public:
  explicit FixedOrderDepthwiseBackpropFilterOp(
      tensorflow::OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    const tensorflow::Tensor& out_backprop = context->input(2);
    tensorflow::TensorShape filter_shape;
    if (!ShapeFrom(context, context->input(1), &filter_shape)) return;
    OP_REQUIRES(context, filter_shape.dim_size(3) == 1,
                tensorflow::errors::InvalidArgument(
                    "Expected a depth multiplier of 1. Received: ",
                    filter_shape.DebugString()));
    Geometry g;
    if (!attributes_.Make(context, input.shape(), filter_shape, &g)) return;
    // One output channel per input channel (a multiplier of 1).
    g.filters = g.channels;
    if (!MatchesOutput(context, g, out_backprop)) return;
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, filter_shape, &output));
    float* out = output->flat<float>().data();
    const float* x = input.flat<float>().data();
    const float* dy = out_backprop.flat<float>().data();
    const int64 blocks = (g.channels + kDepthwiseLanes - 1) / kDepthwiseLanes;
    const int64 terms = g.batch * g.out_h * g.out_w;
    const std::string path = ChooseKernels().name;
    const bool avx512 = path == "avx512", avx2 = path == "avx2";
    const bool vectors = g.filter_w <= kDepthwiseColumns;
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    const int64 threads = ThreadsFor(g.filter_h * g.filter_w * g.channels * terms,
                                     workers->num_threads);
    // With channel blocks enough for the threads, a 3x3 filter's rows go in
    // one task on the AVX-512 path (the gradient read once, not thrice).
    const bool whole_3x3 = avx512 && g.filter_h == 3 &&
                           g.filter_w == 3 && blocks >= threads;
    const int64 rows_a_task = whole_3x3 ? 3 : 1;
    tensorflow::Shard(
        threads, workers->workers, g.filter_h / rows_a_task * blocks,
        std::max<int64>(1, rows_a_task * g.filter_w * kDepthwiseLanes * terms),
        [&](int64 begin, int64 end) {
          for (int64 task = begin; task < end; ++task) {
            const int64 c0 = (task % blocks) * kDepthwiseLanes;
            const DepthwiseTask t{g,  x,  dy, task / blocks * rows_a_task,
                                  c0, std::min(kDepthwiseLanes, g.channels - c0)};
            float* dst = out + t.row * g.filter_w * g.channels + c0;
#ifdef TFDET_X86
            if (whole_3x3 && t.lanes == kDepthwiseLanes) {
              DepthwiseAvx512Whole3x3(t, dst);
              continue;
            }
            if (whole_3x3) {  // the tail channels: their three rows, scalar
              for (int64 row = 0; row < 3; ++row)
                DepthwiseScalar({g, x, dy, row, c0, t.lanes},
                                out + row * 3 * g.channels + c0);
              continue;
            }
            if (vectors && t.lanes == kDepthwiseLanes && avx512) {
              g.filter_w == 3 ? DepthwiseAvx512<3>(t, dst)
                              : DepthwiseAvx512<0>(t, dst);
              continue;
            }
            if (vectors && t.lanes == kDepthwiseLanes && avx2) {
              g.filter_w == 3 ? DepthwiseAvx2<3>(t, dst) : DepthwiseAvx2<0>(t, dst);
              continue;
            }
#endif
            DepthwiseScalar(t, dst);
          }
        });
  }

 private:
  ConvolutionAttributes attributes_;
};

// A gradient op's output: the shape its sizes input (input 0 or 1) holds.
absl::Status ShapeFromSizes(tensorflow::shape_inference::InferenceContext* c,
                            int sizes_input) {
  tensorflow::shape_inference::ShapeHandle shape;
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(sizes_input, &shape));
  TF_RETURN_IF_ERROR(c->WithRank(shape, 4, &shape));
  c->set_output(0, shape);
  return absl::OkStatus();
}

// The vector path a product would take now in this process (a scalar
// string): which one ran is not in the bits, so tests and `tfdet env` ask.
class FixedOrderVectorPathOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* context) override {
    tensorflow::Tensor* path = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({}), &path));
    path->scalar<tensorflow::tstring>()() = ChooseKernels().name;
  }
};

}  // namespace
}  // namespace tfdet

REGISTER_OP("TfdetFixedOrderMatMul")
    .Input("a: float")
    .Input("b: float")
    .Output("product: float")
    .Attr("transpose_a: bool = false")
    .Attr("transpose_b: bool = false")
    .SetShapeFn(tensorflow::shape_inference::MatMulShape);

REGISTER_OP("TfdetFixedOrderBatchMatMul")
    .Input("x: float")
    .Input("y: float")
    .Output("output: float")
    .Attr("adj_x: bool = false")
    .Attr("adj_y: bool = false")
    .SetShapeFn(tensorflow::shape_inference::BatchMatMulV2Shape);

// Conv2D's attributes, NHWC only.
#define TFDET_CONVOLUTION_ATTRIBUTES                      \
  Attr("strides: list(int)")                              \
      .Attr("padding: {'SAME', 'VALID', 'EXPLICIT'}")     \
      .Attr("explicit_paddings: list(int) = []")          \
      .Attr("dilations: list(int) = [1, 1, 1, 1]")

REGISTER_OP("TfdetFixedOrderConv2D")
    .Input("input: float")
    .Input("filter: float")
    .Output("output: float")
    .TFDET_CONVOLUTION_ATTRIBUTES
    .SetShapeFn(tensorflow::shape_inference::Conv2DShapeWithExplicitPadding);

REGISTER_OP("TfdetFixedOrderConv2DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: float")
    .Input("out_backprop: float")
    .Output("output: float")
    .TFDET_CONVOLUTION_ATTRIBUTES
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tfdet::ShapeFromSizes(c, 0);
    });

REGISTER_OP("TfdetFixedOrderConv2DBackpropFilter")
    .Input("input: float")
    .Input("filter_sizes: int32")
    .Input("out_backprop: float")
    .Output("output: float")
    .TFDET_CONVOLUTION_ATTRIBUTES
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tfdet::ShapeFromSizes(c, 1);
    });

REGISTER_OP("TfdetFixedOrderDepthwiseConv2dNativeBackpropFilter")
    .Input("input: float")
    .Input("filter_sizes: int32")
    .Input("out_backprop: float")
    .Output("output: float")
    .TFDET_CONVOLUTION_ATTRIBUTES
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tfdet::ShapeFromSizes(c, 1);
    });

REGISTER_OP("TfdetFixedOrderVectorPath")
    .Output("path: string")
    .SetIsStateful()  // read at each call: TFDET_FIXED_ORDER_ISA may change
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderVectorPath").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderVectorPathOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderBatchMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderBatchMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2D").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderConv2DOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2DBackpropInput").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderConv2DBackpropInputOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2DBackpropFilter").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderConv2DBackpropFilterOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderDepthwiseConv2dNativeBackpropFilter")
        .Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderDepthwiseBackpropFilterOp);
