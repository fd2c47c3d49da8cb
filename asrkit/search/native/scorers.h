// The scorers the native search evaluates from their exported tables (see native_loop.py for the tables of
// each kind): asrkit.lm.word_ngram.WordNgramScorer, asrkit.search.lexicon.LexiconScorer, the dense
// asrkit.lm.ngram.NgramScorer, asrkit.search.scorers.WordCount and asrkit.search.hotwords.HotwordScorer, each
// computing what its Python class computes, in the same float order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "api.h"

namespace asrkit_native {

struct SState {
  int64_t i[3];  // word: trie node, LM history state, state once the word closes; lexicon: node*(V+1); token: state;
                 // word count: 1 while a word is open
  float f[3];    // word: what a letter / a boundary / </s> adds beside the look-ahead
};

struct Scorer {
  int kind = 0;
  double weight = 0.0;
  // word n-gram
  bool dense = true;
  int64_t width = 0, order = 0, n_keys = 0, n_edges = 0, start_state = 0;
  const int32_t* trans = nullptr;      // (nodes * W) next node (dense)
  const float* la_next = nullptr;      // (nodes * W - 1) look-ahead of the next node at node * W + token (dense)
  const int64_t* edge_keys = nullptr;  // (E+1,) sorted node * W + col, then a sentinel (sparse)
  const int64_t* edge_dst = nullptr;   // (E+1,)
  const uint8_t* col_stay = nullptr;   // (W,)
  const int64_t* col_start = nullptr;  // (W,)
  const uint8_t* col_is_end = nullptr; // (W,)
  const float* la = nullptr;           // (nodes,)
  const uint8_t* col_is_start = nullptr;  // (W,)
  const int64_t* token_slot = nullptr;    // (V,)
  const int64_t* node_word = nullptr;     // (nodes,)
  const float* node_floats = nullptr;     // (nodes, 3)
  const int64_t* chain_keys = nullptr;    // (S, order)
  const int64_t* keys = nullptr;          // (G+1,)
  const int64_t* next_state = nullptr;    // (G+1,)
  const float* row_floats = nullptr;      // (G+1, 3)
  const float* backoff = nullptr;         // (S * order,)
  // lexicon
  const int64_t* next_base = nullptr;     // (nodes * W) next node * W (dense)
  const float* score_table = nullptr;     // (nodes * W) 0 or -inf (dense)
  const uint8_t* col_closes = nullptr;    // (W,)
  const int64_t* lex_col_start = nullptr; // (W,) -1: keep the node
  const uint8_t* is_word = nullptr;       // (nodes,)
  // token n-gram (dense)
  const float* logp = nullptr;            // (S, V)
  const int32_t* tok_next = nullptr;      // (S, V)
  const float* eos = nullptr;             // (S,)
  int64_t vocab = 0;
  // word count
  const uint8_t* wc_closes = nullptr;     // (V,) the token closes the partial word
  const int64_t* wc_opens = nullptr;      // (V,) a word open after it: 1, 0, or -1 unchanged
  // hotwords (edge_keys/edge_dst/n_edges: the arcs that differ from root_next; vocab; start_state). A state is
  // its row in the step tables, id * (V + 1) + 1, so that a token's entry is the row plus the token.
  const int64_t* root_next = nullptr;     // (V,) the state id after each token from the empty match
  const float* reach = nullptr;           // (S,) out + pend of reaching a state
  const float* pend = nullptr;            // (S,) provisional bonus held in a state
  const int64_t* step_next = nullptr;     // (S * (V + 1)) the next row at row + token, if the automaton is small
  const float* step_gain = nullptr;       // (S * (V + 1)) the score at row + token; null with step_next
  const int64_t* block = nullptr;         // (S,) the list of each state in a union of lists (root_next: (L * V));
                                          // null: one list
  const int64_t* row_start = nullptr;     // (B,) the start row of utterance b (a stream: [0]); null: start_state
  int64_t n_row_start = 0;
};

const float kNegInfF = -std::numeric_limits<float>::infinity();

Scorer make_scorer(const ScorerDesc& d) {
  Scorer s;
  s.kind = static_cast<int>(d.kind);
  s.weight = d.weight;
  auto i64 = [&](int j) { return static_cast<const int64_t*>(d.tables[j]); };
  auto f32 = [&](int j) { return static_cast<const float*>(d.tables[j]); };
  auto u8 = [&](int j) { return static_cast<const uint8_t*>(d.tables[j]); };
  if (s.kind == kWord) {
    s.dense = d.iparams[0] != 0;
    s.width = d.iparams[1];
    s.order = d.iparams[2];
    s.start_state = d.iparams[3];
    s.trans = static_cast<const int32_t*>(d.tables[0]);
    s.la_next = f32(1);
    s.edge_keys = i64(2);
    s.n_edges = d.sizes[2];
    s.edge_dst = i64(3);
    s.col_stay = u8(4);
    s.col_start = i64(5);
    s.col_is_end = u8(6);
    s.la = f32(7);
    s.col_is_start = u8(8);
    s.token_slot = i64(9);
    s.node_word = i64(10);
    s.node_floats = f32(11);
    s.chain_keys = i64(12);
    s.keys = i64(13);
    s.n_keys = d.sizes[13];
    s.next_state = i64(14);
    s.row_floats = f32(15);
    s.backoff = f32(16);
  } else if (s.kind == kLexicon) {
    s.dense = d.iparams[0] != 0;
    s.width = d.iparams[1];
    s.next_base = i64(0);
    s.score_table = f32(1);
    s.edge_keys = i64(2);
    s.n_edges = d.sizes[2];
    s.edge_dst = i64(3);
    s.col_stay = u8(4);
    s.col_closes = u8(5);
    s.lex_col_start = i64(6);
    s.is_word = u8(7);
  } else if (s.kind == kTokenNgram) {
    s.logp = f32(0);
    s.tok_next = static_cast<const int32_t*>(d.tables[1]);
    s.eos = f32(2);
    s.vocab = d.iparams[0];
    s.start_state = d.iparams[1];
  } else if (s.kind == kWordCount) {
    s.wc_closes = u8(0);
    s.wc_opens = i64(1);
  } else if (s.kind == kHotwords) {
    s.root_next = i64(0);
    s.edge_keys = i64(1);
    s.n_edges = d.sizes[1];
    s.edge_dst = i64(2);
    s.reach = f32(3);
    s.pend = f32(4);
    s.step_next = i64(5);
    s.step_gain = f32(6);
    s.block = i64(7);
    s.row_start = i64(8);
    s.n_row_start = d.sizes[8];
    s.vocab = d.iparams[0];
    s.start_state = d.iparams[1];
  }
  return s;
}

// Position of `key` in a sorted table ending with a sentinel larger than any key (torch.searchsorted, left).
inline int64_t lower(const int64_t* table, int64_t n, int64_t key) {
  return std::lower_bound(table, table + n, key) - table;
}

// ---- word n-gram (asrkit.lm.word_ngram.WordNgramScorer) ----

inline int64_t word_next_node(const Scorer& s, int64_t node, int64_t col) {
  if (s.dense) return s.trans[node * s.width + col];
  const int64_t key = node * s.width + col;
  const int64_t pos = lower(s.edge_keys, s.n_edges, key);
  if (s.edge_keys[pos] == key) return s.edge_dst[pos];
  if (s.col_is_start[col]) return s.col_start[col];
  return s.col_stay[col] ? node : 1;  // 1: SINK
}

// Recent (LM state, word) -> (n-gram row, chain column) lookups of one word scorer, direct-mapped: a
// hypothesis spelling a word looks up the same (history, <unk>) pair letter after letter.
struct LookupCache {
  static constexpr int64_t kSize = 1 << 12;
  const int64_t* owner = nullptr;  // the n-gram keys table the entries were looked up in
  std::vector<int64_t> key, row, col;
  LookupCache() : key(kSize, -1), row(kSize), col(kSize) {}
};

// One cache per scorer, emptied where a scorer's tables are not those it was filled from (a thread serves
// streams with different scorers).
inline void bind_caches(std::vector<LookupCache>& cache, const std::vector<Scorer>& scorers) {
  if (cache.size() != scorers.size()) cache.resize(scorers.size());
  for (size_t j = 0; j < scorers.size(); ++j) {
    if (cache[j].owner == scorers[j].keys) continue;
    std::fill(cache[j].key.begin(), cache[j].key.end(), -1);
    cache[j].owner = scorers[j].keys;
  }
}

// WordNgramScorer._state: trie node `node` after LM state `hist`, one n-gram lookup.
void word_state(const Scorer& s, int64_t node, int64_t hist, SState& out, LookupCache& cache) {
  const int64_t order = s.order;
  const int64_t word = s.node_word[node];
  const int64_t key = (hist << 32) | word;  // states < 2**31, words < 2**32
  const int64_t slot = static_cast<int64_t>((static_cast<uint64_t>(key) * kHashMul) >> 52);
  int64_t col = 0, row = -1;
  if (cache.key[slot] == key) {
    row = cache.row[slot];
    col = cache.col[slot];
  } else {
    const int64_t* chain = s.chain_keys + hist * order;
    for (int64_t j = 0; j < order; ++j) {  // the first match is the longest suffix (closure under suffixes)
      const int64_t q = chain[j] + word;
      const int64_t pos = lower(s.keys, s.n_keys, q);
      if (row < 0 && j == 0) row = pos;  // torch: no match at all gives column 0
      if (s.keys[pos] == q) {
        col = j;
        row = pos;
        break;
      }
    }
    cache.key[slot] = key;
    cache.row[slot] = row;
    cache.col[slot] = col;
  }
  const float bo = s.backoff[hist * order + col];
  const float* rf = s.row_floats + row * 3;
  const float* nf = s.node_floats + node * 3;
  out.f[0] = (rf[0] + bo * 0.0f) + nf[0];
  out.f[1] = (rf[1] + bo) + nf[1];
  out.f[2] = (rf[2] + bo) + nf[2];
  out.i[0] = node;
  out.i[1] = hist;
  out.i[2] = s.next_state[row];
}

inline float word_score(const Scorer& s, const SState& st, int64_t tok) {
  const int64_t node = st.i[0];
  float la_next;
  if (s.dense) {
    la_next = s.la_next[node * s.width + tok];
  } else {
    const int64_t col = tok + 1;
    la_next = s.col_is_end[col] ? 0.0f : s.la[word_next_node(s, node, col)];
  }
  return la_next + st.f[s.token_slot[tok]];
}

void word_select(const Scorer& s, const SState& old, int64_t tok, SState& out, LookupCache& cache) {
  const int64_t col = tok + 1;
  const int64_t node = word_next_node(s, old.i[0], col);
  const int64_t hist = s.col_is_start[col] ? old.i[2] : old.i[1];
  word_state(s, node, hist, out, cache);
}

// ---- lexicon (asrkit.search.lexicon.LexiconScorer) ----

inline int64_t lex_next_node(const Scorer& s, int64_t base, int64_t col) {
  const int64_t key = base + col;
  const int64_t pos = lower(s.edge_keys, s.n_edges, key);
  if (s.edge_keys[pos] == key) return s.edge_dst[pos];
  const int64_t node = base / s.width;
  if (s.col_stay[col]) return node;
  if (s.col_closes[col] && s.is_word[node]) return s.lex_col_start[col] >= 0 ? s.lex_col_start[col] : node;
  return 1;  // DEAD
}

inline float lex_score(const Scorer& s, const SState& st, int64_t tok) {
  if (s.dense) return s.score_table[st.i[0] + tok + 1];
  return lex_next_node(s, st.i[0], tok + 1) == 1 ? kNegInfF : 0.0f;
}

// ---- hotwords (asrkit.search.hotwords.HotwordScorer) ----

// The next state id of state id `id` by `tok` (> 0), searched among the arcs (an automaton without step tables).
inline int64_t hot_next(const Scorer& s, int64_t id, int64_t tok) {
  const int64_t key = id * s.vocab + tok;
  const int64_t pos = lower(s.edge_keys, s.n_edges, key);
  const int64_t root = s.block != nullptr ? s.block[id] * s.vocab + tok : tok;  // the state's own list's root
  return s.edge_keys[pos] == key ? s.edge_dst[pos] : s.root_next[root];
}

inline float hot_score(const Scorer& s, int64_t row, int64_t tok) {
  if (s.step_gain != nullptr) return s.step_gain[row + tok];
  const int64_t id = row / (s.vocab + 1);
  return tok > 0 ? s.reach[hot_next(s, id, tok)] - s.pend[id] : 0.0f;
}

inline int64_t hot_select(const Scorer& s, int64_t row, int64_t tok) {
  if (s.step_next != nullptr) return s.step_next[row + tok];
  return tok > 0 ? hot_next(s, row / (s.vocab + 1), tok) * (s.vocab + 1) + 1 : row;
}

// ---- dispatch over kinds ----

// `utt`: the utterance of the offline call (0 for a stream), which picks a hotword row's own list.
void scorer_init(const Scorer& s, SState& st, LookupCache& cache, int64_t utt) {
  st = SState{{0, 0, 0}, {0.0f, 0.0f, 0.0f}};
  if (s.kind == kWord) word_state(s, 0, s.start_state, st, cache);
  else if (s.kind == kHotwords && s.row_start != nullptr) st.i[0] = s.row_start[utt];
  else if (s.kind == kTokenNgram || s.kind == kHotwords) st.i[0] = s.start_state;
}

inline float scorer_score(const Scorer& s, const SState& st, int64_t tok) {
  if (s.kind == kWord) return word_score(s, st, tok);
  if (s.kind == kLexicon) return lex_score(s, st, tok);
  if (s.kind == kWordCount) return st.i[0] != 0 && s.wc_closes[tok] ? 1.0f : 0.0f;
  if (s.kind == kHotwords) return hot_score(s, st.i[0], tok);
  return s.logp[st.i[0] * s.vocab + tok];
}

// The state after appending `tok` (>= 0); a stay copies the state instead (the torch path recomputes the same).
void scorer_select(const Scorer& s, const SState& old, int64_t tok, SState& out, LookupCache& cache) {
  if (s.kind == kWord) {
    word_select(s, old, tok, out, cache);
  } else if (s.kind == kLexicon) {
    out = old;
    out.i[0] = s.dense ? s.next_base[old.i[0] + tok + 1] : lex_next_node(s, old.i[0], tok + 1) * s.width;
  } else if (s.kind == kWordCount) {
    out = old;
    if (s.wc_opens[tok] >= 0) out.i[0] = s.wc_opens[tok];
  } else if (s.kind == kHotwords) {
    out = old;
    out.i[0] = hot_select(s, old.i[0], tok);
  } else {
    out = old;
    out.i[0] = s.tok_next[old.i[0] * s.vocab + tok];
  }
}

inline float scorer_final(const Scorer& s, const SState& st) {
  if (s.kind == kWord) return st.f[2];
  if (s.kind == kLexicon) return s.is_word[st.i[0] / s.width] ? 0.0f : kNegInfF;
  if (s.kind == kWordCount) return st.i[0] != 0 ? 1.0f : 0.0f;
  if (s.kind == kHotwords) return -s.pend[st.i[0] / (s.vocab + 1)];
  return s.eos[st.i[0]];
}

}  // namespace asrkit_native
