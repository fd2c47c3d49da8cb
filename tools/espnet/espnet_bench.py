#!/usr/bin/env python3
"""The logic of tools/espnet/bench_espnet.sh: asrkit config -> ESPnet2 asr.yaml, ESPnet inputs, timing, best path.

usage:
  espnet_bench.py config --asrkit-config C [--set K=V ...] --epochs N [--asrkit-epochs M] --train DIR --out DIR
      write DIR/asr.yaml (ESPnet2, N epochs) and DIR/asrkit_overrides.txt (the --set lines asrkit trains with;
      M epochs, default N)
  espnet_bench.py tokens --tokenizer tokenizer.json --out tokens.txt
      ESPnet's char token list with the units of an asrkit char tokenizer
  espnet_bench.py text-shapes --stats DIR --token-list tokens.txt
      DIR/{train,valid}/text_shape.char from collect_stats' text_shape ("L" -> "L,V")
  espnet_bench.py timed --record FILE --name NAME -- CMD ...
      run CMD, add {NAME: wall seconds} to the JSON FILE (nothing is run if NAME is there already)
  espnet_bench.py greedy --config exp/config.yaml --model exp/Nepoch.pth --data DIR --out DIR
      decode a Kaldi data dir (wav.scp of audio files) with an ESPnet2 CTC model by best path, the rule of
      asrkit's greedy mode (frame argmax, collapse repeats, drop blank); write DIR/text. Run it with
      .venv-espnet's Python.
  espnet_bench.py posteriors --config exp/config.yaml --model exp/Nepoch.pth --data DIR --out DIR
      the same model's CTC log-probabilities, one (T, V) array per utterance, into DIR/log_probs.npz and its
      token list into DIR/tokens.txt, for tools/espnet/espnet_lm.py (asrkit's search with an LM on them).
      Run it with .venv-espnet's Python.

Runs with the toolkit's .venv (config, tokens import asrkit), .venv-espnet (greedy imports espnet2, inside the
function only) or any Python (text-shapes, timed). Per-step times on identical batches:
tools/espnet/espnet_step_time.py; the table (stage 7): tools/espnet/espnet_report.py; the epochs of an equal-time
run (--budget-minutes): tools/espnet/espnet_budget.py.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

SPACE = "<space>"  # ESPnet's char tokenizer spells a space like this; asrkit's char tokenizer as "▁"
ASRKIT_SPACE = "\u2581"


class BenchError(ValueError):
    """A setting or an input the benchmark cannot use; the message says which and why."""


# ------------------------------------------------------------------ config mapping
def _unsupported(cfg: Any) -> List[str]:
    """The settings of an asrkit ExperimentConfig that have no ESPnet2 equivalent here."""
    m, enc, t = cfg.model, cfg.model.encoder, cfg.train
    bad = []
    if cfg.frontend.kind != "logmel":
        bad.append(f"frontend.kind {cfg.frontend.kind} (ESPnet's default frontend is STFT + log-mel: use logmel)")
    if cfg.frontend.utterance_cmn:
        bad.append("frontend.utterance_cmn (ESPnet normalises with one of global_mvn or utterance_mvn, not both)")
    if cfg.frontend.dither > 0:
        bad.append(f"frontend.dither {cfg.frontend.dither} (ESPnet's default frontend does not dither)")
    if cfg.frontend.log_floor != 1e-10:
        bad.append(f"frontend.log_floor {cfg.frontend.log_floor} (ESPnet's log-mel floors at 1e-10)")
    if cfg.speed_perturb.enabled:
        bad.append("speed_perturb.enabled (ESPnet perturbs speed offline, as copies of the data)")
    for kind in ("reverb", "noise", "vtlp", "band", "gain"):
        if getattr(cfg.augment, kind).prob > 0:  # the five AugmentConfig fields, each with a probability
            bad.append(f"augment.{kind}.prob {getattr(cfg.augment, kind).prob} (the benchmark maps no waveform "
                       "augmentation or VTLP to ESPnet: set it to 0)")
    if enc.kind not in ("transformer", "conformer"):
        bad.append(f"model.encoder.kind {enc.kind} (transformer or conformer)")
    else:
        if enc.dejavu_layer or (enc.interctc_layers and m.intermediate_loss != "interctc"):
            bad.append("model.encoder.dejavu_layer / model.intermediate_loss iterated (ESPnet's intermediate "
                       "CTC is InterCTC on the shared head)")
        if enc.interctc_layers and max(enc.interctc_layers) >= enc.num_layers:
            bad.append(f"model.encoder.interctc_layers {list(enc.interctc_layers)} (ESPnet takes layers "
                       f"1..{enc.num_layers - 1}: the last layer is the final CTC)")
        if enc.input_layer not in ("conv2d", "conv2d6", "conv2d8"):
            bad.append(f"model.encoder.input_layer {enc.input_layer}")
    if m.ctc_weight < 1.0 and m.decoder.kind != "transformer":
        bad.append(f"model.decoder.kind {m.decoder.kind} (a transformer decoder, or ctc_weight 1.0)")
    if t.scheduler not in ("warmup_inverse_sqrt", "warmup_cosine"):
        bad.append(f"train.scheduler {t.scheduler} (ESPnet's warmuplr is asrkit's warmup_inverse_sqrt, its "
                   "cosineannealingwarmuprestarts with one cycle asrkit's warmup_cosine)")
    if t.amp != "none" or t.mwer_weight > 0 or t.init_from:
        bad.append("train.amp/mwer_weight/init_from (the benchmark trains in fp32 from scratch)")
    return bad


def asrkit_overrides(cfg: Any, epochs: int) -> List[str]:
    """``--set`` overrides that make asrkit train the model ESPnet builds: ESPnet's conv2d subsampling has
    d_model channels, asrkit's ``conv_channels`` (0 = d_model) may be fewer; and the epochs."""
    enc = cfg.model.encoder
    out = [f"train.epochs={epochs}"]
    if enc.conv_channels not in (0, enc.d_model):
        out.append(f"model.encoder.conv_channels={enc.d_model}")
    return out


def asrkit_batch_bins(cfg: Any) -> int:
    """asrkit's batch budget (``data.max_frames`` of 10 ms) in samples, the unit of ESPnet's ``batch_bins``."""
    return int(cfg.data.max_frames * cfg.frontend.sample_rate // 100)


def _time_mask(cfg: Any, median_frames: Optional[float]) -> Dict[str, Any]:
    """asrkit caps a time mask at min(time_mask_width, floor(ratio * len)); ESPnet takes either a width range
    or a ratio range of the padded batch length. The cap binding for the median utterance is kept."""
    s = cfg.specaug
    if s.time_mask_ratio < 1.0 and median_frames is not None and s.time_mask_ratio * median_frames < s.time_mask_width:
        return {"time_mask_width_ratio_range": [0.0, s.time_mask_ratio]}
    # ESPnet draws widths with randint(lo, hi): hi is exclusive, asrkit's cap inclusive.
    return {"time_mask_width_range": [0, s.time_mask_width + 1]}


def _scheduler(t: Any, epochs: int, updates_per_epoch: Optional[int]) -> Dict[str, Any]:
    """ESPnet's scheduler for asrkit's ``train.scheduler`` (both stepped after every update)."""
    if t.scheduler == "warmup_inverse_sqrt":
        # WarmupLR: lr * w^0.5 * min(s^-0.5, s * w^-1.5) = lr * min(sqrt(w / s), s / w), asrkit's formula
        return {"scheduler": "warmuplr", "scheduler_conf": {"warmup_steps": max(1, t.warmup_steps)}}
    # warmup_cosine: one cycle of CosineAnnealingWarmupRestarts over all updates, from 0 up to lr over the
    # warm-up, then down to 0 (it gives update s the factor asrkit gives update s - 1: one update later).
    if not updates_per_epoch:
        raise BenchError("train.scheduler warmup_cosine needs ESPnet's updates per epoch (the cosine's length)")
    # A run no longer than its warm-up (the equal-time mode's probe) warms up all along: asrkit's cosine spans at
    # least warmup + 1 updates (asrkit.train.optim.lr_factor), and ESPnet's cycle must be longer than its warm-up.
    total = max(epochs * updates_per_epoch, t.warmup_steps + 1)
    return {"scheduler": "cosineannealingwarmuprestarts",
            "scheduler_conf": {"first_cycle_steps": total, "warmup_steps": t.warmup_steps, "max_lr": t.lr,
                               "min_lr": 0.0}}


def espnet_config(cfg: Any, epochs: int, *, median_frames: Optional[float] = None, cmvn: bool = True,
                  updates_per_epoch: Optional[int] = None) -> Dict[str, Any]:
    """An ESPnet2 asr.yaml (as a dict) for the asrkit ExperimentConfig ``cfg``: same features, SpecAugment,
    encoder, loss weights, optimizer, schedule, batch budget and epochs. ``median_frames``: the median
    training utterance in feature frames (chooses ESPnet's time-mask form, see :func:`_time_mask`);
    ``cmvn``: asrkit normalises with global CMVN stats (ESPnet then uses global_mvn on its own stats);
    ``updates_per_epoch``: ESPnet's batches per epoch (needed by a cosine schedule, whose length it sets)."""
    bad = _unsupported(cfg)
    if bad:
        raise BenchError("no ESPnet2 equivalent for: " + "; ".join(bad))
    f, s, d, m, enc, t = cfg.frontend, cfg.specaug, cfg.data, cfg.model, cfg.model.encoder, cfg.train
    out: Dict[str, Any] = {
        # Slaney-normalised librosa filters (ESPnet's) differ from asrkit's unnormalised HTK filters by a
        # constant per mel bin, which global mean normalisation removes; centred STFT frames (ESPnet) vs
        # snip-edges framing (asrkit) give 2 to 3 more frames per utterance.
        "frontend": "default",
        "frontend_conf": {"fs": f.sample_rate, "n_fft": f.n_fft, "win_length": f.win_length,
                          "hop_length": f.hop_length, "window": f.window, "n_mels": f.n_mels,
                          # ESPnet takes whole hertz here
                          "fmin": round(f.fmin), "fmax": round(f.sample_rate / 2 if f.fmax is None else f.fmax),
                          "htk": True},
        "normalize": "global_mvn" if cmvn else None,
        "specaug": "specaug" if s.enabled else None,
        "encoder": enc.kind,
        "encoder_conf": {"output_size": enc.d_model, "attention_heads": enc.num_heads, "linear_units": enc.ffn_dim,
                         "num_blocks": enc.num_layers, "dropout_rate": enc.dropout,
                         "positional_dropout_rate": enc.dropout, "attention_dropout_rate": enc.attention_dropout,
                         "input_layer": enc.input_layer, "normalize_before": enc.normalize_before},
        "model_conf": {"ctc_weight": m.ctc_weight, "lsm_weight": m.lsm_weight,
                       "length_normalized_loss": m.lsm_normalize == "token"},
        "ctc_conf": {"dropout_rate": 0.0},
        "optim": t.optimizer,  # adam | adamw: the same names in ESPnet
        "optim_conf": {"lr": t.lr, "betas": [0.9, 0.98], "eps": 1.0e-9, "weight_decay": t.weight_decay},
        **_scheduler(t, epochs, updates_per_epoch),
        # ESPnet's length sampler: batch size x longest utterance, in samples (+ the longest transcript in
        # characters, about 0.1% more); asrkit's: batch size x longest utterance in 10 ms frames.
        "batch_type": "length",
        "batch_bins": asrkit_batch_bins(cfg),
        "max_epoch": epochs,
        "grad_clip": t.grad_clip if t.grad_clip > 0 else -1,
        "accum_grad": t.accum_grad,
        "seed": t.seed,
        "num_workers": d.num_workers,
        "num_att_plot": 0,
        "keep_nbest_models": 1,
        "best_model_criterion": [["valid", "loss", "min"]],
    }
    if s.enabled:
        out["specaug_conf"] = {
            "apply_time_warp": s.time_warp > 0, "time_warp_window": max(1, s.time_warp), "time_warp_mode": "bicubic",
            "apply_freq_mask": s.num_freq_masks > 0, "freq_mask_width_range": [0, s.freq_mask_width + 1],
            "num_freq_mask": s.num_freq_masks,
            "apply_time_mask": s.num_time_masks > 0, **_time_mask(cfg, median_frames),
            "num_time_mask": s.num_time_masks,
            # False: masks take the batch mean (asrkit: the CMVN mean, 0 after normalisation); True would
            # put log-mel 0 (a loud bin) before ESPnet's normalisation.
            "replace_with_zero": False,
        }
    if enc.kind == "conformer":
        # asrkit's conformer has rotary positions; ESPnet's standard relative positions stand in for them.
        out["encoder_conf"].update({"pos_enc_layer_type": "rel_pos", "selfattention_layer_type": "rel_selfattn",
                                    "macaron_style": True, "use_cnn_module": True,
                                    "cnn_module_kernel": enc.conv_kernel, "activation_type": "swish",
                                    "rel_pos_type": "latest"})
    if enc.interctc_layers:
        # InterCTC: (1 - w) * final CTC + w * mean of the layers' CTC losses, the shared head on the final-normed
        # layer outputs, layers counted from 1, in both; self-conditioning adds Linear(V, d)(softmax) back.
        out["encoder_conf"].update({"interctc_layer_idx": sorted(enc.interctc_layers),
                                    "interctc_use_conditioning": enc.self_condition})
        out["model_conf"]["interctc_weight"] = m.interctc_weight
    if m.ctc_weight < 1.0:
        dec = m.decoder
        out["decoder"] = "transformer"
        out["decoder_conf"] = {"attention_heads": dec.num_heads, "linear_units": dec.ffn_dim,
                               "num_blocks": dec.num_layers, "dropout_rate": dec.dropout,
                               "self_attention_dropout_rate": dec.attention_dropout,
                               "src_attention_dropout_rate": dec.attention_dropout,
                               "normalize_before": dec.normalize_before}
    # ctc_weight 1.0: no decoder section; ESPnet then builds no decoder (and would drop one anyway).
    return out


def token_list(tokens: Sequence[str]) -> List[str]:
    """ESPnet's token list for an asrkit char tokenizer's tokens (specials first, as asrkit numbers them):
    the same units, ``<blank>`` 0, ``<unk>`` 1, the characters with ``▁`` spelled ``<space>``, ``<sos/eos>`` last."""
    from asrkit.text.tokenizer import SPECIALS

    chars = [SPACE if tok == ASRKIT_SPACE else tok for tok in tokens if tok not in SPECIALS]
    return ["<blank>", "<unk>", *chars, "<sos/eos>"]


def best_path_words(ids: Sequence[int], tokens: Sequence[str], utt: str) -> List[str]:
    """The words of one utterance's CTC best path: ``ids`` are the frame-wise argmax ids (T,) of ESPnet's CTC
    head, ``tokens`` its token list (``<blank>`` at 0). Repeats collapse, blanks go, ``<space>`` breaks words
    (leading, trailing and repeated spaces give no empty words); other tokens are kept as spelled, as ESPnet's
    char tokenizer does. An id outside the token list is an error naming ``utt``."""
    words: List[str] = []
    word: List[str] = []
    prev = -1
    for i in ids:
        if not 0 <= i < len(tokens):
            raise BenchError(f"utterance {utt}: token id {i} is outside the token list (0..{len(tokens) - 1}); "
                             "the config's token_list does not belong to this model")
        if i != prev and i != 0:
            if tokens[i] == SPACE:
                if word:
                    words.append("".join(word))
                word = []
            else:
                word.append(tokens[i])
        prev = i
    if word:
        words.append("".join(word))
    return words


def read_wav_scp(data_dir: str) -> List[Tuple[str, str]]:
    """``(utt, audio path)`` of a data dir's wav.scp; segments, command pipes and malformed lines are errors
    naming the file and line (the best-path decoder reads whole audio files, as ESPnet's 'sound' type)."""
    scp = os.path.join(data_dir, "wav.scp")
    if os.path.exists(os.path.join(data_dir, "segments")):
        raise BenchError(f"{data_dir}: has a segments file; the decoder reads whole files (extract the segments)")
    try:
        with open(scp, encoding="utf-8") as fh:
            lines = fh.readlines()
    except OSError as exc:
        raise BenchError(f"{scp}: {exc.strerror}") from None
    out = []
    for n, line in enumerate(lines, 1):
        parts = line.strip().split(maxsplit=1)
        if not parts:
            continue
        if len(parts) != 2:
            raise BenchError(f"{scp}:{n}: expected 'utt path', got {line.strip()!r}")
        if parts[1].endswith("|"):
            raise BenchError(f"{scp}:{n}: a command pipe; the decoder needs audio files")
        out.append((parts[0], parts[1]))
    if not out:
        raise BenchError(f"{scp}: empty")
    return out


def espnet_log_probs(config: str, model_file: str, data_dir: str) -> Iterator[Tuple[str, Any, List[str]]]:
    """``(utt, log_probs (T, V) float32 numpy, token list)`` of every utterance of ``data_dir`` (wav.scp) by an
    ESPnet2 ASR model's CTC head on the CPU, one utterance at a time (as the benchmark's ``asr_inference
    --batch_size 1``, so no padding enters the centred STFT). Needs espnet2 (run with .venv-espnet)."""
    utts = read_wav_scp(data_dir)
    for path in (config, model_file):
        if not os.path.isfile(path):
            raise BenchError(f"{path}: no such file")
    try:
        import soundfile
        import torch
        from espnet2.tasks.asr import ASRTask
        from tqdm import tqdm
    except ImportError as exc:
        raise BenchError(f"{exc}: run this with .venv-espnet's Python (tools/espnet/setup_espnet_env.sh)") from None
    model, train_args = ASRTask.build_model_from_file(config, model_file, device="cpu")
    model.eval()
    tokens = list(model.token_list)
    fs = (getattr(train_args, "frontend_conf", None) or {}).get("fs")
    with torch.inference_mode():
        for utt, path in tqdm(utts, desc="CTC head", unit="utt"):
            try:
                wav, sr = soundfile.read(path, dtype="float32")
            except (OSError, RuntimeError) as exc:  # soundfile raises LibsndfileError (a RuntimeError)
                raise BenchError(f"utterance {utt}: cannot read {path}: {exc}") from None
            if wav.ndim != 1:
                raise BenchError(f"utterance {utt}: {path} has {wav.shape[1]} channels; the model takes mono")
            if fs is not None and sr != int(fs):
                raise BenchError(f"utterance {utt}: {path} is {sr} Hz; the model was trained at {fs} Hz")
            speech = torch.from_numpy(wav)[None]  # (1, samples)
            enc, enc_lens = model.encode(speech, torch.tensor([speech.size(1)]))  # (1, T, D), (1,)
            if isinstance(enc, tuple):  # with InterCTC layers: (final output, [(layer, output), ...])
                enc = enc[0]
            yield utt, model.ctc.log_softmax(enc)[0, : int(enc_lens[0])].float().numpy(), tokens


def _write_text(out_dir: str, lines: Sequence[str]) -> None:
    """OUT/text, which appears only when complete."""
    os.makedirs(out_dir, exist_ok=True)
    text = os.path.join(out_dir, "text")
    with open(text + ".tmp", "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    os.replace(text + ".tmp", text)


def espnet_best_path(config: str, model_file: str, data_dir: str, out_dir: str) -> int:
    """Decode ``data_dir`` (wav.scp) with an ESPnet2 CTC model by best path (the argmax of its CTC head's
    log-probabilities, :func:`espnet_log_probs`) and write ``out_dir/text``. Returns the number of utterances."""
    lines = [f"{utt} {' '.join(best_path_words(lp.argmax(-1).tolist(), tokens, utt))}".rstrip() + "\n"
             for utt, lp, tokens in espnet_log_probs(config, model_file, data_dir)]
    _write_text(out_dir, lines)
    return len(lines)


def espnet_posteriors(config: str, model_file: str, data_dir: str, out_dir: str) -> int:
    """Write the CTC log-probabilities of every utterance of ``data_dir`` to ``out_dir/log_probs.npz`` (one
    (T, V) float32 array per utterance id, in wav.scp order) and the model's token list (its V columns) to
    ``out_dir/tokens.txt``: what tools/espnet/espnet_lm.py decodes with asrkit's search and an LM. Returns the
    number of utterances."""
    import numpy as np

    arrays: Dict[str, Any] = {}
    tokens: List[str] = []
    for utt, lp, tokens in espnet_log_probs(config, model_file, data_dir):
        arrays[utt] = lp
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "log_probs.npz")
    with open(path + ".tmp", "wb") as fh:  # the archive appears only when complete
        np.savez(fh, **arrays)
    os.replace(path + ".tmp", path)
    with open(os.path.join(out_dir, "tokens.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(tokens) + "\n")
    return len(arrays)


def median_frames(utt2dur: str) -> float:
    """The median utterance length of a data dir's utt2dur, in 10 ms frames."""
    try:
        with open(utt2dur, encoding="utf-8") as fh:
            durs = []
            for n, line in enumerate(fh, 1):
                parts = line.split()
                if len(parts) != 2:
                    raise BenchError(f"{utt2dur}:{n}: expected 'utt seconds', got {line.strip()!r}")
                durs.append(float(parts[1]))
    except OSError as exc:
        raise BenchError(f"{utt2dur}: {exc.strerror} (write it with tools/compute_utt2dur.py)") from None
    if not durs:
        raise BenchError(f"{utt2dur}: empty")
    return statistics.median(durs) * 100


def espnet_batch_count(lengths: Sequence[int], batch_bins: int) -> int:
    """Batches per epoch of ESPnet's length sampler (batch_type length, padding): utterances in ascending
    order join the current batch until ``batch size x the newest one's length`` exceeds ``batch_bins``;
    the one that crosses the budget stays in the batch. ``lengths``: speech samples + transcript tokens."""
    count, size = 0, 0
    for n in sorted(lengths):
        size += 1
        if size * n > batch_bins:
            count, size = count + 1, 0
    return count + (size > 0)


def match_batch_bins(lengths: Sequence[int], target: int, start: int) -> int:
    """The smallest ``batch_bins`` giving ESPnet at most ``target`` batches (the count falls as the budget
    grows); ``start`` (asrkit's budget in samples) when it already does."""
    lo, hi = 1, max(start, 1)
    while espnet_batch_count(lengths, hi) > target:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if espnet_batch_count(lengths, mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def asrkit_batch_count(cfg: Any, durations: Sequence[float]) -> int:
    """Batches in asrkit's first training epoch (its bucketing sampler on the kept durations)."""
    from asrkit.data.sampler import BucketBatchSampler

    d = cfg.data
    kept = [x for x in durations if d.min_duration <= x <= d.max_duration]
    sampler = BucketBatchSampler(kept, d.max_frames, d.max_batch_size, seed=cfg.train.seed,
                                 num_replicas=1, rank=0, bucket_width=d.bucket_width)
    return len(sampler)


def read_table(path: str) -> Dict[str, str]:
    """A Kaldi table: ``utt rest-of-line``; a malformed line is an error naming the file and line."""
    out = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            parts = line.strip().split(maxsplit=1)
            if not parts:
                continue
            out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def check_data_dir(path: str) -> None:
    """ESPnet reads wav.scp as sound files: no segments, no command pipes."""
    for name in ("wav.scp", "text", "utt2dur"):
        if not os.path.isfile(os.path.join(path, name)):
            raise BenchError(f"{path}: no {name} (utt2dur: tools/compute_utt2dur.py)")
    if os.path.exists(os.path.join(path, "segments")):
        raise BenchError(f"{path}: has a segments file; the benchmark reads whole files (extract the segments)")
    with open(os.path.join(path, "wav.scp"), encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.rstrip().endswith("|"):
                raise BenchError(f"{path}/wav.scp:{n}: a command pipe; ESPnet's 'sound' type needs audio files")


# ------------------------------------------------------------------ subcommands
def cmd_config(args: argparse.Namespace) -> None:
    import yaml

    from asrkit.config import load_config

    cfg = load_config(args.asrkit_config, args.set)
    check_data_dir(args.train)
    # The same number of updates per epoch: ESPnet's budget is set to give asrkit's batch count (its sampler
    # lets the utterance that crosses the budget into the batch, asrkit's stays within it).
    durs = {u: float(v) for u, v in read_table(os.path.join(args.train, "utt2dur")).items()}
    texts = read_table(os.path.join(args.train, "text"))
    lengths = [round(durs[u] * cfg.frontend.sample_rate) + len(" ".join(texts.get(u, "").split())) for u in durs]
    target = asrkit_batch_count(cfg, list(durs.values()))
    bins = match_batch_bins(lengths, target, asrkit_batch_bins(cfg))
    batches = espnet_batch_count(lengths, bins)
    conf = espnet_config(cfg, args.epochs, median_frames=median_frames(os.path.join(args.train, "utt2dur")),
                         cmvn=cfg.cmvn is not None or args.cmvn, updates_per_epoch=batches)
    conf["batch_bins"] = bins
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batches.json"), "w", encoding="utf-8") as fh:
        json.dump({"asrkit": target, "espnet": batches, "espnet_batch_bins": bins}, fh)
    with open(os.path.join(args.out, "asr.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(conf, fh, sort_keys=False)
    with open(os.path.join(args.out, "asrkit_overrides.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join([*args.set, *asrkit_overrides(cfg, args.asrkit_epochs or args.epochs)]) + "\n")


def cmd_tokens(args: argparse.Namespace) -> None:
    from asrkit.text.tokenizer import CharTokenizer, load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    if not isinstance(tok, CharTokenizer):
        raise BenchError(f"{args.tokenizer}: the benchmark compares character models (a char tokenizer)")
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(token_list(tok.token_list)) + "\n")


def cmd_greedy(args: argparse.Namespace) -> None:
    n = espnet_best_path(args.config, args.model, args.data, args.out)
    print(f"best path: {n} utterances into {os.path.join(args.out, 'text')}", file=sys.stderr)


def cmd_posteriors(args: argparse.Namespace) -> None:
    n = espnet_posteriors(args.config, args.model, args.data, args.out)
    print(f"CTC log-probabilities: {n} utterances into {os.path.join(args.out, 'log_probs.npz')}", file=sys.stderr)


def text_shapes(stats_dir: str, vocab_size: int) -> None:
    """collect_stats writes ``utt L``; ESPnet's trainer wants ``utt L,V`` in ``text_shape.char``."""
    for split in ("train", "valid"):
        src = os.path.join(stats_dir, split, "text_shape")
        if not os.path.isfile(src):
            raise BenchError(f"{src}: missing (did collect_stats run?)")
        with open(src, encoding="utf-8") as fi, open(src + ".char", "w", encoding="utf-8") as fo:
            for line in fi:
                if line.strip():
                    fo.write(f"{line.rstrip()},{vocab_size}\n")


def cmd_text_shapes(args: argparse.Namespace) -> None:
    with open(args.token_list, encoding="utf-8") as fh:
        vocab = sum(1 for line in fh if line.strip())
    text_shapes(args.stats, vocab)


def load_record(path: str) -> Dict[str, Any]:
    """A JSON record of the benchmark (timings.json, step_time.json); {} while the file does not exist."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def cmd_timed(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise BenchError("timed: no command after --")
    if args.name in load_record(args.record):
        print(f"{args.name}: already timed in {args.record}; not run again", file=sys.stderr)
        return 0
    start = time.perf_counter()
    rc = subprocess.call(cmd)
    seconds = time.perf_counter() - start
    if rc != 0:
        raise BenchError(f"timed {args.name}: '{' '.join(cmd)}' failed with exit status {rc}")
    add_to_record(args.record, args.name, seconds)
    return 0


def add_to_record(path: str, name: str, value: Any) -> None:
    """Set ``name`` in the JSON record ``path``, under a lock: the equal-time mode's two trainings end at
    about the same time and each adds its wall time (read, update, replace), and neither may be lost."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        record = load_record(path)
        record[name] = value
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)
        os.replace(path + ".tmp", path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("--asrkit-config", required=True)
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--epochs", type=int, required=True)
    c.add_argument("--asrkit-epochs", type=int, help="asrkit's epochs when they differ from ESPnet's (--epochs; "
                   "bench_espnet.sh --budget-minutes: each toolkit's own)")
    c.add_argument("--train", required=True, help="the training Kaldi dir (its utt2dur)")
    c.add_argument("--cmvn", action="store_true", help="asrkit trains with --cmvn (global_mvn for ESPnet)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_config)
    c = sub.add_parser("tokens")
    c.add_argument("--tokenizer", required=True)
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_tokens)
    c = sub.add_parser("text-shapes")
    c.add_argument("--stats", required=True)
    c.add_argument("--token-list", required=True)
    c.set_defaults(func=cmd_text_shapes)
    c = sub.add_parser("timed")
    c.add_argument("--record", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("cmd", nargs=argparse.REMAINDER)
    c.set_defaults(func=cmd_timed)
    for name, func, what, writes in (
            ("greedy", cmd_greedy, "CTC best-path decoding (run with .venv-espnet)", "writes OUT/text"),
            ("posteriors", cmd_posteriors, "CTC log-probabilities to OUT/log_probs.npz (.venv-espnet)",
             "writes OUT/log_probs.npz and OUT/tokens.txt")):
        c = sub.add_parser(name, help=f"ESPnet model, {what}")
        c.add_argument("--config", required=True, help="the experiment's config.yaml")
        c.add_argument("--model", required=True, help="the weights, e.g. exp/10epoch.pth")
        c.add_argument("--data", required=True, help="a Kaldi data dir (its wav.scp)")
        c.add_argument("--out", required=True, help=writes)
        c.set_defaults(func=func)
    args = p.parse_args(argv)
    try:
        return args.func(args) or 0
    except BenchError as exc:
        print(f"espnet_bench.py {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
