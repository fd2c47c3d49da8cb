"""Compute global CMVN statistics of a data dir's features and write them as JSON.

Features come from the ``frontend`` section of ``--config`` (default: the
FrontendConfig defaults), computed without augmentation. Utterances are read
and featurised one at a time, so memory does not grow with the corpus.
Unreadable utterances are skipped with a warning naming them; the run fails
only if no frame at all could be computed.

    asrkit compute-cmvn data/train exp/cmvn.json --config conf/tiny_ctc.yaml
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from tqdm import tqdm

from asrkit.audio.cmvn import CMVNError, CMVNStats
from asrkit.audio.frontend import build_frontend
from asrkit.audio.utterance_cmn import UtteranceCMN, build_utterance_cmn
from asrkit.audio.io import AudioError, load_audio
from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.config import ConfigError, FrontendConfig, load_config, to_dict
from asrkit.data.datadir import DataDirError, Utterance, read_data_dir
from asrkit.data.table import TableError


@dataclass
class CMVNResult:
    stats: CMVNStats
    used: int = 0  # utterances that contributed frames
    skipped: Dict[str, str] = field(default_factory=dict)  # utt -> reason


def _pick_evenly(items: List[Utterance], n: Optional[int]) -> List[Utterance]:
    """``n`` items spread evenly over the list (not the first ``n``: sorted ids cluster by speaker)."""
    if n is None or n >= len(items):
        return items
    return [items[(i * len(items)) // n] for i in range(n)]


def compute_cmvn(data_dir: str | os.PathLike, out: Optional[str | os.PathLike] = None,
                 frontend_cfg: FrontendConfig = FrontendConfig(), *, max_utts: Optional[int] = None,
                 device: str = "cpu", progress: bool = True) -> CMVNResult:
    """Accumulate CMVN stats over the utterances of ``data_dir`` and (if ``out``) save them.

    With ``max_utts``, that many utterances evenly spaced over the sorted ids
    are used. Raises :class:`CMVNError` if no frames could be computed.
    """
    dd = read_data_dir(data_dir)
    extractor = build_frontend(frontend_cfg).to(device).eval()
    cmn = build_utterance_cmn(frontend_cfg)  # only the whole utterance's mean comes before global CMVN
    utterance_cmn = cmn if isinstance(cmn, UtteranceCMN) else None
    utts = _pick_evenly(list(dd.utterances()), max_utts)
    stats = CMVNStats(extractor.output_dim, meta={"frontend": to_dict(frontend_cfg)})
    result = CMVNResult(stats)

    def skip(utt: str, reason: str) -> None:
        result.skipped[utt] = reason
        tqdm.write(f"warning: skipping utterance {utt}: {reason}", file=sys.stderr)

    with torch.inference_mode():
        for u in tqdm(utts, desc="compute-cmvn", unit="utt", disable=not progress, file=sys.stderr):
            if u.source is None:
                skip(u.utt, f"no audio entry in {os.path.join(os.fspath(data_dir), 'wav.scp')}"
                             f"{' / segments' if dd.segments is not None else ''}")
                continue
            try:
                wav = load_audio(u.source, frontend_cfg.sample_rate, start=u.start, end=u.end, name=u.utt)
            except AudioError as exc:
                skip(u.utt, str(exc))
                continue
            wav = wav.to(device)[None]  # (1, T)
            feats, feat_lens = extractor(wav, torch.tensor([wav.size(1)], device=device))
            if utterance_cmn is not None:  # stats of what the model's global CMVN will see
                feats, feat_lens = utterance_cmn(feats, feat_lens)
            if int(feat_lens[0]) == 0:
                skip(u.utt, f"{wav.size(1)} samples is shorter than one analysis window")
                continue
            stats.update(feats, feat_lens)
            result.used += 1
    if stats.frame_count == 0:
        raise CMVNError(f"{data_dir}: no features computed ({len(result.skipped)} of {len(utts)} "
                        f"utterances skipped)")
    stats.meta.update(num_utts=result.used, num_skipped=len(result.skipped))
    if out is not None:
        stats.save(out)  # its parent directories created
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="asrkit compute-cmvn", description=__doc__.strip().splitlines()[0])
    parser.add_argument("data_dir", help="Kaldi data dir (wav.scp, optional segments)")
    parser.add_argument("out", help="output stats file (JSON)")
    parser.add_argument("--config", help="experiment YAML; its frontend section defines the features")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a value of --config, as for asrkit train (repeatable)")
    parser.add_argument("--max-utts", type=int, help="use at most N utterances, evenly spaced over the data dir")
    add_device_option(parser, "where the features are computed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.max_utts is not None and args.max_utts < 1:
        parser.error(f"--max-utts must be >= 1, got {args.max_utts}")
    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        print(f"asrkit compute-cmvn: {exc}", file=sys.stderr)
        return 2
    if args.overrides and not args.config:
        parser.error("--set overrides a value of --config: give --config too")
    try:
        cfg = load_config(args.config, args.overrides).frontend if args.config else FrontendConfig()
        res = compute_cmvn(args.data_dir, args.out, cfg, max_utts=args.max_utts, device=device,
                           progress=not args.no_progress)
    except (ConfigError, CMVNError, DataDirError, TableError) as exc:
        print(f"asrkit compute-cmvn: error: {exc}", file=sys.stderr)
        return 1
    print(f"compute-cmvn: {res.stats.frame_count} frames from {res.used} utterances "
          f"({len(res.skipped)} skipped) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
