// y = x W^T + b for a few rows of x: the products of a decoding step, at memory speed.
//
// A decoding step multiplies every weight matrix by one row per sequence. Such a product
// reads each weight once and does 2 flops per weight per row, so memory bounds it; yet
// torch's float32 product (MKL's gemv/gemm) reads the weights at 10-15 GB/s on a 2-core
// machine whose cores read at 40 GB/s. Here each thread takes a range of weight rows and,
// for kWeightRows of them at a time, computes their dot products with every row of x (x
// stays in the caches; kRows of its rows at a time, so that kWeightRows * kRows vector
// accumulators live in registers while each weight vector is loaded once per group of
// kRows rows). Written on at::vec, so one source serves AVX2, AVX-512 and ARM.
//
// float32 weights, or bfloat16 or float16 ones (converted to float32 in registers; x is
// float32 and the sums are float32 either way). The order of the additions differs from MKL's, as it
// does between any two GEMM kernels: results agree to float32 rounding.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "skinny.h"

namespace {

using attnlab_skinny::skinny;

// x [rows, depth] float32, weight [width, depth] float32, bfloat16 or float16, bias [width] or None
// (float32) -> [rows, width] float32. All contiguous.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "skinny linear: x [rows, depth] and weight [width, depth] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && weight.is_contiguous(),
              "skinny linear: contiguous float32 x expected");
  const int64_t rows = x.size(0), depth = x.size(1), width = weight.size(0);
  at::Tensor out = at::empty({rows, width}, x.options());
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == width,
                "skinny linear: contiguous float32 bias of the weight's rows expected");
    bias_data = bias->data_ptr<float>();
  }
  if (weight.scalar_type() == at::kFloat) {
    skinny(x.data_ptr<float>(), rows, weight.data_ptr<float>(), width, depth, bias_data,
           out.data_ptr<float>());
  } else if (weight.scalar_type() == at::kBFloat16) {
    skinny(x.data_ptr<float>(), rows, weight.data_ptr<at::BFloat16>(), width, depth, bias_data,
           out.data_ptr<float>());
  } else {
    TORCH_CHECK(weight.scalar_type() == at::kHalf,
                "skinny linear: float32, bfloat16 or float16 weight expected");
    skinny(x.data_ptr<float>(), rows, weight.data_ptr<at::Half>(), width, depth, bias_data,
           out.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(attnlab_skinny_linear, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.impl("linear", c10::DispatchKey::CPU, &linear);
}
