// Copyright 2026 The harnessrl Authors. Licensed under the Apache License, Version 2.0.
//
// One request's prefill attention over its cached prefix and its own new tokens, causal, float32
// or bfloat16 (computed in float32), GQA-packed (decode_attention.cpp binds it; policy/
// decode_kernel.py builds and loads both). query is [1, heads, S, D], the S new tokens; key and
// value are [1, kv_heads, L, D] (a column's D values contiguous), the prefix's L - S columns and then
// the new tokens' S: new token t sees columns [0, L - S + t]. SDPA's CPU flash kernel computes this
// under a boolean mask through small GEMM calls per query head, at about half the rate of the
// linear layers here (docs/benchmarks.md). This kernel instead puts the G query heads that share a
// key head into one tile of rows (token-major, so a tile's rows see about the same columns), turns
// each key head's keys once into a [D, L] float panel, and computes each tile's scores and outputs
// in register blocks (GCC/Clang vector types: AVX-512 registers where -march=native has them, two
// AVX2 registers otherwise) with an online softmax per block of 64 keys.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_values.h"

namespace {

using harnessrl::as_float;
using harnessrl::exp_nonpositive;
using harnessrl::kLanes;
using harnessrl::lanes_max;
using harnessrl::lanes_sum;
using harnessrl::load;
using harnessrl::store;
using harnessrl::vec16;

constexpr int kRows = 6;                 // query rows per tile
constexpr int kKeys = 64;                // keys per block
constexpr int kVecs = kKeys / kLanes;    // score vectors per row

// One key head's keys as a [D, padded] float panel (zero past L) and, for bfloat16, its values
// as [L, D] floats.
template <int D, typename T>
void unpack_head(const T* key, const T* value, int64_t length, int64_t padded, float* panel, float* values) {
  for (int64_t first = 0; first < padded; first += kLanes) {  // 16 keys (4 KiB at D = 64) stay in L1
    const int count = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kLanes, length - first)));
    for (int d = 0; d < D; ++d) {
      float* column = panel + d * padded + first;
      for (int j = 0; j < count; ++j) column[j] = as_float(key[(first + j) * D + d]);
      for (int j = count; j < kLanes; ++j) column[j] = 0.f;
    }
  }
  if (values != nullptr)
    for (int64_t i = 0; i < length * D; ++i) values[i] = as_float(value[i]);
}

// Scores of kRows query rows against the 64 keys from `first` (scaled queries, so plain dots).
template <int D>
inline void block_scores(const float* const* q, const float* panel, int64_t padded, int64_t first,
                         float (*score)[kKeys]) {
  vec16 acc[kRows][kVecs] = {};
  for (int d = 0; d < D; ++d) {
    const float* k = panel + d * padded + first;
    vec16 kv[kVecs];
#pragma GCC unroll 4
    for (int i = 0; i < kVecs; ++i) kv[i] = load(k + i * kLanes);
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      const float x = q[r][d];
#pragma GCC unroll 4
      for (int i = 0; i < kVecs; ++i) acc[r][i] += x * kv[i];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int i = 0; i < kVecs; ++i) store(score[r] + i * kLanes, acc[r][i]);
}

// out[r] += sum_j p[r][j] * value[first + j], for `count` keys, in chunks of up to 64 columns of D.
template <int D>
inline void block_values(const float (*p)[kKeys], const float* value, int64_t first, int count,
                         float (*out)[D]) {
  constexpr int kChunk = D < 64 ? D : 64;
  constexpr int kChunkVecs = kChunk / kLanes;
  for (int c = 0; c < D; c += kChunk) {
    vec16 acc[kRows][kChunkVecs];
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < kChunkVecs; ++i) acc[r][i] = load(out[r] + c + i * kLanes);
    for (int j = 0; j < count; ++j) {
      const float* v = value + (first + j) * D + c;
      vec16 vv[kChunkVecs];
#pragma GCC unroll 4
      for (int i = 0; i < kChunkVecs; ++i) vv[i] = load(v + i * kLanes);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const float x = p[r][j];
#pragma GCC unroll 4
        for (int i = 0; i < kChunkVecs; ++i) acc[r][i] += x * vv[i];
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < kChunkVecs; ++i) store(out[r] + c + i * kLanes, acc[r][i]);
  }
}

// Turns one row's block of scores into exp(score - new maximum) in place; returns the factor that
// rescales what the row accumulated before (0 for its first block) and adds the block to its sum.
inline float softmax_block(float* s, float& running_max, float& running_sum) {
  vec16 v[kVecs];
  vec16 m = load(s);
  for (int i = 0; i < kVecs; ++i) {
    v[i] = load(s + i * kLanes);
    m = m > v[i] ? m : v[i];
  }
  const float block_max = std::max(running_max, lanes_max(m));
  const float rescale = std::exp(running_max - block_max);
  vec16 sum{};
  for (int i = 0; i < kVecs; ++i) {
    v[i] = exp_nonpositive(v[i] - block_max);
    sum += v[i];
    store(s + i * kLanes, v[i]);
  }
  running_sum = running_sum * rescale + lanes_sum(sum);
  running_max = block_max;
  return rescale;
}

// One tile: kRows query rows (scaled, float), row r seeing keys [0, limit[r]); writes each row's
// attention output to out[r] (rows past `rows` are padding: computed, not written).
template <int D>
void attend_tile(const float* const* q, const int64_t* limit, int rows, const float* panel, int64_t padded,
                 const float* value, float* const* out) {
  float acc[kRows][D];
  float running_max[kRows], running_sum[kRows];
  alignas(64) float score[kRows][kKeys];
  int64_t end = 0, all = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < kRows; ++r) {
    std::fill(acc[r], acc[r] + D, 0.f);
    running_max[r] = -std::numeric_limits<float>::infinity();
    running_sum[r] = 0.f;
    end = std::max(end, limit[r]);
    all = std::min(all, limit[r]);
  }
  for (int64_t first = 0; first < end; first += kKeys) {
    const int count = static_cast<int>(std::min<int64_t>(kKeys, end - first));
    block_scores<D>(q, panel, padded, first, score);
    for (int r = 0; r < kRows; ++r) {
      float* s = score[r];
      if (first + kKeys > all)  // this block crosses some row's last column
        for (int j = static_cast<int>(std::max<int64_t>(0, limit[r] - first)); j < kKeys; ++j)
          s[j] = -std::numeric_limits<float>::infinity();
      const float rescale = softmax_block(s, running_max[r], running_sum[r]);
      if (rescale != 1.f)
        for (int d = 0; d < D; ++d) acc[r][d] *= rescale;
    }
    block_values<D>(score, value, first, count, acc);
  }
  for (int r = 0; r < rows; ++r) {
    const float inverse = 1.f / running_sum[r];
    for (int d = 0; d < D; ++d) out[r][d] = acc[r][d] * inverse;
  }
}

template <int D, typename T>
void prefill(const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value, torch::Tensor& out) {
  const int64_t heads = q.size(0), tokens = q.size(1), kv_heads = key.size(1), length = key.size(2);
  const int64_t groups = heads / kv_heads, prefix = length - tokens, rows = tokens * groups;
  const int64_t padded = (length + kKeys - 1) / kKeys * kKeys, tiles = (rows + kRows - 1) / kRows;
  const bool unpack_values = !std::is_same<T, float>::value;
  std::vector<float> panels(kv_heads * D * padded);
  std::vector<float> values(unpack_values ? kv_heads * length * D : 0);
  const T* kp = static_cast<const T*>(key.data_ptr());
  const T* vp = static_cast<const T*>(value.data_ptr());
  const int64_t k_head = key.stride(1), v_head = value.stride(1);
  at::parallel_for(0, kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h)
      unpack_head<D, T>(kp + h * k_head, vp + h * v_head, length, padded, panels.data() + h * D * padded,
                        unpack_values ? values.data() + h * length * D : nullptr);
  });
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / tiles, tile = item % tiles;
      const float* head_values = unpack_values ? values.data() + h * length * D
                                               : reinterpret_cast<const float*>(vp + h * v_head);
      const float* qrow[kRows];
      float* orow[kRows];
      int64_t limit[kRows];
      const int count = static_cast<int>(std::min<int64_t>(kRows, rows - tile * kRows));
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = tile * kRows + std::min(r, count - 1);  // padding rows repeat the last
        const int64_t t = row / groups, head = h * groups + row % groups;
        qrow[r] = qp + (head * tokens + t) * D;
        orow[r] = op + (t * heads + head) * D;
        limit[r] = prefix + t + 1;
      }
      attend_tile<D>(qrow, limit, count, panels.data() + h * D * padded, padded, head_values, orow);
    }
  });
}

}  // namespace

// Returns the attention output as [1, S, heads, D] (transformers' layout after attention).
torch::Tensor prefill_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "query, key and value are 4-d");
  TORCH_CHECK(query.size(0) == 1 && key.size(0) == 1 && value.size(0) == 1, "one request");
  const auto dtype = key.scalar_type();
  TORCH_CHECK((dtype == torch::kFloat32 || dtype == torch::kBFloat16) && value.scalar_type() == dtype &&
                  query.scalar_type() == dtype, "float32 or bfloat16, one dtype for query, key and value");
  TORCH_CHECK(!query.is_cuda() && !key.is_cuda(), "CPU tensors only");
  const int64_t heads = query.size(1), tokens = query.size(2), head_dim = query.size(3);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(3) == head_dim, "key and value have one shape, the query's head size");
  TORCH_CHECK(heads % key.size(1) == 0, "query heads are a multiple of key heads");
  TORCH_CHECK(tokens >= 1 && tokens <= key.size(2), "the new tokens are the last key columns");
  TORCH_CHECK(key.stride(3) == 1 && key.stride(2) == head_dim && value.stride(3) == 1 && value.stride(2) == head_dim,
              "each column's values are contiguous");
  auto q = (query[0].to(torch::kFloat32) * scale).contiguous();  // [heads, S, D]
  auto out = torch::empty({tokens, heads, head_dim}, q.options());
  switch (head_dim) {
#define HARNESSRL_PREFILL(D)                                                          \
  case D:                                                                            \
    if (dtype == torch::kFloat32) prefill<D, float>(q, key, value, out);              \
    else prefill<D, uint16_t>(q, key, value, out);                                    \
    break;
    HARNESSRL_PREFILL(32)
    HARNESSRL_PREFILL(64)
    HARNESSRL_PREFILL(128)
#undef HARNESSRL_PREFILL
    default: TORCH_CHECK(false, "head size ", head_dim, " is not built (32, 64, 128)");
  }
  return out.unsqueeze(0).to(dtype);
}
