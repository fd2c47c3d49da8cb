// CTC prefix beam search with shallow fusion, one fused frame loop per utterance on the CPU, resumable.
//
// The same algorithm as asrkit/search/ctc_prefix.py (read its module docstring first): per kept frame each
// live hypothesis offers C extension candidates (the frame's pre-selected tokens, chosen in Python) and one
// stay; an extension that duplicates a hypothesis in the beam (found through the prefix hashes) folds into
// that hypothesis's stay; the best K candidates form the next beam. Scorers (word n-gram with look-ahead and
// lexicon, lexicon alone, dense token n-gram, the word count, hotwords) are evaluated here from the tables
// their Python objects export (native_form); every float operation follows the torch path's order and dtype,
// so the two paths agree to rounding. Plain C++ with an extern "C" API over raw pointers (api.h; the scorers
// in scorers.h, the candidate selections in select.h): no torch headers, builds in about 2 s.
//
// The state of one utterance between frames is a Beam (the K hypotheses, their scorer states, the emission
// history and the skipped-blank sum), which `advance` moves over any number of frames. The offline call
// searches each utterance as a fresh Beam advanced once; a stream (asrkit_stream_*) owns a Beam on the heap
// and advances it chunk by chunk, so both run the same code. A run of skipped blank frames moves pnb's mass
// into pb at the next searched frame (the torch loop does it on the frame before the run: the same numbers),
// which needs no look-ahead across a chunk's end.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "api.h"
#include "scorers.h"
#include "select.h"

namespace asrkit_native {
namespace {

template <typename T>
inline T logaddexp(T a, T b) {  // as torch.logaddexp
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (b == neg_inf) return a;  // a + log1p(exp(-inf)) = a + 0 exactly: no exp/log1p for a missing term
  if (a == neg_inf) return b;
  if (std::isinf(a) && a == b) return a;
  const T m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

struct Hyp {
  uint64_t hash, parent;
  int64_t last;
  int64_t node;  // its last emission in Beam::nodes (-1: none)
  int64_t len;   // tokens in the prefix
  bool single;
};
const Hyp kNoHyp{kSentHash, kSentParent, 0, -1, 0, false};

struct Node {  // one emission: the token, its input frame (since the Beam began), the emission before it
  int64_t token, frame, parent;
};

// The beam of one utterance (K slots), what a chunk's advance changes besides appending emissions.
template <typename T>
struct Core {
  std::vector<T> pnb, pb, tot, fused;  // (K,)
  std::vector<uint8_t> dead;           // (K,) slot holds no hypothesis (fewer than K candidates lived)
  std::vector<Hyp> hyp;
  std::vector<SState> st;              // (K, n_scorers)
  int64_t last_kept = -1;              // input frame of the last searched frame (-1: none)
};

// One utterance's whole search state: memory grows with its searched frames (at most K emissions each).
template <typename T>
struct Beam {
  Core<T> core;
  std::vector<Node> nodes;  // only appended: an advance that must re-run truncates what it added
  double offset = 0.0;      // log P(blank) of the skipped frames so far
  int64_t frames = 0;       // input frames consumed
  int64_t vocab = 0;        // V of its advances (0: none yet)
};

// Everything an advance needs besides the Beam, allocated once per thread and reused.
template <typename T>
struct Work {
  std::vector<T> npnb, npb, ntot, nfused;  // (K,) the next beam
  std::vector<uint8_t> ndead;
  std::vector<Hyp> nhyp;
  std::vector<SState> nst;
  std::vector<T> cnb, cb, ctot, cfus;    // (K, C+1) candidate tables; column C is the stay
  std::vector<QueueItem<T>> queue;       // (K * (C+1),) candidate scores
  std::vector<QueueItem<T>> sel;         // the live ones (select_live)
  std::vector<int32_t> par;              // (K,) parent in the beam, -1 none
  std::vector<int64_t> table_keys;       // open addressing: prefix hash -> beam slot
  std::vector<int32_t> table_vals;
  std::vector<int64_t> iota;             // 1 .. V-1: the candidate ids when every token is one
  std::vector<T> vals;                   // (C,) this step's candidate log-probs after token_min_logp
  std::vector<T> step_val;               // (T', C) candidates picked here (select mode)
  std::vector<int64_t> step_tok;
  std::vector<QueueItem<T>> rowq, candq; // select_tokens' work
  std::vector<LookupCache> cache;        // per scorer (word n-grams), kept while the scorers are the same
  Core<T> saved;                         // the beam before an advance, for its exact re-run
  std::vector<T> ctc, total;             // (K,) ranking at the end
  std::vector<QueueItem<T>> rank;
};

// One utterance's frames in a call: rows of the input and the compacted steps over them.
template <typename T>
struct Chunk {
  const T* lp;                 // (frames, V) this utterance's rows
  const int64_t* frame;        // (steps,) row of each step, -1 after the last kept one
  const T* cval;               // (steps, C) candidate log-probs, or null (every token, or picked here)
  const int64_t* ctok;         // (steps, C) their ids, null with cval
  int64_t steps, C, V, base;   // base: the Beam's frame of row 0
  bool select;
  T min_logp, bonus;
};

template <typename T>
void reset(Beam<T>& s, int64_t K, const std::vector<Scorer>& scorers, std::vector<LookupCache>& cache,
           int64_t utt = 0) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t ns = static_cast<int64_t>(scorers.size());
  Core<T>& b = s.core;
  b.pnb.assign(K, neg_inf); b.pb.assign(K, neg_inf); b.tot.assign(K, neg_inf); b.fused.assign(K, 0);
  b.dead.assign(K, 1); b.hyp.assign(K, kNoHyp); b.st.resize(K * ns);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < ns; ++j) scorer_init(scorers[j], b.st[k * ns + j], cache[j], utt);
  // slot 0: the empty prefix (hash 0, last token the blank)
  b.pb[0] = 0; b.tot[0] = 0; b.dead[0] = 0; b.hyp[0] = Hyp{0, kSentParent, 0, -1, 0, false};
  b.last_kept = -1;
  s.nodes.clear(); s.offset = 0.0; s.frames = 0; s.vocab = 0;
}

template <typename T>
void swap_in(Core<T>& b, Work<T>& w) {
  std::swap(b.pnb, w.npnb); std::swap(b.pb, w.npb); std::swap(b.tot, w.ntot); std::swap(b.fused, w.nfused);
  std::swap(b.hyp, w.nhyp); std::swap(b.st, w.nst); std::swap(b.dead, w.ndead);
}

// A padding step of the torch loop (the batch's longer utterances go on): P(blank) = 1, every stay keeps its
// total and moves pnb's mass into pb, and topk reorders the beam (which later ties depend on). Offline only.
template <typename T>
void pad_step(Core<T>& b, Work<T>& w, int64_t K, int64_t cols, bool fusion) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t C = cols - 1;
  for (int64_t at = 0; at < K * cols; ++at) {
    const int64_t k = at / cols;
    T score = neg_inf;
    if (at % cols == C && !b.dead[k]) score = fusion ? b.tot[k] + b.fused[k] : b.tot[k];
    w.queue[at] = QueueItem<T>(score, static_cast<int32_t>(at));
  }
  topk_like_torch(w.queue, K, false);
  const int64_t ns = K ? static_cast<int64_t>(b.st.size()) / K : 0;
  for (int64_t m = 0; m < K; ++m) {
    const int64_t k = w.queue[m].second / cols;
    const bool is_dead = w.queue[m].first == neg_inf;
    w.ndead[m] = is_dead;
    w.npnb[m] = neg_inf;
    w.npb[m] = w.ntot[m] = is_dead ? neg_inf : b.tot[k];
    w.nfused[m] = is_dead ? 0 : b.fused[k];
    w.nhyp[m] = is_dead ? kNoHyp : b.hyp[k];
    for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = b.st[k * ns + j];
  }
  swap_in(b, w);
}

// The searched frames of one chunk (its steps up to the first -1; *kept says how many). exact: select every
// beam with topk_like_torch (torch's slot order). Otherwise a cheaper selection over the live candidates,
// which keeps the same hypotheses in a different slot order; as long as no two live candidates tie, the slot
// order changes nothing. Returns false when it meets a tie that could make the result differ from torch's
// (the Beam is then partly advanced: the caller restores it and runs the exact mode).
template <typename T>
bool advance(Beam<T>& s, const Chunk<T>& ch, const std::vector<Scorer>& scorers, Work<T>& w, bool exact,
             int64_t* kept) {
  Core<T>& b = s.core;
  const int64_t K = static_cast<int64_t>(b.dead.size()), C = ch.C, cols = C + 1, V = ch.V, steps = ch.steps;
  const int64_t ns = static_cast<int64_t>(scorers.size());
  const bool fusion = ns > 0 || ch.bonus != 0;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  // null tables: every non-blank token is a candidate, token c + 1 in column c, its value read from the input
  const T* cval_all = ch.cval;
  const int64_t* ctok_all = ch.ctok;
  if (ch.select) {  // candidates picked per frame below, into per-chunk tables
    w.step_val.resize(std::max<int64_t>(steps, 1) * C);
    w.step_tok.resize(std::max<int64_t>(steps, 1) * C);
    cval_all = w.step_val.data();
    ctok_all = w.step_tok.data();
  }
  w.npnb.resize(K); w.npb.resize(K); w.ntot.resize(K); w.nfused.resize(K);
  w.ndead.resize(K); w.nhyp.resize(K); w.nst.resize(K * ns);
  w.cnb.resize(K * cols); w.cb.resize(K * cols); w.ctot.resize(K * cols); w.cfus.resize(K * cols);
  w.queue.resize(K * cols); w.par.resize(K); w.vals.resize(C);
  if (!ctok_all && static_cast<int64_t>(w.iota.size()) != C) {
    w.iota.resize(C);
    for (int64_t c = 0; c < C; ++c) w.iota[c] = c + 1;
  }
  int64_t size = 1;
  while (size < 2 * K) size <<= 1;
  w.table_keys.resize(size); w.table_vals.resize(size);
  int64_t i = 0;
  for (; i < steps && ch.frame[i] >= 0; ++i) {
    const int64_t at_frame = ch.base + ch.frame[i];
    if (at_frame - b.last_kept > 1) {  // skipped blank frames since the last searched one: pnb's mass into pb
      for (int64_t k = 0; k < K; ++k)
        if (!b.dead[k]) { b.pb[k] = b.tot[k]; b.pnb[k] = neg_inf; }
    }
    b.last_kept = at_frame;
    const T* row = ch.lp + ch.frame[i] * V;
    if (ch.select) {
      T* sv = w.step_val.data() + i * C;
      int64_t* st = w.step_tok.data() + i * C;
      if (exact) select_tokens(row, V, C, w.rowq, w.candq, sv, st);
      else if (!select_fast(row, V, C, sv, st)) return false;
    }
    const T* cval = cval_all ? cval_all + i * C : row + 1;
    const int64_t* ctok = ctok_all ? ctok_all + i * C : w.iota.data();
    const T lpb = row[0];
    // parents: the live hypothesis whose prefix is this one's minus its last token
    std::fill(w.table_vals.begin(), w.table_vals.end(), -1);
    for (int64_t k = 0; k < K; ++k) {
      if (b.dead[k]) continue;
      int64_t at = static_cast<int64_t>((b.hyp[k].hash * kHashMul) >> 40) & (size - 1);
      while (w.table_vals[at] >= 0) at = (at + 1) & (size - 1);
      w.table_keys[at] = static_cast<int64_t>(b.hyp[k].hash);
      w.table_vals[at] = static_cast<int32_t>(k);
    }
    for (int64_t k = 0; k < K; ++k) {
      w.par[k] = -1;
      if (b.dead[k]) continue;
      const uint64_t ph = b.hyp[k].parent;
      int64_t at = static_cast<int64_t>((ph * kHashMul) >> 40) & (size - 1);
      while (w.table_vals[at] >= 0) {
        if (static_cast<uint64_t>(w.table_keys[at]) == ph) { w.par[k] = w.table_vals[at]; break; }
        at = (at + 1) & (size - 1);
      }
    }
    // extensions: from pb and pnb, a repeat of the own last token only from pb
    T* vals = w.vals.data();
    for (int64_t c = 0; c < C; ++c) vals[c] = cval[c] < ch.min_logp ? neg_inf : cval[c];  // token_min_logp
    for (int64_t k = 0; k < K; ++k) {
      T* nb = &w.cnb[k * cols];
      if (b.dead[k]) {
        std::fill(nb, nb + cols, neg_inf);
        continue;
      }
      const int64_t last = b.hyp[k].last;
      const T pb = b.pb[k], tot = b.tot[k];
      for (int64_t c = 0; c < C; ++c) nb[c] = (ctok[c] == last ? pb : tot) + vals[c];
    }
    // merges: extension (parent, own last token) is this hypothesis's prefix: it folds into the stay
    for (int64_t k = 0; k < K; ++k) {
      if (b.dead[k]) continue;
      const int32_t p = w.par[k];
      const T lp_last = row[b.hyp[k].last];
      T src = neg_inf;
      if (p >= 0) {
        src = b.hyp[k].single ? b.tot[p] : b.pb[p];
        const int64_t last = b.hyp[k].last;
        for (int64_t c = 0; c < C; ++c)
          if (ctok[c] == last) w.cnb[p * cols + c] = neg_inf;
      }
      w.cnb[k * cols + C] = logaddexp(b.pnb[k], src) + lp_last;
      w.cb[k * cols + C] = b.tot[k] + lpb;
      w.ctot[k * cols + C] = logaddexp(w.cnb[k * cols + C], w.cb[k * cols + C]);
    }
    // candidate scores in torch's layout: hypothesis k owns entries k*(C+1) .. k*(C+1)+C, the last its stay
    const T bonus = ch.bonus;
    const T w0 = ns > 0 ? static_cast<T>(scorers[0].weight) : T(0);
    for (int64_t k = 0; k < K; ++k) {
      QueueItem<T>* q = &w.queue[k * cols];
      const int32_t at0 = static_cast<int32_t>(k * cols);
      if (b.dead[k]) {
        for (int64_t c = 0; c < cols; ++c) q[c] = QueueItem<T>(neg_inf, at0 + static_cast<int32_t>(c));
        continue;
      }
      const T* nb = &w.cnb[k * cols];
      T* ctot = &w.ctot[k * cols];
      T* cfus = &w.cfus[k * cols];
      const T fused = b.fused[k];
      const SState* st = &b.st[k * ns];
      if (ns == 1 && scorers[0].kind == kWord && scorers[0].dense) {  // the common case, its row hoisted
        const Scorer& sc = scorers[0];
        const float* la_row = sc.la_next + st[0].i[0] * sc.width;
        for (int64_t c = 0; c < C; ++c) {
          ctot[c] = nb[c];
          T score = nb[c];
          if (nb[c] != neg_inf) {
            const int64_t tok = ctok[c];
            const float lm = la_row[tok] + st[0].f[sc.token_slot[tok]];  // word_score
            cfus[c] = (bonus + w0 * static_cast<T>(lm)) + fused;
            score = ctot[c] + cfus[c];
          }
          q[c] = QueueItem<T>(score, at0 + static_cast<int32_t>(c));
        }
        cfus[C] = fused;
        q[C] = QueueItem<T>(ctot[C] + fused, at0 + static_cast<int32_t>(C));
        continue;
      }
      for (int64_t c = 0; c < C; ++c) {
        ctot[c] = nb[c];  // pb is -inf for an extension
        T score = nb[c];
        if (fusion && nb[c] != neg_inf) {
          T f = bonus;
          if (ns > 0) f = bonus + w0 * static_cast<T>(scorer_score(scorers[0], st[0], ctok[c]));
          for (int64_t j = 1; j < ns; ++j)
            f = f + static_cast<T>(scorers[j].weight) * static_cast<T>(scorer_score(scorers[j], st[j], ctok[c]));
          cfus[c] = f + fused;
          score = ctot[c] + cfus[c];
        }
        q[c] = QueueItem<T>(score, at0 + static_cast<int32_t>(c));
      }
      cfus[C] = fused;  // a stay carries its fused score
      q[C] = QueueItem<T>(fusion ? ctot[C] + fused : ctot[C], at0 + static_cast<int32_t>(C));
    }
    if (exact) {
      topk_like_torch(w.queue, K, false);
    } else if (!select_live(w.queue, w.sel, K, neg_inf, static_cast<int32_t>(C))) {
      return false;
    }
    for (int64_t m = 0; m < K; ++m) {
      const int64_t at = w.queue[m].second, k = at / cols, c = at % cols;
      const bool is_dead = w.queue[m].first == neg_inf;
      w.ndead[m] = is_dead;
      if (is_dead) {  // fewer live candidates than K: an empty slot
        w.npnb[m] = w.npb[m] = w.ntot[m] = neg_inf;
        w.nfused[m] = 0;
        w.nhyp[m] = kNoHyp;
        for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = b.st[k * ns + j];
        continue;
      }
      w.npnb[m] = w.cnb[at];
      w.npb[m] = c < C ? neg_inf : w.cb[at];
      w.ntot[m] = w.ctot[at];
      w.nfused[m] = fusion ? w.cfus[at] : b.fused[k];
      const Hyp& old = b.hyp[k];
      if (c < C) {
        const int64_t tok = ctok[c];
        s.nodes.push_back(Node{tok, at_frame, old.node});
        w.nhyp[m] = Hyp{static_cast<uint64_t>(tok) + old.hash * kHashMul, old.hash, tok,
                        static_cast<int64_t>(s.nodes.size()) - 1, old.len + 1, tok != old.last};
        for (int64_t j = 0; j < ns; ++j) scorer_select(scorers[j], b.st[k * ns + j], tok, w.nst[m * ns + j], w.cache[j]);
      } else {
        w.nhyp[m] = old;
        for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = b.st[k * ns + j];
      }
    }
    swap_in(b, w);
  }
  *kept = i;
  return true;
}

// A chunk's advance, re-run in the exact mode from the saved beam when the cheaper one meets a tie.
template <typename T>
void advance_checked(Beam<T>& s, const Chunk<T>& ch, const std::vector<Scorer>& scorers, Work<T>& w,
                     int64_t* kept) {
  w.saved = s.core;
  const size_t n_nodes = s.nodes.size();
  if (advance(s, ch, scorers, w, false, kept)) return;
  s.core = w.saved;
  s.nodes.resize(n_nodes);
  advance(s, ch, scorers, w, true, kept);
}

// The best N slots into w.rank (their totals in w.total, CTC scores in w.ctc): + the skipped blank frames,
// + the scorers' end-of-sentence scores if `final`; torch.topk's order in the exact mode, else by (total,
// slot), which returns false on a tie among the first N + 1 (torch's order decides it).
template <typename T>
bool rank(const Beam<T>& s, const std::vector<Scorer>& scorers, int64_t N, bool final, bool exact, Work<T>& w) {
  const Core<T>& b = s.core;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t K = static_cast<int64_t>(b.dead.size()), ns = static_cast<int64_t>(scorers.size());
  const T offset = static_cast<T>(s.offset);
  w.ctc.resize(K); w.total.resize(K); w.rank.resize(K);
  for (int64_t k = 0; k < K; ++k) {
    w.ctc[k] = b.tot[k] + offset;
    T t = w.ctc[k] + b.fused[k];
    for (int64_t j = 0; final && j < ns && !b.dead[k]; ++j)
      t = t + static_cast<T>(scorers[j].weight) * static_cast<T>(scorer_final(scorers[j], b.st[k * ns + j]));
    w.total[k] = b.dead[k] ? neg_inf : t;
    w.rank[k] = QueueItem<T>(w.total[k], static_cast<int32_t>(k));
  }
  if (exact) {
    topk_like_torch(w.rank, N, true);
    return true;
  }
  const int64_t n = std::min<int64_t>(N + 1, K);
  std::partial_sort(w.rank.begin(), w.rank.begin() + n, w.rank.end(), [](const QueueItem<T>& x, const QueueItem<T>& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  for (int64_t r = 0; r + 1 < n; ++r)
    if (w.rank[r].first == w.rank[r + 1].first && w.rank[r].first > neg_inf) return false;
  for (int64_t r = 0; r < K; ++r)
    if (std::isnan(w.rank[r].first)) return false;
  return true;
}

// The ranked hypotheses (rank's first N) as rows of width `width` (>= any prefix's length), padded with -1.
template <typename T>
void write_hyps(const Beam<T>& s, const Work<T>& w, int64_t N, int64_t width, T* out_total, T* out_ctc,
                int64_t* tokens, int64_t* token_frames, int64_t* lengths) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < N; ++r) {
    int64_t* toks = tokens + r * width;
    int64_t* frs = token_frames + r * width;
    std::fill(toks, toks + width, -1);
    std::fill(frs, frs + width, -1);
    const int64_t k = w.rank[r].second;
    out_total[r] = w.total[k];
    lengths[r] = 0;
    if (!(w.total[k] > neg_inf)) {  // an empty slot, or a hypothesis a scorer refuses to end
      out_ctc[r] = neg_inf;
      continue;
    }
    out_ctc[r] = w.ctc[k];
    const Hyp& h = s.core.hyp[k];
    int64_t node = h.node;
    for (int64_t j = h.len - 1; j >= 0; --j) {  // the emission history, last token first
      toks[j] = s.nodes[node].token;
      frs[j] = s.nodes[node].frame;
      node = s.nodes[node].parent;
    }
    lengths[r] = h.len;
  }
}

// ---- the offline search: each utterance a fresh Beam, advanced once ----

template <typename T>
bool offline_utterance(const SearchDesc& d, const std::vector<Scorer>& scorers, int64_t b, Beam<T>& s,
                       Work<T>& w, bool exact) {
  const int64_t K = d.beam, C = d.n_cand, V = d.vocab, steps = d.steps, N = d.nbest;
  bind_caches(w.cache, scorers);
  reset(s, K, scorers, w.cache, b);
  Chunk<T> ch{static_cast<const T*>(d.lp) + b * d.frames * V, d.frame + b * steps,
              d.cval ? static_cast<const T*>(d.cval) + b * steps * C : nullptr,
              d.ctok ? d.ctok + b * steps * C : nullptr, steps, C, V, 0, d.select != 0,
              static_cast<T>(d.min_logp), static_cast<T>(d.bonus)};  // min_logp compared in the search's dtype
  int64_t kept = 0;
  if (!advance(s, ch, scorers, w, exact, &kept)) return false;
  if (exact) {  // the padding steps of the batch's longer utterances reorder the beam as torch's topk does
    const bool fusion = !scorers.empty() || d.bonus != 0.0;
    for (int64_t i = kept; i < steps; ++i) pad_step(s.core, w, K, C + 1, fusion);
  }
  s.offset = static_cast<double>(static_cast<const T*>(d.offset)[b]);
  if (!rank(s, scorers, N, true, exact, w)) return false;
  write_hyps(s, w, N, steps, static_cast<T*>(d.total) + b * N, static_cast<T*>(d.ctc) + b * N,
             d.tokens + b * N * steps, d.token_frames + b * N * steps, d.lengths + b * N);
  return true;
}

// Calls fn(index, work) for index 0 .. n-1 over `threads` threads, each with its own Work (items interleaved:
// their lengths vary, so no contiguous blocks).
template <typename T, typename Fn>
void parallel(int64_t n, int64_t threads, Fn fn) {
  threads = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (threads == 1) {
    Work<T> w;
    for (int64_t b = 0; b < n; ++b) fn(b, w);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t]() {
      Work<T> w;
      for (int64_t b = t; b < n; b += threads) fn(b, w);
    });
  }
  for (auto& th : pool) th.join();
}

template <typename T>
void search_all(const SearchDesc& d, const std::vector<Scorer>& scorers) {
  parallel<T>(d.batch, d.threads, [&](int64_t b, Work<T>& w) {
    Beam<T> s;
    if (!offline_utterance<T>(d, scorers, b, s, w, false)) offline_utterance<T>(d, scorers, b, s, w, true);
  });
}

bool read_scorers(const ScorerDesc* descs, int64_t n, std::vector<Scorer>& out) {
  for (int64_t j = 0; j < n; ++j) {
    Scorer s = make_scorer(descs[j]);
    if (s.kind < kWord || s.kind > kHotwords) return false;
    out.push_back(s);
  }
  return true;
}

// ---- streams: a Beam on the heap, advanced chunk by chunk ----

constexpr uint64_t kStreamMagic = 0x6173726B69745354ULL;  // "asrkitST": a live handle
std::atomic<int64_t> live_streams{0};

struct StreamBase {
  uint64_t magic = kStreamMagic;
  bool is_double = false;
  int64_t beam = 0;
  double bonus = 0.0;
  std::vector<Scorer> scorers;  // their tables are owned by the Python StreamState
  StreamBase() { ++live_streams; }
  virtual ~StreamBase() {
    magic = 0;
    --live_streams;
  }
};

template <typename T>
struct Stream : StreamBase {
  Beam<T> state;
};

// The handles of a call as streams of dtype T; false if one is not a live stream of that dtype.
template <typename T>
bool as_streams(void* const* handles, int64_t n, std::vector<Stream<T>*>& out) {
  if (handles == nullptr || n < 0) return false;
  out.resize(n);
  for (int64_t b = 0; b < n; ++b) {
    auto* base = static_cast<StreamBase*>(handles[b]);
    if (base == nullptr || base->magic != kStreamMagic || base->is_double != std::is_same<T, double>::value)
      return false;
    out[b] = static_cast<Stream<T>*>(base);
  }
  return true;
}

template <typename T>
int64_t stream_advance(const AdvanceDesc& d) {
  std::vector<Stream<T>*> streams;
  if (!as_streams(d.states, d.batch, streams)) return 3;
  const int64_t steps = d.steps, C = d.n_cand, V = d.vocab;
  for (int64_t b = 0; b < d.batch; ++b) {
    if (d.lengths[b] < 0 || d.lengths[b] > d.frames) return 1;
    if (streams[b]->state.vocab != 0 && streams[b]->state.vocab != V) return 4;
    for (int64_t c = 0; c < b; ++c)
      if (streams[c] == streams[b]) return 5;  // one Beam advanced twice at once
  }
  parallel<T>(d.batch, d.threads, [&](int64_t b, Work<T>& w) {
    Stream<T>& st = *streams[b];
    Beam<T>& s = st.state;
    bind_caches(w.cache, st.scorers);
    Chunk<T> ch{static_cast<const T*>(d.lp) + b * d.frames * V, d.frame + b * steps,
                d.cval ? static_cast<const T*>(d.cval) + b * steps * C : nullptr,
                d.ctok ? d.ctok + b * steps * C : nullptr, steps, C, V, s.frames, d.select != 0,
                static_cast<T>(d.min_logp), static_cast<T>(st.bonus)};
    int64_t kept = 0;
    advance_checked(s, ch, st.scorers, w, &kept);
    s.offset += static_cast<double>(static_cast<const T*>(d.offset)[b]);
    s.frames += d.lengths[b];
    s.vocab = V;
  });
  return 0;
}

template <typename T>
int64_t stream_nbest(const NBestDesc& d) {
  std::vector<Stream<T>*> streams;
  if (!as_streams(d.states, d.batch, streams)) return 3;
  Work<T> w;
  for (int64_t b = 0; b < d.batch; ++b) {
    const Stream<T>& st = *streams[b];
    if (d.nbest < 1 || d.nbest > st.beam) return 1;
    for (const Hyp& h : st.state.core.hyp)
      if (h.len > d.width) return 1;
    if (!rank(st.state, st.scorers, d.nbest, d.final != 0, false, w))
      rank(st.state, st.scorers, d.nbest, d.final != 0, true, w);
    const int64_t N = d.nbest;
    write_hyps(st.state, w, N, d.width, static_cast<T*>(d.total) + b * N, static_cast<T*>(d.ctc) + b * N,
               d.tokens + b * N * d.width, d.token_frames + b * N * d.width, d.lengths + b * N);
  }
  return 0;
}

StreamBase* base_of(void* handle) {
  auto* base = static_cast<StreamBase*>(handle);
  return base != nullptr && base->magic == kStreamMagic ? base : nullptr;
}

}  // namespace
}  // namespace asrkit_native

using namespace asrkit_native;

extern "C" int64_t asrkit_native_abi(void) { return 10; }

extern "C" int64_t asrkit_prefix_search(const SearchDesc* d) {
  if (d == nullptr || d->beam < 1 || d->nbest < 1 || d->nbest > d->beam || d->n_cand < 1) return 1;
  if (d->select && (d->cval != nullptr || d->ctok != nullptr || d->n_cand >= d->vocab - 1)) return 1;
  std::vector<Scorer> scorers;
  if (!read_scorers(d->scorers, d->n_scorers, scorers)) return 2;
  for (const Scorer& s : scorers)
    if (s.row_start != nullptr && s.n_row_start != d->batch) return 1;  // a start per utterance
  if (d->is_double) search_all<double>(*d, scorers);
  else search_all<float>(*d, scorers);
  return 0;
}

extern "C" void* asrkit_stream_create(const StreamDesc* d) {
  if (d == nullptr || d->beam < 1 || d->n_scorers < 0) return nullptr;
  std::vector<Scorer> scorers;
  if (!read_scorers(d->scorers, d->n_scorers, scorers)) return nullptr;
  for (const Scorer& s : scorers)
    if (s.row_start != nullptr && s.n_row_start != 1) return nullptr;  // one stream: one start
  std::vector<LookupCache> cache;
  bind_caches(cache, scorers);
  StreamBase* base;
  if (d->is_double) {
    auto* s = new Stream<double>();
    reset(s->state, d->beam, scorers, cache);
    base = s;
  } else {
    auto* s = new Stream<float>();
    reset(s->state, d->beam, scorers, cache);
    base = s;
  }
  base->is_double = d->is_double != 0;
  base->beam = d->beam;
  base->bonus = d->bonus;
  base->scorers = std::move(scorers);
  return base;
}

extern "C" int64_t asrkit_stream_free(void* state) {
  StreamBase* base = base_of(state);
  if (base == nullptr) return 3;
  delete base;
  return 0;
}

extern "C" int64_t asrkit_stream_live(void) { return live_streams.load(); }

extern "C" int64_t asrkit_stream_frames(void* state) {
  StreamBase* base = base_of(state);
  if (base == nullptr) return -1;
  return base->is_double ? static_cast<Stream<double>*>(base)->state.frames
                         : static_cast<Stream<float>*>(base)->state.frames;
}

extern "C" int64_t asrkit_stream_width(void* const* states, int64_t batch) {
  int64_t width = 0;
  for (int64_t b = 0; b < batch; ++b) {
    StreamBase* base = base_of(states[b]);
    if (base == nullptr) return -1;
    auto longest = [&](const auto& s) {
      for (int64_t k = 0; k < static_cast<int64_t>(s.core.hyp.size()); ++k)
        if (!s.core.dead[k]) width = std::max(width, s.core.hyp[k].len);
    };
    if (base->is_double) longest(static_cast<Stream<double>*>(base)->state);
    else longest(static_cast<Stream<float>*>(base)->state);
  }
  return width;
}

extern "C" int64_t asrkit_stream_advance(const AdvanceDesc* d) {
  if (d == nullptr || d->batch < 0 || d->n_cand < 1 || d->n_cand > d->vocab - 1) return 1;
  if (d->select && (d->cval != nullptr || d->ctok != nullptr || d->n_cand >= d->vocab - 1)) return 1;
  return d->is_double ? stream_advance<double>(*d) : stream_advance<float>(*d);
}

extern "C" int64_t asrkit_stream_nbest(const NBestDesc* d) {
  if (d == nullptr || d->batch < 0 || d->width < 0) return 1;
  return d->is_double ? stream_nbest<double>(*d) : stream_nbest<float>(*d);
}
