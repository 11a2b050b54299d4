// GGML's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K) and the
// kernels' shared entry points.
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
constexpr int kQ5_0 = 6;
constexpr int kQ5_1 = 7;
constexpr int kQ8_0 = 8;
constexpr int kQ4_K = 12;
constexpr int kQ5_K = 13;
constexpr int kQ6_K = 14;
constexpr int kBlock = 32;   // values per block of Q8_0, Q4_x, Q5_x; a K-quant's sub-block
constexpr int kSuper = 256;  // values per K-quant super-block

// Bytes per block: a float16 scale d (and for Q4_1 a float16 minimum m), then the quants.
// Q8_0: d, int8 q[32]; value = d * q.
// Q4_0: d, uint8 qs[16]; value j = d * ((qs[j] & 15) - 8), value j+16 = d * ((qs[j] >> 4) - 8).
// Q4_1: d, m, uint8 qs[16]; value j = d * (qs[j] & 15) + m, value j+16 = d * (qs[j] >> 4) + m.
// These three are what the int8-activation and rows16 kernels read; `format_of` names all.
static inline int block_bytes(int type) {
  switch (type) {
    case kQ8_0: return 34;
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    default: return 0;
  }
}

// Q5_0: d, uint32 qh, uint8 qs[16]; a value's fifth bit is bit j (j+16) of qh:
//   value j = d * ((qs[j] & 15 | bit j << 4) - 16), value j+16 likewise with qs[j] >> 4.
// Q5_1: d, m, qh, qs; value = d * q5 + m.
// K-quants (kquants.h): super-blocks of 256 values in 8 sub-blocks of 32 (Q6_K: 16 of 16).
struct Format {
  int values;  // per block (0: not a type the kernels read)
  int bytes;
};

static inline Format format_of(int type) {
  switch (type) {
    case kQ8_0: return {kBlock, 34};
    case kQ4_0: return {kBlock, 18};
    case kQ4_1: return {kBlock, 20};
    case kQ5_0: return {kBlock, 22};
    case kQ5_1: return {kBlock, 24};
    case kQ4_K: return {kSuper, 144};
    case kQ5_K: return {kSuper, 176};
    case kQ6_K: return {kSuper, 210};
    default: return {0, 0};
  }
}

static inline uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
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
// the K-quant and Q5 kernels of the AVX2 and AVX-512 paths
void linear_avx2_k(const LinearArgs& a, int64_t o_begin, int64_t o_end);
void linear_avx512_k(const LinearArgs& a, int64_t o_begin, int64_t o_end);

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
// the K-quants' (Q4_K, Q5_K, Q6_K) on AVX2 and on AVX-512 VNNI
void int8_avx2_k(const Int8Args& a, int64_t o_begin, int64_t o_end);
void int8_vnni512_k(const Int8Args& a, int64_t o_begin, int64_t o_end);

// Row `o`'s `in` values as float32 (the exact dequantization, as ggml's reference code), any
// type of `format_of`.
void dequantize_row(int type, const uint8_t* row, int64_t in, float* out);

}  // namespace kvledger::quant
