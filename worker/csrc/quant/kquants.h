// GGML's K-quant super-blocks (Q4_K, Q5_K, Q6_K: the parts of Q4_K_M, Q5_K_M and Q6_K files)
// and their exact dequantization, in the order of operations of gguf-py's reference (so a value
// equals `gguf.quants.dequantize`'s bit for bit where no FMA contracts it: the scalar file).
//
// A super-block holds 256 values of a row in 8 sub-blocks of 32 (Q6_K: 16 of 16):
//   Q4_K (144 bytes): half d, half dmin, 12 bytes of 6-bit scales and mins (8 each, packed as
//     `scale_min` unpacks them), uint8 qs[128]: sub-block g's value l is the nibble
//     (qs[32 * (g / 2) + l] >> 4 * (g % 2)) & 15, and equals (d * sc[g]) * q - (dmin * m[g]).
//   Q5_K (176 bytes): d, dmin, the same 12 scale bytes, uint8 qh[32], qs[128]: q as Q4_K's nibble
//     plus bit g of qh[l] as its fifth bit.
//   Q6_K (210 bytes): uint8 ql[128], qh[64], int8 scales[16], half d: for half h = g / 4 and
//     k = g % 4, value l of sub-block g is
//     q = ((ql[64 h + 32 (k % 2) + l] >> 4 (k / 2)) & 15 | ((qh[32 h + l] >> 2 k) & 3) << 4) - 32,
//     times (d * scales[8 h + 2 k + l / 16]).
// Pure C++, `static inline` (as blocks.h: each ISA's file keeps its own copy).
#pragma once

#include "blocks.h"

namespace kvledger::quant {

// Q4_K/Q5_K sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
static inline void scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A Q4_K/Q5_K super-block's 8 sub-block factors: d * sc[g] and dmin * m[g] in float32.
static inline void k4_factors(const uint8_t* b, float* dg, float* mg) {
  const float d = half_to_float(read_u16(b)), dmin = half_to_float(read_u16(b + 2));
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    scale_min(g, b + 4, sc, m);
    dg[g] = d * static_cast<float>(sc);
    mg[g] = dmin * static_cast<float>(m);
  }
}

// Q6_K's 16 factors d * scales[i].
static inline void k6_factors(const uint8_t* b, float* f) {
  const float d = half_to_float(read_u16(b + 208));
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int i = 0; i < 16; ++i) f[i] = d * static_cast<float>(sc[i]);
}

// The 256 values of super-block `b` of `type` into out.
static inline void dequantize_super(int type, const uint8_t* b, float* out) {
  if (type == kQ6_K) {
    float f[16];
    k6_factors(b, f);
    for (int g = 0; g < 8; ++g) {
      const int h = g / 4, k = g % 4;
      const uint8_t* ql = b + 64 * h + 32 * (k % 2);
      const uint8_t* qh = b + 128 + 32 * h;
      for (int l = 0; l < kBlock; ++l) {
        const int q = (((ql[l] >> (4 * (k / 2))) & 15) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        out[kBlock * g + l] = f[8 * h + 2 * k + l / 16] * static_cast<float>(q);
      }
    }
    return;
  }
  float dg[8], mg[8];
  k4_factors(b, dg, mg);
  const bool five = type == kQ5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int g = 0; g < 8; ++g) {
    const uint8_t* q = qs + 32 * (g / 2);
    for (int l = 0; l < kBlock; ++l) {
      int v = (q[l] >> (4 * (g % 2))) & 15;
      if (five) v |= ((qh[l] >> g) & 1) << 4;
      out[kBlock * g + l] = dg[g] * static_cast<float>(v) - mg[g];
    }
  }
}

}  // namespace kvledger::quant
