"""Vocal tract length normalisation at decode time (``decode.vtln``): a warp factor per speaker, chosen unsupervised.

Classic VTLN (Lee & Rose 1998) warps the frequency axis of each test speaker towards the voices the model knows, and
picks the speaker's factor by the likelihood the model gives the speaker's audio under each candidate. Here the warp is
the one VTLP trains with (asrkit.audio.vtlp, through :meth:`~asrkit.audio.frontend.Frontend.warped`) and the
likelihood is the CTC best-path log-posterior (greedy decoding's path score: the sum over frames of the best
token's log-probability), summed over the speaker's utterances; the number of frames does not depend on the warp, so
the highest sum is the highest per-frame mean. Speakers come from the data dir's utt2spk; without one each
utterance is its own speaker. Candidates cost one encoder pass each over the data dir, before the decode.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch

from asrkit.data.datadir import read_data_dir

if TYPE_CHECKING:
    from asrkit.pipeline.transcriber import Transcriber

__all__ = ["select_warps", "speaker_warps"]

log = logging.getLogger("asrkit.pipeline")


def select_warps(scores: torch.Tensor, alphas: Sequence[float]) -> torch.Tensor:
    """scores (S, K): each speaker's summed best-path log-posterior under each candidate of ``alphas`` (K) -> (S,)
    the factor with the highest score per speaker (on a tie the first listed)."""
    if scores.dim() != 2 or scores.size(1) != len(alphas):
        raise ValueError(f"scores must be (speakers, {len(alphas)} candidates), got {tuple(scores.shape)}")
    return torch.tensor(list(alphas), dtype=torch.float64)[scores.argmax(1)]


def speaker_warps(tr: "Transcriber", data_dir: str, alphas: Sequence[float], batch_size: Optional[int],
                  failed: Dict[str, str], max_seconds: float) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(spk2warp, utt2warp): the factor of ``alphas`` chosen for each speaker of ``data_dir`` and so for each of its
    utterances of at most ``max_seconds``, in batches of ``batch_size`` as the decode reads them; unreadable
    utterances are recorded in ``failed``, as the decode records them."""
    utt2spk = read_data_dir(data_dir).utt2spk or {}
    scores: Dict[str, torch.Tensor] = {}  # speaker -> (K,) summed best-path log-posterior
    speaker_of: Dict[str, str] = {}
    max_samples = max_seconds * tr.sample_rate
    for names, wavs in tr.data_dir_batches(data_dir, batch_size, failed, max_seconds):
        kept = [(name, wav) for name, wav in zip(names, wavs) if wav.numel() <= max_samples]
        if not kept:
            continue
        for (name, _), row in zip(kept, _scores(tr, [wav for _, wav in kept], alphas)):
            if row is None:  # it cannot be decoded either: the decode records why
                continue
            spk = speaker_of[name] = utt2spk.get(name, name)
            scores[spk] = scores[spk] + row if spk in scores else row
    speakers = sorted(scores)
    if not speakers:
        return {}, {}
    chosen = select_warps(torch.stack([scores[s] for s in speakers]), alphas).tolist()
    spk2warp = dict(zip(speakers, chosen))
    counts = {a: chosen.count(a) for a in alphas if a in chosen}
    log.info("decode.vtln: warp factors of %d speakers: %s", len(speakers),
             ", ".join(f"{a:g} x{n}" for a, n in sorted(counts.items())))
    return spk2warp, {utt: spk2warp[spk] for utt, spk in speaker_of.items()}


def _scores(tr: "Transcriber", wavs: List[torch.Tensor], alphas: Sequence[float]) -> List[Optional[torch.Tensor]]:
    """(K,) best-path scores per waveform; if the batch raises, each waveform alone, None for one that raises (as
    the decode treats a batch: one utterance's failure is that utterance's alone)."""
    try:
        return list(torch.stack([tr.best_path_scores(wavs, a) for a in alphas], dim=1).double())  # (B, K)
    except Exception:  # noqa: BLE001 - whatever one utterance raises
        if len(wavs) == 1:
            return [None]
        return [row for wav in wavs for row in _scores(tr, [wav], alphas)]
