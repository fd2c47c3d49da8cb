"""Grid search of the LM fusion weights on a dev set: encode once, search once per (lm_weight, length_bonus)."""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from asrkit.config import ConfigError, DecodeConfig, save_config
from asrkit.pipeline.transcriber import Transcriber, pad_waveforms

log = logging.getLogger("asrkit.pipeline")


@torch.inference_mode()
def tune_fusion(transcriber: Transcriber, data_dir: str, lm_weights: Sequence[float],
                length_bonuses: Sequence[float], evaluate: Callable[[Dict[str, str]], float],
                batch_size: Optional[int] = None) -> List[Tuple[float, float, float]]:
    """``[(lm_weight, length_bonus, evaluate(hypotheses))]`` for every pair of the grid, in grid order.

    The encoder runs once per utterance and its outputs are kept (on the model's device) while every
    setting searches them, so a grid of G settings costs one encoding and G searches. ``evaluate`` maps
    ``{utt: text}`` to an error rate (lower is better); unreadable utterances are left out (logged).
    """
    if transcriber.decode_cfg.vtln.alphas:  # the weights are tuned on unwarped features: say so, not ignore it
        raise ConfigError("decode.vtln: tune-fusion tunes on unwarped features; leave decode.vtln.alphas empty "
                          "here and give it to asrkit decode")
    encoded = []
    failed: Dict[str, str] = {}
    for names, wavs in transcriber.data_dir_batches(data_dir, batch_size, failed):
        if names:
            wav, lens = pad_waveforms(wavs)
            encoded.append((names, *transcriber.model.encode(wav.to(transcriber.device), lens.to(transcriber.device))))
    results = []
    for weight in lm_weights:
        for bonus in length_bonuses:
            searcher = transcriber.searcher.reweighted(weight, bonus)
            hyps = {}
            for names, enc, enc_lens in encoded:
                for name, hyp in zip(names, searcher.search(transcriber.model, enc, enc_lens).best()):
                    hyps[name] = transcriber.tokenizer.decode(hyp.tokens)
            results.append((weight, bonus, evaluate(hyps)))
            log.info("lm_weight %g length_bonus %g: %.2f%%", weight, bonus, 100 * results[-1][2])
    return results


def save_tuning(out_dir: str, results: Sequence[Tuple[float, float, float]], decode: DecodeConfig,
                unit: str = "WER") -> Tuple[float, float, float]:
    """Write a grid's ``results`` (as :func:`tune_fusion` returns them) to OUT/results.tsv and ``decode`` with the
    best pair (the lowest error, the first of equals in grid order) to OUT/decode.yaml; returns the best."""
    best = min(results, key=lambda r: r[2])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.tsv"), "w", encoding="utf-8") as fh:
        fh.write(f"lm_weight\tlength_bonus\t{unit}\n")
        fh.writelines(f"{weight:g}\t{bonus:g}\t{100 * err:.2f}\n" for weight, bonus, err in results)
    save_config(replace(decode, lm_weight=best[0], length_bonus=best[1]), os.path.join(out_dir, "decode.yaml"))
    return best
