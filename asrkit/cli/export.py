"""Export a trained model's frontend (with CMVN), encoder and CTC head to ONNX or TorchScript.

The file takes waveforms ``wav`` (B, S) float32 and ``wav_lens`` (B,) int64 with any batch and length and gives
CTC ``log_probs`` (B, T, V) and ``lens`` (B,); it carries the tokenizer, sample rate and frame shift, so
``asrkit transcribe --model OUT`` needs nothing else. ONNX runs in onnxruntime and is safe to load from anyone;
loading a TorchScript file runs code stored in it (load only your own).

    asrkit export --model exp/tiny_ctc --format onnx exp/tiny_ctc/model.onnx
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from asrkit.cli.device import DeviceError, resolve_device


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train'")
    p.add_argument("--format", required=True, choices=["onnx", "torchscript"], help="file format to write")
    p.add_argument("--device", default="cpu",
                   help="TorchScript only: cpu, cuda or cuda:N, the device the trace runs on and is bound to (default: "
                        "cpu, unlike the other commands, so that the file loads on any machine); ONNX is exported on "
                        "the CPU and runs on any onnxruntime provider")
    p.add_argument("--checkpoint", help="weights to export instead of MODEL/model.pt (e.g. an epoch checkpoint)")
    p.add_argument("out", help="output file (e.g. model.onnx, model.ts)")
    args = p.parse_args(argv)
    if args.device != "cpu" and args.format == "onnx":
        p.error(f"--device {args.device} applies to --format torchscript (an ONNX file runs on any device)")
    try:
        resolve_device(args.device)
    except DeviceError as exc:
        print(f"asrkit export: {exc}", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(args.model, "config.yaml")):
        print(f"asrkit export: {args.model}: not an experiment directory (no config.yaml)", file=sys.stderr)
        return 2
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        print(f"asrkit export: --checkpoint {args.checkpoint}: no such file", file=sys.stderr)
        return 2
    if os.path.isdir(args.out):
        print(f"asrkit export: {args.out} is a directory; give the output file's name", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from asrkit.config import ConfigError
    from asrkit.pipeline.export import ExportError, export_from_dir

    try:
        info = export_from_dir(args.model, args.out, args.format, args.checkpoint, args.device)
    except (ExportError, ConfigError, FileNotFoundError) as exc:
        print(f"asrkit export: {args.model}: {exc}", file=sys.stderr)
        return 2
    meta = info.metadata
    limit = ("any length" if meta["max_samples"] is None
             else f"up to {meta['max_samples'] / meta['sample_rate']:.0f} s per row")
    print(f"exported {args.model} to {info.path} ({info.format}, {os.path.getsize(info.path) / 1e6:.1f} MB, "
          f"{info.seconds:.1f} s): {meta['vocab_size']} tokens, {meta['sample_rate']} Hz, "
          f"{meta['frame_shift'] * 1000:.0f} ms per frame, {limit}")
    return 0
