"""Minimum word error rate training: the expected number of word errors over the model's own N-best.

Graves & Jaitly (2014) train on the expected transcription loss ``L(x) = sum_y P(y | x) W(y, y*)``
(W: word errors against the reference y*). The sum over every y is approximated, as in Prabhavalkar et al.
(2018), by the model's N-best list with its probabilities renormalised over the list::

    P^(y_i) = exp(log P(y_i | x)) / sum_j exp(log P(y_j | x))
    L_mwer  = sum_i P^(y_i) (W_i - mean_j W_j)

The mean (a constant) changes the value, not the gradient: ``d L / d log P(y_i) = P^(y_i) (W_i - E[W])``,
which lowers the probability of hypotheses with more errors than the list's average.

Everything is computed on one input: the model's features are computed once per batch, with the training
augmentation (speed perturbation, dither, SpecAugment) drawn once. The N-best is decoded from those features
by the model in eval mode (no dropout) without gradients; the same features then go through the encoder once
more, with gradients, and that one pass gives both the model loss and ``log P(y_i | x)``: the attention
decoder's teacher-forced score for a model with a decoder (hypotheses from the attention or joint search), the
CTC log-likelihood ``-ctc_loss`` for a pure CTC model (hypotheses from CTC prefix beam search; the setting of
Graves & Jaitly). A CTC hypothesis that cannot be emitted in its utterance's frames has log P = -inf and is left
out of the list (never possible for hypotheses decoded on these frames, but a score of 0 there would take the
whole renormalised mass). The training loss is ``(1 - mwer_weight) * model loss + mwer_weight * L_mwer``
(``train.mwer_weight``; the model loss keeps the output distribution from drifting, Prabhavalkar et al.'s CE
term).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import jiwer
import torch
import torch.nn.functional as F

from asrkit.models.asr import AsrModel
from asrkit.models.losses import ctc_feasible
from asrkit.search import NBest, ctc_prefix_beam_search, joint_beam_search
from asrkit.text.tokenizer import Tokenizer


def word_errors(reference: str, hypothesis: str) -> int:
    """Substitutions + deletions + insertions of ``hypothesis`` against ``reference`` (words split on spaces)."""
    ref, hyp = reference.split(), hypothesis.split()
    if not ref or not hyp:
        return len(ref) + len(hyp)
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    return out.substitutions + out.deletions + out.insertions


def expected_errors(log_probs: torch.Tensor, errors: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The N-best MWER loss, summed over utterances.

    log_probs (B, N): log P(y_i | x) of each hypothesis (with gradients); errors (B, N) word errors;
    valid (B, N) bool, False for empty slots (an utterance with fewer than N hypotheses). An utterance
    with no valid hypothesis contributes 0.
    """
    masked = log_probs.masked_fill(~valid, float("-inf"))
    any_valid = valid.any(dim=1, keepdim=True)
    posterior = torch.where(any_valid, masked, torch.zeros_like(masked)).softmax(dim=1) * valid  # (B, N)
    errors = errors.to(posterior.dtype)
    mean = (errors * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)
    return (posterior * (errors - mean)).sum()


def nbest_errors(nbest: NBest, tokenizer: Tokenizer, references: Sequence[str]) -> torch.Tensor:
    """(B, N) word errors of every hypothesis (0 for empty slots) against its utterance's reference."""
    out: List[List[int]] = []
    tokens, lengths = nbest.tokens.cpu().tolist(), nbest.lengths.cpu().tolist()
    for b, ref in enumerate(references):
        out.append([word_errors(ref, tokenizer.decode(tokens[b][n][: lengths[b][n]])) for n in range(nbest.nbest)])
    return torch.tensor(out, device=nbest.tokens.device)


def hypothesis_log_probs(model: AsrModel, enc: torch.Tensor, enc_lens: torch.Tensor, nbest: NBest) -> torch.Tensor:
    """(B, N) log P(y_i | x) with gradients: the decoder's if the model has one, else CTC's, which is -inf for a
    hypothesis CTC cannot emit in its utterance's ``enc_lens`` frames. enc (B, T, D), enc_lens (B,)."""
    b, n = nbest.tokens.shape[:2]
    rows = torch.arange(b, device=enc.device).repeat_interleave(n)  # (B*N,): the utterance of each hypothesis
    tokens = nbest.tokens.flatten(0, 1)  # (B*N, L), padded with -1
    lengths = nbest.lengths.flatten().clamp(min=0)
    if model.decoder is not None:
        scores = model.score_tokens(enc[rows], enc_lens[rows], tokens, lengths)
    else:
        log_probs = model.ctc_log_probs(enc)[rows].transpose(0, 1).float()  # (T, B*N, V)
        # zero_infinity: an infeasible hypothesis's inf would send NaN gradients; its 0 is then made -inf.
        scores = -F.ctc_loss(log_probs, tokens.clamp(min=0), enc_lens[rows], lengths, reduction="none",
                             zero_infinity=True)
        scores = scores.masked_fill(~ctc_feasible(tokens, lengths, enc_lens[rows]), float("-inf"))
    return scores.view(b, n)


def mwer_forward(model: AsrModel, batch: Dict[str, torch.Tensor], tokenizer: Tokenizer, nbest: int,
                 ctc_weight: float) -> Dict[str, torch.Tensor]:
    """``model(batch)``'s loss terms plus ``loss_mwer`` (per utterance) and ``mwer_errors`` (the N-best's mean word
    errors, detached), all from one draw of the batch's features (see the module docstring).

    ``ctc_weight``: the joint search's CTC prefix score weight when the model has both a decoder and a CTC
    head (0: attention search).
    """
    # the training augmentation, drawn once (VTLP's warp factors came with the batch)
    warp = (batch["vtlp_alpha"],) if "vtlp_alpha" in batch else ()
    feats, feat_lens = model.frontend(batch["wav"], batch["wav_lens"], *warp)
    was_training = model.training
    model.eval()  # the N-best without dropout
    try:
        with torch.no_grad():
            enc, enc_lens = model.encode_features(feats, feat_lens)
            if model.decoder is not None:
                log_probs = model.ctc_log_probs(enc) if model.ctc is not None and ctc_weight > 0 else None
                hyps = joint_beam_search(model, enc, enc_lens, log_probs,
                                         ctc_weight=ctc_weight if log_probs is not None else 0.0, beam=nbest,
                                         nbest=nbest)
            else:
                hyps = ctc_prefix_beam_search(model.ctc_log_probs(enc), enc_lens, beam=nbest, nbest=nbest)
    finally:
        model.train(was_training)
    out, enc, enc_lens = model.forward_features(feats, feat_lens, batch["tokens"], batch["token_lens"])
    log_p = hypothesis_log_probs(model, enc, enc_lens, hyps)
    errors = nbest_errors(hyps, tokenizer, batch["texts"])
    valid = torch.isfinite(hyps.scores) & torch.isfinite(log_p.detach())
    n = max(len(batch["texts"]), 1)
    mean_errors = (errors * valid).sum() / valid.sum().clamp(min=1)
    return {**out, "loss_mwer": expected_errors(log_p, errors, valid) / n, "mwer_errors": mean_errors.float()}
