// CTC prefix beam search with shallow fusion, one fused frame loop per utterance on the CPU.
//
// The same algorithm as asrkit/search/ctc_prefix.py (read its module docstring first): per kept frame each
// live hypothesis offers C extension candidates (the frame's pre-selected tokens, chosen in Python) and one
// stay; an extension that duplicates a hypothesis in the beam (found through the prefix hashes) folds into
// that hypothesis's stay; the best K candidates form the next beam. Scorers (word n-gram with look-ahead and
// lexicon, lexicon alone, dense token n-gram, the word count) are evaluated here from the tables their Python
// objects export (native_form); every float operation follows the torch path's order and dtype, so the two
// paths agree to rounding. Plain C++ with an extern "C" API over raw pointers (api.h; the scorers in scorers.h): no torch
// headers, builds in about 2 s.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "api.h"
#include "scorers.h"

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
  bool single;
};

// torch.topk(values, k) on the CPU, reproduced so that ties and the order of an unsorted result come out
// as in the torch loop (the beam's order decides later ties): the same comparator and partial-sort /
// nth_element choice, applied to the same layout of candidates. The permutation depends only on the
// comparisons, so the narrower (value, index) pair and the NaN-free comparator give the same result.
template <typename T>
using QueueItem = std::pair<T, int32_t>;

template <typename T>
void topk_like_torch(std::vector<QueueItem<T>>& queue, int64_t k, bool sorted) {
  bool nan = false;
  for (const auto& q : queue) nan |= std::isnan(q.first);
  auto run = [&](auto greater) {
    const int64_t n = static_cast<int64_t>(queue.size());
    if (k * 64 <= n) {
      std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
    } else {
      std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), greater);
      if (sorted) std::sort(queue.begin(), queue.begin() + k - 1, greater);
    }
  };
  if (nan) {
    run([](const QueueItem<T>& x, const QueueItem<T>& y) {
      return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
    });
  } else {
    run([](const QueueItem<T>& x, const QueueItem<T>& y) { return x.first > y.first; });
  }
}

// The live (finite) candidates of `queue` into its first slots, the best K of them (best first) if there are
// more, then empty slots (-inf, pointing at slot 0's stay). Insertion into a sorted buffer: most candidates
// fall below the K-th and cost one comparison. Returns false on a tie at the cut (a candidate left out with
// the score of the last one kept: torch's order decides which stays) or a NaN.
template <typename T>
bool select_live(std::vector<QueueItem<T>>& queue, std::vector<QueueItem<T>>& sel, int64_t K, T neg_inf,
                 int32_t stay0) {
  sel.resize(K);
  int64_t n = 0;
  T dropped = neg_inf;  // the best score left out
  for (const auto& q : queue) {
    const T x = q.first;
    if (!(x > neg_inf)) {
      if (std::isnan(x)) return false;
      continue;
    }
    if (n == K) {
      if (!(x > sel[K - 1].first)) {
        dropped = std::max(dropped, x);
        continue;
      }
      dropped = std::max(dropped, sel[K - 1].first);
      --n;
    }
    int64_t j = n++;
    for (; j > 0 && sel[j - 1].first < x; --j) sel[j] = sel[j - 1];
    sel[j] = q;
  }
  if (n == K && dropped == sel[K - 1].first) return false;
  std::copy(sel.begin(), sel.begin() + n, queue.begin());
  for (int64_t m = n; m < K; ++m) queue[m] = QueueItem<T>(neg_inf, stay0);
  return true;
}

// The `count` best non-blank tokens of a frame's V log-probs, in the order asrkit.search.candidates.top_tokens
// returns them for small vocabularies (torch.topk of count + 1, the blank masked, torch.topk of count): the
// same selections, so the candidate columns and any ties come out as in the torch loop.
template <typename T>
void select_tokens(const T* row, int64_t V, int64_t count, std::vector<QueueItem<T>>& rowq,
                   std::vector<QueueItem<T>>& candq, T* vals, int64_t* ids) {
  rowq.resize(V);
  for (int64_t v = 0; v < V; ++v) rowq[v] = QueueItem<T>(row[v], static_cast<int32_t>(v));
  topk_like_torch(rowq, count + 1, false);  // rowq[0 .. count]: (value, token)
  candq.resize(count + 1);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j <= count; ++j)  // the blank may be among them: masked
    candq[j] = QueueItem<T>(rowq[j].second == 0 ? neg_inf : rowq[j].first, static_cast<int32_t>(j));
  topk_like_torch(candq, count, false);
  for (int64_t j = 0; j < count; ++j) {
    vals[j] = candq[j].first;
    ids[j] = rowq[candq[j].second].second;
  }
}

// The same `count` best non-blank tokens as select_tokens, in another order (best first), by insertion into a
// sorted buffer: ~V comparisons instead of two nth_elements. Returns false on a tie at the cut (a token left
// out with the same finite log-prob as the last one kept), where torch's order decides.
template <typename T>
bool select_fast(const T* row, int64_t V, int64_t count, T* vals, int64_t* ids) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  int64_t n = 0;
  T dropped = neg_inf;  // the best value left out
  for (int64_t v = 1; v < V; ++v) {  // token 0 is the blank
    const T x = row[v];
    if (n == count) {
      if (!(x > vals[n - 1])) {
        dropped = std::max(dropped, x);
        continue;
      }
      dropped = std::max(dropped, vals[n - 1]);
      --n;
    }
    int64_t j = n++;
    for (; j > 0 && vals[j - 1] < x; --j) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
    }
    vals[j] = x;
    ids[j] = v;
  }
  return !(dropped == vals[count - 1] && dropped > neg_inf);
}

// Everything one utterance needs, allocated once per thread and reused.
template <typename T>
struct Work {
  std::vector<T> pnb, pb, tot, fused, npnb, npb, ntot, nfused;  // (K,) per beam slot
  std::vector<uint8_t> dead, ndead;      // (K,) slot holds no hypothesis (fewer than K candidates lived)
  std::vector<Hyp> hyp, nhyp;
  std::vector<SState> st, nst;           // (K, n_scorers)
  std::vector<T> cnb, cb, ctot, cfus;    // (K, C+1) candidate tables; column C is the stay
  std::vector<QueueItem<T>> queue;       // (K * (C+1),) candidate scores
  std::vector<QueueItem<T>> sel;         // the live ones (select_live)
  std::vector<int32_t> par;              // (K,) parent in the beam, -1 none
  std::vector<int64_t> table_keys;       // open addressing: prefix hash -> beam slot
  std::vector<int32_t> table_vals;
  std::vector<int32_t> back_parent, back_col;  // (T', K) back-pointers
  std::vector<int64_t> iota;             // 1 .. V-1: the candidate ids when every token is one
  std::vector<T> vals;                   // (C,) this step's candidate log-probs after token_min_logp
  std::vector<T> step_val;               // (T', C) candidates picked here (select mode)
  std::vector<int64_t> step_tok;
  std::vector<QueueItem<T>> rowq, candq; // select_tokens' work
  std::vector<LookupCache> cache;        // per scorer (word n-grams), kept across the thread's utterances
};

// A padding step of the torch loop (the batch's longer utterances go on): P(blank) = 1, every stay keeps its
// total and moves pnb's mass into pb, and topk reorders the beam (which later ties depend on).
template <typename T>
void pad_step(Work<T>& w, int64_t i, int64_t K, int64_t cols, bool fusion) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t C = cols - 1;
  for (int64_t at = 0; at < K * cols; ++at) {
    const int64_t k = at / cols;
    T score = neg_inf;
    if (at % cols == C && !w.dead[k]) score = fusion ? w.tot[k] + w.fused[k] : w.tot[k];
    w.queue[at] = QueueItem<T>(score, static_cast<int32_t>(at));
  }
  topk_like_torch(w.queue, K, false);
  const int64_t ns = K ? static_cast<int64_t>(w.st.size()) / K : 0;
  for (int64_t m = 0; m < K; ++m) {
    const int64_t at = w.queue[m].second, k = at / cols;
    w.back_parent[i * K + m] = static_cast<int32_t>(k);
    w.back_col[i * K + m] = static_cast<int32_t>(C);
    const bool is_dead = w.queue[m].first == neg_inf;
    w.ndead[m] = is_dead;
    w.npnb[m] = neg_inf;
    w.npb[m] = w.ntot[m] = is_dead ? neg_inf : w.tot[k];
    w.nfused[m] = is_dead ? 0 : w.fused[k];
    w.nhyp[m] = is_dead ? Hyp{kSentHash, kSentParent, 0, false} : w.hyp[k];
    for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = w.st[k * ns + j];
  }
  std::swap(w.pnb, w.npnb); std::swap(w.pb, w.npb); std::swap(w.tot, w.ntot); std::swap(w.fused, w.nfused);
  std::swap(w.hyp, w.nhyp); std::swap(w.st, w.nst); std::swap(w.dead, w.ndead);
}

// One utterance. exact: select every beam with topk_like_torch (torch's slot order). Otherwise a cheaper
// selection over the live candidates, which keeps the same hypotheses in a different slot order; as long as
// no two live candidates tie, the slot order changes nothing. Returns false (and writes no output) when it
// meets a tie that could make the result differ from torch's, so that the caller runs the exact mode.
template <typename T>
bool search_utterance(const SearchDesc& d, const std::vector<Scorer>& scorers, int64_t b, Work<T>& w,
                      bool exact) {
  const int64_t K = d.beam, C = d.n_cand, cols = C + 1, V = d.vocab, steps = d.steps;
  const int64_t ns = static_cast<int64_t>(scorers.size());
  const bool fusion = ns > 0 || d.bonus != 0.0;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T* lp = static_cast<const T*>(d.lp) + b * d.frames * V;
  const int64_t* frame = d.frame + b * steps;
  // null tables: every non-blank token is a candidate, token c + 1 in column c, its value read from the input
  const T* cval_all = d.cval ? static_cast<const T*>(d.cval) + b * steps * C : nullptr;
  const int64_t* ctok_all = d.ctok ? d.ctok + b * steps * C : nullptr;
  if (d.select) {  // candidates picked per frame below, into per-utterance tables
    w.step_val.resize(std::max<int64_t>(steps, 1) * C);
    w.step_tok.resize(std::max<int64_t>(steps, 1) * C);
    cval_all = w.step_val.data();
    ctok_all = w.step_tok.data();
  }
  const T min_logp = static_cast<T>(d.min_logp);  // compared in the search's dtype, as torch does
  const Hyp none{kSentHash, kSentParent, 0, false};
  w.pnb.assign(K, neg_inf); w.pb.assign(K, neg_inf); w.tot.assign(K, neg_inf); w.fused.assign(K, 0);
  w.npnb.resize(K); w.npb.resize(K); w.ntot.resize(K); w.nfused.resize(K);
  w.dead.assign(K, 1); w.ndead.resize(K);
  w.hyp.assign(K, none); w.nhyp.resize(K);
  w.st.resize(K * ns); w.nst.resize(K * ns);
  if (static_cast<int64_t>(w.cache.size()) != ns) w.cache.resize(ns);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < ns; ++j) scorer_init(scorers[j], w.st[k * ns + j], w.cache[j]);
  w.cnb.resize(K * cols); w.cb.resize(K * cols); w.ctot.resize(K * cols); w.cfus.resize(K * cols);
  w.queue.resize(K * cols); w.par.resize(K); w.vals.resize(C);
  w.back_parent.resize(std::max<int64_t>(steps, 1) * K); w.back_col.resize(std::max<int64_t>(steps, 1) * K);
  if (!ctok_all && static_cast<int64_t>(w.iota.size()) != C) {
    w.iota.resize(C);
    for (int64_t c = 0; c < C; ++c) w.iota[c] = c + 1;
  }
  int64_t size = 1;
  while (size < 2 * K) size <<= 1;
  w.table_keys.resize(size); w.table_vals.resize(size);
  // slot 0: the empty prefix (hash 0, last token the blank)
  w.pb[0] = 0; w.tot[0] = 0; w.dead[0] = 0; w.hyp[0] = Hyp{0, kSentParent, 0, false};
  for (int64_t i = 0; i < steps; ++i) {
    if (frame[i] < 0) {  // padding after the utterance's last frame: stays only, to keep torch's beam order
      if (exact) {
        pad_step(w, i, K, cols, fusion);
      } else {  // the same stays in place: pnb's mass moves into pb, totals unchanged
        for (int64_t k = 0; k < K; ++k) {
          if (!w.dead[k]) { w.pb[k] = w.tot[k]; w.pnb[k] = neg_inf; }
          w.back_parent[i * K + k] = static_cast<int32_t>(k);
          w.back_col[i * K + k] = static_cast<int32_t>(C);
        }
      }
      continue;
    }
    const T* row = lp + frame[i] * V;
    if (d.select) {
      T* sv = w.step_val.data() + i * C;
      int64_t* st = w.step_tok.data() + i * C;
      if (exact) select_tokens(row, V, C, w.rowq, w.candq, sv, st);
      else if (!select_fast(row, V, C, sv, st)) return false;
    }
    const T* cval = cval_all ? cval_all + i * C : row + 1;
    const int64_t* ctok = ctok_all ? ctok_all + i * C : w.iota.data();
    const T lpb = row[0];
    // a run of skipped blank frames follows: pnb's mass moves into pb (their log P is added at the end)
    const bool run = i + 1 < steps && frame[i + 1] >= 0 && frame[i + 1] - frame[i] > 1;
    // parents: the live hypothesis whose prefix is this one's minus its last token
    std::fill(w.table_vals.begin(), w.table_vals.end(), -1);
    for (int64_t k = 0; k < K; ++k) {
      if (w.dead[k]) continue;
      int64_t at = static_cast<int64_t>((w.hyp[k].hash * kHashMul) >> 40) & (size - 1);
      while (w.table_vals[at] >= 0) at = (at + 1) & (size - 1);
      w.table_keys[at] = static_cast<int64_t>(w.hyp[k].hash);
      w.table_vals[at] = static_cast<int32_t>(k);
    }
    for (int64_t k = 0; k < K; ++k) {
      w.par[k] = -1;
      if (w.dead[k]) continue;
      const uint64_t ph = w.hyp[k].parent;
      int64_t at = static_cast<int64_t>((ph * kHashMul) >> 40) & (size - 1);
      while (w.table_vals[at] >= 0) {
        if (static_cast<uint64_t>(w.table_keys[at]) == ph) { w.par[k] = w.table_vals[at]; break; }
        at = (at + 1) & (size - 1);
      }
    }
    // extensions: from pb and pnb, a repeat of the own last token only from pb
    T* vals = w.vals.data();
    for (int64_t c = 0; c < C; ++c) vals[c] = cval[c] < min_logp ? neg_inf : cval[c];  // token_min_logp
    for (int64_t k = 0; k < K; ++k) {
      T* nb = &w.cnb[k * cols];
      if (w.dead[k]) {
        std::fill(nb, nb + cols, neg_inf);
        continue;
      }
      const int64_t last = w.hyp[k].last;
      const T pb = w.pb[k], tot = w.tot[k];
      for (int64_t c = 0; c < C; ++c) nb[c] = (ctok[c] == last ? pb : tot) + vals[c];
    }
    // merges: extension (parent, own last token) is this hypothesis's prefix: it folds into the stay
    for (int64_t k = 0; k < K; ++k) {
      if (w.dead[k]) continue;
      const int32_t p = w.par[k];
      const T lp_last = row[w.hyp[k].last];
      T src = neg_inf;
      if (p >= 0) {
        src = w.hyp[k].single ? w.tot[p] : w.pb[p];
        const int64_t last = w.hyp[k].last;
        for (int64_t c = 0; c < C; ++c)
          if (ctok[c] == last) w.cnb[p * cols + c] = neg_inf;
      }
      w.cnb[k * cols + C] = logaddexp(w.pnb[k], src) + lp_last;
      w.cb[k * cols + C] = w.tot[k] + lpb;
      w.ctot[k * cols + C] = logaddexp(w.cnb[k * cols + C], w.cb[k * cols + C]);
    }
    // candidate scores in torch's layout: hypothesis k owns entries k*(C+1) .. k*(C+1)+C, the last its stay
    const T bonus = static_cast<T>(d.bonus);
    const T w0 = ns > 0 ? static_cast<T>(scorers[0].weight) : T(0);
    for (int64_t k = 0; k < K; ++k) {
      QueueItem<T>* q = &w.queue[k * cols];
      const int32_t at0 = static_cast<int32_t>(k * cols);
      if (w.dead[k]) {
        for (int64_t c = 0; c < cols; ++c) q[c] = QueueItem<T>(neg_inf, at0 + static_cast<int32_t>(c));
        continue;
      }
      const T* nb = &w.cnb[k * cols];
      T* ctot = &w.ctot[k * cols];
      T* cfus = &w.cfus[k * cols];
      const T fused = w.fused[k];
      const SState* st = &w.st[k * ns];
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
      w.back_parent[i * K + m] = static_cast<int32_t>(k);
      w.back_col[i * K + m] = static_cast<int32_t>(c);
      const bool is_dead = w.queue[m].first == neg_inf;
      w.ndead[m] = is_dead;
      if (is_dead) {  // fewer live candidates than K: an empty slot
        w.npnb[m] = w.npb[m] = w.ntot[m] = neg_inf;
        w.nfused[m] = 0;
        w.nhyp[m] = none;
        for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = w.st[k * ns + j];
        continue;
      }
      if (run) {
        w.npnb[m] = neg_inf;
        w.npb[m] = w.ctot[at];
      } else {
        w.npnb[m] = w.cnb[at];
        w.npb[m] = c < C ? neg_inf : w.cb[at];
      }
      w.ntot[m] = w.ctot[at];
      w.nfused[m] = fusion ? w.cfus[at] : w.fused[k];
      const Hyp& old = w.hyp[k];
      if (c < C) {
        const int64_t tok = ctok[c];
        w.nhyp[m] = Hyp{static_cast<uint64_t>(tok) + old.hash * kHashMul, old.hash, tok, tok != old.last};
        for (int64_t j = 0; j < ns; ++j) scorer_select(scorers[j], w.st[k * ns + j], tok, w.nst[m * ns + j], w.cache[j]);
      } else {
        w.nhyp[m] = old;
        for (int64_t j = 0; j < ns; ++j) w.nst[m * ns + j] = w.st[k * ns + j];
      }
    }
    std::swap(w.pnb, w.npnb); std::swap(w.pb, w.npb); std::swap(w.tot, w.ntot); std::swap(w.fused, w.nfused);
    std::swap(w.hyp, w.nhyp); std::swap(w.st, w.nst); std::swap(w.dead, w.ndead);
  }
  // end: + skipped blank frames, + the scorers' final scores; best first (torch.topk's order again)
  const T offset = static_cast<const T*>(d.offset)[b];
  std::vector<T> ctc(K), total(K);
  std::vector<QueueItem<T>> rank(K);
  for (int64_t k = 0; k < K; ++k) {
    ctc[k] = w.tot[k] + offset;
    T t = ctc[k] + w.fused[k];
    for (int64_t j = 0; j < ns && !w.dead[k]; ++j)
      t = t + static_cast<T>(scorers[j].weight) * static_cast<T>(scorer_final(scorers[j], w.st[k * ns + j]));
    total[k] = w.dead[k] ? neg_inf : t;
    rank[k] = QueueItem<T>(total[k], static_cast<int32_t>(k));
  }
  const int64_t N = d.nbest;
  if (exact) {
    topk_like_torch(rank, N, true);
  } else {  // best first, by (total, slot); a tie among the first N + 1 needs torch's order
    const int64_t n = std::min<int64_t>(N + 1, K);
    std::partial_sort(rank.begin(), rank.begin() + n, rank.end(), [](const QueueItem<T>& x, const QueueItem<T>& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    });
    for (int64_t r = 0; r + 1 < n; ++r)
      if (rank[r].first == rank[r + 1].first && rank[r].first > neg_inf) return false;
    for (int64_t r = 0; r < K; ++r)
      if (std::isnan(rank[r].first)) return false;
  }
  T* out_total = static_cast<T*>(d.total) + b * N;
  T* out_ctc = static_cast<T*>(d.ctc) + b * N;
  for (int64_t r = 0; r < N; ++r) {
    int64_t* toks = d.tokens + (b * N + r) * steps;
    int64_t* frs = d.token_frames + (b * N + r) * steps;
    std::fill(toks, toks + steps, -1);
    std::fill(frs, frs + steps, -1);
    d.lengths[b * N + r] = 0;
    int64_t k = rank[r].second;
    if (!(total[k] > neg_inf)) {  // an empty slot, or a hypothesis a scorer refuses to end
      out_total[r] = total[k];
      out_ctc[r] = neg_inf;
      continue;
    }
    out_total[r] = total[k];
    out_ctc[r] = ctc[k];
    int64_t len = 0;
    for (int64_t i = steps - 1; i >= 0; --i) {  // back-pointers: tokens in reverse order
      const int64_t c = w.back_col[i * K + k];
      if (c < C) {  // an extension (padding steps only stay)
        toks[len] = ctok_all ? ctok_all[i * C + c] : c + 1;
        frs[len] = frame[i];
        ++len;
      }
      k = w.back_parent[i * K + k];
    }
    std::reverse(toks, toks + len);
    std::reverse(frs, frs + len);
    d.lengths[b * N + r] = len;
  }
  return true;
}

template <typename T>
void search_all(const SearchDesc& d, const std::vector<Scorer>& scorers) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(d.threads, d.batch));
  if (threads == 1) {
    Work<T> w;
    for (int64_t b = 0; b < d.batch; ++b)
      if (!search_utterance<T>(d, scorers, b, w, false)) search_utterance<T>(d, scorers, b, w, true);
    return;
  }
  // utterances are independent: interleaved over threads (lengths vary, so no contiguous blocks)
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t]() {
      Work<T> w;
      for (int64_t b = t; b < d.batch; b += threads)
        if (!search_utterance<T>(d, scorers, b, w, false)) search_utterance<T>(d, scorers, b, w, true);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace
}  // namespace asrkit_native

using namespace asrkit_native;

extern "C" int64_t asrkit_native_abi(void) { return 6; }

extern "C" int64_t asrkit_prefix_search(const SearchDesc* d) {
  if (d == nullptr || d->beam < 1 || d->nbest < 1 || d->nbest > d->beam || d->n_cand < 1) return 1;
  if (d->select && (d->cval != nullptr || d->ctok != nullptr || d->n_cand >= d->vocab - 1)) return 1;
  std::vector<Scorer> scorers;
  for (int64_t j = 0; j < d->n_scorers; ++j) {
    Scorer s = make_scorer(d->scorers[j]);
    if (s.kind < kWord || s.kind > kHotwords) return 2;
    scorers.push_back(s);
  }
  if (d->is_double) search_all<double>(*d, scorers);
  else search_all<float>(*d, scorers);
  return 0;
}
