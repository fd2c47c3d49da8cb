"""The one speech recognition model: a frontend, an encoder, an optional CTC head and an optional decoder.

Every model family is this class with other parts (``model.encoder.kind``, ``model.decoder.kind``; see
:mod:`asrkit.models.registry`). What a model can do is which parts it has: ``model.ctc is not None``,
``model.decoder is not None``. Loss terms, written once for every pairing::

    loss_ctc       CTC on the final encoder output (summed over utterances / batch size, see ``ctc_loss``)
    loss_interctc  mean CTC loss of the encoder's intermediate layers (InterCTC, the Deja-vu auxiliary loss)
    ctc_term       intermediate_loss interctc (ESPnet's InterCTC, the shared CTC head on the final-normed
                   layer outputs): (1 - interctc_weight) * loss_ctc + interctc_weight * loss_interctc;
                   intermediate_loss iterated (Tjandra et al. 2020, Deja-vu, sec. 3 and Fig. 2: an MLP and
                   softmax of its own per intermediate layer k): loss_ctc + interctc_weight * sum_k L_k
    loss_att       label-smoothed decoder loss: KL(q || p) summed over the targets ``y_1 .. y_L <eos>``,
                   divided by the batch size (lsm_normalize: batch) or the token count (token);
                   q = 1 - lsm_weight on the target, lsm_weight / (V - 1) on every other id
    loss           ctc_weight * ctc_term + (1 - ctc_weight) * loss_att
    acc            the decoder's teacher-forced token accuracy (targets include <eos>)

Without a decoder ``ctc_weight`` is 1; without a CTC head it is 0. In eval mode the output also holds
``attention`` (B, L+1, T), the decoder's alignments, for the trainer's plots.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
from torch import nn

from asrkit.models.dynamic_chunk import DynamicChunk
from asrkit.models.losses import (ctc_loss, ctc_min_frames, interctc_combine, iterated_combine, label_smoothing_loss,
                                  token_accuracy)
from asrkit.text.tokenizer import SOS_EOS_ID

CTCLogits = Callable[[torch.Tensor], torch.Tensor]


class Encoder(Protocol):
    """(B, T, F) features -> (B, T', D) encodings, (B,) lengths and the intermediate layers' outputs."""

    output_dim: int
    subsampling_factor: int  # feature frames per encoder frame
    intermediate_layers: Tuple[int, ...]  # 1-based layers whose outputs come back as intermediates, in order

    def __call__(self, feats: torch.Tensor, feat_lens: torch.Tensor, ctc_logits: Optional[CTCLogits] = None,
                 **chunking: int) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
        """``ctc_logits`` (the model's CTC layer) is what a self-conditioned encoder feeds back. ``chunking``
        (``chunk_frames``, ``left_chunks``: chunk-wise attention) is passed only to encoders that stream."""
        ...

    def output_lengths(self, feat_lens: torch.Tensor) -> torch.Tensor:
        ...


class Decoder(Protocol):
    """An attention decoder over encoder memory: teacher-forced logits, alignments and incremental steps."""

    vocab_size: int

    def __call__(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                 memory_lens: torch.Tensor) -> torch.Tensor:
        """ys_in (B, L) ``<sos> y`` (valid ids on padding too), ys_lens (B,) -> logits (B, L, V)."""
        ...

    def attention_weights(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                          memory_lens: torch.Tensor) -> torch.Tensor:
        """(B, L, T) alignments of each output position over the memory frames, for plots."""
        ...

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Any = None) -> Tuple[torch.Tensor, Any]:
        """ys (N, L) prefixes starting with <sos> -> ((N, V) log P(next token), state for ys)."""
        ...


class CTCHead(nn.Module):
    """Linear projection of encodings to the vocabulary (blank = 0)."""

    def __init__(self, input_dim: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, vocab_size)

    def forward(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, V) logits."""
        return self.proj(enc)

    def log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        return self.proj(enc).log_softmax(dim=-1)


class MLPCTCHead(nn.Module):
    """The "additional MLP network and softmax" of an intermediate layer (Deja-vu, Fig. 2, orange boxes):
    ``LayerNorm -> Linear(D, D) -> ReLU -> Linear(D, V)``. The paper leaves the MLP's shape open; the
    LayerNorm is there because a pre-LN stack's residual stream is not normalised at layer k."""

    def __init__(self, input_dim: int, vocab_size: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(input_dim), nn.Linear(input_dim, input_dim), nn.ReLU(),
                                 nn.Linear(input_dim, vocab_size))

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, V) log-probabilities."""
        return self.net(h).log_softmax(dim=-1)


def decoder_io(tokens: torch.Tensor, token_lens: torch.Tensor, sos_eos: int = SOS_EOS_ID
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens (B, L) padded -1 -> ys_in (B, L+1) ``<sos> y`` padded with <eos> (a valid id; masked anyway),
    ys_out (B, L+1) ``y <eos>`` padded -1, ys_lens (B,) = token_lens + 1."""
    b = tokens.size(0)
    sos = tokens.new_full((b, 1), sos_eos)
    ys_in = torch.cat([sos, tokens.masked_fill(tokens < 0, sos_eos)], dim=1)
    ys_out = torch.cat([tokens, tokens.new_full((b, 1), -1)], dim=1)
    ys_out = ys_out.scatter(1, token_lens.unsqueeze(1), sos_eos)
    return ys_in, ys_out, token_lens + 1


class AsrModel(nn.Module):
    """See the module docstring. ``forward(batch)`` takes ``wav`` (B, S), ``wav_lens``, ``tokens`` (B, L)
    padded with -1 and ``token_lens``, and returns the named loss terms."""

    def __init__(self, frontend: nn.Module, encoder: Encoder, vocab_size: int, ctc: Optional[CTCHead],
                 decoder: Optional[Decoder], *, ctc_weight: float, lsm_weight: float, interctc_weight: float = 0.0,
                 lsm_normalize: str = "batch", aux_heads: Optional[Sequence[MLPCTCHead]] = None,
                 dynamic_chunk: Optional[DynamicChunk] = None):
        """``aux_heads``: one head per intermediate encoder layer for the iterated loss; None: InterCTC (the
        shared ``ctc`` head reads the intermediate layers). ``dynamic_chunk``: each training batch draws the
        encoder's chunk-wise attention from it (dynamic chunk training, :mod:`asrkit.models.dynamic_chunk`)."""
        super().__init__()
        if ctc is None and decoder is None:
            raise ValueError("a model needs a CTC head, a decoder or both")
        if not 0.0 <= ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
        if (ctc is not None) != (ctc_weight > 0) or (decoder is not None) != (ctc_weight < 1):
            raise ValueError(f"ctc_weight {ctc_weight} does not match the parts: a CTC head is built exactly when "
                             f"ctc_weight > 0 and a decoder exactly when ctc_weight < 1")
        if lsm_normalize not in ("batch", "token"):
            raise ValueError(f"lsm_normalize must be 'batch' or 'token', got '{lsm_normalize}'")
        if decoder is not None and decoder.vocab_size != vocab_size:
            raise ValueError(f"decoder vocabulary {decoder.vocab_size} != model vocabulary {vocab_size}")
        self.frontend = frontend
        self.encoder = encoder
        self.ctc = ctc
        self.aux_heads = None if aux_heads is None else nn.ModuleList(aux_heads)
        self.decoder = decoder
        self.vocab_size = vocab_size
        self.subsampling_factor = encoder.subsampling_factor
        self.ctc_weight, self.interctc_weight = ctc_weight, interctc_weight
        self.lsm_weight, self.lsm_normalize = lsm_weight, lsm_normalize
        self.dynamic_chunk = dynamic_chunk

    # -- encoding ---------------------------------------------------------------------------------------------
    def encode(self, wav: torch.Tensor, wav_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, S) waveforms, (B,) lengths -> (B, T, D) encodings, (B,) lengths."""
        return self.encode_features(*self.frontend(wav, wav_lens))

    def encode_features(self, feats: torch.Tensor, feat_lens: torch.Tensor, **chunking: int
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) features from ``self.frontend``, (B,) lengths -> (B, T', D) encodings, (B,) lengths.
        Transcription computes features in data-loader workers and encodes them here. ``chunking``
        (``chunk_frames``, ``left_chunks``) overrides a streaming encoder's default chunk-wise attention."""
        enc, lens, _ = self.encoder(feats, feat_lens, self.ctc, **chunking)
        return enc, lens

    def output_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """(B,) waveform lengths in samples -> (B,) encoder frames (without speed perturbation)."""
        return self.encoder.output_lengths(self.frontend.num_frames(num_samples))

    def can_align(self, num_samples: int, tokens: Sequence[int]) -> bool:
        """Whether an utterance of ``num_samples`` samples has enough encoder frames for CTC to emit ``tokens``."""
        frames = int(self.output_lengths(torch.tensor([num_samples]))[0])
        return frames >= max(ctc_min_frames(list(tokens)), 1)

    # -- the parts' outputs -----------------------------------------------------------------------------------
    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, V) CTC log-probabilities."""
        if self.ctc is None:
            raise RuntimeError("this model has no CTC head (model.ctc_weight is 0)")
        return self.ctc.log_probs(enc)

    def _need_decoder(self) -> Decoder:
        if self.decoder is None:
            raise RuntimeError("this model has no attention decoder (model.decoder.kind is none)")
        return self.decoder

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Any = None) -> Tuple[torch.Tensor, Any]:
        """(N, V) log P(next token | prefix ys (N, L), memory (N, T, D)); see the decoder's decode_step."""
        return self._need_decoder().decode_step(ys, memory, memory_lens, state)

    def score_tokens(self, enc: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor,
                     token_lens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced (B,) log P(y_1 .. y_L, <eos> | x) summed over the tokens, in one decoder pass.

        enc (B, T, D), enc_lens (B,): encoder output; tokens (B, L) padded with -1; token_lens (B,).
        Used by attention rescoring of an N-best list (rows = hypotheses, enc repeated per row).
        """
        ys_in, ys_out, ys_lens = decoder_io(tokens, token_lens)
        log_probs = self._need_decoder()(ys_in, ys_lens, enc, enc_lens).float().log_softmax(-1)  # (B, L+1, V)
        picked = log_probs.gather(-1, ys_out.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, L+1)
        return picked.masked_fill(ys_out < 0, 0.0).sum(1)

    # -- training ---------------------------------------------------------------------------------------------
    def _ctc_term(self, ctc: CTCHead, enc: torch.Tensor, enc_lens: torch.Tensor,
                  intermediates: List[torch.Tensor], tokens: torch.Tensor, token_lens: torch.Tensor
                  ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """The CTC term of the loss (intermediate layers folded in) and its named parts (detached)."""
        loss_ctc, num_inf = ctc_loss(ctc.log_probs(enc), enc_lens, tokens, token_lens)
        heads = self.aux_heads if self.aux_heads is not None else [ctc] * len(intermediates)
        if len(heads) != len(intermediates):
            raise RuntimeError(f"{len(intermediates)} intermediate layers but {len(heads)} auxiliary CTC heads")
        # Every layer has the same frame count, so the final layer's infinite count covers them all.
        inter = [ctc_loss(head.log_probs(h), enc_lens, tokens, token_lens)[0]
                 for head, h in zip(heads, intermediates)]
        terms = {"loss_ctc": loss_ctc.detach(), "num_infinite_ctc": num_inf}
        if inter:
            terms["loss_interctc"] = torch.stack(inter).mean().detach()
        if self.aux_heads is not None:
            return iterated_combine(loss_ctc, inter, self.interctc_weight), terms
        return interctc_combine(loss_ctc, inter, self.interctc_weight), terms

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        # vtlp_alpha (B,): VTLP warp factors, in batches the training loader augmented (augment:); the frontend warps
        # in training only. Other batches call the frontend with the waveforms alone.
        warp = (batch["vtlp_alpha"],) if "vtlp_alpha" in batch else ()
        feats, feat_lens = self.frontend(batch["wav"], batch["wav_lens"], *warp)
        return self.forward_features(feats, feat_lens, batch["tokens"], batch["token_lens"])[0]

    def forward_features(self, feats: torch.Tensor, feat_lens: torch.Tensor, tokens: torch.Tensor,
                         token_lens: torch.Tensor) -> Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """:meth:`forward` from features ``self.frontend`` computed (B, T, F), (B,): the named loss terms, and the
        encodings (B, T', D) and lengths (B,) they came from (MWER scores its N-best on the same ones)."""
        chunking = {}
        if self.training and self.dynamic_chunk is not None:  # one chunk per batch (its frame count on the host)
            frames = int(self.encoder.output_lengths(torch.tensor([feats.size(1)]))[0])
            chunking = dict(zip(("chunk_frames", "left_chunks"), self.dynamic_chunk.draw(frames)))
        enc, enc_lens, intermediates = self.encoder(feats, feat_lens, self.ctc, **chunking)
        out: Dict[str, torch.Tensor] = {}
        loss = enc.new_zeros(())
        if self.ctc is not None:
            ctc_term, terms = self._ctc_term(self.ctc, enc, enc_lens, intermediates, tokens, token_lens)
            loss = loss + self.ctc_weight * ctc_term
            out.update(terms)
        if self.decoder is not None:
            ys_in, ys_out, ys_lens = decoder_io(tokens, token_lens)
            logits = self.decoder(ys_in, ys_lens, enc, enc_lens)  # (B, L+1, V)
            loss_att = label_smoothing_loss(logits, ys_out, self.lsm_weight, self.lsm_normalize)
            loss = loss + (1.0 - self.ctc_weight) * loss_att
            out["loss_att"] = loss_att.detach()
            out["acc"] = token_accuracy(logits.detach(), ys_out)
            if not self.training:  # alignments for the trainer's attention plots
                out["attention"] = self.decoder.attention_weights(ys_in, ys_lens, enc.detach(), enc_lens)
        out["loss"] = loss
        return out, enc, enc_lens
