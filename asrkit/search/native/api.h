// The C interface of prefix_search.cpp: what asrkit/search/native_loop.py fills through ctypes.
#pragma once
#include <cstdint>

namespace asrkit_native {

constexpr uint64_t kHashMul = 0x9E3779B97F4A7C15ULL;  // as ctc_prefix._HASH_MUL
constexpr uint64_t kSentParent = 0x5BE0CD19137E2179ULL;  // parent hash of the empty prefix and empty slots
constexpr uint64_t kSentHash = 0xC3910C8D016B07D5ULL;    // hash of an empty slot (-0x3C6EF372FE94F82B)
constexpr int kMaxTables = 20;
enum Kind { kWord = 1, kLexicon = 2, kTokenNgram = 3, kWordCount = 4, kHotwords = 5 };

}  // namespace asrkit_native

extern "C" {
using asrkit_native::kMaxTables;

// One scorer's exported tables (see asrkit/search/native_loop.py for the order of each kind).
struct ScorerDesc {
  int64_t kind;
  double weight;
  const void* tables[kMaxTables];
  int64_t sizes[kMaxTables];  // element counts
  int64_t iparams[8];
};

struct SearchDesc {
  int64_t is_double;  // 0: float32 search, 1: float64
  int64_t batch, frames, vocab, steps, n_cand, beam, nbest, n_scorers, threads;
  int64_t select;         // 1: cval/ctok are null and the C best non-blank tokens of each frame are picked here
  double bonus;           // added per emitted token
  double min_logp;        // token_min_logp (-inf: none)
  const void* lp;         // (B, T, V) log-probabilities
  const int64_t* frame;   // (B, T') input frame of each kept step, -1 after the last
  const void* cval;       // (B, T', C) candidate log-probabilities; null: every token 1 .. V-1 (C = V-1) or select
  const int64_t* ctok;    // (B, T', C) candidate token ids; null with cval
  const void* offset;     // (B,) log P(blank) summed over the skipped frames
  const ScorerDesc* scorers;
  void* total;            // out (B, N) fused score, -inf for an empty slot
  void* ctc;              // out (B, N) CTC score
  int64_t* tokens;        // out (B, N, T') padded with -1
  int64_t* token_frames;  // out (B, N, T') padded with -1
  int64_t* lengths;       // out (B, N)
};

int64_t asrkit_native_abi(void);  // native_build.ABI: bump with these structs
int64_t asrkit_prefix_search(const SearchDesc* d);  // 0, or 1 (bad sizes) / 2 (unknown scorer kind)

}  // extern "C"
