// Copyright 2026 The harnessrl Authors. Licensed under the Apache License, Version 2.0.
//
// What decode_attention.cpp and prefill_attention.cpp share: a slab value as a float, 16-lane float
// vectors (GCC/Clang vector types: one AVX-512 register where -march=native has them, two AVX2
// registers otherwise) and exp over them.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace harnessrl {

// A value of the slab as float: float32 as is, bfloat16 (its bits the high half of a float's).
inline float as_float(float x) { return x; }
inline float as_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}

typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline vec16 load(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, vec16 v) { std::memcpy(p, &v, sizeof(v)); }

// exp(x) for x <= 0 in 16 lanes (scores less their row's maximum): 2^n times a degree-6
// polynomial on |r| <= ln 2 / 2, relative error about 2e-7; 0 below -87 (and for -inf, a masked
// column). glibc's expf is scalar here; calling it per score cost four times the dot products.
inline vec16 exp_nonpositive(vec16 x) {
  const ivec16 under = x < -87.f;
  x = under ? vec16{} - 87.f : x;
  const vec16 t = x * 1.44269504088896341f;
  const ivec16 n = __builtin_convertvector(t + (t < 0.f ? vec16{} - 0.5f : vec16{} + 0.5f), ivec16);
  const vec16 nf = __builtin_convertvector(n, vec16);
  const vec16 r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;
  vec16 p = 1.f / 720 + r * 0.f;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const ivec16 bits = (n + 127) << 23;
  vec16 two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return under ? vec16{} : p * two_n;
}

inline float lanes_max(vec16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}
inline float lanes_sum(vec16 v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

}  // namespace harnessrl
