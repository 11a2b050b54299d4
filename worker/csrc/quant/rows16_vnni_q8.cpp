// The int8-activation kernel on Q8_0's rows16 tiles (rows16.h), AVX-512 VNNI with VBMI.
//
// Q8_0's tiles keep their values value-major (a 64-byte chunk is values 4c .. 4c+3 of the
// sixteen rows, one value after the other) for the exact kernel's sign extensions. One byte
// permutation (vpermb, AVX512-VBMI) makes a chunk the lanes VNNI multiplies, row j's four
// values in lane j, and an exclusive or with 0x80 makes them unsigned (q + 128), the operand
// vpdpbusd takes unsigned. Each lane's sum is then dot + 128 * (the activation block's sum of
// quants, `Rows16Args::qsum`), and the accumulator starts at minus that, so the integer dot is
// exact and the block adds, as the per-row kernels' Q8_0 term (blocks.h, `Int8Args`):
//   y += dw * (d * dot)
// A tile's eight permutations serve up to four activation rows; per row and block the 512
// products are 8 vpdpbusd, where the exact kernel spends 32 FMAs. A separate file for its
// own target: VBMI is not implied by VNNI (Cascade Lake has one without the other), so
// rows16_ops.cpp calls it only where the CPU reports both.
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page

static inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// The permutation's index: lane j takes bytes 16 i + j (i = 0..3), row j's four values.
static inline __m512i lane_order() {
  alignas(64) int8_t idx[64];
  for (int j = 0; j < kGroupRows; ++j)
    for (int i = 0; i < 4; ++i) idx[4 * j + i] = static_cast<int8_t>(16 * i + j);
  return _mm512_load_si512(idx);
}

template <int R>
void group(const Rows16Args& a, int64_t r0, int64_t g, __m512i order) {
  const int64_t nb = a.in / kBlock, tile = rows16_tile_bytes(kQ8_0);
  const uint8_t* t = a.w + g * nb * tile;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += tile) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    for (int64_t l = 0; l < tile; l += 64) _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetch + l), _MM_HINT_T0);
    __m512i w[8];
    for (int k = 0; k < 8; ++k) {
      const __m512i c = _mm512_loadu_si512(t + rows16_quants_at(kQ8_0) + 64 * k);
      w[k] = _mm512_xor_si512(_mm512_permutexvar_epi8(order, c), flip);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * nb + b;
      const int8_t* xq = a.x.q + i * kBlock;
      __m512i s[4];
      s[0] = _mm512_set1_epi32(-128 * a.qsum[i]);
      for (int k = 1; k < 4; ++k) s[k] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        s[k] = _mm512_dpbusd_epi32(s[k], w[2 * k], bcast4(xq + 8 * k));
        s[k] = _mm512_dpbusd_epi32(s[k], w[2 * k + 1], bcast4(xq + 8 * k + 4));
      }
      const __m512i dot = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
      const __m512 fdot = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(a.x.d[i]));
      acc[r] = _mm512_fmadd_ps(dw, fdot, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.y + (r0 + r) * a.ldy + g * kGroupRows, acc[r]);
}

}  // namespace

void rows16_vnni512_q8(const Rows16Args& a, int64_t g_begin, int64_t g_end) {
  const __m512i order = lane_order();
  rows16_drive<4>(a.rows, g_begin, g_end, [&a, order](auto rows, int64_t r0, int64_t g) {
    group<decltype(rows)::value>(a, r0, g, order);
  });
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
