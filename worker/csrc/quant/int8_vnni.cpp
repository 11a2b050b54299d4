// The int8-activation path on AVX-512 VNNI (`int8_tile.h` with vpdpbusd on 256-bit registers,
// AVX512VL): one instruction for the 32 products of a block. Function-level target, chosen at
// run time only where the CPU reports avx512_vnni (linear.cpp).
#include "blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

static inline __m256i dot32(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }

#include "int8_tile.h"

}  // namespace

void int8_vnni512(const Int8Args& a, int64_t o_begin, int64_t o_end) { int8_dispatch(a, o_begin, o_end); }

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
