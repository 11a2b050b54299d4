// The portable path: each block is dequantized to floats on the stack (32 values, a K-quant's
// 256), then multiplied into up to kRows activation rows at once (one weight read serves them
// all). Compiled for the baseline x86-64 (or any other) target: no FMA contracts a
// dequantization, so `dequantize_row` equals gguf-py's bit for bit.
#include "blocks.h"
#include "kquants.h"

namespace kvledger::quant {
namespace {

constexpr int kRows = 4;

static inline void dequantize_block(int type, const uint8_t* b, float* out) {
  const float d = half_to_float(read_u16(b));
  if (type == kQ8_0) {
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < kBlock; ++j) out[j] = d * static_cast<float>(q[j]);
  } else if (type == kQ4_0) {
    const uint8_t* qs = b + 2;
    for (int j = 0; j < kBlock / 2; ++j) {
      out[j] = d * static_cast<float>((qs[j] & 15) - 8);
      out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  } else if (type == kQ4_1) {
    const float m = half_to_float(read_u16(b + 2));
    const uint8_t* qs = b + 4;
    for (int j = 0; j < kBlock / 2; ++j) {
      out[j] = d * static_cast<float>(qs[j] & 15) + m;
      out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  } else if (type == kQ5_0 || type == kQ5_1) {
    const bool one = type == kQ5_1;
    const float m = one ? half_to_float(read_u16(b + 2)) : 0.f;
    const uint32_t qh = read_u32(b + (one ? 4 : 2));
    const uint8_t* qs = b + (one ? 8 : 6);
    const int off = one ? 0 : 16;
    for (int j = 0; j < kBlock / 2; ++j) {
      const int lo = static_cast<int>((qs[j] & 15) | (((qh >> j) & 1) << 4)) - off;
      const int hi = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off;
      out[j] = one ? d * static_cast<float>(lo) + m : d * static_cast<float>(lo);
      out[j + 16] = one ? d * static_cast<float>(hi) + m : d * static_cast<float>(hi);
    }
  } else {
    dequantize_super(type, b, out);
  }
}

template <int R>
void tile(const LinearArgs& a, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const Format f = format_of(a.type);
  const int64_t nb = a.in / f.values;
  float w[kSuper];
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    float acc[R][kBlock] = {};
    for (int64_t b = 0; b < nb; ++b) {
      dequantize_block(a.type, row + b * f.bytes, w);
      for (int r = 0; r < R; ++r) {
        const float* xb = x + r * a.ldx + b * f.values;
        for (int j = 0; j < f.values; ++j) acc[r][j % kBlock] += w[j] * xb[j];
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
      for (int j = 0; j < kBlock; ++j) s += acc[r][j];
      y[r * a.ldy + o] = s;
    }
  }
}

}  // namespace

void dequantize_row(int type, const uint8_t* row, int64_t in, float* out) {
  const Format f = format_of(type);
  for (int64_t b = 0; b < in / f.values; ++b) dequantize_block(type, row + b * f.bytes, out + b * f.values);
}

void linear_scalar(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  int64_t r = 0;
  for (; r + kRows <= a.rows; r += kRows) tile<kRows>(a, a.x + r * a.ldx, a.y + r * a.ldy, o_begin, o_end);
  const float* x = a.x + r * a.ldx;
  float* y = a.y + r * a.ldy;
  switch (a.rows - r) {
    case 3: tile<3>(a, x, y, o_begin, o_end); break;
    case 2: tile<2>(a, x, y, o_begin, o_end); break;
    case 1: tile<1>(a, x, y, o_begin, o_end); break;
    default: break;
  }
}

}  // namespace kvledger::quant
