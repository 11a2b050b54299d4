// The portable int8-activation path: the activation quantizer every path shares the rule of
// (blocks.h, `Int8Acts`), and a scalar kernel whose integer dot products are the reference the
// vector paths must equal. Compiled for the baseline target.
#include <cmath>

#include "blocks.h"
#include "kquants.h"

namespace kvledger::quant {
namespace {

// The weight block's quants as 32 unsigned (Q4) or signed (Q8_0) values, and its two factors.
static inline void unpack(int type, const uint8_t* b, int* q, float& dw, float& cw) {
  dw = half_to_float(read_u16(b));
  if (type == kQ8_0) {
    const int8_t* s = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < kBlock; ++j) q[j] = s[j];
    cw = 0.f;
    return;
  }
  const uint8_t* qs = b + (type == kQ4_1 ? 4 : 2);
  for (int j = 0; j < kBlock / 2; ++j) {
    q[j] = qs[j] & 15;
    q[j + 16] = qs[j] >> 4;
  }
  cw = type == kQ4_1 ? half_to_float(read_u16(b + 2)) : -8.f * dw;
}

}  // namespace

void quantize_acts(const float* x, int64_t rows, int64_t in, int8_t* q, float* d, float* sd) {
  const int64_t nb = in / kBlock;
  for (int64_t i = 0; i < rows * nb; ++i) {
    const float* xb = x + i * kBlock;
    float amax = 0.f;
    for (int j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int v = static_cast<int>(std::lrintf(xb[j] * id));  // nearest, ties to even
      q[i * kBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[i] = amax * (1.f / 127.f);
    sd[i] = d[i] * static_cast<float>(sum);
  }
}

// The K-quants: each super-block dequantized exactly (kquants.h), times the dequantized
// activations; the same sums as the integer form up to rounding (kquant_int8_avx2.cpp).
static void int8_k_scalar(const Int8Args& a, int64_t o_begin, int64_t o_end) {
  const Format f = format_of(a.type);
  const int64_t nb = a.in / kBlock;
  float w[kSuper];
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t r = 0; r < a.rows; ++r) {
      float acc = 0.f;
      for (int64_t s = 0; s < a.in / kSuper; ++s) {
        dequantize_super(a.type, row + s * f.bytes, w);
        for (int j = 0; j < kSuper; ++j) {
          const int64_t i = r * a.in + s * kSuper + j;
          acc += w[j] * (a.x.d[r * nb + i % a.in / kBlock] * static_cast<float>(a.x.q[i]));
        }
      }
      a.y[r * a.ldy + o] = acc;
    }
  }
}

void int8_scalar(const Int8Args& a, int64_t o_begin, int64_t o_end) {
  if (format_of(a.type).values == kSuper) return int8_k_scalar(a, o_begin, o_end);
  const int bytes = block_bytes(a.type);
  const int64_t nb = a.in / kBlock;
  int q[kBlock];
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t r = 0; r < a.rows; ++r) {
      float acc = 0.f, corr = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        float dw, cw;
        unpack(a.type, row + b * bytes, q, dw, cw);
        const int8_t* xq = a.x.q + r * a.in + b * kBlock;
        int dot = 0;
        for (int j = 0; j < kBlock; ++j) dot += q[j] * xq[j];
        acc += dw * a.x.d[r * nb + b] * static_cast<float>(dot);
        corr += cw * a.x.sd[r * nb + b];
      }
      a.y[r * a.ldy + o] = acc + corr;
    }
  }
}

}  // namespace kvledger::quant
