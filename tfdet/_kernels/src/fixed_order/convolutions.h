// 2-D convolutions (NHWC images, HWIO filters, float32) and their two
// gradients, as products over the image's patches packed from the image.
//
// Part of tfdet's fixed-order library: included once, by
// fixed_order_products.cc, into its one translation unit (the library is one
// TensorFlow op library, built from that file; see its header for the bits).
#ifndef TFDET_KERNELS_FIXED_ORDER_CONVOLUTIONS_H_
#define TFDET_KERNELS_FIXED_ORDER_CONVOLUTIONS_H_

#include "core.h"

namespace tfdet {
namespace {

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
  // Each row's terms at a tap: a run of channels in the pixel it reads.
  int64 TermsPerTap() const { return g.channels; }
  void RowSources(int64 i0, int64 first_tap, int64 taps, const float* zeros,
                  const float** at) const {
    int64 image[kMR], oh[kMR], ow[kMR];
    const int64 rows = std::min(kMR, m() - i0);
    for (int64 r = 0; r < rows; ++r) {
      const int64 p = i0 + r;
      ow[r] = p % g.out_w, oh[r] = (p / g.out_w) % g.out_h;
      image[r] = p / (g.out_w * g.out_h);
    }
    for (int64 tap = first_tap; tap < first_tap + taps; ++tap, at += kMR) {
      const int64 top = (tap / g.filter_w) * g.dilation_h - g.pad_top;
      const int64 left = (tap % g.filter_w) * g.dilation_w - g.pad_left;
      for (int64 r = 0; r < kMR; ++r) {
        const int64 ih = r < rows ? oh[r] * g.stride_h + top : -1;
        const int64 iw = r < rows ? ow[r] * g.stride_w + left : -1;
        at[r] = (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width)
                    ? zeros
                    : input +
                          ((image[r] * g.height + ih) * g.width + iw) * g.channels;
      }
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
  // Each row's terms at a tap: a run of filters in the output gradient's
  // position that read this pixel through the tap.
  int64 TermsPerTap() const { return g.filters; }
  void RowSources(int64 i0, int64 first_tap, int64 taps, const float* zeros,
                  const float** at) const {
    int64 image[kMR], ih[kMR], iw[kMR];
    const int64 rows = std::min(kMR, m() - i0);
    for (int64 r = 0; r < rows; ++r) {
      const int64 p = i0 + r;
      iw[r] = p % g.width, ih[r] = (p / g.width) % g.height;
      image[r] = p / (g.width * g.height);
    }
    const bool unit_stride = g.stride_h == 1 && g.stride_w == 1;
    for (int64 tap = first_tap; tap < first_tap + taps; ++tap, at += kMR) {
      const int64 top = g.pad_top - (tap / g.filter_w) * g.dilation_h;
      const int64 left = g.pad_left - (tap % g.filter_w) * g.dilation_w;
      for (int64 r = 0; r < kMR; ++r) {
        at[r] = zeros;
        if (r >= rows) continue;
        const int64 h = ih[r] + top, w = iw[r] + left;
        if (h < 0 || w < 0) continue;
        // At a unit stride every pixel is read at every tap: no division,
        // which per row and tap cost as much as the tap's packing.
        const int64 oh = unit_stride ? h : h / g.stride_h;
        const int64 ow = unit_stride ? w : w / g.stride_w;
        if (oh >= g.out_h || ow >= g.out_w ||
            (!unit_stride && (h % g.stride_h != 0 || w % g.stride_w != 0)))
          continue;
        at[r] = out_backprop + ((image[r] * g.out_h + oh) * g.out_w + ow) * g.filters;
      }
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
  // The rows of one tap (its channels), and where each term's first one
  // lies: the pixel tap `tap` reads at output position k0 + x (its channel
  // 0), or `zeros` where that is padding. A micro-row of one tap's
  // channels reads its kMR values side by side there (ComputeTileReadingA).
  int64 RowsATap() const { return g.channels; }
  void TapTerms(int64 tap, int64 k0, int64 kc, const float* zeros,
                const float** at) const {
    const int64 top = (tap / g.filter_w) * g.dilation_h - g.pad_top;
    const int64 left = (tap % g.filter_w) * g.dilation_w - g.pad_left;
    OutputPosition position(g, k0);
    for (int64 x = 0; x < kc; ++x, position.Next(g)) {
      const int64 ih = position.oh * g.stride_h + top;
      const int64 iw = position.ow * g.stride_w + left;
      at[x] = ih < 0 || ih >= g.height || iw < 0 || iw >= g.width
                  ? zeros
                  : input + ((position.image * g.height + ih) * g.width + iw) *
                                g.channels;
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

// A convolution op's Compute, the steps every one shares: the geometry and
// the output's shape from its inputs and attributes (`Kind::Shapes`, false
// where it put an error in the context), the output allocated, then the
// op's own computation into it (`Kind::Run`).
template <typename Kind>
class ConvolutionOp : public tensorflow::OpKernel {
 public:
  explicit ConvolutionOp(tensorflow::OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(tensorflow::OpKernelContext* context) override {
    Geometry g;
    tensorflow::TensorShape output_shape;
    if (!Kind::Shapes(context, attributes_, &g, &output_shape)) return;
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, output_shape, &output));
    Kind::Run(context, g, output->flat<float>().data());
  }

 private:
  ConvolutionAttributes attributes_;
};

// Inputs: the image, the filter. Output: the convolution.
struct Forward {
  static bool Shapes(tensorflow::OpKernelContext* context,
                     const ConvolutionAttributes& attributes, Geometry* g,
                     tensorflow::TensorShape* output) {
    if (!attributes.Make(context, context->input(0).shape(),
                         context->input(1).shape(), g))
      return false;
    *output = tensorflow::TensorShape({g->batch, g->out_h, g->out_w, g->filters});
    return true;
  }
  static void Run(tensorflow::OpKernelContext* context, const Geometry& g,
                  float* out) {
    const ForwardOperands operands{g, context->input(0).flat<float>().data(),
                                   context->input(1).flat<float>().data(), out};
    ComputeProducts(context, operands, 1, operands.m(), g.filters,
                    operands.k());
  }
};

// Inputs: the image's shape, the filter, the output's gradient. Output: the
// image's gradient.
struct InputGradient {
  static bool Shapes(tensorflow::OpKernelContext* context,
                     const ConvolutionAttributes& attributes, Geometry* g,
                     tensorflow::TensorShape* output) {
    return ShapeFrom(context, context->input(0), output) &&
           attributes.Make(context, *output, context->input(1).shape(), g) &&
           MatchesOutput(context, *g, context->input(2));
  }
  static void Run(tensorflow::OpKernelContext* context, const Geometry& g,
                  float* out) {
    const InputGradientOperands operands{
        g, context->input(1).flat<float>().data(),
        context->input(2).flat<float>().data(), out};
    ComputeProducts(context, operands, 1, operands.m(), g.channels,
                    operands.k());
  }
};

// Inputs: the image, the filter's shape, the output's gradient. Output: the
// filter's gradient.
struct FilterGradient {
  static bool Shapes(tensorflow::OpKernelContext* context,
                     const ConvolutionAttributes& attributes, Geometry* g,
                     tensorflow::TensorShape* output) {
    return ShapeFrom(context, context->input(1), output) &&
           attributes.Make(context, context->input(0).shape(), *output, g) &&
           MatchesOutput(context, *g, context->input(2));
  }
  static void Run(tensorflow::OpKernelContext* context, const Geometry& g,
                  float* out) {
    const float* input = context->input(0).flat<float>().data();
    const float* out_backprop = context->input(2).flat<float>().data();
    // Filters that fill a pair of micro-tiles: the filter's own layout;
    // fewer: filters-major, which vectorizes over (tap, channel) instead,
    // then transposed. The same bits either way.
    if (g.filters >= 2 * kNR) {
      const FilterGradientDirectOperands operands{g, input, out_backprop, out};
      ComputeProducts(context, operands, 1, operands.m(), g.filters,
                      operands.k());
      return;
    }
    std::vector<float> transposed(g.filters * g.filter_h * g.filter_w *
                                  g.channels);
    const FilterGradientOperands operands{g, input, out_backprop,
                                          transposed.data()};
    const int64 weights = operands.n();
    ComputeProducts(context, operands, 1, g.filters, weights, operands.k());
    for (int64 o = 0; o < g.filters; ++o)
      for (int64 w = 0; w < weights; ++w)
        out[w * g.filters + o] = transposed[o * weights + w];
  }
};

}  // namespace
}  // namespace tfdet

#endif  // TFDET_KERNELS_FIXED_ORDER_CONVOLUTIONS_H_
