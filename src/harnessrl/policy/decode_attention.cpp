// Copyright 2026 The harnessrl Authors. Licensed under the Apache License, Version 2.0.
//
// One decode step's attention over HFPolicy's right-aligned KV slab, float32 or bfloat16 (computed
// in float32), GQA-packed
// (policy/decode_kernel.py builds and loads it). query is [rows, kv_heads, G, D]: the G query
// heads that share a key head, one token each; key and value are [rows, kv_heads, columns, D]
// views of the slab (a column's D values contiguous, any other strides); row r attends over its
// columns [start[r], columns), the ones it fills. Each (row, key head) streams its keys and
// values once, in blocks of 128, with an online softmax (the max and the sum rescaled per
// block), so a key is read once for its G queries; SDPA's CPU flash kernel reaches the same
// numbers through GEMM calls of G x D x block, too small to stream the keys at memory speed
// (docs/benchmarks.md). The loops are plain C++ that the compiler vectorizes (-O3 -march=native).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention_values.h"

namespace {

using harnessrl::as_float;
using harnessrl::exp_nonpositive;
using harnessrl::kLanes;
using harnessrl::lanes_sum;
using harnessrl::load;
using harnessrl::store;
using harnessrl::vec16;

constexpr int kBlock = 128;  // a multiple of kLanes
constexpr int kMaxGroup = 8;


// One key or value column as D floats.
template <int D, typename T>
inline void load_row(const T* source, float* row) {
#pragma omp simd
  for (int d = 0; d < D; ++d) row[d] = as_float(source[d]);
}

template <int D, typename T>
void attend_one(const float* q, const T* k, const T* v, float* out, int64_t n, int groups, float scale) {
  float acc[kMaxGroup][D];
  float running_max[kMaxGroup];
  float running_sum[kMaxGroup];
  float score[kMaxGroup][kBlock];
  for (int g = 0; g < groups; ++g) {
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.f;
    for (int d = 0; d < D; ++d) acc[g][d] = 0.f;
  }
  for (int64_t first = 0; first < n; first += kBlock) {
    const int count = static_cast<int>(std::min<int64_t>(kBlock, n - first));
    for (int j = 0; j < count; ++j) {
      float kf[D];
      load_row<D>(k + (first + j) * D, kf);
      for (int g = 0; g < groups; ++g) {
        const float* query = q + g * D;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += query[d] * kf[d];
        score[g][j] = dot * scale;
      }
    }
    for (int g = 0; g < groups; ++g) {
      float* s = score[g];
      float block_max = running_max[g];
      for (int j = 0; j < count; ++j) block_max = std::max(block_max, s[j]);
      const float rescale = std::exp(running_max[g] - block_max);  // 0 for the first block
      for (int j = count; j % kLanes != 0; ++j) s[j] = -std::numeric_limits<float>::infinity();  // exp: 0
      vec16 sum{};
      for (int j = 0; j < count; j += kLanes) {
        const vec16 e = exp_nonpositive(load(s + j) - block_max);
        store(s + j, e);
        sum += e;
      }
      running_sum[g] = running_sum[g] * rescale + lanes_sum(sum);
      running_max[g] = block_max;
      for (int d = 0; d < D; ++d) acc[g][d] *= rescale;
    }
    for (int j = 0; j < count; ++j) {
      float vf[D];
      load_row<D>(v + (first + j) * D, vf);
      for (int g = 0; g < groups; ++g) {
        const float p = score[g][j];
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[g][d] += p * vf[d];
      }
    }
  }
  for (int g = 0; g < groups; ++g) {
    const float inverse = 1.f / running_sum[g];
    for (int d = 0; d < D; ++d) out[g * D + d] = acc[g][d] * inverse;
  }
}

template <int D, typename T>
void attend(const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value, const int64_t* start,
            torch::Tensor& out, float scale) {
  const int64_t rows = q.size(0), kv_heads = q.size(1), groups = q.size(2), columns = key.size(2);
  const float* qp = q.data_ptr<float>();
  const T* kp = static_cast<const T*>(key.data_ptr());
  const T* vp = static_cast<const T*>(value.data_ptr());
  float* op = out.data_ptr<float>();
  const int64_t k_row = key.stride(0), k_head = key.stride(1), v_row = value.stride(0), v_head = value.stride(1);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = i / kv_heads, head = i % kv_heads, s = start[row];
      attend_one<D, T>(qp + i * groups * D, kp + row * k_row + head * k_head + s * D,
                       vp + row * v_row + head * v_head + s * D, op + i * groups * D, columns - s,
                       static_cast<int>(groups), scale);
    }
  });
}

template <typename T>
void attend_sized(int64_t head_dim, const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value,
                  const int64_t* start, torch::Tensor& out, float scale) {
  switch (head_dim) {
    case 32: attend<32, T>(q, key, value, start, out, scale); break;
    case 64: attend<64, T>(q, key, value, start, out, scale); break;
    case 128: attend<128, T>(q, key, value, start, out, scale); break;
    default: TORCH_CHECK(false, "head size ", head_dim, " is not built (32, 64, 128)");
  }
}

torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const torch::Tensor& start, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "query, key and value are 4-d");
  const auto dtype = key.scalar_type();
  TORCH_CHECK((dtype == torch::kFloat32 || dtype == torch::kBFloat16) && value.scalar_type() == dtype &&
                  query.scalar_type() == dtype, "float32 or bfloat16, one dtype for query, key and value");
  TORCH_CHECK(!query.is_cuda() && !key.is_cuda(), "CPU tensors only");
  const int64_t head_dim = query.size(3);
  TORCH_CHECK(key.size(3) == head_dim && value.size(3) == head_dim, "key and value have the query's head size");
  TORCH_CHECK(key.sizes() == value.sizes(), "key and value have one shape");
  TORCH_CHECK(key.size(0) == query.size(0) && key.size(1) == query.size(1), "one key head per query group");
  TORCH_CHECK(query.size(2) <= kMaxGroup, "at most ", kMaxGroup, " query heads per key head");
  TORCH_CHECK(key.stride(3) == 1 && key.stride(2) == head_dim && value.stride(3) == 1 && value.stride(2) == head_dim,
              "each column's values are contiguous");
  auto starts = start.to(torch::kLong).contiguous();
  TORCH_CHECK(starts.numel() == query.size(0), "one start per row");
  const int64_t* sp = starts.data_ptr<int64_t>();
  for (int64_t r = 0; r < starts.numel(); ++r)
    TORCH_CHECK(sp[r] >= 0 && sp[r] < key.size(2), "row ", r, " attends over no column");
  auto q = query.to(torch::kFloat32).contiguous();
  auto out = torch::empty_like(q);
  const float s = static_cast<float>(scale);
  if (dtype == torch::kFloat32) {
    attend_sized<float>(head_dim, q, key, value, sp, out, s);
  } else {
    attend_sized<uint16_t>(head_dim, q, key, value, sp, out, s);
  }
  return out.to(dtype);
}

}  // namespace

// prefill_attention.cpp
torch::Tensor prefill_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "one decode step's attention over a right-aligned KV slab");
  m.def("prefill_attention", &prefill_attention, "one request's causal prefill attention over its cached prefix");
}
