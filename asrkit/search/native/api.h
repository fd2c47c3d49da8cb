// The C interface of prefix_search.cpp: what asrkit/search/native_loop.py fills through ctypes.
#pragma once
#include <cstdint>

namespace asrkit_native {

constexpr uint64_t kHashMul = 0x9E3779B97F4A7C15ULL;  // as asrkit.search.interfaces.HASH_MUL
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

// A stream's search configuration (asrkit_stream_create).
struct StreamDesc {
  int64_t is_double;  // 0: float32 search, 1: float64
  int64_t beam, n_scorers;
  double bonus;       // added per emitted token
  const ScorerDesc* scorers;  // their tables must outlive the stream
};

// The next frames of B streams (asrkit_stream_advance): SearchDesc's input fields, per stream row b.
struct AdvanceDesc {
  void* const* states;  // (B,) distinct stream handles of the search's dtype
  int64_t is_double, batch, frames, vocab, steps, n_cand, threads, select;
  double min_logp;
  const void* lp;          // (B, T, V) log-probabilities
  const int64_t* frame;    // (B, T') input frame (row of lp) of each kept step, -1 after the last
  const void* cval;        // (B, T', C) as in SearchDesc
  const int64_t* ctok;
  const void* offset;      // (B,) log P(blank) summed over this chunk's skipped frames
  const int64_t* lengths;  // (B,) input frames each stream consumes (its rows 0 .. length-1)
};

// The N best hypotheses of B streams (asrkit_stream_nbest); outputs as SearchDesc's, rows of `width`.
struct NBestDesc {
  void* const* states;
  int64_t is_double, batch, nbest, final;  // final: + the scorers' end-of-sentence scores
  int64_t width;           // >= asrkit_stream_width(states)
  void* total;             // out (B, N)
  void* ctc;               // out (B, N)
  int64_t* tokens;         // out (B, N, width) padded with -1
  int64_t* token_frames;   // out (B, N, width): frames since the stream was created
  int64_t* lengths;        // out (B, N)
};

// Return codes: 0, or 1 (bad sizes) / 2 (unknown scorer kind) / 3 (not a live stream of the search's dtype) /
// 4 (a vocabulary other than the stream's earlier frames) / 5 (a stream twice in one call).
int64_t asrkit_native_abi(void);  // native_build.ABI: bump with these structs
int64_t asrkit_prefix_search(const SearchDesc* d);
void* asrkit_stream_create(const StreamDesc* d);  // null on bad arguments
int64_t asrkit_stream_free(void* state);
int64_t asrkit_stream_live(void);  // streams created and not freed (in this process)
int64_t asrkit_stream_frames(void* state);  // input frames consumed so far (-1: not a live stream)
int64_t asrkit_stream_width(void* const* states, int64_t batch);  // the longest prefix in their beams
int64_t asrkit_stream_advance(const AdvanceDesc* d);
int64_t asrkit_stream_nbest(const NBestDesc* d);

}  // extern "C"
