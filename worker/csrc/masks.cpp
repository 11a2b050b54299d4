// Structured outputs' grammar masks written into the logits, in place (worker/constraints.py).
//
// The grammar engine hands one packed bitmask per constrained row: bit t % 32 of int32 word
// t / 32 is set when token t is allowed. Expanding it to one bool per token in torch (shift,
// and, view, slice, masked_fill, then copying the rows back) took a sizeable share of a decode
// step (docs/performance.md, "Sampler and elementwise kernels"); here each word is read once
// and only the forbidden tokens are written, so a row costs a pass over its logits.
//
// Everything is done on the floats' bit patterns: under -ffast-math a float compare with -inf
// may be folded away, an integer compare never is. The rows are finite (the sampler zeroes a
// non-finite row before it masks), so a value is -inf exactly when its bits are kNegInf.
#include "ops.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvledger {
namespace {

constexpr uint32_t kNegInf = 0xFF800000u;  // -inf as a float32's bits

// Tokens [0, n) of one row under one word of the mask (n <= 32: the vocabulary's tail); true
// when an allowed token among them is not -inf. Branch-free, so that it vectorizes.
inline bool mask_word_portable(uint32_t* p, uint32_t bits, int n) {
  uint32_t alive = 0;
  for (int b = 0; b < n; ++b) {
    const uint32_t ok = 0u - ((bits >> b) & 1u);  // all ones where the token is allowed
    const uint32_t v = p[b];
    alive |= ok & (v ^ kNegInf);
    p[b] = (v & ok) | (kNegInf & ~ok);
  }
  return alive != 0;
}

#if defined(__AVX512F__)
// A whole word: two 16-lane masked stores of -inf where the bit is clear; `alive` as in
// mask_word_portable, looked for only until one is found.
inline bool mask_word_avx512(uint32_t* p, uint32_t bits, bool alive) {
  const __m512i neg_inf = _mm512_set1_epi32(static_cast<int>(kNegInf));
  for (int half = 0; half < 2; ++half, bits >>= 16, p += 16) {
    const __mmask16 ok = static_cast<__mmask16>(bits & 0xFFFFu);
    if (ok != 0xFFFF) _mm512_mask_storeu_epi32(p, static_cast<__mmask16>(~ok), neg_inf);
    if (!alive && ok) {
      const __m512i v = _mm512_maskz_loadu_epi32(ok, p);
      alive = _mm512_mask_cmpneq_epi32_mask(ok, v, neg_inf) != 0;
    }
  }
  return alive;
}
#endif

// One row: forbidden tokens to -inf. A row left with no allowed finite value (min_tokens or a
// logit bias pushed the grammar's only tokens to -inf) gets 0 at every allowed token instead,
// so the draw stays among them: the grammar wins.
void mask_row(uint32_t* row, const uint32_t* words, int64_t vocab, bool portable) {
  const int64_t full = vocab / 32;
  bool alive = false;
  for (int64_t w = 0; w < full; ++w) {
#if defined(__AVX512F__)
    if (!portable) {
      alive = mask_word_avx512(row + 32 * w, words[w], alive);
      continue;
    }
#endif
    alive |= mask_word_portable(row + 32 * w, words[w], 32);
  }
  const int tail = static_cast<int>(vocab - 32 * full);
  if (tail) alive |= mask_word_portable(row + 32 * full, words[full], tail);
  if (alive) return;
  for (int64_t t = 0; t < vocab; ++t) {
    if ((words[t / 32] >> (t % 32)) & 1u) row[t] = 0u;  // 0.0f
  }
}

}  // namespace

void mask_logits(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& bitmask,
                 bool portable) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "mask_logits: logits must be contiguous float32 [N, V]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "mask_logits: rows is int64 [R]");
  const int64_t n = logits.size(0), vocab = logits.size(1), count = rows.size(0);
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt &&
                  bitmask.size(0) == count && bitmask.size(1) * 32 >= vocab,
              "mask_logits: bitmask must be int32 [R, >= ceil(V / 32)]");
  const at::Tensor bits = bitmask.contiguous(), picked = rows.contiguous();
  const int64_t* rp = picked.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(rp[i] >= 0 && rp[i] < n, "mask_logits: row ", rp[i], " is not in the logits");
  }
  auto* base = reinterpret_cast<uint32_t*>(logits.data_ptr<float>());
  const auto* words = reinterpret_cast<const uint32_t*>(bits.data_ptr<int32_t>());
  const int64_t width = bits.size(1);
  // A row is a few microseconds: the calling thread does them all, waking no pool.
  for (int64_t i = 0; i < count; ++i) {
    mask_row(base + rp[i] * vocab, words + i * width, vocab, portable);
  }
}

}  // namespace kvledger
