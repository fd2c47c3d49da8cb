// Candidate selection of the native prefix search: torch.topk's order reproduced (for ties) and the cheaper
// selections the search tries first (see prefix_search.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace asrkit_native {

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

}  // namespace asrkit_native
