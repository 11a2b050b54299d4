// The int8-activation path (`--quantization gguf-int8`) for the K-quants on AVX-512 VNNI: the
// kernel of kquant_int8_tile.h with vpdpbusd on 256-bit registers (AVX512VL), one instruction
// for a sub-block's 32 products where AVX2 takes two and a constant. Chosen at run time only
// where the CPU reports avx512_vnni (linear.cpp).
#include "blocks.h"
#include "kquants.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

#include "kquants_avx2.h"

static inline __m256i dot32(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

#include "kquant_int8_tile.h"

}  // namespace

void int8_vnni512_k(const Int8Args& a, int64_t o_begin, int64_t o_end) { int8_k_dispatch(a, o_begin, o_end); }

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
