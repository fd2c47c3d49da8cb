#!/usr/bin/env python3
"""Can a confidence tell a hotword said from a false alarm? Measured on a names set (bench_hotwords.py make).

Usage:
    tools/bench/bench_hotword_confidence.py --work exp/bench_hotwords_tune --model recipes/mini/exp/small \
        [--decode-config MODEL/tune_dev/decode.yaml] [--class-scores -9 -7 -5] [--set KEY=VALUE ...]

The names set is searched once without hotwords and once with WORK/hotwords.txt per ``--class-scores``
(decode.hotword_class_score; the N-best of the whole beam kept). Every listed name in a best hypothesis is a
*hit* (its utterance says it) or a *false alarm*, and gets three confidences:

* ``frame``: keyword-spotting verification: the CTC log-probability of the name's tokens over the frames it
  occupies (from its first token's frame to the next token's; all alignments, ``ctc_loss``) less that of the
  best path over those frames, per frame (<= 0).
* ``words``: the same log-probability less that of the tokens the search without hotwords put in those frames,
  per frame: does the name fit the audio better than the words it displaced?
* ``score``: the hypothesis's score without its hotword bonus less the best score of the search without
  hotwords (one value an utterance): how much of the way the bonus alone carried it.

For each it prints the quantiles of the hits' and the false alarms' values and the names set's recall, false
alarms and other-word WER (as bench_hotwords.py) when names under a threshold are rejected: for ``frame`` and
``words`` the output is the first N-best entry with the fewest rejected names, for ``score`` the output without
hotwords. The thresholds are the deciles of all names' values. A benchmark, not a test; run it with ``nice``.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", ".."))
if _HERE not in sys.path:  # bench_hotwords beside this file; appended, so it shadows nothing
    sys.path.append(_HERE)

import asrkit  # noqa: E402
from asrkit.config import load_decode_config  # noqa: E402
from asrkit.data.datadir import read_data_dir  # noqa: E402
from asrkit.pipeline.searcher import Searcher  # noqa: E402
from asrkit.pipeline.transcriber import pad_waveforms  # noqa: E402
from asrkit.search.hotwords import HotwordScorer  # noqa: E402
from bench_hotwords import _read_lines, name_metrics  # noqa: E402

Word = Tuple[str, int, int]  # a word of a hypothesis: its text, its first token and the token after it


def words_of(tokens: Sequence[int], token_list: Sequence[str]) -> List[Word]:
    """The words of a token sequence: a token whose piece starts with ``▁`` (or is it) begins one."""
    starts = [k for k, t in enumerate(tokens) if k == 0 or token_list[t].startswith("\u2581")]
    bounds = starts + [len(tokens)]
    return [("".join(token_list[t] for t in tokens[a:b]).replace("\u2581", ""), a, b)
            for a, b in zip(bounds[:-1], bounds[1:])]


def path_logp(log_probs: torch.Tensor, tokens: Sequence[int]) -> float:
    """log P(tokens | log_probs (T, V)) summed over the CTC alignments (blank 0); -inf if none fits."""
    if not tokens:
        return float(log_probs[:, 0].sum())
    loss = F.ctc_loss(log_probs[:, None], torch.tensor([list(tokens)]), torch.tensor([len(log_probs)]),
                      torch.tensor([len(tokens)]), reduction="sum")
    return -float(loss)


def frame_confidence(log_probs: torch.Tensor, tokens: Sequence[int]) -> float:
    """(log P(tokens | segment) - log P(best path | segment)) / frames, the segment ``log_probs`` (T, V)."""
    return (path_logp(log_probs, tokens) - float(log_probs.max(-1).values.sum())) / len(log_probs)


def hotword_bonus(scorer: HotwordScorer, tokens: Sequence[int]) -> float:
    """The bonus the scorer gives a finished hypothesis (unweighted), step by step as a search adds it."""
    state = scorer.init_state(1, 1, torch.device("cpu"))
    total = 0.0
    for tok in tokens:
        step = torch.tensor([[tok]])
        total += float(scorer.score(state, step)[0, 0])
        state = scorer.select_state(state, torch.tensor([0]), step[0])
    return total + float(scorer.final_score(state)[0])


class Utterance:
    """One utterance's CTC log-probs (T, V), its output without hotwords and its biased N-best."""

    def __init__(self, log_probs: torch.Tensor, plain: Tuple[List[int], float, List[int]],
                 nbest: List[Tuple[List[int], float, List[int]]]) -> None:
        self.log_probs, self.plain, self.nbest = log_probs, plain, nbest


def occurrence_features(utt: Utterance, entry: Tuple[List[int], float, List[int]], token_list: Sequence[str],
                        listed: Set[str]) -> List[Tuple[str, float, float]]:
    """(name, frame confidence, words margin) of each listed word of one N-best entry."""
    tokens, _, frames = entry
    plain_tokens, _, plain_frames = utt.plain
    out = []
    for word, a, b in words_of(tokens, token_list):
        if word not in listed:
            continue
        start, end = frames[a], frames[b] if b < len(tokens) else len(utt.log_probs)
        seg = utt.log_probs[start:max(end, start + 1)]
        displaced = [t for t, f in zip(plain_tokens, plain_frames) if start <= f < end]
        name = path_logp(seg, tokens[a:b])
        out.append((word, frame_confidence(seg, tokens[a:b]), (name - path_logp(seg, displaced)) / len(seg)))
    return out


def sweep(refs: Dict[str, str], listed: Set[str], values: Sequence[float],
          output: Callable[[Optional[float]], Dict[str, str]]) -> List[str]:
    """Table rows: no rejection, then each decile of ``values`` as the threshold."""
    ordered = sorted(values)
    cuts = sorted({ordered[int(len(ordered) * q / 10)] for q in range(10)}) if ordered else []
    rows = []
    for cut in [None] + cuts:
        recall, alarms, others, _ = name_metrics(refs, output(cut), listed)
        rows.append(f"| {'none' if cut is None else f'{cut:.3g}'} | {100 * recall:.1f} | {100 * alarms:.1f} | "
                    f"{100 * others:.2f} |")
    return rows


def quantiles(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return " / ".join(f"{ordered[min(len(ordered) - 1, int(len(ordered) * q))]:.2f}" for q in (0.1, 0.5, 0.9))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="a names set's dir (bench_hotwords.py make)")
    p.add_argument("--model", required=True)
    p.add_argument("--decode-config", help="the word-LM decode config (default: MODEL/tune_dev/decode.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="decode config overrides")
    p.add_argument("--class-scores", type=float, nargs="+", default=[-9.0])
    p.add_argument("--batch-size", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tuned = load_decode_config(args.decode_config or os.path.join(args.model, "tune_dev", "decode.yaml"), args.set)
    tuned = replace(tuned, nbest=tuned.beam)
    transcriber = asrkit.load_model(args.model, decode=tuned)
    model, tokenizer, token_list = transcriber.model, transcriber.tokenizer, transcriber.tokenizer.token_list
    listed = _read_lines(os.path.join(args.work, "hotwords.txt"))
    names_dir = os.path.join(args.work, "data", "names")
    plain_searcher = Searcher(tuned, model, tokenizer, transcriber.device)
    biased = {cs: Searcher(replace(tuned, hotword_class_score=cs), model, tokenizer,
                           transcriber.device).with_hotwords(listed) for cs in args.class_scores}
    utts: Dict[float, Dict[str, Utterance]] = {cs: {} for cs in args.class_scores}
    with torch.inference_mode():
        for names, wavs in transcriber.data_dir_batches(names_dir, args.batch_size, {}):
            enc, lens = model.encode(*pad_waveforms(wavs))
            log_probs = model.ctc_log_probs(enc)
            plain = plain_searcher.search(model, enc, lens, log_probs).to_lists()
            for cs, searcher in biased.items():
                found = searcher.search(model, enc, lens, log_probs).to_lists()
                for b, name in enumerate(names):
                    entry = [(h.tokens, h.score, h.token_frames) for h in found[b]]
                    top = plain[b][0]
                    utts[cs][name] = Utterance(log_probs[b, : lens[b]], (top.tokens, top.score, top.token_frames),
                                               entry)
    refs = dict(read_data_dir(names_dir).text)
    said_of = {u: set(r.split()) & set(listed) for u, r in refs.items()}
    text = tokenizer.decode
    for cs, searcher in biased.items():
        feats = {u: [occurrence_features(utt, e, token_list, set(listed)) for e in utt.nbest]
                 for u, utt in utts[cs].items()}
        weight = tuned.hotword_weight
        margin = {u: utt.nbest[0][1] - weight * hotword_bonus(searcher.hotwords, utt.nbest[0][0]) - utt.plain[1]
                  for u, utt in utts[cs].items()}
        print(f"\nclass score {cs:g} (hotword_weight {weight:g}, beam {tuned.beam}):\n")
        print("| confidence | hits: 10% / 50% / 90% | false alarms: 10% / 50% / 90% |\n| --- | --- | --- |")
        for k, label in ((1, "frame"), (2, "words")):
            hit = [f[k] for u, fs in feats.items() for f in fs[0] if f[0] in said_of[u]]
            alarm = [f[k] for u, fs in feats.items() for f in fs[0] if f[0] not in said_of[u]]
            print(f"| {label} | {quantiles(hit)} ({len(hit)}) | {quantiles(alarm)} ({len(alarm)}) |")
        named = [u for u, fs in feats.items() if fs[0]]
        print(f"| score | {quantiles([margin[u] for u in named if all(f[0] in said_of[u] for f in feats[u][0])])} | "
              f"{quantiles([margin[u] for u in named if any(f[0] not in said_of[u] for f in feats[u][0])])} |")
        for k, label in ((1, "frame"), (2, "words")):
            def output(cut: Optional[float], k: int = k) -> Dict[str, str]:
                picked = {}
                for u, fs in feats.items():
                    rejected = [sum(cut is not None and f[k] < cut for f in entry) for entry in fs]
                    picked[u] = text(utts[cs][u].nbest[rejected.index(min(rejected))][0])
                return picked
            print(f"\n| {label} >= | recall % | false alarms % | other-word WER % |\n| ---: | ---: | ---: | ---: |")
            print("\n".join(sweep(refs, set(listed), [f[k] for fs in feats.values() for f in fs[0]], output)))

        def fallback(cut: Optional[float]) -> Dict[str, str]:
            return {u: text(utt.plain[0] if cut is not None and u in named and margin[u] < cut else utt.nbest[0][0])
                    for u, utt in utts[cs].items()}
        print("\n| score >= | recall % | false alarms % | other-word WER % |\n| ---: | ---: | ---: | ---: |")
        print("\n".join(sweep(refs, set(listed), [margin[u] for u in named], fallback)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
