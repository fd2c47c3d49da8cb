#!/usr/bin/env python3
"""ESPnet's CTC posteriors through asrkit's search: both toolkits' models decoded with the same LM and search.

usage: espnet_lm.py --posteriors DIR --tokenizer lang/tokenizer.json --decode-config decode.yaml
                    [--set KEY=VALUE ...] --out DIR [--batch-size 16]
                    [--tune-ref dev/text --lm-weights W ... [--length-bonuses B ...]]

DIR/log_probs.npz and DIR/tokens.txt are what ``espnet_bench.py posteriors`` (run with .venv-espnet) dumps: one
(T, V) array of CTC log-probabilities per utterance and the ESPnet model's token list. Its columns are put in the
order of asrkit's tokenizer (the same characters; ESPnet spells the space ``<space>``, asrkit ``▁``) and decoded by
the search a decode config describes (``asrkit decode --decode-config`` builds the same one for an asrkit model:
``Searcher`` with the word LM, its lexicon, weights and pruning), so the two models differ and the decoding does
not. Writes OUT/text (Kaldi) and OUT/decode.yaml (the settings used). Run it with the toolkit's .venv.

With ``--tune-ref`` (the posteriors of a dev set and its text) it chooses the LM weight and length bonus as
``asrkit tune-fusion`` does for an asrkit model: every pair of the grid searches the posteriors, the lowest WER
wins (the first of equals, in grid order), and OUT gets results.tsv and decode.yaml with that pair (no text).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # espnet_bench beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # asrkit from a checkout without installing

from espnet_bench import ASRKIT_SPACE, SPACE, BenchError  # noqa: E402

from asrkit.config import DecodeConfig, load_decode_config, save_config  # noqa: E402
from asrkit.data.table import read_table  # noqa: E402
from asrkit.pipeline.searcher import Searcher  # noqa: E402
from asrkit.pipeline.tuning import save_tuning  # noqa: E402
from asrkit.score.wer import score_texts  # noqa: E402
from asrkit.text.tokenizer import Tokenizer, load_tokenizer  # noqa: E402


def column_order(espnet_tokens: Sequence[str], asrkit_tokens: Sequence[str]) -> List[int]:
    """For each asrkit token id, the ESPnet column that holds it (``▁`` is ESPnet's ``<space>``). Both lists
    must hold the same units: a unit of one missing from the other is an error naming it."""
    index = {tok: i for i, tok in enumerate(espnet_tokens)}
    if len(index) != len(espnet_tokens):
        raise BenchError("the ESPnet token list has a unit twice")
    names = [SPACE if tok == ASRKIT_SPACE else tok for tok in asrkit_tokens]
    missing = [tok for tok in names if tok not in index]
    extra = sorted(set(espnet_tokens) - set(names))
    if missing or extra:
        raise BenchError(f"the ESPnet model's units differ from the tokenizer's: missing there {missing}, "
                         f"not in the tokenizer {extra}")
    return [index[tok] for tok in names]


def read_posteriors(directory: str) -> tuple[Dict[str, np.ndarray], List[str]]:
    """``({utt: (T, V) log-probabilities}, ESPnet token list)`` of ``espnet_bench.py posteriors``' DIR; arrays
    of another width than the token list are an error naming the utterance."""
    npz, tokens_txt = os.path.join(directory, "log_probs.npz"), os.path.join(directory, "tokens.txt")
    for path in (npz, tokens_txt):
        if not os.path.isfile(path):
            raise BenchError(f"{path}: no such file (espnet_bench.py posteriors writes it)")
    with open(tokens_txt, encoding="utf-8") as fh:
        tokens = [line.strip() for line in fh if line.strip()]
    with np.load(npz, allow_pickle=False) as archive:  # arrays only: loading runs no code
        arrays = {utt: archive[utt] for utt in archive.files}
    for utt, lp in arrays.items():
        if lp.ndim != 2 or lp.shape[1] != len(tokens):
            raise BenchError(f"{npz}: utterance {utt} has shape {lp.shape}, not (frames, {len(tokens)} units)")
    if not arrays:
        raise BenchError(f"{npz}: no utterances")
    return arrays, tokens


def decode_posteriors(arrays: Dict[str, np.ndarray], espnet_tokens: Sequence[str], tokenizer: Tokenizer,
                      cfg: DecodeConfig, batch_size: int = 16, searcher: Optional[Searcher] = None) -> Dict[str, str]:
    """{utt: text} of the best hypothesis of asrkit's search (``cfg``, or ``searcher`` built from it) on ESPnet's
    log-probabilities, the columns reordered to the tokenizer's ids; utterances in batches of similar length."""
    order = torch.tensor(column_order(espnet_tokens, tokenizer.token_list))
    searcher = searcher or Searcher(cfg, None, tokenizer, torch.device("cpu"))
    utts = sorted(arrays, key=lambda u: arrays[u].shape[0])
    out: Dict[str, str] = {}
    for start in range(0, len(utts), batch_size):
        names = utts[start:start + batch_size]
        rows = [torch.from_numpy(arrays[u]).float()[:, order] for u in names]  # (T, V) in asrkit's order
        lens = torch.tensor([r.shape[0] for r in rows])
        log_probs = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (B, T, V); padding past lens
        with torch.inference_mode():
            best = searcher.search(None, None, lens, log_probs).best()
        out.update({u: tokenizer.decode(h.tokens) for u, h in zip(names, best)})
    return out


def tune_posteriors(arrays: Dict[str, np.ndarray], espnet_tokens: Sequence[str], tokenizer: Tokenizer,
                    cfg: DecodeConfig, refs: Dict[str, str], lm_weights: Sequence[float],
                    length_bonuses: Sequence[float], batch_size: int = 16) -> List[Tuple[float, float, float]]:
    """``[(lm_weight, length_bonus, WER)]`` of every pair of the grid in grid order (``asrkit tune-fusion``'s
    rule on ESPnet's posteriors); an utterance without a reference, or a reference without posteriors, is an
    error naming it."""
    if cfg.lm is None:
        raise BenchError("no LM to tune: the decode config has no lm")
    unmatched = sorted(set(arrays) ^ set(refs))
    if unmatched:
        raise BenchError(f"the posteriors and --tune-ref hold different utterances, e.g. {unmatched[0]}")
    searcher = Searcher(cfg, None, tokenizer, torch.device("cpu"))
    results = []
    for weight in lm_weights:
        for bonus in length_bonuses:
            hyps = decode_posteriors(arrays, espnet_tokens, tokenizer, cfg, batch_size,
                                     searcher.reweighted(weight, bonus))
            results.append((weight, bonus, score_texts(refs, hyps).wer))
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--posteriors", required=True, help="espnet_bench.py posteriors' DIR (log_probs.npz, tokens.txt)")
    p.add_argument("--tokenizer", required=True, help="asrkit's tokenizer of the same units (lang/tokenizer.json)")
    p.add_argument("--decode-config", required=True, help="a decode.yaml (greedy or ctc_prefix, LM, lexicon)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="decode config overrides")
    p.add_argument("--out", required=True, help="writes OUT/text and OUT/decode.yaml")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--tune-ref", help="the posteriors' reference text (a dev set): choose the LM weight and length "
                                      "bonus on it (OUT/results.tsv, OUT/decode.yaml) instead of decoding")
    p.add_argument("--lm-weights", type=float, nargs="+", metavar="W", help="--tune-ref's grid of LM weights")
    p.add_argument("--length-bonuses", type=float, nargs="+", default=[0.0], metavar="B",
                   help="--tune-ref's grid of length bonuses (default 0)")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if bool(args.tune_ref) != bool(args.lm_weights):
        p.error("--tune-ref and --lm-weights go together")
    try:
        cfg = load_decode_config(args.decode_config, args.set)
        arrays, tokens = read_posteriors(args.posteriors)
        tokenizer = load_tokenizer(args.tokenizer)
        if args.tune_ref:
            results = tune_posteriors(arrays, tokens, tokenizer, cfg, read_table(args.tune_ref), args.lm_weights,
                                      args.length_bonuses, args.batch_size)
        else:
            texts = decode_posteriors(arrays, tokens, tokenizer, cfg, args.batch_size)
    except ValueError as exc:  # BenchError, ConfigError, a bad --tune-ref table (TableError)
        print(f"espnet_lm.py: {exc}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    if args.tune_ref:
        best = save_tuning(args.out, results, cfg)  # asrkit tune-fusion's files and rule
        print(f"espnet_lm.py: lm_weight {best[0]:g}, length_bonus {best[1]:g} ({100 * best[2]:.2f}% WER on "
              f"{args.tune_ref}) into {os.path.join(args.out, 'decode.yaml')}", file=sys.stderr)
        return 0
    save_config(cfg, os.path.join(args.out, "decode.yaml"))
    with open(os.path.join(args.out, "text.tmp"), "w", encoding="utf-8") as fh:
        fh.writelines(f"{u} {texts[u]}".rstrip() + "\n" for u in sorted(texts))
    os.replace(os.path.join(args.out, "text.tmp"), os.path.join(args.out, "text"))
    print(f"espnet_lm.py: {len(texts)} utterances into {os.path.join(args.out, 'text')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
