"""Export a trained model's CTC path (frontend with CMVN -> encoder -> CTC head) to ONNX or TorchScript, and load
it back as an :class:`ExportedModel` that the transcriber can run without asrkit's model code.

The exported graph has dynamic batch and length::

    inputs   wav        float32 (B, S)   waveforms at the model's sample rate, zero padded
             wav_lens   int64   (B,)     valid samples per row
    outputs  log_probs  float32 (B, T, V) CTC log-probabilities (frames at or past ``lens`` are padding)
             lens       int64   (B,)     valid encoder frames per row

A file carries what decoding needs, so it loads alone: one JSON object (:data:`METADATA_KEY`) with the format
and its version, the asrkit version, the sample rate, the seconds per output frame, the tokenizer (the JSON
that ``Tokenizer.save`` writes: a char list, or the sentencepiece model in base64), the shortest and longest
input the graph takes, and for TorchScript the device it was traced on. ONNX keeps it in the model's
``metadata_props``, TorchScript in ``_extra_files`` (read from the archive before the file is loaded).

Exporters, and why:

* ONNX: ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript). The TorchScript-based exporter
  cannot translate the complex ``torch.stft`` of the log-mel frontend; the dynamo exporter can, and it keeps
  the batch and length symbolic. ``pack_padded_sequence`` does not go through torch.export, so a BiLSTM
  encoder is exported as :class:`UnpackedBLSTM` (the same weights and outputs, without packing). The log-mel
  spectrum is exported as :class:`ConvLogMel`: onnxruntime's STFT is a plain DFT, twice as slow as a strided
  convolution with the same DFT basis (torch's own stft, an FFT, stays in TorchScript).
* TorchScript: ``torch.jit.trace``. The model code is not scriptable (protocols, optional callables), and
  tracing records arithmetic on sizes, so the traced graph takes any batch and length (Python branches on a
  size are baked in: the graph avoids those that matter, see :class:`CtcLogProbs`).

Security: loading a TorchScript file runs the code stored in it, as ``torch.jit.load`` always does, so
:func:`load_exported` loads one only with ``trust_torchscript=True`` (``asrkit transcribe --trust-torchscript``),
and a file named ``.onnx`` must be ONNX whatever the caller trusts. ONNX is a data format interpreted by
onnxruntime: it is the format for models from others.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from asrkit.audio.frontend import KaldiFbank, LogMel
from asrkit.extras import require
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.positional import PositionalEncoding
from asrkit.pipeline.model_dir import load_from_dir
from asrkit.text.tokenizer import Tokenizer, load_tokenizer

FORMATS = ("onnx", "torchscript")
FORMAT_NAME = "asrkit-export"
FORMAT_VERSION = 1
METADATA_KEY = "asrkit"  # ONNX metadata_props key, and the TorchScript extra file's name with ".json"
TS_EXTRA_FILE = f"{METADATA_KEY}.json"
log = logging.getLogger("asrkit.pipeline")
INPUT_NAMES = ["wav", "wav_lens"]
OUTPUT_NAMES = ["log_probs", "lens"]


class ExportError(ValueError):
    """A model that cannot be exported, or a file that is not a usable export; the message says which and why."""


def _one_direction(lstm: nn.LSTM, suffix: str) -> nn.LSTM:
    """A unidirectional one-layer LSTM with the weights of one direction of ``lstm`` (suffix "" or "_reverse")."""
    one = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
    weights = lstm.state_dict()
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    one.load_state_dict({n: weights[n + suffix].clone() for n in names})
    return one


class UnpackedBLSTM(nn.Module):
    """:class:`~asrkit.nets.lstm.BLSTMEncoder` without packed sequences, which torch.export cannot trace.

    The forward direction runs over the padded batch (an LSTM reads left to right, so frames past a row's end
    cannot change its valid outputs); the backward direction runs over each row reversed within its own length
    (valid frames first), and its outputs are put back in order. Padding is zeroed after every layer, as
    ``pad_packed_sequence`` leaves it, so pyramid steps pair an odd row's last frame with zeros as in eager.
    Equal to the packed encoder on valid frames (checked by the export tests).
    """

    def __init__(self, encoder: BLSTMEncoder):
        super().__init__()
        self.subsampling = encoder.subsampling
        self.pyramid_layers = encoder.pyramid_layers
        self.forward_lstms = nn.ModuleList(_one_direction(lstm, "") for lstm in encoder.layers)
        self.backward_lstms = nn.ModuleList(_one_direction(lstm, "_reverse") for lstm in encoder.layers)

    def forward(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """feats (B, T, F), feat_lens (B,) -> encodings (B, T', 2H), lengths (B,)."""
        x, lens = (feats, feat_lens) if self.subsampling is None else self.subsampling(feats, feat_lens)
        for i, (fwd, bwd) in enumerate(zip(self.forward_lstms, self.backward_lstms), start=1):
            t = torch.arange(x.size(1), device=x.device)[None]  # (1, T)
            valid = t < lens[:, None]  # (B, T)
            order = torch.where(valid, lens[:, None] - 1 - t, t)  # (B, T): reverses valid frames, keeps padding
            y_fwd, _ = fwd(x)  # (B, T, H)
            y_bwd, _ = bwd(x.gather(1, order[..., None].expand(-1, -1, x.size(2))))
            y_bwd = y_bwd.gather(1, order[..., None].expand(-1, -1, y_bwd.size(2)))  # the reversal is its own inverse
            x = torch.cat([y_fwd, y_bwd], dim=-1).masked_fill(~valid[..., None], 0.0)  # (B, T, 2H)
            if i in self.pyramid_layers:  # nets.lstm.pyramid_halve, with the odd-length pad kept symbolic
                b, n, d = x.shape
                x = nn.functional.pad(x, (0, 0, 0, n % 2)).reshape(b, (n + 1) // 2, 2 * d)
                lens = torch.div(lens + 1, 2, rounding_mode="floor")
        return x, lens


class ConvLogMel(nn.Module):
    """:class:`~asrkit.audio.frontend.LogMel` with the windowed DFT as one strided ``conv1d`` (real and imaginary
    basis rows, float64-built): (B, S) -> (B, F, n_mels) with the same snip-edges framing and zeroed padding."""

    def __init__(self, logmel: LogMel):
        super().__init__()
        self.logmel = logmel
        n_fft, win = logmel.n_fft, logmel.win_length
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]  # (K, 1)
        # torch.stft centres the window in the n_fft frame: sample n of a frame sits at offset left + n.
        n = torch.arange(win, dtype=torch.float64)[None, :] + (n_fft - win) // 2  # (1, win)
        angle, window = 2 * math.pi * k * n / n_fft, logmel.window.double()[None, :]
        basis = torch.cat([window * torch.cos(angle), -window * torch.sin(angle)])  # (2K, win)
        self.register_buffer("basis", basis.float()[:, None, :], persistent=False)  # (2K, 1, win)

    def forward(self, wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        lm = self.logmel
        feat_lens = lm.num_frames(wav_lens.long())
        spec = nn.functional.conv1d(wav[:, None, :].float(), self.basis, stride=lm.hop_length)  # (B, 2K, F)
        real, imag = spec.chunk(2, dim=1)
        mel = torch.matmul((real.square() + imag.square()).transpose(1, 2), lm.mel_fb)  # (B, F, M)
        feats = torch.log(torch.clamp(mel, min=lm.log_floor))
        valid = torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]  # (B, F)
        return feats.masked_fill(~valid[..., None], 0.0), feat_lens


class CtcLogProbs(nn.Module):
    """The exported graph: ``(wav (B, S) float32, wav_lens (B,) int64) -> (log_probs (B, T, V), lens (B,))``.

    A BiLSTM encoder runs as :class:`UnpackedBLSTM`: torch.export cannot trace packing, and jit.trace would bake
    the example's parity into a pyramid step (``if T % 2``), breaking inputs of the other parity. ``conv_stft``:
    log-mel features through :class:`ConvLogMel` (for onnxruntime), then the frontend's normalisation."""

    def __init__(self, model: nn.Module, conv_stft: bool = False):
        super().__init__()
        if model.ctc is None:
            raise ExportError("this model has no CTC head (model.ctc_weight is 0): export covers frontend + encoder "
                              "+ CTC head, so an attention-only model cannot be exported")
        self.model = model
        self.unpacked = UnpackedBLSTM(model.encoder) if isinstance(model.encoder, BLSTMEncoder) else None
        extractor = model.frontend.extractor
        self.conv_logmel = ConvLogMel(extractor) if conv_stft and isinstance(extractor, LogMel) else None

    def forward(self, wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        if self.conv_logmel is None:
            feats, feat_lens = self.model.frontend(wav, wav_lens)  # (B, F, M), (B,)
        else:  # Frontend.forward in eval mode: features, then utterance CMN and global CMVN
            feats, feat_lens = self.model.frontend.normalize(*self.conv_logmel(wav, wav_lens))
        if self.unpacked is None:
            enc, lens, _ = self.model.encoder(feats, feat_lens, self.model.ctc)  # (B, T, D), (B,)
        else:
            enc, lens = self.unpacked(feats, feat_lens)
        return self.model.ctc_log_probs(enc).float(), lens.long()  # (B, T, V), (B,)


def _min_samples(model: nn.Module) -> int:
    """The fewest samples that give one encoder frame (shorter inputs are zero padded up to it by the loader)."""
    n = 1
    while int(model.output_lengths(torch.tensor([n]))[0]) < 1:
        n *= 2
    lo, hi = n // 2, n  # output_lengths(lo) < 1 <= output_lengths(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if int(model.output_lengths(torch.tensor([mid]))[0]) >= 1 else (mid, hi)
    return hi


def _max_samples(model: nn.Module) -> Optional[int]:
    """The most samples the graph takes, or None for no limit: absolute sinusoid positions are a fixed table in
    the exported graph (eager code regrows it; a graph cannot), so the encoder frames must fit in it."""
    exported = (model.frontend, model.encoder)  # not the decoder: its positions are not in the graph
    tables = [m.table.size(0) for part in exported for m in part.modules() if isinstance(m, PositionalEncoding)]
    if not tables:
        return None
    limit, lo, hi = min(tables), 1, 1
    while int(model.output_lengths(torch.tensor([hi]))[0]) <= limit:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # output_lengths(lo) <= limit < output_lengths(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if int(model.output_lengths(torch.tensor([mid]))[0]) <= limit else (lo, mid)
    return lo


def _tokenizer_json(tokenizer: Tokenizer) -> dict:
    """What ``Tokenizer.save`` writes, as an object (so ``load_tokenizer`` rebuilds it, sentencepiece included)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        tokenizer.save(path)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)


def export_metadata(model: nn.Module, tokenizer: Tokenizer, sample_rate: int) -> dict:
    """The JSON object stored in an exported file (see the module docstring)."""
    from asrkit import __version__

    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "asrkit_version": __version__,
            "sample_rate": int(sample_rate),
            "frame_shift": float(model.frontend.frame_shift_seconds * model.subsampling_factor),
            "vocab_size": int(tokenizer.vocab_size), "tokenizer": _tokenizer_json(tokenizer),
            "min_samples": _min_samples(model), "max_samples": _max_samples(model)}


def check_exportable(model: nn.Module, fmt: str) -> None:
    """Raise :class:`ExportError` naming what keeps ``model`` from being exported to ``fmt``."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format '{fmt}' (choose from: {', '.join(FORMATS)})")
    if model.ctc is None:
        CtcLogProbs(model)  # raises with the message
    if isinstance(model.frontend.extractor, KaldiFbank):
        raise ExportError("frontend.kind kaldi_fbank runs torchaudio's unbatched fbank once per utterance in "
                          "Python and cannot be exported with a dynamic batch; export a logmel model")


def _example(model: nn.Module, sample_rate: int) -> Tuple[Tensor, Tensor]:
    """Two rows of unequal length (so padding is in the traced graph), 0.37 s: an odd size nothing is tuned to, and
    short because torch.export decomposes an LSTM frame by frame (export time grows with the example's length)."""
    n = max(int(0.37 * sample_rate), 2 * _min_samples(model))
    gen = torch.Generator().manual_seed(0)
    wav = 0.1 * torch.randn(2, n, generator=gen)
    return wav, torch.tensor([n, n * 3 // 4], dtype=torch.long)


# Exporter warnings about its own internals that say nothing about the exported model.
_EXPORTER_NOISE = (r".*axis name: \w+ will not be used", r".*were assigned during export", r".*_check_is_size",
                   r".*torch\.jit\.\w+` is deprecated")


def _export_onnx(graph: CtcLogProbs, example: Tuple[Tensor, Tensor], out: str, meta: dict) -> None:
    onnx = require("onnx", "exporting to ONNX")
    require("onnxscript", "exporting to ONNX")  # torch.onnx.export(dynamo=True) writes the graph with it

    # The exporter's registry logs a warning per torchvision op it skips when torchvision is absent (asrkit needs none).
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    batch = torch.export.Dim("batch", min=1)
    samples = torch.export.Dim("samples", min=meta["min_samples"], max=meta["max_samples"] or int(2 ** 31 - 1))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        for noise in _EXPORTER_NOISE:
            warnings.filterwarnings("ignore", message=noise)
        tmp_out = os.path.join(tmp, "model.onnx")
        # external_data=False: one self-contained file (ONNX's protobuf limit makes that < 2 GB of weights).
        torch.onnx.export(graph, example, tmp_out, dynamo=True, external_data=False, input_names=INPUT_NAMES,
                          output_names=OUTPUT_NAMES, verbose=False,
                          dynamic_shapes={"wav": {0: batch, 1: samples}, "wav_lens": {0: batch}})
        proto = onnx.load(tmp_out)
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta, ensure_ascii=False)
    onnx.save(proto, out)


def _export_torchscript(graph: CtcLogProbs, example: Tuple[Tensor, Tensor], out: str, meta: dict) -> None:
    with warnings.catch_warnings():
        for noise in _EXPORTER_NOISE:
            warnings.filterwarnings("ignore", message=noise)
        # Tracing warns about every Python-level branch on a size (input checks, the empty-input early returns);
        # they hold for every input the loader passes (at least min_samples long, batch >= 1).
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        traced = torch.jit.trace(graph, example, check_trace=False)
    traced.save(out, _extra_files={TS_EXTRA_FILE: json.dumps(meta, ensure_ascii=False)})


@dataclass
class ExportInfo:
    path: str
    format: str
    seconds: float  # wall time of the export
    metadata: dict


def export_model(model: nn.Module, tokenizer: Tokenizer, sample_rate: int, out: str, fmt: str,
                 device: str | torch.device = "cpu") -> ExportInfo:
    """Export ``model`` (an AsrModel; put in eval mode) to ``out`` as ``fmt`` (onnx | torchscript).

    ONNX is exported on the CPU and runs on any onnxruntime provider. A TorchScript trace fixes the device of the
    tensors it creates (masks, positions), so it is traced on ``device`` and runs there only (the metadata says
    which; :func:`load_exported` refuses another). The file is written atomically (a temporary name, then
    renamed), so a failed export leaves no partial file.
    """
    check_exportable(model, fmt)
    device = torch.device("cpu" if fmt == "onnx" else device)
    model = model.to(device).eval()
    meta = export_metadata(model, tokenizer, sample_rate)
    if fmt == "torchscript":
        meta["device"] = device.type
    graph = CtcLogProbs(model, conv_stft=fmt == "onnx").to(device).eval()
    example = tuple(t.to(device) for t in _example(model, sample_rate))
    start = time.perf_counter()
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{os.path.basename(out)}.tmp{os.getpid()}")
    try:
        with torch.no_grad():
            (_export_onnx if fmt == "onnx" else _export_torchscript)(graph, example, tmp, meta)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return ExportInfo(out, fmt, time.perf_counter() - start, meta)


def export_from_dir(exp_dir: str, out: str, fmt: str, checkpoint: Optional[str] = None,
                    device: str | torch.device = "cpu") -> ExportInfo:
    """Export the model of an experiment directory (see :func:`export_model`)."""
    model, cfg, tokenizer = load_from_dir(exp_dir, checkpoint, "cpu")
    return export_model(model, tokenizer, cfg.frontend.sample_rate, out, fmt, device)


# -- loading --------------------------------------------------------------------------------------------------

def _check_metadata(meta: object, path: str) -> dict:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ExportError(f"{path}: not an asrkit export (no '{METADATA_KEY}' metadata of format {FORMAT_NAME})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ExportError(f"{path}: export format version {version}, this asrkit reads version {FORMAT_VERSION} "
                          f"(written by asrkit {meta.get('asrkit_version')}); export the model again")
    missing = [k for k in ("sample_rate", "frame_shift", "tokenizer", "min_samples", "max_samples") if k not in meta]
    if missing:
        raise ExportError(f"{path}: export metadata lacks {', '.join(missing)}")
    return meta


def _tokenizer_from(meta: dict, path: str) -> Tokenizer:
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = os.path.join(tmp, "tokenizer.json")
        with open(tok_path, "w", encoding="utf-8") as fh:
            json.dump(meta["tokenizer"], fh, ensure_ascii=False)
        try:
            tokenizer = load_tokenizer(tok_path)
        except (ValueError, KeyError) as exc:
            raise ExportError(f"{path}: the stored tokenizer is unusable: {exc}") from None
    if "vocab_size" in meta and tokenizer.vocab_size != meta["vocab_size"]:
        raise ExportError(f"{path}: the stored tokenizer has {tokenizer.vocab_size} tokens, the model "
                          f"{meta['vocab_size']}")
    return tokenizer


class ExportedModel:
    """An exported CTC model: ``sample_rate``, ``frame_shift`` (seconds per output frame), ``tokenizer`` and
    :meth:`log_probs`. Build it with :func:`load_exported`."""

    def __init__(self, path: str, meta: dict, runner, device: torch.device):
        self._path, self._meta, self._run, self._device = path, meta, runner, device
        self.sample_rate: int = int(meta["sample_rate"])
        self.frame_shift: float = float(meta["frame_shift"])
        self.tokenizer: Tokenizer = _tokenizer_from(meta, path)

    def log_probs(self, wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """wav (B, S) float32 zero padded, wav_lens (B,) int64 -> CTC log-probs (B, T, V) float32, lens (B,) int64,
        on this model's device. Rows shorter than the graph's minimum come back with length 0."""
        if wav.dim() != 2 or wav_lens.shape != (wav.size(0),):
            raise ValueError(f"{self._path}: expected wav (B, S) and wav_lens (B,), got {tuple(wav.shape)} and "
                             f"{tuple(wav_lens.shape)}")
        max_samples = self._meta["max_samples"]
        if max_samples is not None and wav.size(1) > max_samples:
            raise ValueError(f"{self._path}: input of {wav.size(1)} samples is longer than this exported model takes "
                             f"({max_samples} samples, {max_samples / self.sample_rate:.1f} s: the size of its "
                             f"positional table); split the audio into shorter segments")
        if wav.size(0) == 0:  # the graph's batch dimension is at least 1
            return (torch.zeros(0, 0, self.tokenizer.vocab_size, device=self._device),
                    torch.zeros(0, dtype=torch.long, device=self._device))
        if wav.size(1) < self._meta["min_samples"]:  # padding never changes a row's output, so pad up to the minimum
            wav = nn.functional.pad(wav, (0, self._meta["min_samples"] - wav.size(1)))
        return self._run(wav.float().contiguous(), wav_lens.long())


def _onnx_runner(path: str, device: torch.device, num_threads: Optional[int]):
    ort = require("onnxruntime", f"{path}: an ONNX model")
    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        else:
            log.warning("%s: onnxruntime has no CUDAExecutionProvider here (pip install onnxruntime-gpu): "
                        "running on the CPU", path)
    try:
        session = ort.InferenceSession(path, options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
        raise ExportError(f"{path}: onnxruntime cannot load it: {exc}") from None
    meta_json = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)

    def run(wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        feeds: Dict[str, object] = {"wav": wav.detach().cpu().numpy(), "wav_lens": wav_lens.detach().cpu().numpy()}
        log_probs, lens = session.run(OUTPUT_NAMES, feeds)
        return torch.from_numpy(log_probs).to(device), torch.from_numpy(lens).to(device)

    return meta_json, run


def _torchscript_metadata(path: str) -> Optional[str]:
    """The asrkit metadata of a TorchScript file, read from its zip archive without loading (running) it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(f"/extra/{TS_EXTRA_FILE}")]
            return archive.read(names[0]).decode("utf-8") if names else None
    except (zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise ExportError(f"{path}: not a readable TorchScript archive: {exc}") from None


def _torchscript_runner(path: str, device: torch.device):
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EXPORTER_NOISE[-1])
            module = torch.jit.load(path, map_location=device)
    except RuntimeError as exc:
        raise ExportError(f"{path}: torch.jit.load cannot load it: {str(exc).splitlines()[0]}") from None
    module.eval()

    @torch.inference_mode()
    def run(wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        log_probs, lens = module(wav.to(device), wav_lens.to(device))
        return log_probs, lens

    return run


def detect_format(path: str) -> str:
    """``onnx`` or ``torchscript`` from the file's first bytes (TorchScript files are zip archives)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ExportError(f"{path}: cannot read: {exc.strerror}") from None
    return "torchscript" if head.startswith(b"PK") else "onnx"


def load_exported(path: str | os.PathLike, device: str | torch.device = "cpu",
                  num_threads: Optional[int] = None, *, trust_torchscript: bool = False) -> ExportedModel:
    """Load a file written by :func:`export_model`; the format is read from the file itself.

    ONNX runs in onnxruntime (CUDAExecutionProvider when ``device`` is cuda and that provider is installed, else
    the CPU); ``num_threads`` sets onnxruntime's intra-op threads (default: its own choice). TorchScript runs in
    torch on ``device``. Loading a TorchScript file runs code stored in it, so it is refused unless
    ``trust_torchscript`` says the caller trusts its author (ONNX is the safe format for models from elsewhere);
    a file named ``.onnx`` that is not ONNX is refused unread either way.
    """
    path, device = os.fspath(path), torch.device(device)
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file")
    fmt = detect_format(path)
    if fmt != "onnx" and path.lower().endswith(".onnx"):
        raise ExportError(f"{path}: named .onnx but not an ONNX file (a zip archive, as TorchScript files are): "
                          f"refused unread")
    if fmt == "torchscript" and not trust_torchscript:
        raise ExportError(f"{path}: a TorchScript file, and loading one runs code stored in it: load it only from an "
                          f"author you trust, with --trust-torchscript (Python: trust_torchscript=True), or use an "
                          f"ONNX export")
    if fmt == "onnx":
        meta_json, run = _onnx_runner(path, device, num_threads)
    else:  # metadata first: a foreign file or a wrong device is refused before any of its code runs
        meta_json, run = _torchscript_metadata(path), None
    if meta_json is None:
        raise ExportError(f"{path}: a {fmt} file without asrkit metadata (not written by 'asrkit export')")
    try:
        meta = json.loads(meta_json)
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: the asrkit metadata is not valid JSON: {exc}") from None
    meta = _check_metadata(meta, path)
    if fmt == "torchscript" and meta.get("device", "cpu") != device.type:
        raise ExportError(f"{path}: this TorchScript trace runs on {meta.get('device', 'cpu')} (a trace fixes the "
                          f"device it was exported on), not {device.type}: export again with --device "
                          f"{device.type}, or use ONNX")
    return ExportedModel(path, meta, run or _torchscript_runner(path, device), device)
