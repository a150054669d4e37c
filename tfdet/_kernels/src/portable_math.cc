// Element-wise functions and sums whose bits are the same on x86-64 and
// aarch64, on any thread pool and for any batch.
//
// TfdetPortableUnary(x, function): exp, log, log1p, expm1, tanh, sigmoid,
// sin or cos of every float32 element (and TfdetPortablePow(x, y), x ** y), by Eigen's own packet algorithms (the code that
// TensorFlow's Exp, Log, Tanh, Sigmoid... kernels run), with two things
// fixed that TensorFlow's builds leave to the machine:
//   - Every multiply-add is a multiplication rounded, then an addition
//     rounded. TensorFlow's x86-64 wheels are compiled for AVX2 without
//     FMA, so that is what they compute there; its aarch64 wheels fuse them
//     (Eigen defines EIGEN_VECTORIZE_FMA from __ARM_FEATURE_FMA), which
//     gives other bits, and Eigen's tanh clamps at another bound with FMA.
//     This file is built for AVX2 on x86-64 and with __ARM_FEATURE_FMA
//     undefined on aarch64 (tfdet/_kernels/build.py), and with
//     -ffp-contract=off, so both run the same sequence of IEEE correctly
//     rounded operations: the same bits, and on x86-64 the bits of
//     TensorFlow's own kernels.
//   - Every element takes the packet path. Eigen computes a tensor's last
//     `size % packet` elements with the scalar function, another
//     approximation; here they are computed in a zero-padded packet of
//     their own, so an element's bits follow neither the tensor's size (and
//     with it the batch) nor the packet width (8 lanes on AVX, 4 on NEON).
//
// TfdetPortableGradient(y, dy, function): TensorFlow's TanhGrad or
// SigmoidGrad (the gradient from the function's output), every element on
// the packet path too.
//
// TfdetFixedOrderSum(input, reduction_indices, keep_dims, mean): TensorFlow's
// Sum (or Mean) of float32, the reduced axes made one (x viewed as [outer,
// n, inner]) and summed in an order fixed by the shape alone: the n rows are
// cut into blocks of RowsPerBlock(inner) rows; a block's partial sum is
// added in row order per column (for inner == 1, in 16 interleaved lanes,
// then the lanes pairwise); the blocks' partials are added pairwise. Blocks
// are the tasks, so the work spreads over the pool whatever its size, and
// the bits follow neither the pool, nor the vector width, nor the
// architecture. The mean divides the sum by n, correctly rounded, as
// Eigen's MeanReducer does.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/kernels/cwise_ops_gradients.h"
#include "unsupported/Eigen/CXX11/Tensor"

#include "runtime_floor.h"

namespace tfdet {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

using Flat = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;
using ConstFlat = Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;

// Elements per padded packet: a multiple of every float32 packet width
// (4 on NEON, 8 on AVX, 16 on AVX-512).
constexpr int64_t kWhole = 16;

// `functor` over `n` elements: the whole packets on the op's pool (Eigen's
// executor splits a range into blocks of whole packets, so each element of
// a multiple of kWhole takes the packet path), the rest in one zero-padded
// packet of its own.
template <typename Functor>
void OnWholePackets(const Eigen::ThreadPoolDevice& device, const float* in,
                    float* out, int64_t n, const Functor& functor = Functor()) {
  const int64_t whole = n - n % kWhole;
  if (whole > 0) {
    Flat(out, whole).device(device) = ConstFlat(in, whole).unaryExpr(functor);
  }
  if (whole < n) {
    alignas(64) float padded_in[kWhole] = {0};
    alignas(64) float padded_out[kWhole];
    std::memcpy(padded_in, in + whole, (n - whole) * sizeof(float));
    Flat(padded_out, kWhole) = ConstFlat(padded_in, kWhole).unaryExpr(functor);
    std::memcpy(out + whole, padded_out, (n - whole) * sizeof(float));
  }
}

// The binary `functor(a, b)` over `n` elements of each, the same way.
template <typename Functor>
void BinaryOnWholePackets(const Eigen::ThreadPoolDevice& device, const float* a,
                          const float* b, float* out, int64_t n) {
  const int64_t whole = n - n % kWhole;
  if (whole > 0) {
    Flat(out, whole).device(device) =
        ConstFlat(a, whole).binaryExpr(ConstFlat(b, whole), Functor());
  }
  if (whole < n) {
    alignas(64) float padded_a[kWhole] = {0};
    alignas(64) float padded_b[kWhole] = {0};
    alignas(64) float padded_out[kWhole];
    std::memcpy(padded_a, a + whole, (n - whole) * sizeof(float));
    std::memcpy(padded_b, b + whole, (n - whole) * sizeof(float));
    Flat(padded_out, kWhole) =
        ConstFlat(padded_a, kWhole).binaryExpr(ConstFlat(padded_b, kWhole), Functor());
    std::memcpy(out + whole, padded_out, (n - whole) * sizeof(float));
  }
}

using UnaryFunction = void (*)(const Eigen::ThreadPoolDevice&, const float*,
                               float*, int64_t);

template <typename Functor>
void Unary(const Eigen::ThreadPoolDevice& device, const float* in, float* out,
           int64_t n) {
  OnWholePackets<Functor>(device, in, out, n);
}

UnaryFunction FindFunction(const std::string& name) {
  using namespace Eigen::internal;  // NOLINT: Eigen's functor names.
  if (name == "exp") return Unary<scalar_exp_op<float>>;
  if (name == "log") return Unary<scalar_log_op<float>>;
  if (name == "log1p") return Unary<scalar_log1p_op<float>>;
  if (name == "expm1") return Unary<scalar_expm1_op<float>>;
  if (name == "tanh") return Unary<scalar_tanh_op<float>>;
  if (name == "sigmoid") return Unary<scalar_logistic_op<float>>;
  if (name == "sin") return Unary<scalar_sin_op<float>>;
  if (name == "cos") return Unary<scalar_cos_op<float>>;
  return nullptr;
}

class PortableUnaryOp : public OpKernel {
 public:
  explicit PortableUnaryOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string name;
    OP_REQUIRES_OK(context, context->GetAttr("function", &name));
    function_ = FindFunction(name);
    OP_REQUIRES(context, function_ != nullptr,
                tensorflow::errors::InvalidArgument("Unknown function: ", name));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context,
                   context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    if (x.NumElements() == 0) return;
    function_(context->eigen_cpu_device(), x.flat<float>().data(),
              y->flat<float>().data(), x.NumElements());
  }

 private:
  UnaryFunction function_ = nullptr;
};

using GradientFunction = void (*)(const Eigen::ThreadPoolDevice&, const float*,
                                  const float*, float*, int64_t);

// TensorFlow's TanhGrad and SigmoidGrad functors (from its output y and the
// upstream gradient dy): multiplications and a subtraction, no
// multiply-add, but their scalar path groups the products otherwise than
// their packet path.
GradientFunction FindGradient(const std::string& name) {
  using namespace Eigen::internal;  // NOLINT: Eigen's functor names.
  if (name == "tanh") return BinaryOnWholePackets<scalar_tanh_gradient_op<float>>;
  if (name == "sigmoid") {
    return BinaryOnWholePackets<scalar_sigmoid_gradient_op<float>>;
  }
  return nullptr;
}

class PortableGradientOp : public OpKernel {
 public:
  explicit PortableGradientOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string name;
    OP_REQUIRES_OK(context, context->GetAttr("function", &name));
    gradient_ = FindGradient(name);
    OP_REQUIRES(context, gradient_ != nullptr,
                tensorflow::errors::InvalidArgument("Unknown function: ", name));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& y = context->input(0);
    const Tensor& dy = context->input(1);
    OP_REQUIRES(context, y.shape() == dy.shape(),
                tensorflow::errors::InvalidArgument(
                    "Expected y and dy of one shape. Received: ", y.shape().DebugString(),
                    " and ", dy.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output(
                                {1}, 0, y.shape(), &out));
    if (y.NumElements() == 0) return;
    gradient_(context->eigen_cpu_device(), y.flat<float>().data(),
              dy.flat<float>().data(), out->flat<float>().data(), y.NumElements());
  }

 private:
  GradientFunction gradient_ = nullptr;
};

// x ** y, y a scalar or of x's shape, by Eigen's packet pow.
class PortablePowOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    using Eigen::internal::bind2nd_op;
    using Eigen::internal::scalar_pow_op;
    const Tensor& x = context->input(0);
    const Tensor& y = context->input(1);
    const bool scalar = y.NumElements() == 1 && y.dims() == 0;
    OP_REQUIRES(context, scalar || y.shape() == x.shape(),
                tensorflow::errors::InvalidArgument(
                    "Expected an exponent of rank 0 or of the base's shape. Received: ",
                    x.shape().DebugString(), " and ", y.shape().DebugString()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output(
                                {0}, 0, x.shape(), &out));
    if (x.NumElements() == 0) return;
    const auto& device = context->eigen_cpu_device();
    const float* base = x.flat<float>().data();
    float* result = out->flat<float>().data();
    if (scalar) {
      using Power = bind2nd_op<scalar_pow_op<float, float>>;
      OnWholePackets<Power>(device, base, result, x.NumElements(),
                            Power(y.scalar<float>()()));
    } else {
      BinaryOnWholePackets<scalar_pow_op<float, float>>(
          device, base, y.flat<float>().data(), result, x.NumElements());
    }
  }
};

// The sum's order. Rows per block: enough that a block is a task worth
// scheduling, fixed by the row length alone.
constexpr int64_t kLanes = 16;
int64_t RowsPerBlock(int64_t inner) {
  return inner == 1 ? 4096 : std::max<int64_t>(16, 16384 / inner);
}

// v[0] + ... + v[count - 1] (each `stride` apart), halves added pairwise:
// the first ceil(count / 2), then the rest.
float Pairwise(const float* v, int64_t count, int64_t stride) {
  if (count == 1) return v[0];
  const int64_t half = (count + 1) / 2;
  return Pairwise(v, half, stride) + Pairwise(v + half * stride, count - half, stride);
}

// Pairwise(lanes, kLanes, 1), level by level: neighbours added, then the
// neighbouring sums, down to one (the same additions, without the calls).
float LanePairs(const float* lanes) {
  float sums[kLanes / 2];
  for (int i = 0; i < kLanes / 2; ++i) sums[i] = lanes[2 * i] + lanes[2 * i + 1];
  for (int count = kLanes / 4; count >= 1; count /= 2) {
    for (int i = 0; i < count; ++i) sums[i] = sums[2 * i] + sums[2 * i + 1];
  }
  return sums[0];
}

// One block's partial sums: rows [0, rows) of `x` (row length `inner`) into
// `partial[inner]`.
void BlockSum(const float* x, int64_t rows, int64_t inner, float* partial) {
  if (inner == 1) {
    // Row r goes to lane r % kLanes; whole groups of kLanes first (one
    // vector addition each), then the rest.
    float lanes[kLanes] = {0};
    int64_t row = 0;
    for (; row + kLanes <= rows; row += kLanes) {
      for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] += x[row + lane];
    }
    for (int64_t lane = 0; row + lane < rows; ++lane) lanes[lane] += x[row + lane];
    partial[0] = LanePairs(lanes);
    return;
  }
  std::memcpy(partial, x, inner * sizeof(float));
  for (int64_t row = 1; row < rows; ++row) {
    const float* line = x + row * inner;
    for (int64_t column = 0; column < inner; ++column) partial[column] += line[column];
  }
}

// x's elements in the order of its axes `order` (a permutation), into `out`:
// a transpose, for reduced axes that are not adjacent.
void Permuted(const float* x, const std::vector<int64_t>& dims,
              const std::vector<int>& order, float* out) {
  const int rank = static_cast<int>(dims.size());
  std::vector<int64_t> strides(rank, 1);
  for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * dims[d + 1];
  std::vector<int64_t> index(rank, 0);
  int64_t total = 1;
  for (int64_t dim : dims) total *= dim;
  for (int64_t at = 0; at < total; ++at) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[d] * strides[order[d]];
    out[at] = x[offset];
    for (int d = rank - 1; d >= 0; --d) {  // The next index, last axis first.
      if (++index[d] < dims[order[d]]) break;
      index[d] = 0;
    }
  }
}

// TensorFlow's Sum and Mean (input, reduction_indices, keep_dims) for
// float32, in the fixed order above: the reduced axes made one (x viewed as
// [outer, n, inner] where they are adjacent, else transposed after the kept
// ones), then the sum over n.
template <typename Index>
class FixedOrderSumOp : public OpKernel {
 public:
  explicit FixedOrderSumOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("mean", &mean_));
    OP_REQUIRES_OK(context, context->GetAttr("keep_dims", &keep_dims_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& axes = context->input(1);
    OP_REQUIRES(context, axes.dims() <= 1,
                tensorflow::errors::InvalidArgument(
                    "Expected reduction indices of rank 0 or 1. Received: ",
                    axes.shape().DebugString()));
    const int rank = x.dims();
    std::vector<bool> reduced(rank, false);
    const auto named = axes.flat<Index>();
    for (int64_t i = 0; i < named.size(); ++i) {
      const int64_t axis = static_cast<int64_t>(named(i));
      OP_REQUIRES(context, -rank <= axis && axis < rank,
                  tensorflow::errors::InvalidArgument(
                      "Invalid reduction dimension (", axis, " for input with ",
                      rank, " dimension(s)"));
      // An axis named twice is TensorFlow's error too (its text, with the
      // axis counted from 0), not a sum over it once.
      const int64_t normalized = (axis + rank) % rank;
      OP_REQUIRES(context, !reduced[normalized],
                  tensorflow::errors::InvalidArgument(
                      "Invalid reduction arguments: Axes contains duplicate "
                      "dimension: ",
                      normalized));
      reduced[normalized] = true;
    }
    std::vector<int64_t> dims(rank);
    std::vector<int> order;  // The kept axes, then the reduced ones.
    TensorShape output_shape;
    int64_t outer = 1, n = 1, inner = 1;
    int first = rank, last = -1;
    for (int d = 0; d < rank; ++d) {
      dims[d] = x.dim_size(d);
      if (reduced[d]) {
        first = std::min(first, d);
        last = d;
        n *= dims[d];
        if (keep_dims_) output_shape.AddDim(1);
      } else {
        order.push_back(d);
        output_shape.AddDim(dims[d]);
      }
    }
    if (last < 0) {  // Nothing reduced: the input itself, as TensorFlow gives.
      context->set_output(0, x);
      return;
    }
    bool adjacent = true;
    for (int d = first; d <= last; ++d) adjacent = adjacent && reduced[d];
    for (int d = 0; d < rank; ++d) {
      if (reduced[d]) order.push_back(d);
      if (!reduced[d] && (!adjacent || d < first)) outer *= dims[d];
      if (!reduced[d] && adjacent && d > last) inner *= dims[d];
    }
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, output_shape, &y));
    if (outer * inner == 0) return;
    float* out = y->flat<float>().data();
    if (n == 0) {  // Eigen's sum of nothing is 0; its mean, 0 / 0.
      std::fill(out, out + outer * inner,
                mean_ ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
      return;
    }
    const float* in = x.flat<float>().data();
    Tensor transposed;
    if (!adjacent) {
      OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_FLOAT,
                                                     x.shape(), &transposed));
      Permuted(in, dims, order, transposed.flat<float>().data());
      in = transposed.flat<float>().data();
    }
    Reduce(context, in, outer, n, inner, out);
  }

 private:
  // out[outer, inner] = the sum (or mean) of x[outer, n, inner] over n.
  void Reduce(OpKernelContext* context, const float* in, int64_t outer, int64_t n,
              int64_t inner, float* out) {
    const int64_t rows_per_block = RowsPerBlock(inner);
    const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
    const auto& device = context->eigen_cpu_device();
    const float count = static_cast<float>(n);
    if (blocks == 1) {  // One block: its partials are the sums.
      const Eigen::TensorOpCost cost(n * inner * sizeof(float), inner * sizeof(float),
                                     n * inner);
      device.parallelFor(outer, cost, [&](Eigen::Index first, Eigen::Index last) {
        for (Eigen::Index o = first; o < last; ++o) {
          float* sums = out + o * inner;
          BlockSum(in + o * n * inner, n, inner, sums);
          if (mean_) {
            for (int64_t column = 0; column < inner; ++column) sums[column] /= count;
          }
        }
      });
      return;
    }
    Tensor partials;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                tensorflow::DT_FLOAT,
                                TensorShape({outer, blocks, inner}), &partials));
    float* partial = partials.flat<float>().data();
    const Eigen::TensorOpCost block_cost(rows_per_block * inner * sizeof(float), 0,
                                         rows_per_block * inner);
    device.parallelFor(outer * blocks, block_cost,
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index task = first; task < last; ++task) {
                           const int64_t o = task / blocks, b = task % blocks;
                           const int64_t row = b * rows_per_block;
                           BlockSum(in + (o * n + row) * inner,
                                    std::min(rows_per_block, n - row), inner,
                                    partial + task * inner);
                         }
                       });
    const Eigen::TensorOpCost column_cost(blocks * sizeof(float), sizeof(float), blocks);
    device.parallelFor(outer * inner, column_cost,
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index at = first; at < last; ++at) {
                           const int64_t o = at / inner, column = at % inner;
                           const float sum = Pairwise(
                               partial + o * blocks * inner + column, blocks, inner);
                           out[at] = mean_ ? sum / count : sum;
                         }
                       });
  }

  bool mean_ = false;
  bool keep_dims_ = false;
};

REGISTER_OP("TfdetPortableUnary")
    .Input("x: float")
    .Output("y: float")
    .Attr("function: {'exp', 'log', 'log1p', 'expm1', 'tanh', 'sigmoid', 'sin', 'cos'}")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("TfdetPortablePow")
    .Input("x: float")
    .Input("y: float")
    .Output("z: float")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("TfdetPortableGradient")
    .Input("y: float")
    .Input("dy: float")
    .Output("dx: float")
    .Attr("function: {'tanh', 'sigmoid'}")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("TfdetFixedOrderSum")
    .Input("input: float")
    .Input("reduction_indices: Tidx")
    .Output("output: float")
    .Attr("keep_dims: bool = false")
    .Attr("mean: bool = false")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .SetShapeFn(tensorflow::shape_inference::ReductionShape);

REGISTER_KERNEL_BUILDER(Name("TfdetPortableUnary").Device(tensorflow::DEVICE_CPU),
                        PortableUnaryOp);
REGISTER_KERNEL_BUILDER(Name("TfdetPortablePow").Device(tensorflow::DEVICE_CPU),
                        PortablePowOp);
REGISTER_KERNEL_BUILDER(Name("TfdetPortableGradient").Device(tensorflow::DEVICE_CPU),
                        PortableGradientOp);
REGISTER_KERNEL_BUILDER(Name("TfdetFixedOrderSum")
                            .Device(tensorflow::DEVICE_CPU)
                            .TypeConstraint<int32_t>("Tidx")
                            .HostMemory("reduction_indices"),
                        FixedOrderSumOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("TfdetFixedOrderSum")
                            .Device(tensorflow::DEVICE_CPU)
                            .TypeConstraint<int64_t>("Tidx")
                            .HostMemory("reduction_indices"),
                        FixedOrderSumOp<int64_t>);

}  // namespace
}  // namespace tfdet
