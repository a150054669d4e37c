// tfdet's portable element-wise functions as single ops: the same bits as
// the compositions of TensorFlow ops that tfdet's patches use, in one pass
// over the data instead of one per op.
//
// TfdetPortableErfc(x) is `tfdet.patches.portable_erfc.erfc_float32(x)`:
// Eigen's float32 erfc algorithm with a correctly rounded division in place
// of the CPU-model dependent reciprocal (RCPPS). Every step is the
// composition's, in its order, one IEEE correctly rounded float32 operation
// at a time (this file is compiled with -ffp-contract=off: no FMA
// contraction), so each element's bits are the composition's on any CPU.
// The one step that is not correctly rounded, exp(-x^2), is computed as
// TensorFlow's own Exp kernel computes it: Eigen's exp functor over the
// whole flat tensor on the op's thread pool, from the same Eigen headers,
// for the same packet width (this file is compiled for AVX, as the
// TensorFlow wheels' kernels are); whether an element takes the packet or
// the scalar path depends only on its index and the tensor's size. With
// `whole_packets`, the exp runs over the tensor padded with zeros to a whole
// number of kWholePacket elements, so every element takes the packet path,
// as the composition's Exp does under the pool-size-free products (whose
// element-wise functions are padded so): then an element's bits do not
// follow the tensor's size, and with it the batch.
//
// tfdet checks the bits against the composition when it loads the library
// and uses the op only when they agree.

#define EIGEN_USE_THREADS

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unsupported/Eigen/CXX11/Tensor"

#include "runtime_floor.h"

namespace tfdet {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

// Eigen's generic_fast_erfc<float> coefficients, highest degree first (the
// same numbers as portable_erfc.py).
constexpr float kClamp = 11.0f;
constexpr float kAlpha[] = {
    5.61802298761904239654541015625e-04f, -4.91381669417023658752441406250e-03f,
    2.67075151205062866210937500000e-02f, -1.12800106406211853027343750000e-01f,
    3.76122951507568359375000000000e-01f, -1.12837910652160644531250000000e00f};
constexpr float kGamma[] = {
    1.0208116471767425537109375e-01f, 4.2920666933059692382812500e-01f,
    3.2379078865051269531250000e-01f, 5.3971976041793823242187500e-02f};
constexpr float kDelta[] = {
    1.7251677811145782470703125e-02f, 3.9137163758277893066406250e-01f,
    1.0000000000000000000000000e00f, 6.2173241376876831054687500e-01f,
    9.5662862062454223632812500e-02f};

// The composition's _horner: x * c0 + c1, then r * x + c for each next c.
template <int N>
inline float Horner(float x, const float (&c)[N]) {
  float r = x * c[0] + c[1];
  for (int i = 2; i < N; ++i) r = r * x + c[i];
  return r;
}

template <int N>
inline __m256 Horner(__m256 x, const float (&c)[N]) {
  __m256 r = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(c[0])),
                           _mm256_set1_ps(c[1]));
  for (int i = 2; i < N; ++i) {
    r = _mm256_add_ps(_mm256_mul_ps(r, x), _mm256_set1_ps(c[i]));
  }
  return r;
}

// tf.clip_by_value(x, -11, 11): Minimum, then Maximum; a NaN stays the NaN.
inline float Clamp(float x) {
  const float low = x < kClamp ? x : (x != x ? x : kClamp);
  return low > -kClamp ? low : (low != low ? low : -kClamp);
}

// The same in 8 lanes: MINPS/MAXPS return their second operand when either
// is a NaN, so x goes second.
inline __m256 Clamp(__m256 x) {
  const __m256 low = _mm256_min_ps(_mm256_set1_ps(kClamp), x);
  return _mm256_max_ps(_mm256_set1_ps(-kClamp), low);
}

// -(clip(x)^2), the argument of the composition's Exp.
inline float NegatedSquare(float x) {
  const float c = Clamp(x);
  return -(c * c);
}

inline __m256 NegatedSquare(__m256 x) {
  const __m256 c = Clamp(x);
  return _mm256_xor_ps(_mm256_mul_ps(c, c), _mm256_set1_ps(-0.0f));
}

// erfc(x) from x and exp(-clip(x)^2), each step the composition's.
inline float Erfc(float x, float exp2_hi) {
  const float c = Clamp(x);
  const float x2 = c * c;
  const float small = c * Horner(x2, kAlpha) + 1.0f;
  // The rounding error of x*x, exact in double.
  const double wide = static_cast<double>(c);
  const float x2_lo = static_cast<float>(wide * wide - static_cast<double>(x2));
  const float z = exp2_hi - exp2_hi * x2_lo;
  const float q2 = 1.0f / x2;
  const float ratio = Horner(q2, kGamma) / (c * Horner(q2, kDelta));
  const float large = z * ratio + (c < 0.0f ? 2.0f : 0.0f);
  return x2 > 1.0f ? large : small;
}

// The rounding error of x2 = c*c in 4 lanes of double, back to float.
inline __m128 SquareError(__m128 c, __m128 x2) {
  const __m256d wide = _mm256_cvtps_pd(c);
  return _mm256_cvtpd_ps(
      _mm256_sub_pd(_mm256_mul_pd(wide, wide), _mm256_cvtps_pd(x2)));
}

inline __m256 Erfc(__m256 x, __m256 exp2_hi) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 c = Clamp(x);
  const __m256 x2 = _mm256_mul_ps(c, c);
  const __m256 small = _mm256_add_ps(_mm256_mul_ps(c, Horner(x2, kAlpha)), one);
  const __m256 x2_lo =
      _mm256_set_m128(SquareError(_mm256_extractf128_ps(c, 1),
                                  _mm256_extractf128_ps(x2, 1)),
                      SquareError(_mm256_castps256_ps128(c),
                                  _mm256_castps256_ps128(x2)));
  const __m256 z = _mm256_sub_ps(exp2_hi, _mm256_mul_ps(exp2_hi, x2_lo));
  const __m256 q2 = _mm256_div_ps(one, x2);
  const __m256 ratio = _mm256_div_ps(
      Horner(q2, kGamma), _mm256_mul_ps(c, Horner(q2, kDelta)));
  const __m256 negative = _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 large = _mm256_add_ps(
      _mm256_mul_ps(z, ratio), _mm256_and_ps(negative, _mm256_set1_ps(2.0f)));
  const __m256 wide_branch = _mm256_cmp_ps(x2, one, _CMP_GT_OQ);
  return _mm256_blendv_ps(small, large, wide_branch);
}

// Applies `lanes(8 floats)` to whole packets of [first, last) and `scalar` to
// the rest: the same bits either way (each is the other's steps).
template <typename Lanes, typename Scalar>
inline void ForEach(Eigen::Index first, Eigen::Index last, Lanes lanes,
                    Scalar scalar) {
  Eigen::Index i = first;
  for (; i + 8 <= last; i += 8) lanes(i);
  for (; i < last; ++i) scalar(i);
}

// The pad of the whole-packets mode: a multiple of every float32 packet
// Eigen uses (tfdet.patches._whole_packets.PACKET).
constexpr Eigen::Index kWholePacket = 16;

// A cost per element for Eigen's thread pool (bytes in, bytes out, cycles).
const Eigen::TensorOpCost kCost(8, 4, 20);

class PortableErfcOp : public OpKernel {
 public:
  explicit PortableErfcOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("whole_packets", &whole_packets_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, input.shape(), &output));
    const Eigen::Index size = input.NumElements();
    if (size == 0) return;
    const Eigen::Index padded =
        whole_packets_ ? (size + kWholePacket - 1) / kWholePacket * kWholePacket
                       : size;
    Tensor negated_square;
    OP_REQUIRES_OK(context,
                   context->allocate_temp(tensorflow::DT_FLOAT,
                                          tensorflow::TensorShape({padded}),
                                          &negated_square));
    const float* x = input.flat<float>().data();
    float* exp_term = negated_square.flat<float>().data();
    float* y = output->flat<float>().data();
    const auto& device = context->eigen_device<Eigen::ThreadPoolDevice>();

    // -(clip(x)^2), then its exp as TensorFlow's Exp kernel computes it.
    device.parallelFor(size, kCost, [&](Eigen::Index first, Eigen::Index last) {
      ForEach(
          first, last,
          [&](Eigen::Index i) {
            _mm256_storeu_ps(exp_term + i, NegatedSquare(_mm256_loadu_ps(x + i)));
          },
          [&](Eigen::Index i) { exp_term[i] = NegatedSquare(x[i]); });
    });
    std::fill(exp_term + size, exp_term + padded, 0.0f);
    auto exp_flat = negated_square.flat<float>();
    exp_flat.device(device) = exp_flat.exp();

    device.parallelFor(size, kCost, [&](Eigen::Index first, Eigen::Index last) {
      ForEach(
          first, last,
          [&](Eigen::Index i) {
            _mm256_storeu_ps(y + i, Erfc(_mm256_loadu_ps(x + i),
                                         _mm256_loadu_ps(exp_term + i)));
          },
          [&](Eigen::Index i) { y[i] = Erfc(x[i], exp_term[i]); });
    });
  }

 private:
  bool whole_packets_;
};

}  // namespace
}  // namespace tfdet

REGISTER_OP("TfdetPortableErfc")
    .Input("x: float")
    .Output("y: float")
    .Attr("whole_packets: bool = false")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* context) {
      context->set_output(0, context->input(0));
      return ::tensorflow::OkStatus();
    })
    .Doc("erfc(x) with the bits of tfdet's portable composition, in one op.");

REGISTER_KERNEL_BUILDER(
    Name("TfdetPortableErfc").Device(::tensorflow::DEVICE_CPU),
    tfdet::PortableErfcOp);
