#!/usr/bin/env python3
"""The GPU search side by side with its peers on the same inputs, in one run sized for a 15-minute GPU lease.

Usage: tools/bench/bench_gpu_search.py [--device cuda] [--lm-dir .bench_lm] [--out results.md]
           [--sections search lm e2e] [--vocabs 29 500] [--batches 32 2048] [--lm-batches 32 512] [--lm-units bpe500]
           [--e2e-batches 32 256]
           [--frames 250] [--beam 10] [--repeats 3] [--config conf/mini_medium.yaml]

Every row is one batch of 10 s utterances (250 frames of 40 ms), timed best of --repeats after a warm-up call
(which captures the graph of a new bucket), hypotheses read back to the host inside the timing. Figures:
utterances per second and RTFx (audio seconds per wall second).

* ``search``: the search alone, no LM, beam --beam, on peaky random log-probs (tools/bench/bench_decode_inputs.py)
  of each of --vocabs at each of --batches: greedy; asrkit's torch loop eager (``cuda_graph=False``) and
  captured once per bucket and replayed with the torch step (``ASRKIT_FUSED_STEP=0``); torchaudio's
  ``cuda_ctc_decoder`` (no LM) at the same beam and blank-skip threshold (0.999); the captured loop with its CTC
  step as one Triton kernel on tables the host builds (``+ fused step``, :mod:`asrkit.search.fused_step`,
  ``ASRKIT_FUSED_SEARCH=0``); the whole search as one launch over the log-probs (``fused search``,
  :mod:`asrkit.search.fused_search`, the default on CUDA), with each frame's best tokens taken in the kernel (the
  default) and by ``torch.topk`` before the launch (``ASRKIT_FUSED_CANDIDATES=topk``); asrkit's C++ loop on one
  CPU core (first batch size only). "agree": top-1 equal to asrkit's exact search (no pruning, C++ loop, CPU) at the first batch size.
  Each row sets its switches itself, whatever the environment says.
* ``lm``: the BPE-500 text inputs of --lm-dir (tools/bench/make_bench_lm.py --order 3) with the word 3-gram:
  eager, captured with the torch step, captured with the fused step and the scorer's per-step calls eager
  (``ASRKIT_COMPILE_SCORERS=0``), the same with them compiled by ``torch.compile``
  (:mod:`asrkit.search.compiled_scorers`; its first call compiles, outside the timing), the whole search with the
  scorer in one launch (``fused search + scorers``, :mod:`asrkit.search.fused_scorers`, the default on CUDA for
  table scorers), and the C++ loop on one CPU core, at each of --lm-batches.
* ``e2e``: waveform to text with the --config model (random weights: speed only; the CTC head's posteriors are
  flat, so no frame is skipped as blank and every frame is searched) at each of --e2e-batches: the frontend,
  the encoder and the search; greedy, CTC prefix without LM (the default: the fused search; and the fused step on
  host tables), with the char-unit word 3-gram (the default: the fused search with the scorer in the kernel; and
  captured with the fused step, its per-step calls compiled, or eager with ``ASRKIT_COMPILE_SCORERS=0``), with a
  2 x 512 LSTM LM (the default: the fused step, the LM eager); RTFx and its ratio to greedy's.

``--device cpu`` runs the same code on the CPU (a smoke test; torchaudio's CUDA decoder is left out).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

_TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_TOOLS)))  # asrkit from a checkout without installing
if _TOOLS not in sys.path:
    sys.path.append(_TOOLS)

from asrkit.config import load_config  # noqa: E402
from asrkit.lm import LSTMLM, NeuralLMScorer, ngram_scorer  # noqa: E402
from asrkit.models.registry import build_model  # noqa: E402
from asrkit.search import ctc_prefix_beam_search, fused_search, fused_step, greedy_search, native_build  # noqa: E402
from asrkit.search import prefix_graph  # noqa: E402
from asrkit.text.tokenizer import load_tokenizer  # noqa: E402
from bench_decode_inputs import AUDIO_SECONDS, peaky_log_probs, pick_texts, text_log_probs  # noqa: E402

SKIP = 0.999
Tokens = List[List[int]]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Tokens], device: torch.device, repeats: int) -> Tuple[float, Tokens]:
    """Best-of-`repeats` seconds of fn() after one warm-up call, and its last output (a failure: inf seconds and no
    output, the error printed, so that one broken row does not lose the rest of a GPU lease's run)."""
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - reported in the output, the row reads "inf"
        print(f"  FAILED: {type(err).__name__}: {str(err)[:300]}", flush=True)
        return float("inf"), []
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def prefix(lp: torch.Tensor, lens: torch.Tensor, beam: int, graph: Optional[bool], native: Optional[bool] = None,
           scorers: Optional[Dict[str, Any]] = None, weights: Optional[Dict[str, float]] = None,
           exact: bool = False) -> Tokens:
    prune: Dict[str, Any] = dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None) if exact else \
        dict(blank_skip_threshold=SKIP)
    nbest = ctc_prefix_beam_search(lp, lens, beam=beam, nbest=1, scorers=scorers, weights=weights,
                                   cuda_graph=graph, native=native, **prune)
    return [h.tokens for h in nbest.best()]


# The GPU path's forms, as (FUSED_STEP, FUSED_SEARCH) of asrkit.search.prefix_graph: the captured torch step, the
# fused step on host-built tables, the whole search in one launch (the default on CUDA, without scorers or with
# table scorers only).
TORCH_STEP, FUSED_STEP, FUSED_SEARCH = (False, False), (True, False), (True, True)


def with_path(fn: Callable[[], Tokens], path: Tuple[bool, bool], candidates: str = "kernel",
              compiled: bool = False) -> Callable[[], Tokens]:
    """fn with the GPU path's switches set to ``path`` (one of TORCH_STEP, FUSED_STEP, FUSED_SEARCH; the fused search
    with the table scorers inside it, :data:`asrkit.search.fused_search.FUSED_SCORERS`), the fused search's
    ``candidates`` ("kernel" or "topk", :data:`asrkit.search.fused_search.CANDIDATES`) and the scorers compiled or
    not (:data:`asrkit.search.prefix_graph.COMPILE_SCORERS`)."""
    def run() -> Tokens:
        saved = (prefix_graph.FUSED_STEP, prefix_graph.FUSED_SEARCH, fused_search.CANDIDATES,
                 prefix_graph.COMPILE_SCORERS, fused_search.FUSED_SCORERS)
        prefix_graph.FUSED_STEP, prefix_graph.FUSED_SEARCH = path
        fused_search.CANDIDATES, prefix_graph.COMPILE_SCORERS = candidates, compiled
        fused_search.FUSED_SCORERS = True
        try:
            return fn()
        finally:
            (prefix_graph.FUSED_STEP, prefix_graph.FUSED_SEARCH, fused_search.CANDIDATES,
             prefix_graph.COMPILE_SCORERS, fused_search.FUSED_SCORERS) = saved
    return run


def fused_rows(dev: torch.device) -> bool:
    return fused_step.unavailable(dev) is None


def greedy(lp: torch.Tensor, lens: torch.Tensor) -> Tokens:
    return [h.tokens for h in greedy_search(lp, lens).best()]


_TORCHAUDIO_RUN = r"""
import sys, time, torch
from torchaudio.models.decoder import cuda_ctc_decoder
folder, vocab, beam, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = torch.load(folder + "/in.pt")
lp, lens = data["lp"].cuda().contiguous(), data["lens"].cuda().to(torch.int32)
dec = cuda_ctc_decoder([f"t{i}" for i in range(vocab)], nbest=1, beam_size=beam, blank_skip_threshold=data["skip"])
run = lambda: [hyps[0].tokens for hyps in dec(lp, lens)]
out, best = run(), float("inf")
for _ in range(repeats):
    torch.cuda.synchronize(); start = time.perf_counter(); out = run(); torch.cuda.synchronize()
    best = min(best, time.perf_counter() - start)
torch.save({"secs": best, "tokens": [list(map(int, t)) for t in out]}, folder + "/out.pt")
"""


def torchaudio_row(lp: torch.Tensor, lens: torch.Tensor, vocab: int, beam: int, repeats: int
                   ) -> Tuple[float, Tokens]:
    """torchaudio's CUDA CTC beam search (blank 0, no LM) timed in a child process: a crash there (it has
    failed with an illegal memory access) cannot take this run's CUDA context with it. inf where it fails."""
    with tempfile.TemporaryDirectory() as folder:
        torch.save({"lp": lp.cpu(), "lens": lens.cpu(), "skip": SKIP}, os.path.join(folder, "in.pt"))
        proc = subprocess.run([sys.executable, "-c", _TORCHAUDIO_RUN, folder, str(vocab), str(beam), str(repeats)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            print(f"  torchaudio cuda_ctc_decoder failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}",
                  flush=True)
            return float("inf"), []
        out = torch.load(os.path.join(folder, "out.pt"))
    return out["secs"], out["tokens"]


class Table:
    def __init__(self, title: str, columns: Sequence[str]) -> None:
        self.lines = [f"\n### {title}\n", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def row(self, *cells: Any) -> None:
        line = "| " + " | ".join(str(c) for c in cells) + " |"
        self.lines.append(line)
        print(line, flush=True)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def agree(got: Tokens, ref: Tokens) -> str:
    return f"{100.0 * sum(g == r for g, r in zip(got, ref)) / max(1, len(ref)):.1f}%"


def cpu_label() -> str:
    """The CPU row's name: the C++ loop, or the torch loop where the C++ library does not build."""
    return "asrkit C++ loop, 1 CPU core" if native_build.load() is not None else "asrkit torch loop, 1 CPU core"


def cpu_one_core(fn: Callable[[], Tokens], repeats: int) -> Tuple[float, Tokens]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return timed(fn, torch.device("cpu"), repeats)
    finally:
        torch.set_num_threads(threads)


def section_search(args: argparse.Namespace, dev: torch.device) -> str:
    table = Table(f"Search alone, no LM, beam {args.beam} ({args.frames} frames = 10 s per utterance)",
                  ["V", "batch", "decoder", "utt/s", "RTFx", "ms/batch", "agree (exact)"])
    for vocab in args.vocabs:
        for i, batch in enumerate(args.batches):
            lp_cpu = peaky_log_probs(batch, args.frames, vocab, seed=vocab + batch)
            lens_cpu = torch.full((batch,), args.frames, dtype=torch.long)
            lp, lens = lp_cpu.to(dev), lens_cpu.to(dev)
            ref = prefix(lp_cpu, lens_cpu, args.beam, False, native=None, exact=True) if i == 0 else None
            def captured() -> Tokens:
                return prefix(lp, lens, args.beam, True, native=False)
            rows: List[Tuple[str, Callable[[], Tokens], torch.device]] = [
                ("greedy", lambda: greedy(lp, lens), dev),
                ("asrkit eager", lambda: prefix(lp, lens, args.beam, False, native=False), dev),
                ("asrkit captured", with_path(captured, TORCH_STEP), dev)]
            if fused_rows(dev):
                rows += [("asrkit captured + fused step", with_path(captured, FUSED_STEP), dev),
                         ("asrkit fused search", with_path(captured, FUSED_SEARCH), dev),
                         ("asrkit fused search, topk tables", with_path(captured, FUSED_SEARCH, "topk"), dev)]
            if i == 0:
                rows.append((cpu_label(), lambda: prefix(lp_cpu, lens_cpu, args.beam, False), None))
            results = [(name, *(cpu_one_core(fn, args.repeats) if where is None else timed(fn, dev, args.repeats)))
                       for name, fn, where in rows]
            if dev.type == "cuda":
                results.insert(3, ("torchaudio cuda_ctc_decoder", *torchaudio_row(lp, lens, vocab, args.beam,
                                                                                   args.repeats)))
            for name, secs, out in results:
                table.row(vocab, batch, name, f"{batch / secs:.0f}", f"{batch * AUDIO_SECONDS / secs:.0f}",
                          f"{secs * 1000:.1f}", agree(out, ref) if ref is not None and name != "greedy" else "")
    return table.text()


def lm_inputs(args: argparse.Namespace, batch: int, name: str) -> Tuple[Any, torch.Tensor]:
    tok = load_tokenizer(os.path.join(args.lm_dir, name, "tokenizer.json"))
    with open(os.path.join(args.lm_dir, "heldout.txt"), encoding="utf-8") as fh:
        sentences = [line.strip() for line in fh if line.strip()]
    texts = pick_texts(sentences, batch, int(15 * AUDIO_SECONDS * args.frames / 250), seed=batch)  # 15 chars a second
    lp = text_log_probs([tok.encode(t) for t in texts], args.frames, tok.vocab_size, seed=batch,
                        competitors=range(3, tok.vocab_size))
    return tok, lp


def section_lm(args: argparse.Namespace, dev: torch.device) -> str:
    table = Table(f"Search alone with the word 3-gram, {args.lm_units} tokens, beam {args.beam}",
                  ["batch", "decoder", "utt/s", "RTFx", "ms/batch", "agree (CPU)"])
    arpa = os.path.join(args.lm_dir, "word_3gram.arpa")
    for i, batch in enumerate(args.lm_batches):
        tok, lp_cpu = lm_inputs(args, batch, args.lm_units)
        lens_cpu = torch.full((batch,), args.frames, dtype=torch.long)
        lp, lens = lp_cpu.to(dev), lens_cpu.to(dev)
        kw = dict(unk_offset=-10.0, units="word")
        gpu_lm = {"lm": ngram_scorer(arpa, tok.token_list, device=dev, **kw)}
        cpu_lm = {"lm": ngram_scorer(arpa, tok.token_list, **kw)}
        weights = {"lm": 0.5}
        ref_secs, ref = cpu_one_core(lambda: prefix(lp_cpu, lens_cpu, args.beam, False, scorers=cpu_lm,
                                                    weights=weights), args.repeats if i == 0 else 1)
        variants = [("asrkit eager", False, TORCH_STEP, False), ("asrkit captured", True, TORCH_STEP, False)]
        if fused_rows(dev):
            variants += [("asrkit captured + fused step, scorers eager (ASRKIT_COMPILE_SCORERS=0)", True, FUSED_STEP,
                          False),
                         ("asrkit captured + fused step + compiled scorers", True, FUSED_STEP, True),
                         ("asrkit fused search + scorers, one launch (default)", True, FUSED_SEARCH, False)]
        for name, graph, path, compiled in variants:
            def search(graph: bool = graph) -> Tokens:
                return prefix(lp, lens, args.beam, graph, native=False, scorers=gpu_lm, weights=weights)
            secs, out = timed(with_path(search, path, compiled=compiled), dev, args.repeats)
            table.row(batch, name, f"{batch / secs:.0f}", f"{batch * AUDIO_SECONDS / secs:.0f}", f"{secs * 1000:.1f}",
                      agree(out, ref))
        table.row(batch, cpu_label(), f"{batch / ref_secs:.0f}",
                  f"{batch * AUDIO_SECONDS / ref_secs:.0f}", f"{ref_secs * 1000:.1f}", "")
    return table.text()


def section_e2e(args: argparse.Namespace, dev: torch.device) -> str:
    tok = load_tokenizer(os.path.join(args.lm_dir, "char", "tokenizer.json"))
    cfg = load_config(args.config)
    torch.manual_seed(0)
    model = build_model(cfg, tok.vocab_size).to(dev).eval()
    lstm = NeuralLMScorer(LSTMLM(tok.vocab_size, embed_dim=256, hidden_size=512, num_layers=2, dropout=0.0).to(dev))
    word = ngram_scorer(os.path.join(args.lm_dir, "word_3gram.arpa"), tok.token_list, units="word",
                        unk_offset=-10.0, device=dev)
    table = Table(f"End to end: {os.path.basename(args.config)} (random weights), waveform to text, beam {args.beam}",
                  ["batch", "decoding", "RTFx", "ms/batch", "x greedy", "search share"])
    samples = int(AUDIO_SECONDS * cfg.frontend.sample_rate)
    for batch in args.e2e_batches:
        wav = 0.1 * torch.randn(batch, samples, generator=torch.Generator().manual_seed(batch)).to(dev)
        wav_lens = torch.full((batch,), samples, dtype=torch.long, device=dev)

        @torch.inference_mode()
        def encode() -> Tuple[torch.Tensor, torch.Tensor]:
            enc, lens = model.encode(wav, wav_lens)
            return model.ctc_log_probs(enc).float(), lens

        enc_secs, _ = timed(lambda: (encode(), [])[1], dev, args.repeats)
        greedy_secs = None
        decodings: List[Tuple[str, Callable[[torch.Tensor, torch.Tensor], Tokens]]] = [
            ("greedy", greedy),
            ("CTC prefix, no LM", lambda lp, lens: prefix(lp, lens, args.beam, None, native=False)),
            ("CTC prefix + word 3-gram", lambda lp, lens: prefix(lp, lens, args.beam, None, native=False,
                                                                 scorers={"lm": word}, weights={"lm": 0.5})),
            ("CTC prefix + LSTM LM", lambda lp, lens: prefix(lp, lens, args.beam, None, native=False,
                                                             scorers={"lm": lstm}, weights={"lm": 0.3}))]
        if fused_rows(dev):  # the rows above run the default (no LM: the fused search; with scorers: the fused step)
            decodings.insert(2, ("CTC prefix, no LM (fused step, host tables)", lambda lp, lens: with_path(
                lambda: prefix(lp, lens, args.beam, None, native=False), FUSED_STEP)()))
            # the default row above: the fused search with the scorer in the kernel; these two the captured loop
            # (the compiled scorers run there only, which the CPU does not take)
            decodings.insert(4, ("CTC prefix + word 3-gram, captured + compiled scorers",
                                 lambda lp, lens: with_path(lambda: prefix(
                                     lp, lens, args.beam, None, native=False, scorers={"lm": word},
                                     weights={"lm": 0.5}), FUSED_STEP, compiled=True)()))
            decodings.insert(5, ("CTC prefix + word 3-gram, captured, scorers eager (ASRKIT_COMPILE_SCORERS=0)",
                                 lambda lp, lens: with_path(lambda: prefix(
                                     lp, lens, args.beam, None, native=False, scorers={"lm": word},
                                     weights={"lm": 0.5}), FUSED_STEP, compiled=False)()))
        for name, search in decodings:
            def run(search: Callable[[torch.Tensor, torch.Tensor], Tokens] = search) -> Tokens:
                lp, lens = encode()
                with torch.inference_mode():
                    return search(lp, lens)
            secs, _ = timed(run, dev, args.repeats)
            greedy_secs = greedy_secs or secs
            table.row(batch, name, f"{batch * AUDIO_SECONDS / secs:.0f}", f"{secs * 1000:.1f}",
                      f"{greedy_secs / secs:.2f}", f"{max(0.0, secs - enc_secs) / secs:.0%}")
    return table.text()


SECTIONS = {"search": section_search, "lm": section_lm, "e2e": section_e2e}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--lm-dir", default=".bench_lm")
    p.add_argument("--out", default=None, help="append the markdown tables to this file")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--vocabs", nargs="+", type=int, default=[29, 500], help="the search section's vocabularies")
    p.add_argument("--batches", nargs="+", type=int, default=[32, 2048])
    p.add_argument("--lm-batches", nargs="+", type=int, default=[32, 512])
    p.add_argument("--lm-units", default="bpe500", help="the lm section's tokenizer: LM_DIR/NAME/tokenizer.json")
    p.add_argument("--e2e-batches", nargs="+", type=int, default=[32, 256])
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--config", default=os.path.join(os.path.dirname(os.path.dirname(_TOOLS)), "conf",
                                                   "mini_medium.yaml"))
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu_search.py: no CUDA device is visible (--device cpu for a smoke test)", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    header = f"\n## bench_gpu_search.py on {where}, torch {torch.__version__}\n"
    print(header, flush=True)
    parts = [header]
    for name in args.sections:
        parts.append(SECTIONS[name](args, dev))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
