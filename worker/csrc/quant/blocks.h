// GGML's block formats for Q8_0, Q4_0 and Q4_1, and the kernels' shared entry points.
//
// Pure C++ (no torch headers): each ISA's file includes this before its `#pragma GCC target`,
// so nothing defined here is compiled for an instruction set the CPU may lack. Every helper is
// `static inline`: each translation unit keeps its own copy, and the linker can never hand the
// scalar file an AVX-512 build of one (an ODR merge of differently targeted inline functions).
#pragma once

#include <cstdint>
#include <cstring>

namespace kvledger::quant {

// ggml_type values (ggml.h) of the formats the kernels read.
constexpr int kQ4_0 = 2;
constexpr int kQ4_1 = 3;
constexpr int kQ8_0 = 8;
constexpr int kBlock = 32;  // values per block, all three formats

// Bytes per block: a float16 scale d (and for Q4_1 a float16 minimum m), then the quants.
// Q8_0: d, int8 q[32]; value = d * q.
// Q4_0: d, uint8 qs[16]; value j = d * ((qs[j] & 15) - 8), value j+16 = d * ((qs[j] >> 4) - 8).
// Q4_1: d, m, uint8 qs[16]; value j = d * (qs[j] & 15) + m, value j+16 = d * (qs[j] >> 4) + m.
static inline int block_bytes(int type) {
  switch (type) {
    case kQ8_0: return 34;
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    default: return 0;
  }
}

static inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);  // blocks are byte-packed: no alignment to rely on
  return v;
}

// IEEE half -> float, exact (normals, subnormals, infinities, NaN), without F16C.
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// One product y = x @ W^T over output rows [o_begin, o_end):
//   w: row o's blocks start at w + o * row_bytes; x: `rows` rows of `in` floats, ldx apart;
//   y: row r's output o lands at y[r * ldy + o].
struct LinearArgs {
  int type;
  const uint8_t* w;
  int64_t row_bytes;
  int64_t in;
  const float* x;
  int64_t ldx;
  int64_t rows;
  float* y;
  int64_t ldy;
};

using LinearKernel = void (*)(const LinearArgs& a, int64_t o_begin, int64_t o_end);

void linear_scalar(const LinearArgs& a, int64_t o_begin, int64_t o_end);
void linear_avx2(const LinearArgs& a, int64_t o_begin, int64_t o_end);
void linear_avx512(const LinearArgs& a, int64_t o_begin, int64_t o_end);

// Activations quantized per block of 32 as llama.cpp's Q8_0/Q8_1 do (the int8 path):
//   q[r * in + i] = round(x[r][i] / d), d = max|x[r][block]| / 127 (0 for an all-zero block);
//   d[r * nb + b] = that scale; sd[r * nb + b] = d * the block's sum of q (the Q4_1 minimum's
//   and the Q4_0 offset's term); dv and sv hold d and sd / 8 each repeated 8 times (8 floats a
//   block), so that a vector path loads the factors of two blocks as one 16-float register.
struct Int8Acts {
  const int8_t* q;
  const float* d;
  const float* sd;
  const float* dv;
  const float* sv;
};

// One product y = dequantize(W) applied to the int8 activations, rows [0, rows), outputs
// [o_begin, o_end). Per weight block and activation block, `dot` is the exact integer sum of
// the 32 products; with dw the weight block's scale (and mw Q4_1's minimum) the block adds
//   Q4_0: dw * d * dot(q4, q) - 8 * dw * sd      (q4: the nibbles 0..15)
//   Q4_1: dw * d * dot(q4, q) + mw * sd
//   Q8_0: dw * d * dot(q8, q)
// which is the dequantized weight block times the dequantized activation block, up to rounding.
struct Int8Args {
  int type;
  const uint8_t* w;
  int64_t row_bytes;
  int64_t in;
  Int8Acts x;
  int64_t rows;
  float* y;
  int64_t ldy;
};

using Int8Kernel = void (*)(const Int8Args& a, int64_t o_begin, int64_t o_end);

void quantize_acts(const float* x, int64_t rows, int64_t in, int8_t* q, float* d, float* sd);
void quantize_acts_avx2(const float* x, int64_t rows, int64_t in, int8_t* q, float* d, float* sd);
void int8_scalar(const Int8Args& a, int64_t o_begin, int64_t o_end);
void int8_avx2(const Int8Args& a, int64_t o_begin, int64_t o_end);
void int8_vnni512(const Int8Args& a, int64_t o_begin, int64_t o_end);

// Row `o`'s `in` values as float32 (the exact dequantization, as ggml's reference code).
void dequantize_row(int type, const uint8_t* row, int64_t in, float* out);

}  // namespace kvledger::quant
