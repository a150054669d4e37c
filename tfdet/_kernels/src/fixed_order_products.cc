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
// - the work is split over output tiles, each tile computed by one thread,
//   so the pool size decides who computes a tile, never how; and a long
//   sum (K of 8,192 terms or more) over K blocks whose number and bounds
//   follow K alone (KBlocks in core.h): each block's chain starts from zero
//   and an element's block sums are added in block order, so for such a K
//   the chain above runs per block, and the blocks' sums in order;
// - padded rows and columns of the edge tiles are zeros computed beside the
//   real ones and thrown away: they never enter a real element's chain.
//
// A convolution is the same product over its image patches, read from the
// image directly (no im2col copy in memory): packed into panels, or read
// in place by the micro-kernel through a pointer per row and filter tap
// (ReadsARows in core.h) or per term (ReadsATerms), which changes no chain:
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
//
// The library's sources: fixed_order/core.h (the micro-kernels, packing,
// tiling, scratch and the tile driver), fixed_order/products.h,
// fixed_order/convolutions.h and fixed_order/depthwise.h (each op's operands
// and kernel class), and this file, which registers every op and kernel of
// the library.

// In this order (clang-format off: each part reads the ones before it).
// clang-format off
#include "fixed_order/products.h"
#include "fixed_order/convolutions.h"
#include "fixed_order/depthwise.h"
// clang-format on

namespace tfdet {
namespace {

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

// How the kernels would split a call of (batch, m, n, k) at a pool of
// `pool` threads on this process's vector path, from those five values
// alone (an int64 vector): [threads, K blocks, tasks, tile rows, tile
// columns]. No product runs: benchmarks/kernel_parallelism.py's table and
// its test read the kernels' own rule (Plan in core.h), not a copy.
class FixedOrderPlanOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& call = context->input(0);
    OP_REQUIRES(context, call.dims() == 1 && call.NumElements() == 5,
                tensorflow::errors::InvalidArgument(
                    "Expected [batch, m, n, k, pool]. Received shape ",
                    call.shape().DebugString()));
    const auto v = call.vec<int64_t>();
    for (int i = 0; i < 5; ++i)
      OP_REQUIRES(context, v(i) > 0,
                  tensorflow::errors::InvalidArgument(
                      "Expected positive [batch, m, n, k, pool]. Received ",
                      call.DebugString()));
    const Plan plan(v(0), v(1), v(2), v(3), v(4), ChooseKernels().pair != nullptr);
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({5}), &out));
    auto o = out->vec<int64_t>();
    o(0) = plan.threads;
    o(1) = plan.blocks.count;
    o(2) = plan.tasks;
    o(3) = plan.tiling.tm;
    o(4) = plan.tiling.tn;
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

REGISTER_OP("TfdetFixedOrderPlan")
    .Input("call: int64")
    .Output("plan: int64")
    .SetIsStateful()  // the vector path, read at each call, shapes the tiles
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(5));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderVectorPath").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderVectorPathOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderPlan").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderPlanOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderBatchMatMul").Device(tensorflow::DEVICE_CPU),
    tfdet::FixedOrderBatchMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2D").Device(tensorflow::DEVICE_CPU),
    tfdet::ConvolutionOp<tfdet::Forward>);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2DBackpropInput").Device(tensorflow::DEVICE_CPU),
    tfdet::ConvolutionOp<tfdet::InputGradient>);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderConv2DBackpropFilter").Device(tensorflow::DEVICE_CPU),
    tfdet::ConvolutionOp<tfdet::FilterGradient>);
REGISTER_KERNEL_BUILDER(
    Name("TfdetFixedOrderDepthwiseConv2dNativeBackpropFilter")
        .Device(tensorflow::DEVICE_CPU),
    tfdet::ConvolutionOp<tfdet::DepthwiseFilterGradient>);
