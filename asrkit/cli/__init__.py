"""The ``asrkit`` command: a thin dispatcher over one module per subcommand.

Each module named in :data:`SUBCOMMANDS` exposes ``main(argv) -> int``.
Modules are imported lazily, so ``asrkit --help`` and ``asrkit score`` stay fast.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import List, Optional

from asrkit.extras import MissingExtraError

# name -> (module, one-line help)
SUBCOMMANDS = {
    "average": ("asrkit.cli.average", "average the best K epoch checkpoints of an experiment into model.pt"),
    "compute-cmvn": ("asrkit.cli.compute_cmvn", "global mean/variance statistics of a data dir's features"),
    "decode": ("asrkit.cli.decode", "decode a Kaldi data dir with a trained model into a Kaldi text file"),
    "export": ("asrkit.cli.export", "export a model's frontend + encoder + CTC head to ONNX or TorchScript"),
    "score": ("asrkit.cli.score", "WER/CER of a hypothesis text against a reference, sclite-style reports"),
    "serve": ("asrkit.cli.serve", "serve a model: live WebSocket streams, file uploads, a browser page, metrics"),
    "stream-client": ("asrkit.cli.stream_client", "send recordings to 'asrkit serve' as live streams, print partials "
                                                  "and finals (JSONL)"),
    "train": ("asrkit.cli.train", "train a model from a YAML config into an experiment dir"),
    "train-lm": ("asrkit.cli.train_lm", "train a neural LM (LSTM or Transformer) on text into an LM dir"),
    "train-ngram": ("asrkit.cli.train_ngram", "train an ARPA n-gram LM (word or token units) with KenLM's lmplz"),
    "train-tokenizer": ("asrkit.cli.train_tokenizer", "train a char or sentencepiece tokenizer on a text file"),
    "transcribe": ("asrkit.cli.transcribe", "transcribe audio files with a trained model"),
    "tune-fusion": ("asrkit.cli.tune_fusion", "choose the LM weight and length bonus on a dev set (grid, WER)"),
}

TORCHAUDIO_HINT = (
    "asrkit: torchaudio cannot load with the installed torch ({detail}); this happens when torch is a CPU-only "
    "build but torchaudio is the registry's CUDA build. Fix: pip install 'torch==2.14.1' 'torchaudio==2.11.*' "
    "(matching builds), or run 'make install'."
)


def usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: asrkit <command> [options]", "", "commands:"]
    for name, (_, summary) in sorted(SUBCOMMANDS.items()):
        lines.append(f"  {name:<{width}}  {summary}")
    lines += ["", "Run 'asrkit <command> --help' for a command's options."]
    return "\n".join(lines)


def _is_torchaudio_abi_error(exc: BaseException) -> bool:
    text = f"{exc}"
    return "libc10_cuda" in text or ("torchaudio" in text and "undefined symbol" in text)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        from asrkit import __version__
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"asrkit: unknown command '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except (ImportError, OSError) as exc:
        if _is_torchaudio_abi_error(exc):
            print(TORCHAUDIO_HINT.format(detail=str(exc).splitlines()[0]), file=sys.stderr)
            return 1
        raise
    try:
        return int(module.main(rest) or 0)
    except MissingExtraError as exc:  # an optional package this command needs: one line naming its extra
        print(f"asrkit: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`asrkit score ... | head -n 1`): stop quietly, as Unix tools do on SIGPIPE,
        # and point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except OSError as exc:
        if exc.errno is None:
            raise
        # the machine's refusal (a full disk, a read-only file system, a missing file): its message names the
        # file, and a traceback would add nothing to act on
        print(f"asrkit {name}: {exc}", file=sys.stderr)
        return 1

