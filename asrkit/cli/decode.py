"""Decode a Kaldi data dir with a trained model into a Kaldi text file (greedy CTC, beam searches, LM fusion).

With --nj N the data dir is split into N shards decoded by N local processes and merged in utterance order;
under torchrun each rank decodes one shard. Finished shards are kept: a rerun decodes only the missing ones.
With --streaming each utterance is decoded as a live stream (fed --chunk-ms at a time), into the same outputs.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, List, Optional

from asrkit.cli.decode_options import add_decode_options, add_streaming_options, decode_config_from_args
from asrkit.cli.device import DeviceError, add_device_option, resolve_device

if TYPE_CHECKING:
    from asrkit.config import DecodeConfig
    from asrkit.pipeline import Transcriber


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train'")
    p.add_argument("--data", required=True, help="Kaldi data dir to decode")
    p.add_argument("--out", required=True, help="output dir; hypotheses go to OUT/text, settings to OUT/decode.yaml")
    p.add_argument("--checkpoint", help="checkpoint file (default: MODEL/model.pt)")
    p.add_argument("--batch-size", type=int,
                   help="utterances per batch (default: the config's batch_size; when that is null, 16, or on CUDA "
                        "as many as fill decode.gpu_memory_fraction of the free GPU memory, by seconds of audio)")
    add_device_option(p, "with --nj, cuda spreads the shards over the visible GPUs")
    p.add_argument("--nj", type=int, default=1,
                   help="number of shards, each decoded by its own local process with cpus/N threads "
                        "(OUT/split<N>/<k>, logs in OUT/log/decode.<k>.log); under torchrun the number of ranks")
    p.add_argument("--max-utt-seconds", type=float, metavar="S",
                   help="utterances longer than S seconds (default 60) are split at pauses and decoded in segments, "
                        "as 'asrkit transcribe' splits recordings, then joined; shorter ones are decoded whole")
    add_decode_options(p)
    add_streaming_options(p)
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        print(f"asrkit decode: {exc}", file=sys.stderr)
        return 2
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if args.nj < 1:
        p.error(f"--nj must be >= 1, got {args.nj}")
    if args.chunk_ms is not None and not args.streaming:
        p.error("--chunk-ms applies to --streaming")
    if args.streaming and (args.nj > 1 or args.max_utt_seconds is not None):
        p.error("--streaming decodes in one process and splits long utterances at endpoints: leave out --nj and "
                "--max-utt-seconds")
    if args.max_utt_seconds is not None and not args.max_utt_seconds > 0:
        p.error(f"--max-utt-seconds must be > 0, got {args.max_utt_seconds}")
    for path, what in ((args.model, "--model"), (args.data, "--data")):
        if not os.path.isdir(path):
            p.error(f"{what} {path}: no such directory")
    from asrkit.pipeline.sharded import torchrun_world

    rank, world, _ = torchrun_world()
    if world > 1 and args.streaming:
        p.error("--streaming decodes in one process: run it without torchrun")
    if world > 1 and args.nj not in (1, world):
        p.error(f"under torchrun every rank decodes one shard: --nj {args.nj} differs from WORLD_SIZE {world} "
                f"(leave --nj out)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from asrkit.pipeline import Transcriber
    from asrkit.rundir_lock import RunDirBusy, RunDirLock

    try:
        decode = decode_config_from_args(args)
        # built once here even when shards decode: a bad model dir, checkpoint or search setting is one clear
        # message now rather than one traceback per shard
        transcriber = Transcriber.from_dir(args.model, device="cpu" if world > 1 or args.nj > 1 else device,
                                           checkpoint=args.checkpoint, decode=decode)
    except (FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError
        print(f"asrkit decode: {exc}", file=sys.stderr)
        return 1
    if world > 1 or args.nj > 1:
        transcriber = None  # the shards' processes load their own
    try:
        with RunDirLock(args.out, enabled=rank == 0):  # one decode per out dir; torchrun's ranks share rank 0's
            return _decode(args, transcriber, decode, device, world)
    except RunDirBusy as exc:
        print(f"asrkit decode: {exc}", file=sys.stderr)
        return 1


def _decode(args: argparse.Namespace, transcriber: Optional[Transcriber], decode: DecodeConfig, device: str,
            world: int) -> int:
    """Decode ``args.data`` into ``args.out``: with ``transcriber`` in this process, else in shards' processes
    (``--nj``) or torchrun's ranks."""
    from asrkit.pipeline.decode_dir import MAX_UTTERANCE_SECONDS, decode_data_dir
    from asrkit.pipeline.sharded import DecodeJob, ShardError, decode_distributed, decode_sharded

    max_seconds = args.max_utt_seconds or MAX_UTTERANCE_SECONDS
    try:
        if transcriber is not None and args.streaming:
            from asrkit.pipeline.streaming_files import decode_data_dir_streaming

            counts = decode_data_dir_streaming(transcriber, args.data, args.out, args.batch_size)
        elif transcriber is not None:
            counts = decode_data_dir(transcriber, args.data, args.out, args.batch_size, max_seconds)
        else:
            job = DecodeJob(args.model, decode, args.checkpoint, device, args.batch_size, max_seconds)
            counts = (decode_distributed(job, args.data, args.out) if world > 1 else
                      decode_sharded(job, args.data, args.out, args.nj))
    except (ShardError, ValueError, OSError) as exc:  # DataDirError and TableError are ValueErrors
        print(f"asrkit decode: {exc}", file=sys.stderr)
        return 1
    if counts is None or not counts["failed"]:  # (None: a torchrun rank other than 0, which merges and reports)
        return 0
    listed = os.path.join(args.out, "failed")
    if not counts["decoded"]:
        print(f"asrkit decode: no utterance could be decoded ({counts['failed']} failed, listed in {listed})",
              file=sys.stderr)
        return 1
    print(f"asrkit decode: {counts['failed']} of {counts['decoded'] + counts['failed']} utterances failed "
          f"(listed in {listed}); the others are in {os.path.join(args.out, 'text')}", file=sys.stderr)
    return 0
