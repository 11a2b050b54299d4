// The int8-activation kernel for the K-quants shared by the AVX2 and AVX-512 VNNI paths
// (`--quantization gguf-int8`): activations quantized per block of 32 (blocks.h, `Int8Acts`)
// meet each 32-value sub-block of a super-block (kquants.h) in an integer dot product, scaled
// once per sub-block:
//   Q4_K / Q5_K: d_g * d_x * dot(q, x) - m_g * sd_x   (q unsigned; m_g: dmin * min, sd_x: the
//                activation block's d times its sum of quants; the 8 sub-blocks' factors and
//                min terms are taken 8 at a time per super-block, one broadcast per sub-block)
//   Q6_K:        per 16 values, f_i * d_x * dot(q - 32, x), the signed quants as |q| against x
//                signed by q (the dot products want one unsigned side), each half's scale on its
//                4 lanes
// which is the dequantized weight times the dequantized activations up to rounding, as the other
// int8 kernels (int8_tile.h) compute.
//
// Included by each path's file after its `#pragma GCC target` and kquants_avx2.h, inside an
// anonymous namespace, with `dot32(u, s)` defined before it: the sums of four u8 x s8 products
// per int32 lane (VNNI's vpdpbusd, or AVX2's maddubs + madd, exact here: |u| <= 63).
//
// Nothing here may be included outside such a file: it is compiled for that target only.

constexpr int kRows = 4;
constexpr int64_t kOutChunk = 64;
constexpr int64_t kPrefetch = 2048;

static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

static inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Q4_K / Q5_K: sub-block g's 32 unsigned quants (Q5_K: the fifth bit from qh).
template <bool kFive>
struct K45 {
  static constexpr int kBytes = kFive ? 176 : 144;
  static inline __m256i quants(const uint8_t* b, int g) {
    __m256i q = bits(load32(b + (kFive ? 48 : 16) + 32 * (g / 2)), 4 * (g % 2), 15);
    if (kFive) q = _mm256_or_si256(q, _mm256_slli_epi16(bits(load32(b + 16), g, 1), 4));
    return q;
  }
};

template <bool kFive, int R>
void tile45(const Int8Args& a, int64_t r0, int64_t o_begin, int64_t o_end) {
  using Q = K45<kFive>;
  const int64_t nb = a.in / kBlock, ns = a.in / kSuper;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch + l), _MM_HINT_T0);
    __m256 acc[R], cacc[R];
    for (int r = 0; r < R; ++r) acc[r] = cacc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* blk = row + s * Q::kBytes;
      alignas(32) float dg[8], mg[8];
      k4_factors_avx2(blk, dg, mg);
      // per row, the 8 sub-blocks' d_g * d_x at once, and the mins' term for the super-block
      alignas(32) float scale[R][8];
      for (int r = 0; r < R; ++r) {
        const int64_t xb = (r0 + r) * nb + s * 8;
        _mm256_store_ps(scale[r], _mm256_mul_ps(_mm256_load_ps(dg), _mm256_loadu_ps(a.x.d + xb)));
        cacc[r] = _mm256_fnmadd_ps(_mm256_load_ps(mg), _mm256_loadu_ps(a.x.sd + xb), cacc[r]);
      }
      for (int g = 0; g < 8; ++g) {
        const __m256i q = Q::quants(blk, g);
        const int64_t b = s * 8 + g;
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (r0 + r) * nb + b;
          const __m256i dot = dot32(q, load32(reinterpret_cast<const uint8_t*>(a.x.q) + xb * kBlock));
          acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[r][g]), _mm256_cvtepi32_ps(dot), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) a.y[(r0 + r) * a.ldy + o] = hsum8(_mm256_add_ps(acc[r], cacc[r]));
  }
}

template <int R>
void tile6(const Int8Args& a, int64_t r0, int64_t o_begin, int64_t o_end) {
  const int64_t nb = a.in / kBlock, ns = a.in / kSuper;
  const __m256i off = _mm256_set1_epi8(32);
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch + l), _MM_HINT_T0);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* blk = row + s * 210;
      alignas(32) float f[16];
      k6_factors_avx2(blk, f);
      // per row, each 16 values' f_i * d_x (sub-block g's two halves: i = 2g, 2g + 1)
      alignas(32) float scale[R][16];
      for (int r = 0; r < R; ++r) {
        const __m256 d = _mm256_loadu_ps(a.x.d + (r0 + r) * nb + s * 8);
        const __m256 lo = _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
        const __m256 hi = _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
        _mm256_store_ps(scale[r], _mm256_mul_ps(_mm256_load_ps(f), lo));
        _mm256_store_ps(scale[r] + 8, _mm256_mul_ps(_mm256_load_ps(f + 8), hi));
      }
      for (int g = 0; g < 8; ++g) {
        const int h = g / 4, k = g % 4;
        const __m256i lo = bits(load32(blk + 64 * h + 32 * (k % 2)), 4 * (k / 2), 15);
        const __m256i hi = _mm256_slli_epi16(bits(load32(blk + 128 + 32 * h), 2 * k, 3), 4);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, hi), off);  // -32..31
        const __m256i wq = _mm256_sign_epi8(q, q);
        const int i = 8 * h + 2 * k;  // the factor of the sub-block's first 16 values
        for (int r = 0; r < R; ++r) {
          const int64_t xb = (r0 + r) * nb + s * 8 + g;
          const __m256i x = load32(reinterpret_cast<const uint8_t*>(a.x.q) + xb * kBlock);
          const __m256i dot = dot32(wq, _mm256_sign_epi8(x, q));
          const __m256 sc = _mm256_setr_m128(_mm_broadcast_ss(&scale[r][i]), _mm_broadcast_ss(&scale[r][i + 1]));
          acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(dot), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) a.y[(r0 + r) * a.ldy + o] = hsum8(acc[r]);
  }
}

template <int R>
void tile(const Int8Args& a, int64_t r0, int64_t o0, int64_t o1) {
  switch (a.type) {
    case kQ4_K: tile45<false, R>(a, r0, o0, o1); break;
    case kQ5_K: tile45<true, R>(a, r0, o0, o1); break;
    case kQ6_K: tile6<R>(a, r0, o0, o1); break;
    default: break;
  }
}

static inline void int8_k_dispatch(const Int8Args& a, int64_t o_begin, int64_t o_end) {
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kOutChunk) {
    const int64_t o1 = o0 + kOutChunk < o_end ? o0 + kOutChunk : o_end;
    int64_t r = 0;
    for (; r + kRows <= a.rows; r += kRows) tile<kRows>(a, r, o0, o1);
    switch (a.rows - r) {
      case 3: tile<3>(a, r, o0, o1); break;
      case 2: tile<2>(a, r, o0, o1); break;
      case 1: tile<1>(a, r, o0, o1); break;
      default: break;
    }
  }
}
