"""Transcriber: experiment dir -> frontend -> encoder -> search -> transcripts with timestamps."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm import tqdm

from asrkit.audio.io import AudioError, load_audio
from asrkit.config import DecodeConfig, ExperimentConfig, load_config, save_config
from asrkit.data.datadir import read_data_dir
from asrkit.data.table import write_table
from asrkit.models.registry import build_model
from asrkit.pipeline.searcher import Searcher
from asrkit.search import Hypothesis
from asrkit.text.tokenizer import Tokenizer, load_tokenizer
from asrkit.checkpoint import MODEL_FILE, load_checkpoint

log = logging.getLogger("asrkit.pipeline")


@dataclass
class Transcript:
    text: str
    tokens: List[int]
    # start time (seconds) of each token: the encoder frame that emitted it (for attention/joint search, from a
    # CTC forced alignment; empty when the model has no CTC head)
    token_times: List[float] = field(default_factory=list)
    score: float = 0.0  # the search's total score (log domain)
    ctc_score: float = 0.0  # log P_ctc of the tokens (summed over alignments; the best path for greedy)


def load_from_dir(exp_dir: str, checkpoint: Optional[str] = None,
                  device: str | torch.device = "cpu") -> Tuple[nn.Module, ExperimentConfig, Tokenizer]:
    """Build the model described by ``exp_dir/config.yaml`` and load ``model.pt`` (or ``checkpoint``) into it."""
    cfg_path = os.path.join(exp_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{exp_dir}: not an experiment directory (no config.yaml)")
    cfg = load_config(cfg_path)
    tokenizer = load_tokenizer(os.path.join(exp_dir, cfg.tokenizer.path))
    cmvn = os.path.join(exp_dir, cfg.cmvn) if cfg.cmvn else None
    model = build_model(cfg, tokenizer.vocab_size, cmvn)
    ckpt = load_checkpoint(checkpoint or os.path.join(exp_dir, MODEL_FILE), map_location="cpu")
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), cfg, tokenizer


def pad_waveforms(wavs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """List of (T_i,) -> (B, T_max) zero-padded, (B,) lengths."""
    lens = torch.tensor([w.numel() for w in wavs], dtype=torch.long)
    out = torch.zeros(len(wavs), int(lens.max()) if len(wavs) else 0)
    for i, w in enumerate(wavs):
        out[i, : w.numel()] = w
    return out, lens


class Transcriber:
    """Batch transcription with a trained model; ``decode`` picks the search (default: greedy CTC)."""

    def __init__(self, model: nn.Module, cfg: ExperimentConfig, tokenizer: Tokenizer,
                 device: str | torch.device = "cpu", decode: Optional[DecodeConfig] = None):
        self.model, self.cfg, self.tokenizer = model.eval(), cfg, tokenizer
        self.device = torch.device(device)
        self.decode_cfg = decode or DecodeConfig()
        self.searcher = Searcher(self.decode_cfg, model, tokenizer, self.device)
        self.sample_rate = cfg.frontend.sample_rate
        # seconds per encoder frame = feature hop x subsampling factor
        self.frame_shift = model.frontend.frame_shift_seconds * model.subsampling_factor

    @classmethod
    def from_dir(cls, exp_dir: str, device: str = "cpu", checkpoint: Optional[str] = None,
                 decode: Optional[DecodeConfig] = None) -> "Transcriber":
        model, cfg, tokenizer = load_from_dir(exp_dir, checkpoint, device)
        return cls(model, cfg, tokenizer, device, decode)

    def _transcript(self, hyp: Hypothesis) -> Transcript:
        return Transcript(self.tokenizer.decode(hyp.tokens), hyp.tokens,
                          [round(f * self.frame_shift, 3) for f in hyp.token_frames if f >= 0],
                          hyp.score, hyp.ctc_score)

    @torch.inference_mode()
    def transcribe_nbest(self, wavs: Sequence[torch.Tensor]) -> List[List[Transcript]]:
        """Up to ``decode.nbest`` transcripts per mono waveform (at the model's sample rate), best first.

        A batch that runs out of GPU memory (encoder or search) is split in half and retried.
        """
        if not wavs:
            return []
        try:
            wav, wav_lens = pad_waveforms(wavs)
            enc, enc_lens = self.model.encode(wav.to(self.device), wav_lens.to(self.device))
            nbest = self.searcher.search(self.model, enc, enc_lens)
        except torch.cuda.OutOfMemoryError:
            if len(wavs) <= 1:
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            half = len(wavs) // 2
            log.warning("out of memory on a batch of %d utterances: decoding it in halves", len(wavs))
            return self.transcribe_nbest(wavs[:half]) + self.transcribe_nbest(wavs[half:])
        return [[self._transcript(h) for h in hyps] or [Transcript("", [])] for hyps in nbest.to_lists()]

    def transcribe(self, wavs: Sequence[torch.Tensor]) -> List[Transcript]:
        """The best transcript of each mono waveform (at the model's sample rate)."""
        return [hyps[0] for hyps in self.transcribe_nbest(wavs)]

    def load(self, path: str) -> torch.Tensor:
        """Read an audio file (or ``cmd |``) as a mono waveform at the model's rate; raises AudioError."""
        return load_audio(path, self.sample_rate, name=path)

    def transcribe_files(self, paths: Sequence[str]) -> List[Transcript]:
        return self.transcribe([self.load(p) for p in paths])

    def data_dir_batches(self, data_dir: str, batch_size: Optional[int], failed: Dict[str, str]
                         ) -> Iterator[Tuple[List[str], List[torch.Tensor]]]:
        """(utterance ids, waveforms) of a Kaldi data dir, longest first (less padding, memory problems show
        early), with progress; unreadable utterances are logged and recorded in ``failed``, not raised."""
        utts = sorted(read_data_dir(data_dir).utterances(), key=lambda u: -(u.duration or 0.0))
        batch_size = batch_size or self.decode_cfg.batch_size
        for chunk in tqdm(list(_chunks(utts, batch_size)), desc="decode", dynamic_ncols=True):
            wavs, names = [], []
            for u in chunk:
                try:
                    wavs.append(load_audio(u.source, self.sample_rate, start=u.start, end=u.end, name=u.utt))
                    names.append(u.utt)
                except AudioError as exc:
                    log.warning("skipping %s", exc)
                    failed[u.utt] = str(exc).replace("\n", " ")
            yield names, wavs

    def decode_data_dir(self, data_dir: str, out_dir: str, batch_size: Optional[int] = None) -> dict:
        """Transcribe every utterance of a Kaldi data dir into ``out_dir/text``.

        Also writes ``out_dir/decode.yaml`` (every search setting used) and, with ``decode.nbest > 1``,
        ``out_dir/nbest.jsonl`` (one JSON object per hypothesis: utt, rank, text, score, ctc_score).
        Unreadable utterances are logged, listed in ``out_dir/failed``, and left out of ``text``
        (so scoring counts them as deletions), never a crash.
        """
        os.makedirs(out_dir, exist_ok=True)
        save_config(self.decode_cfg, os.path.join(out_dir, "decode.yaml"))
        hyps, nbests, failed = {}, {}, {}
        for names, wavs in self.data_dir_batches(data_dir, batch_size, failed):
            for name, alternatives in zip(names, self.transcribe_nbest(wavs)):
                hyps[name] = alternatives[0].text
                nbests[name] = alternatives
        write_table(os.path.join(out_dir, "text"), hyps)
        if self.decode_cfg.nbest > 1:
            with open(os.path.join(out_dir, "nbest.jsonl"), "w", encoding="utf-8") as fh:
                for name in sorted(nbests):
                    for rank, tr in enumerate(nbests[name], 1):
                        fh.write(json.dumps({"utt": name, "rank": rank, "text": tr.text, "score": tr.score,
                                             "ctc_score": tr.ctc_score}, ensure_ascii=False) + "\n")
        if failed:
            write_table(os.path.join(out_dir, "failed"), failed)
        log.info("decoded %d utterances into %s/text (%d failed)", len(hyps), out_dir, len(failed))
        return {"decoded": len(hyps), "failed": len(failed)}


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i: i + n]
