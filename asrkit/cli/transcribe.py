"""Transcribe audio of any length with a trained (or exported) model: words with times and confidences.

INPUT: audio files (read as files whatever their names hold: a *.scp among them too, so a glob over a
folder runs nothing), directories (searched recursively for wav/flac/ogg/mp3), or - for standard input:
the bytes of one audio file (cat a.wav | asrkit transcribe -), or a list of paths one per line.
--scp FILE: a Kaldi wav.scp (id source), the one place where "cmd |" sources run, as trusted recipe data;
its entries come before the INPUTs. Long recordings are split by voice activity (--segmenter).
Audio is read and featurized in --num-workers loader processes while the model runs; segments are batched
by --batch-seconds of audio. Each result is written as soon as it and those before it are finished (to
stdout, flushed, or one whole file per input in --output-dir), so a stopped run keeps what it finished; the
progress bar counts seconds of audio. A missing or unreadable input is named on stderr when its turn comes
and the rest are transcribed; the exit status is 1 when any input failed. At the end: inputs, audio, wall
time, real-time factor and where the time went.
--streaming decodes each input as a live stream instead (fed --chunk-ms at a time, split into utterances by
endpoints, not by --segmenter): the same outputs; --partials adds the partial results to --format jsonl.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Iterator, List, Optional

from asrkit.atomic import check_writable_dir
from asrkit.cli.decode_options import add_decode_options, add_streaming_options, decode_config_from_args
from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.pipeline.formats import FORMATS, format_partial, write_results
from asrkit.pipeline.inputs import expand_arguments, read_scp
from asrkit.pipeline.results import Result
from asrkit.pipeline.stream import SEGMENTERS

if TYPE_CHECKING:
    from asrkit.pipeline.streaming import Partial

EXPORTED_SUFFIXES = (".onnx", ".pt", ".ts", ".torchscript")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asrkit transcribe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="experiment dir written by 'asrkit train', or a file written by 'asrkit export' "
                        "(.onnx, or TorchScript .pt/.ts: CTC searches only)")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="audio file, directory, or - (audio bytes or a list of paths on stdin)")
    p.add_argument("--scp", action="append", default=[], metavar="FILE",
                   help="a wav.scp to transcribe (repeatable); its 'cmd |' sources run as shell commands, so "
                        "name only lists you trust")
    p.add_argument("--checkpoint", help="checkpoint file (default: MODEL/model.pt)")
    p.add_argument("--trust-torchscript", action="store_true",
                   help="let --model be a TorchScript file: loading one runs code stored in it, so give this only "
                        "for files from an author you trust (ONNX files need no trust; a .onnx must be ONNX)")
    add_device_option(p)
    p.add_argument("--batch-seconds", type=float,
                   help="audio per batch, counting padding (default 120; on CUDA as much as fills "
                        "decode.gpu_memory_fraction of the free GPU memory)")
    p.add_argument("--num-workers", type=int, default=min(2, max(0, (os.cpu_count() or 1) - 1)),
                   help="loader processes reading audio and computing features (0: in the main process)")
    p.add_argument("--segmenter", choices=SEGMENTERS, default="energy",
                   help="energy: split at pauses found by frame energy (default; vad is its old name); silero: at "
                        "pauses found by the Silero VAD (pip install -e '.[vad]'); fixed: overlapping windows "
                        "stitched at the seams; none: each input as one utterance")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    p.add_argument("--output-dir", help="write one file per input there (default: everything to stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_decode_options(p)
    add_streaming_options(p)
    p.add_argument("--partials", action="store_true",
                   help="with --streaming --format jsonl to stdout: also a {name, partial, start} line whenever an "
                        "input's partial text changes, before its result")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        print(f"asrkit transcribe: {exc}", file=sys.stderr)
        return 2
    if args.batch_seconds is not None and args.batch_seconds <= 0:
        p.error("--batch-seconds must be > 0")
    if args.num_workers < 0:
        p.error("--num-workers must be >= 0")
    if not args.inputs and not args.scp:
        p.error("give an INPUT or --scp FILE")
    exported = os.path.isfile(args.model) and args.model.endswith(EXPORTED_SUFFIXES)
    if args.chunk_ms is not None and not args.streaming:
        p.error("--chunk-ms applies to --streaming")
    if args.partials and not (args.streaming and args.format == "jsonl" and args.output_dir is None):
        p.error("--partials needs --streaming and --format jsonl, written to stdout (no --output-dir)")
    if args.streaming and exported:
        p.error("--streaming needs an experiment dir: an exported model has no chunk-step graph yet")
    if not exported and not os.path.isdir(args.model):
        p.error(f"--model {args.model}: not an experiment dir nor an exported model ({', '.join(EXPORTED_SUFFIXES)})")
    if exported and args.checkpoint:
        p.error("--checkpoint applies to an experiment dir, not to an exported model")
    if args.output_dir is not None:
        try:
            check_writable_dir(args.output_dir)  # now, not after the first input's work
        except OSError as exc:
            print(f"asrkit transcribe: --output-dir {args.output_dir}: cannot write there: {exc.strerror}",
                  file=sys.stderr)
            return 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("asrkit.pipeline.autobatch").setLevel(logging.INFO)  # the batch chosen on a GPU, once
    for arg in args.inputs:
        if arg.endswith(".scp") and os.path.isfile(arg):
            print(f"asrkit transcribe: {arg} is an INPUT, read as audio: a wav.scp list is read with --scp FILE "
                  f"(only there do its 'cmd |' sources run)", file=sys.stderr)
    from asrkit.pipeline import Transcriber

    try:
        inputs = [x for scp in args.scp for x in read_scp(scp)]
        inputs += expand_arguments(args.inputs, stdin=sys.stdin.buffer)
        decode = decode_config_from_args(args)
        options = dict(segmenter=args.segmenter, batch_seconds=args.batch_seconds)
        if exported:
            transcriber = Transcriber.from_exported(args.model, device=device, decode=decode,
                                                    trust_torchscript=args.trust_torchscript, **options)
        else:
            transcriber = Transcriber.from_dir(args.model, device=device, checkpoint=args.checkpoint,
                                               decode=decode, **options)
    except (FileNotFoundError, ValueError) as exc:  # ConfigError and TableError are ValueErrors
        print(f"asrkit transcribe: {exc}", file=sys.stderr)
        return 1
    if args.format in ("srt", "vtt") and args.output_dir is None and len(inputs) > 1:
        print(f"asrkit transcribe: --format {args.format} writes one file per input and INPUT holds {len(inputs)}: "
              f"give --output-dir", file=sys.stderr)
        return 2
    failed = 0

    def results() -> Iterator[Result]:
        """Each Result as it is finished, its failure named on stderr then."""
        nonlocal failed
        if args.streaming:
            from asrkit.pipeline.streaming_files import transcribe_streaming

            def partial(name: str, part: Partial) -> None:
                sys.stdout.write(format_partial(name, part.text, part.start))
                sys.stdout.flush()

            found = transcribe_streaming(transcriber, inputs, num_workers=args.num_workers,
                                         on_partial=partial if args.partials else None)
        else:
            found = transcriber.transcribe_iter(inputs, num_workers=args.num_workers, progress=not args.no_progress)
        for r in found:
            if not r.ok:
                failed += 1
                print(f"asrkit transcribe: {r.error}", file=sys.stderr)
            yield r

    write_results(results(), args.format, out_dir=args.output_dir, stream=sys.stdout)
    print(f"asrkit transcribe: {transcriber.stats.summary()}", file=sys.stderr)
    if failed:
        print(f"asrkit transcribe: {failed} of {len(inputs)} inputs failed", file=sys.stderr)
    return 1 if failed else 0
