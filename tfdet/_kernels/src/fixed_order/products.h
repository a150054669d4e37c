// Matrix products: MatMul and BatchMatMul (broadcast batches, adjoints as
// strides) on the shared core.
//
// Part of tfdet's fixed-order library: included once, by
// fixed_order_products.cc, into its one translation unit (the library is one
// TensorFlow op library, built from that file; see its header for the bits).
#ifndef TFDET_KERNELS_FIXED_ORDER_PRODUCTS_H_
#define TFDET_KERNELS_FIXED_ORDER_PRODUCTS_H_

#include <unordered_map>

#include "core.h"

namespace tfdet {
namespace {

// One product of a batch of matrices: c (m x n, row-major) = a @ b.
struct Product {
  View a;
  View b;
  float* c;
};

// Matrices read through strides (a transpose is a stride). `b_slots`:
// which distinct B each product reads (see SharesB in core.h), and
// `b_owners` a product of each.
struct Matrices {
  const std::vector<Product>& products;
  int64 m, n, k;
  std::vector<int64> b_slots, b_owners;
  int64 BSlots() const { return static_cast<int64>(b_owners.size()); }
  int64 BSlot(int64 p) const { return b_slots[p]; }
  int64 BOwner(int64 slot) const { return b_owners[slot]; }
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
  Matrices matrices{products, m, n, k, {}, {}};
  // A broadcast B is one matrix read by several products: the same data
  // (every product of a call reads B with the same strides). Each distinct
  // one gets a slot (one packed copy).
  matrices.b_slots.reserve(products.size());
  std::unordered_map<const float*, int64> slot_of;
  for (int64 p = 0; p < static_cast<int64>(products.size()); ++p) {
    const auto [found, added] =
        slot_of.emplace(products[p].b.data, matrices.BSlots());
    if (added) matrices.b_owners.push_back(p);
    matrices.b_slots.push_back(found->second);
  }
  ComputeProducts(context, matrices, products.size(), m, n, k);
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

}  // namespace
}  // namespace tfdet

#endif  // TFDET_KERNELS_FIXED_ORDER_PRODUCTS_H_
