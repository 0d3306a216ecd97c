// Copyright 2026 The harnessrl Authors. Licensed under the Apache License, Version 2.0.
//
// What decode_attention.cpp and prefill_attention.cpp share: a slab value as a float.

#pragma once

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

}  // namespace harnessrl
