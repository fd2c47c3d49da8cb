"""Transcriber: experiment dir -> frontend -> encoder -> search -> transcripts with timestamps."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm import tqdm

from asrkit.audio.io import AudioError, load_audio
from asrkit.config import ExperimentConfig, load_config
from asrkit.data.datadir import read_data_dir
from asrkit.data.table import write_table
from asrkit.models.registry import build_model
from asrkit.search.greedy import ctc_greedy_search
from asrkit.text.tokenizer import Tokenizer, load_tokenizer
from asrkit.train.checkpoint import MODEL_FILE, load_checkpoint

log = logging.getLogger("asrkit.pipeline")


@dataclass
class Transcript:
    text: str
    tokens: List[int]
    # start time (seconds) of each token: the first encoder frame that emitted it
    token_times: List[float] = field(default_factory=list)


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
    """Batch transcription with a trained model (greedy CTC)."""

    def __init__(self, model: nn.Module, cfg: ExperimentConfig, tokenizer: Tokenizer,
                 device: str | torch.device = "cpu"):
        self.model, self.cfg, self.tokenizer = model.eval(), cfg, tokenizer
        self.device = torch.device(device)
        self.sample_rate = cfg.frontend.sample_rate
        # seconds per encoder frame = feature hop x subsampling factor
        self.frame_shift = model.frontend.frame_shift_seconds * model.subsampling_factor

    @classmethod
    def from_dir(cls, exp_dir: str, device: str = "cpu", checkpoint: Optional[str] = None) -> "Transcriber":
        model, cfg, tokenizer = load_from_dir(exp_dir, checkpoint, device)
        return cls(model, cfg, tokenizer, device)

    @torch.inference_mode()
    def transcribe(self, wavs: Sequence[torch.Tensor]) -> List[Transcript]:
        """Transcribe a batch of mono waveforms at the model's sample rate."""
        if not wavs:
            return []
        wav, wav_lens = pad_waveforms(wavs)
        enc, enc_lens = self.model.encode(wav.to(self.device), wav_lens.to(self.device))
        tokens, token_lens, frames = ctc_greedy_search(self.model.ctc_log_probs(enc), enc_lens,
                                                       blank=self.tokenizer.blank_id)
        out = []
        for ids, n, fr in zip(tokens.tolist(), token_lens.tolist(), frames.tolist()):
            ids = ids[:n]
            out.append(Transcript(self.tokenizer.decode(ids), ids,
                                  [round(f * self.frame_shift, 3) for f in fr[:n]]))
        return out

    def load(self, path: str) -> torch.Tensor:
        """Read an audio file (or ``cmd |``) as a mono waveform at the model's rate; raises AudioError."""
        return load_audio(path, self.sample_rate, name=path)

    def transcribe_files(self, paths: Sequence[str]) -> List[Transcript]:
        return self.transcribe([self.load(p) for p in paths])

    def decode_data_dir(self, data_dir: str, out_dir: str, batch_size: int = 16) -> dict:
        """Transcribe every utterance of a Kaldi data dir into ``out_dir/text``.

        Unreadable utterances are logged, listed in ``out_dir/failed``, and left
        out of ``text`` (so scoring counts them as deletions), never a crash.
        """
        os.makedirs(out_dir, exist_ok=True)
        dd = read_data_dir(data_dir)
        hyps, failed = {}, {}
        utts = list(dd.utterances())
        # Longest first keeps padding low and surfaces memory problems early.
        utts.sort(key=lambda u: -(u.duration or 0.0))
        for chunk in tqdm(list(_chunks(utts, batch_size)), desc="decode", dynamic_ncols=True):
            wavs, names = [], []
            for u in chunk:
                try:
                    wavs.append(load_audio(u.source, self.sample_rate, start=u.start, end=u.end, name=u.utt))
                    names.append(u.utt)
                except AudioError as exc:
                    log.warning("skipping %s", exc)
                    failed[u.utt] = str(exc).replace("\n", " ")
            for name, tr in zip(names, self.transcribe(wavs)):
                hyps[name] = tr.text
        write_table(os.path.join(out_dir, "text"), hyps)
        if failed:
            write_table(os.path.join(out_dir, "failed"), failed)
        log.info("decoded %d utterances into %s/text (%d failed)", len(hyps), out_dir, len(failed))
        return {"decoded": len(hyps), "failed": len(failed)}


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i: i + n]
