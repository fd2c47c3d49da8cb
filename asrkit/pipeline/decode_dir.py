"""Decode a Kaldi data dir (``asrkit decode``) into Kaldi-style outputs under ``OUT``:

* ``decode.yaml``: every search setting used, written first (an output dir that cannot be written fails
  before any work);
* ``text``: ``utt hypothesis`` lines of the utterances decoded;
* ``nbest.jsonl`` (with ``decode.nbest > 1``): one JSON object per hypothesis: utt, rank, text, score, ctc_score;
* ``failed``: ``utt reason`` lines of the utterances that could not be decoded (absent when none failed);
* ``spk2warp`` (with ``decode.vtln``): ``speaker factor`` lines, the warp chosen for each speaker
  (:mod:`asrkit.pipeline.vtln`).

**One utterance's failure is that utterance's alone.** Audio that cannot be read, and an utterance whose
decoding raises (absurd samples that overflow the features to inf and the log-probs to NaN, a search error,
running out of memory alone) is logged, listed in ``failed`` and left out of ``text`` (scoring counts its
words as deletions); every other utterance is decoded and written. A batch that raises is decoded again one
utterance at a time, so a bad utterance costs its batch one retry and takes no other utterance with it.

**Long utterances** are not pushed through the encoder whole (self-attention memory grows with the square of
the length, and the model never saw such lengths in training): an utterance longer than ``max_seconds`` is
decoded as ``asrkit transcribe`` decodes a recording (:meth:`Transcriber.transcribe`: split at pauses by voice
activity into segments of at most ``VadConfig.max_segment`` seconds, batched, joined). Its line in ``text``
is the joined text, and its N-best the joined 1-best alone.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Dict, List, Optional, Sequence

import torch

from asrkit.atomic import atomic_write
from asrkit.config import save_config
from asrkit.data.datadir import read_data_dir
from asrkit.data.table import write_table
from asrkit.pipeline.inputs import AudioInput
from asrkit.pipeline.results import Alternative
from asrkit.pipeline.transcriber import Transcriber
from asrkit.pipeline.vtln import speaker_warps

log = logging.getLogger("asrkit.pipeline")

# Seconds: longer utterances are segmented. Above the longest utterances of read-speech corpora (LibriSpeech's
# test sets: 35 s), so their decoding is unchanged; below the lengths whose whole-utterance attention needs
# gigabytes (one hour: 3.2 GB on the tiny model, against 0.95 GB segmented).
MAX_UTTERANCE_SECONDS = 60.0
SPK2WARP = "spk2warp"  # decode.vtln's choice: ``speaker factor`` lines (Kaldi's name for the table)


def decode_data_dir(transcriber: Transcriber, data_dir: str, out_dir: str, batch_size: Optional[int] = None,
                    max_seconds: float = MAX_UTTERANCE_SECONDS) -> Dict[str, int]:
    """Decode every utterance of ``data_dir`` into ``out_dir`` (see the module docstring); returns
    ``{"decoded": n, "failed": m}``. Raises DataDirError / TableError (ValueErrors) for a data dir that cannot
    be read, before anything is written, and OSError when an output cannot be written."""
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds}")
    read_data_dir(data_dir)  # a data dir that cannot be read fails here, before anything is written
    save_config(transcriber.decode_cfg, os.path.join(out_dir, "decode.yaml"))
    max_samples = max_seconds * transcriber.sample_rate
    nbest: Dict[str, List[Alternative]] = {}
    failed: Dict[str, str] = {}
    alphas = transcriber.decode_cfg.vtln.alphas
    utt2warp: Optional[Dict[str, float]] = None
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, SPK2WARP))  # an earlier decode's
    if alphas:
        spk2warp, utt2warp = speaker_warps(transcriber, data_dir, alphas, batch_size, failed, max_seconds)
        write_table(os.path.join(out_dir, SPK2WARP), {s: f"{a:g}" for s, a in spk2warp.items()})
    for names, wavs in transcriber.data_dir_batches(data_dir, batch_size, failed, max_seconds):
        short = [(name, wav) for name, wav in zip(names, wavs) if wav.numel() <= max_samples]
        for name, wav in zip(names, wavs):
            if wav.numel() > max_samples:
                _decode_long(transcriber, name, wav, nbest, failed)
        # (no factor: its scoring raised, so its decode most likely raises too and records why, else runs unwarped)
        warps = None if utt2warp is None else [utt2warp.get(name, 1.0) for name, _ in short]
        _decode_batch(transcriber, [name for name, _ in short], [wav for _, wav in short], nbest, failed, warps)
    write_outputs(out_dir, {u: alts[0].text for u, alts in nbest.items()}, failed,
                  nbest_lines(nbest) if transcriber.decode_cfg.nbest > 1 else [])
    log.info("decoded %d utterances into %s (%d failed)", len(nbest), os.path.join(out_dir, "text"), len(failed))
    return {"decoded": len(nbest), "failed": len(failed)}


def nbest_lines(nbest: Dict[str, List[Alternative]]) -> List[str]:
    """``nbest.jsonl``'s lines: one JSON object per hypothesis (utt, rank, text, score, ctc_score), in
    utterance order."""
    return [json.dumps({"utt": name, "rank": rank, "text": alt.text, "score": alt.score,
                        "ctc_score": alt.ctc_score}, ensure_ascii=False) + "\n"
            for name in sorted(nbest) for rank, alt in enumerate(nbest[name], 1)]


def write_outputs(out_dir: str, text: Dict[str, str], failed: Dict[str, str], nbest_lines: Sequence[str]) -> None:
    """``out_dir``'s text, failed and nbest.jsonl (lines in utterance order); a ``failed`` or ``nbest.jsonl``
    left by an earlier decode into the same dir is removed when this one has none."""
    write_table(os.path.join(out_dir, "text"), text)
    for name, present in (("failed", bool(failed)), ("nbest.jsonl", bool(nbest_lines))):
        if not present:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))
    if failed:
        write_table(os.path.join(out_dir, "failed"), failed)
    if nbest_lines:
        with atomic_write(os.path.join(out_dir, "nbest.jsonl")) as fh:
            fh.writelines(nbest_lines)


def _decode_batch(tr: Transcriber, names: List[str], wavs: List[torch.Tensor], out: Dict[str, List[Alternative]],
                  failed: Dict[str, str], warps: Optional[List[float]] = None) -> None:
    """Decode the batch (``warps``: decode.vtln's factor per utterance); if it raises, each utterance alone, so that
    only the one that raises fails."""
    if not names:
        return
    try:
        results = tr.transcribe_nbest(wavs, warps)
    except Exception as exc:  # noqa: BLE001 - whatever one utterance raises must not end the decode
        if len(names) == 1:
            _fail(failed, names[0], f"utt {names[0]}: cannot be decoded: {_one_line(exc)}")
            return
        log.warning("a batch of %d utterances failed (%s): decoding them one at a time", len(names), _one_line(exc))
        for i, (name, wav) in enumerate(zip(names, wavs)):
            _decode_batch(tr, [name], [wav], out, failed, None if warps is None else [warps[i]])
        return
    for name, transcripts in zip(names, results):
        out[name] = [Alternative(t.text, t.score, t.ctc_score) for t in transcripts]


def _decode_long(tr: Transcriber, name: str, wav: torch.Tensor, out: Dict[str, List[Alternative]],
                 failed: Dict[str, str]) -> None:
    """An utterance over the limit, segmented and decoded as ``transcribe`` does (which has no speakers to warp)."""
    if tr.decode_cfg.vtln.alphas:
        _fail(failed, name, f"utt {name}: {wav.numel() / tr.sample_rate:.1f} s, over the limit of whole utterances; "
                            f"decode.vtln warps whole utterances only (raise --max-utt-seconds, or no decode.vtln)")
        return
    try:
        result = tr.transcribe([AudioInput(name, waveform=wav)])[0]
    except Exception as exc:  # noqa: BLE001 - as in _decode_batch
        _fail(failed, name, f"utt {name}: cannot be decoded: {_one_line(exc)}")
        return
    if result.error is not None:
        _fail(failed, name, result.error)
        return
    log.info("utt %s: %.1f s, decoded in %d segments", name, result.duration, len(result.segments))
    best = result.nbest[0] if result.nbest else Alternative(result.text, 0.0)
    out[name] = [Alternative(result.text, best.score, best.ctc_score)]


def _fail(failed: Dict[str, str], name: str, reason: str) -> None:
    reason = " ".join(reason.split())  # one line in the `failed` table
    log.warning("skipping %s", reason)
    failed[name] = reason


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
