// The int8-activation path (`--quantization gguf-int8`) for the K-quants on AVX2: the kernel of
// kquant_int8_tile.h with AVX2's dot products (maddubs + madd). AVX-512 CPUs without VNNI run it.
#include "blocks.h"
#include "kquants.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvledger::quant {
namespace {

#include "kquants_avx2.h"

// u8 x s8 pairs summed to int16 (|u| <= 63 here, no saturation), then to 8 int32 lanes: lane i
// holds bytes 4i..4i+3.
static inline __m256i dot32(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "kquant_int8_tile.h"

}  // namespace

void int8_avx2_k(const Int8Args& a, int64_t o_begin, int64_t o_end) { int8_k_dispatch(a, o_begin, o_end); }

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
