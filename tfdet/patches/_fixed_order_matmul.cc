// tfdet's matrix products whose bits are fixed by the shapes alone.
//
// Every output element C[i][j] is one chain of fused multiply-adds,
//     acc = 0; for k = 0 .. K-1: acc = fma(A[i][k], B[k][j], acc)
// in that order, whatever the thread count, the row count M (a sample's
// batch), the tile the element lands in and the vector width:
//
// - the AVX2 micro-kernel (6x16, BLIS's outer product) keeps one output
//   element per accumulator lane, so a lane does exactly the chain above;
//   the scalar micro-kernel does the same chain with std::fma;
// - K is cut into blocks of KC, and each block continues the chain from the
//   value stored in C: a float32 store and reload is exact, and each FMA
//   rounds anyway, so the blocks give the chain's bits;
// - the work is split over output tiles only (never over K), each tile
//   computed by one thread, so the pool size decides who computes a tile,
//   never how;
// - padded rows and columns of the edge tiles are zeros computed beside the
//   real ones and thrown away: they never enter a real element's chain.
//
// The AVX2 path is compiled with target attributes and chosen by CPUID at
// run time; the scalar path runs elsewhere or when TFDET_FIXED_ORDER_ISA is
// "scalar" (the tests compare both).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/matmul_bcast.h"
#include "tensorflow/core/util/work_sharder.h"

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

// Rows [i0, i0 + kMR) of a (every k), as one panel: for each k, the
// panel's kMR rows side by side (zeros past m).
void PackA(const View& a, int64 m, int64 k, int64 i0, float* dst) {
  const int64 rows = std::min(kMR, m - i0);
  if (rows < kMR) std::memset(dst, 0, sizeof(float) * kMR * k);
  if (a.cols == 1) {
    for (int64 r = 0; r < rows; ++r) {
      const float* src = a.data + (i0 + r) * a.rows;
      for (int64 x = 0; x < k; ++x) dst[x * kMR + r] = src[x];
    }
  } else {
    for (int64 x = 0; x < k; ++x) {
      const float* src = a.data + i0 * a.rows + x * a.cols;
      for (int64 r = 0; r < rows; ++r) dst[x * kMR + r] = src[r * a.rows];
    }
  }
}

// Columns [j0, j0 + kNR) of b (every k), as one panel: for each k, the
// panel's kNR columns side by side (zeros past n).
void PackB(const View& b, int64 k, int64 n, int64 j0, float* dst) {
  const int64 cols = std::min(kNR, n - j0);
  if (cols < kNR) std::memset(dst, 0, sizeof(float) * kNR * k);
  if (b.cols == 1) {
    for (int64 x = 0; x < k; ++x)
      std::memcpy(dst + x * kNR, b.data + x * b.rows + j0, sizeof(float) * cols);
  } else {
    for (int64 c = 0; c < cols; ++c) {
      const float* src = b.data + (j0 + c) * b.cols;
      for (int64 x = 0; x < k; ++x) dst[x * kNR + c] = src[x * b.rows];
    }
  }
}

// c (kMR x kNR, row stride ldc) = (accumulate ? c : 0) + a-panel x b-panel,
// each element one FMA chain over k in order.
using MicroKernel = void (*)(int64 kc, const float* a, const float* b,
                             float* c, int64 ldc, bool accumulate);

void ScalarKernel(int64 kc, const float* a, const float* b, float* c,
                  int64 ldc, bool accumulate) {
  for (int64 r = 0; r < kMR; ++r) {
    for (int64 j = 0; j < kNR; ++j) {
      float acc = accumulate ? c[r * ldc + j] : 0.0f;
      for (int64 k = 0; k < kc; ++k)
        acc = std::fma(a[k * kMR + r], b[k * kNR + j], acc);
      c[r * ldc + j] = acc;
    }
  }
}

__attribute__((target("avx2,fma"))) void Avx2Kernel(int64 kc, const float* a,
                                                     const float* b, float* c,
                                                     int64 ldc,
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
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
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
    b += kNR;
  }
  _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

bool CpuHasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The micro-kernel of this process: AVX2 where the CPU has it, unless
// TFDET_FIXED_ORDER_ISA=scalar asks for the scalar one (read at each call,
// so a test can compare both in one process).
MicroKernel ChooseKernel() {
  static const bool avx2 = CpuHasAvx2Fma();
  const char* wanted = std::getenv("TFDET_FIXED_ORDER_ISA");
  if (wanted != nullptr && std::strcmp(wanted, "scalar") == 0)
    return ScalarKernel;
  return avx2 ? Avx2Kernel : ScalarKernel;
}

// One product of the batch: c (m x n, row-major) = a (m x k) @ b (k x n).
struct Product {
  View a;
  View b;
  float* c;
};

// The output tiles: a fixed function of the shapes. Tiles are large enough
// to amortize packing, and small enough that a product has a few dozen of
// them to share among threads. (The bits do not depend on this choice.)
struct Tiling {
  int64 tm, tn, row_tiles, col_tiles;
  Tiling(int64 batch, int64 m, int64 n) {
    tm = std::min<int64>(96, ((m + kMR - 1) / kMR) * kMR);
    tn = std::min<int64>(256, ((n + kNR - 1) / kNR) * kNR);
    auto count = [&] {
      return batch * ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
    };
    while (count() < 32 && tn > 2 * kNR) tn /= 2;
    while (count() < 32 && tm > 4 * kMR) tm /= 2;
    tm = ((tm + kMR - 1) / kMR) * kMR;
    tn = ((tn + kNR - 1) / kNR) * kNR;
    row_tiles = (m + tm - 1) / tm;
    col_tiles = (n + tn - 1) / tn;
  }
};

// The packed panels' memory, kept by each op kernel between its calls: a
// fresh allocation of a large block costs its page faults at every call.
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

// One product with its packed panels: a_pack holds ceil(m / kMR) panels of
// kMR x k, b_pack ceil(n / kNR) panels of k x kNR.
struct Packed {
  const float* a_pack;
  const float* b_pack;
  float* c;
};

// Tile (i0.., j0..) of one product: for each K block in order, the
// micro-kernel over the tile's micro-tiles, continuing each chain from C.
void ComputeTile(const Packed& p, int64 m, int64 n, int64 k, int64 i0,
                 int64 j0, int64 tm, int64 tn, MicroKernel kernel) {
  const int64 rows = std::min(tm, m - i0);
  const int64 cols = std::min(tn, n - j0);
  float* c = p.c;
  if (k == 0) {
    for (int64 r = 0; r < rows; ++r)
      std::fill(c + (i0 + r) * n + j0, c + (i0 + r) * n + j0 + cols, 0.0f);
    return;
  }
  alignas(64) float edge[kMR * kNR];
  for (int64 k0 = 0; k0 < k; k0 += kKC) {
    const int64 kc = std::min(kKC, k - k0);
    const bool accumulate = k0 > 0;
    for (int64 q = 0; q < cols; q += kNR) {
      const float* b_panel = p.b_pack + ((j0 + q) / kNR) * kNR * k + k0 * kNR;
      const int64 nr = std::min(kNR, cols - q);
      for (int64 r = 0; r < rows; r += kMR) {
        const float* a_panel =
            p.a_pack + ((i0 + r) / kMR) * kMR * k + k0 * kMR;
        const int64 mr = std::min(kMR, rows - r);
        float* out = c + (i0 + r) * n + j0 + q;
        if (mr == kMR && nr == kNR) {
          kernel(kc, a_panel, b_panel, out, n, accumulate);
          continue;
        }
        // An edge micro-tile: the same chains on a full-size copy.
        if (accumulate)
          for (int64 x = 0; x < mr; ++x)
            std::memcpy(edge + x * kNR, out + x * n, sizeof(float) * nr);
        kernel(kc, a_panel, b_panel, edge, kNR, accumulate);
        for (int64 x = 0; x < mr; ++x)
          std::memcpy(out + x * n, edge + x * kNR, sizeof(float) * nr);
      }
    }
  }
}

// Computes every product: packs each operand once (split over panels),
// then splits the (product, row tile, column tile) tasks over TensorFlow's
// intra-op pool. Packing copies values and does no arithmetic, so how it
// is split cannot change a bit.
void ComputeProducts(tensorflow::OpKernelContext* context, Scratch* scratch,
                     const std::vector<Product>& products, int64 m, int64 n,
                     int64 k) {
  if (products.empty() || m == 0 || n == 0) return;
  const int64 batch = products.size();
  const int64 a_panels = (m + kMR - 1) / kMR;
  const int64 b_panels = (n + kNR - 1) / kNR;
  // Each product's B panels start on a 64-byte line (aligned loads).
  const int64 a_size = ((a_panels * kMR * k + 15) / 16) * 16;
  const int64 b_size = b_panels * kNR * k;
  float* a_pack = scratch->Get(batch * (a_size + b_size));
  float* b_pack = a_pack + batch * a_size;
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  const int64 panels = a_panels + b_panels;
  auto pack = [&](int64 unit) {
    const Product& p = products[unit / panels];
    const int64 panel = unit % panels;
    const int64 b = unit / panels;
    if (panel < a_panels)
      PackA(p.a, m, k, panel * kMR, a_pack + b * a_size + panel * kMR * k);
    else
      PackB(p.b, k, n, (panel - a_panels) * kNR,
            b_pack + b * b_size + (panel - a_panels) * kNR * k);
  };
  const Tiling tiling(batch, m, n);
  const int64 per_product = tiling.row_tiles * tiling.col_tiles;
  const MicroKernel kernel = ChooseKernel();
  if (per_product == 1) {
    // Small products, one tile each: one pass over the pool, each task
    // packing its own product's panels and computing it.
    tensorflow::Shard(
        workers->num_threads, workers->workers, batch,
        std::max<int64>(1, m * n * k), [&](int64 begin, int64 end) {
          for (int64 b = begin; b < end; ++b) {
            for (int64 panel = 0; panel < panels; ++panel)
              pack(b * panels + panel);
            const Packed packed{a_pack + b * a_size, b_pack + b * b_size,
                                products[b].c};
            ComputeTile(packed, m, n, k, 0, 0, tiling.tm, tiling.tn, kernel);
          }
        });
    return;
  }
  tensorflow::Shard(workers->num_threads, workers->workers, batch * panels,
                    std::max<int64>(1, 16 * k), [&](int64 begin, int64 end) {
                      for (int64 unit = begin; unit < end; ++unit) pack(unit);
                    });
  tensorflow::Shard(
      workers->num_threads, workers->workers, batch * per_product,
      std::max<int64>(1, tiling.tm * tiling.tn * k),
      [&](int64 begin, int64 end) {
        for (int64 task = begin; task < end; ++task) {
          const int64 b = task / per_product;
          const Packed packed{a_pack + b * a_size, b_pack + b * b_size,
                              products[b].c};
          const int64 tile = task % per_product;
          ComputeTile(packed, m, n, k, (tile / tiling.col_tiles) * tiling.tm,
                      (tile % tiling.col_tiles) * tiling.tn, tiling.tm,
                      tiling.tn, kernel);
        }
      });
}

// A (rows x cols) matrix stored row-major, read as its transpose or not.
View Read(const float* data, int64 rows, int64 cols, bool transpose) {
  return transpose ? View{data, 1, cols} : View{data, cols, 1};
}

// An op kernel that keeps its scratch memory between calls; calls that
// overlap (the same node run by two steps at once) take their own.
class ProductKernel : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

 protected:
  void ComputeAll(tensorflow::OpKernelContext* context,
               const std::vector<Product>& products, int64 m, int64 n,
               int64 k) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      ComputeProducts(context, &scratch_, products, m, n, k);
    } else {
      Scratch own;
      ComputeProducts(context, &own, products, m, n, k);
    }
  }

 private:
  std::mutex mutex_;
  Scratch scratch_;
};

class FixedOrderMatMulOp : public ProductKernel {
 public:
  explicit FixedOrderMatMulOp(tensorflow::OpKernelConstruction* context)
      : ProductKernel(context) {
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
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, {m, n}, &c));
    const std::vector<Product> products = {
        {Read(a.flat<float>().data(), a.dim_size(0), a.dim_size(1),
              transpose_a_),
         Read(b.flat<float>().data(), b.dim_size(0), b.dim_size(1),
              transpose_b_),
         c->flat<float>().data()}};
    ComputeAll(context, products, m, n, k);
  }

 private:
  bool transpose_a_ = false;
  bool transpose_b_ = false;
};

class FixedOrderBatchMatMulOp : public ProductKernel {
 public:
  explicit FixedOrderBatchMatMulOp(tensorflow::OpKernelConstruction* context)
      : ProductKernel(context) {
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
    ComputeAll(context, products, m, n, k);
  }

 private:
  bool adj_x_ = false;
  bool adj_y_ = false;
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

REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderBatchMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderBatchMatMulOp);
