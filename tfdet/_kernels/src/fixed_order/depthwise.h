// The filter gradient of a depthwise convolution (one filter per channel).
//
// Part of tfdet's fixed-order library: included once, by
// fixed_order_products.cc, into its one translation unit (the library is one
// TensorFlow op library, built from that file; see its header for the bits).
#ifndef TFDET_KERNELS_FIXED_ORDER_DEPTHWISE_H_
#define TFDET_KERNELS_FIXED_ORDER_DEPTHWISE_H_

#include "convolutions.h"

namespace tfdet {
namespace {

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

// Inputs: the image, the filter's shape (a depth multiplier of 1), the
// output's gradient. Output: the filter's gradient.
struct DepthwiseFilterGradient {
  static bool Shapes(tensorflow::OpKernelContext* context,
                     const ConvolutionAttributes& attributes, Geometry* g,
                     tensorflow::TensorShape* filter_shape) {
    if (!ShapeFrom(context, context->input(1), filter_shape)) return false;
    if (filter_shape->dim_size(3) != 1) {
      context->CtxFailure(tensorflow::errors::InvalidArgument(
          "Expected a depth multiplier of 1. Received: ",
          filter_shape->DebugString()));
      return false;
    }
    if (!attributes.Make(context, context->input(0).shape(), *filter_shape, g))
      return false;
    // One output channel per input channel (a multiplier of 1).
    g->filters = g->channels;
    return MatchesOutput(context, *g, context->input(2));
  }

  static void Run(tensorflow::OpKernelContext* context, const Geometry& g,
                  float* out) {
    const float* x = context->input(0).flat<float>().data();
    const float* dy = context->input(2).flat<float>().data();
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
};

}  // namespace
}  // namespace tfdet

#endif  // TFDET_KERNELS_FIXED_ORDER_DEPTHWISE_H_
