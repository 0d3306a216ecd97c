// Copyright 2026 The harnessrl Authors. Licensed under the Apache License, Version 2.0.
//
// A prototype, not used by harnessrl (benchmarks/bench_decode_attention.py builds and measures it):
// one decode step's attention over HFPolicy's right-aligned KV slab, float32, GQA-packed. Each
// (row, key head) streams its keys and values once, in blocks of 128, with an online softmax; the
// dot products and the weighted sum are plain loops the compiler vectorizes (-O3 -march=native).
// What it tests: whether a kernel that reads each key once for its 3 queries beats SDPA's flash
// kernel, whose 3 x 64 products per key go through GEMM calls too small to stream the keys.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <limits>
#include <vector>

// query [B, KH, G, D] (contiguous), key/value [B, KH, C, D] (stride along C = D, any other strides),
// start [B] int64: row b attends over columns [start[b], C). Returns [B, KH, G, D].
template <int D>
static void attend(const float* q, const float* k, const float* v, float* out, int64_t n, int G, float scale,
                   int64_t k_stride, int64_t v_stride) {
  constexpr int BLOCK = 128;
  float acc[4][D];
  float m[4], l[4];
  float s[4][BLOCK];
  for (int g = 0; g < G; ++g) { m[g] = -std::numeric_limits<float>::infinity(); l[g] = 0.f;
    for (int d = 0; d < D; ++d) acc[g][d] = 0.f; }
  for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
    int nb = (int)std::min<int64_t>(BLOCK, n - j0);
    for (int j = 0; j < nb; ++j) {
      const float* kj = k + (j0 + j) * k_stride;
      for (int g = 0; g < G; ++g) {
        const float* qg = q + g * D;
        float dot = 0.f;
#pragma omp simd reduction(+:dot)
        for (int d = 0; d < D; ++d) dot += qg[d] * kj[d];
        s[g][j] = dot * scale;
      }
    }
    for (int g = 0; g < G; ++g) {
      float mx = m[g];
      for (int j = 0; j < nb; ++j) mx = std::max(mx, s[g][j]);
      float corr = std::exp(m[g] - mx);
      float sum = 0.f;
      float* sg = s[g];
#pragma omp simd reduction(+:sum)
      for (int j = 0; j < nb; ++j) { float e = expf(sg[j] - mx); sg[j] = e; sum += e; }
      l[g] = l[g] * corr + sum;
      m[g] = mx;
      for (int d = 0; d < D; ++d) acc[g][d] *= corr;
    }
    for (int j = 0; j < nb; ++j) {
      const float* vj = v + (j0 + j) * v_stride;
      for (int g = 0; g < G; ++g) {
        float p = s[g][j];
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[g][d] += p * vj[d];
      }
    }
  }
  for (int g = 0; g < G; ++g) { float inv = 1.f / l[g];
    for (int d = 0; d < D; ++d) out[g * D + d] = acc[g][d] * inv; }
}

torch::Tensor decode_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, torch::Tensor start, double scale) {
  TORCH_CHECK(query.dtype() == torch::kFloat32 && key.dtype() == torch::kFloat32, "float32 only");
  auto q = query.contiguous();
  int64_t B = q.size(0), KH = q.size(1), G = q.size(2), Dd = q.size(3), C = key.size(2);
  TORCH_CHECK(Dd == 64 && G <= 4, "head_dim 64, at most 4 queries per key head");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1 && key.stride(2) == Dd && value.stride(2) == Dd, "key rows contiguous");
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>(); const float* kp = key.data_ptr<float>(); const float* vp = value.data_ptr<float>();
  float* op = out.data_ptr<float>();
  auto st = start.contiguous(); const int64_t* sp = st.data_ptr<int64_t>();
  int64_t kb = key.stride(0), kh = key.stride(1), vb = value.stride(0), vh = value.stride(1);
  at::parallel_for(0, B * KH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t b = i / KH, h = i % KH, s0 = sp[b];
      attend<64>(qp + i * G * Dd, kp + b * kb + h * kh + s0 * Dd, vp + b * vb + h * vh + s0 * Dd, op + i * G * Dd,
                 C - s0, (int)G, (float)scale, Dd, Dd);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_attention", &decode_attention); }
