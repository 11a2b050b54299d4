// The int8-activation kernel shared by the AVX2 and AVX-512 VNNI paths (blocks.h, `Int8Args`).
//
// Included by each path's file after its `#pragma GCC target`, inside an anonymous namespace,
// with `dot32(acc, u, s)` defined before it: acc + the sums of four u8 x s8 products per int32
// lane (VNNI's vpdpbusd, or AVX2's maddubs + madd, exact for these operands). A weight block's
// quants become 32 unsigned bytes in registers (Q8_0: their absolute values, the activations
// taking their signs), are multiplied into up to kRows activation rows, and each row's 8
// integer lanes are scaled once per block into float accumulators, two per row (even and odd
// blocks) so that the FMA chains overlap; the Q4 correction (`Int8Acts::sv`) has its own.
//
// Nothing here may be included outside such a file: it is compiled for that target only.

constexpr int kInt8Rows = 4;
constexpr int64_t kInt8Prefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page
constexpr int64_t kInt8OutChunk = 64;  // weight rows kept hot while every row tile passes

static inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

// Per format: the unsigned quants, the activation's sign source (Q8_0 only), and the factors.
struct I4_0 {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = false;
  static inline __m256i quants(const uint8_t* b) { return nibbles32(b + 2); }
  static inline float corr(const uint8_t*, float dw) { return -8.f * dw; }
};

struct I4_1 {
  static constexpr int kBytes = 20;
  static constexpr bool kSigned = false;
  static inline __m256i quants(const uint8_t* b) { return nibbles32(b + 4); }
  static inline float corr(const uint8_t* b, float) { return _cvtsh_ss(read_u16(b + 2)); }
};

struct I8_0 {
  static constexpr int kBytes = 34;
  static constexpr bool kSigned = true;
  static inline __m256i quants(const uint8_t* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
  static inline float corr(const uint8_t*, float) { return 0.f; }
};

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One block of weight row `row` into R activation rows' accumulators (K: which of two, so
// that consecutive blocks' FMA chains overlap).
template <class Q, int R>
static inline void int8_block(const Int8Args& a, const uint8_t* blk, const int8_t* xq,
                              const float* dv, const float* sv, int64_t b, __m256 (&acc)[R],
                              __m256 (&cacc)[R]) {
  const int64_t nb = a.in / kBlock;
  const float dw = _cvtsh_ss(read_u16(blk));
  const __m256 ws = _mm256_set1_ps(dw);
  __m256i wq = Q::quants(blk);
  const __m256i ws8 = wq;
  if constexpr (Q::kSigned) wq = _mm256_sign_epi8(wq, wq);  // |q8|, as unsigned bytes
  for (int r = 0; r < R; ++r) {
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * a.in + b * kBlock));
    if constexpr (Q::kSigned) x = _mm256_sign_epi8(x, ws8);  // q8 * x = |q8| * (x signed by q8)
    const __m256i dot = dot32(_mm256_setzero_si256(), wq, x);
    const __m256 s = _mm256_mul_ps(ws, _mm256_loadu_ps(dv + (r * nb + b) * 8));
    acc[r] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), acc[r]);
    if constexpr (!Q::kSigned) {
      const __m256 cw = _mm256_set1_ps(Q::corr(blk, dw));
      cacc[r] = _mm256_fmadd_ps(cw, _mm256_loadu_ps(sv + (r * nb + b) * 8), cacc[r]);
    }
  }
}

template <class Q, int R>
void int8_tile(const Int8Args& a, int64_t r0, int64_t o_begin, int64_t o_end) {
  const int64_t nb = a.in / kBlock;
  const int8_t* xq = a.x.q + r0 * a.in;
  const float* dv = a.x.dv + r0 * nb * 8;
  const float* sv = a.x.sv + r0 * nb * 8;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kInt8Prefetch + l), _MM_HINT_T0);
    __m256 acc0[R], acc1[R], cacc0[R], cacc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = cacc0[r] = cacc1[r] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      int8_block<Q, R>(a, row + b * Q::kBytes, xq, dv, sv, b, acc0, cacc0);
      int8_block<Q, R>(a, row + (b + 1) * Q::kBytes, xq, dv, sv, b + 1, acc1, cacc1);
    }
    if (b < nb) int8_block<Q, R>(a, row + b * Q::kBytes, xq, dv, sv, b, acc0, cacc0);
    for (int r = 0; r < R; ++r) {
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc0[r], acc1[r]), _mm256_add_ps(cacc0[r], cacc1[r]));
      a.y[(r0 + r) * a.ldy + o] = hsum8(sum);
    }
  }
}

template <class Q>
void int8_run(const Int8Args& a, int64_t o_begin, int64_t o_end) {
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kInt8OutChunk) {
    const int64_t o1 = o0 + kInt8OutChunk < o_end ? o0 + kInt8OutChunk : o_end;
    int64_t r = 0;
    for (; r + kInt8Rows <= a.rows; r += kInt8Rows) int8_tile<Q, kInt8Rows>(a, r, o0, o1);
    switch (a.rows - r) {
      case 3: int8_tile<Q, 3>(a, r, o0, o1); break;
      case 2: int8_tile<Q, 2>(a, r, o0, o1); break;
      case 1: int8_tile<Q, 1>(a, r, o0, o1); break;
      default: break;
    }
  }
}

static inline void int8_dispatch(const Int8Args& a, int64_t o_begin, int64_t o_end) {
  switch (a.type) {
    case kQ8_0: int8_run<I8_0>(a, o_begin, o_end); break;
    case kQ4_0: int8_run<I4_0>(a, o_begin, o_end); break;
    case kQ4_1: int8_run<I4_1>(a, o_begin, o_end); break;
    default: break;
  }
}
