#!/usr/bin/env python3
"""Benchmark CTC decoders (asrkit's prefix beam search and peers) on identical, seeded log-probs.

Usage: tools/bench/bench_decode.py [--vocabs 29 500 5000 | char bpe500] [--batch 32] [--frames 250]
           [--beams 10 50] [--threads 1 2] [--lms none token word] [--repeats 3]
           [--decoders prefix prefix-exact prefix-lexicon api greedy pyctcdecode flashlight flashlight-lexicon]
           [--lm-dir exp/bench_decode] [--order 4]
           [--lm-weight 0.5] [--token-topk 8] [--token-min-logp -12] [--blank-skip 0.999]
           [--fl-token-beam N] [--native auto|on|off] [--device cpu|cuda] [--cuda-graph]
           [--markdown FILE] [--profile N]

Inputs (every decoder sees the same log-probs; one utterance = 10 s = 250 frames of 40 ms; the
log-probs come from tools/bench/bench_decode_inputs.py):
  * an integer vocab (default 29 500 5000): random "peaky" log-probs, one random dominant class per
    frame (:func:`peaky_log_probs`); tokens are meaningless, so no LM runs on them.
  * a name (char, bpe500): log-probs made from real text. Sentences of LM_DIR/heldout.txt
    (sentences no LM saw; tools/bench/make_bench_lm.py writes it, the tokenizers and the LMs) are
    tokenized with LM_DIR/NAME/tokenizer.json, each token spread over 1-3 frames with blanks
    between, --confusion of the tokens get a competitor (another token or blank) with 25-65% of
    the mass, every frame gets noise (:func:`text_log_probs`). LMs: "token" = LM_DIR/NAME/ORDERgram.arpa
    (over the tokenizer's pieces), "word" = LM_DIR/word_ORDERgram.arpa (ORDER = --order, default 4;
    for 3-grams run tools/bench/make_bench_lm.py --order 3 and pass --order 3).

Decoders ("prefix" etc. need only asrkit; the peers come with `pip install -e '.[bench]'`, best in
a separate venv made by tools/install/setup_bench_env.sh; their builders are in tools/bench/bench_decode_peers.py):
  prefix        asrkit.search.ctc_prefix_beam_search with the pruning flags
  prefix-exact  the same search with no token pruning and no blank-frame skipping
  api           asrkit.search.decode_ctc (the checked entry point) with the prefix settings
  greedy        best path
  pyctcdecode   pyctcdecode.build_ctcdecoder(...).decode_beams, its default pruning; LM: word
  flashlight    torchaudio.models.decoder.ctc_decoder, lexicon-free, log_add=True (flashlight-text's
                LexiconFreeDecoder directly if torchaudio lacks it), beam_size_token = --fl-token-beam
                (default: --token-topk + 1, the candidates asrkit keeps); LM: token
  prefix-lexicon  "prefix" with the word scorer's lexicon= constraint (the word LM's own words) and no
                --token-min-logp floor (as flashlight: measured, the floor of -12 cut the tokens that
                spell listed words near an OOV word: char WER 14.3% with it, 11.2% without); LM: word
  flashlight-lexicon  torchaudio's ctc_decoder with a lexicon file (the word LM's words spelled in the
                tokens, "▁" as its silence token: flashlight-text's LexiconDecoder), the same
                beam_size_token and log_add; LM: word. Its inputs get one "▁" frame after the last
                word (flashlight completes a word at its separator). Its hypotheses are its words.
--native: asrkit's prefix search with its C++ frame loop (on), its torch loop (off; rows are labelled
"/torch"), or whichever the search picks (auto, the default: the C++ loop on the CPU when it builds).
--device cuda: asrkit's searches (and their LMs) run on the GPU, the torch loop there (rows "/cuda"; with
--cuda-graph the frame loop is captured as one CUDA graph per batch, rows "/cuda-graph"); the log-probs are
on the GPU before timing starts, the hypotheses are read back to the host inside it. Peers stay on the CPU
and are refused with --device cuda; the exact-search reference runs on the CPU.
LM fusion is the same everywhere: score = log P_ctc + w ln P_lm (w = --lm-weight; flashlight's
KenLM gives log10, so it gets lm_weight = w ln 10; pyctcdecode's alpha = w, beta = 0), no bonus.
asrkit runs a token LM with asrkit.lm.ngram_scorer(units="token"), the word LM with units="word".

--threads N: N = 1 decodes the batch in this process; N > 1 splits it into N contiguous shards
decoded by N forked worker processes (made before timing, 1 intra-op thread each): the peers are
single-threaded (flashlight holds the GIL), and asrkit's CPU search runs with one intra-op thread.

Per setting: best-of-`--repeats` wall time after one warm-up; utterances/s, real-time factor
(decode seconds / audio seconds), CPU ms (all processes). Quality, from the last run, against the
reference = asrkit's exact search (no pruning) at the same beam and LM: "agree" = fraction of
utterances whose top hypothesis has the same text; "dll" = mean over utterances of the exact CTC
log-likelihood (torch ctc_loss, float64) of the top hypothesis minus the reference's; "WER" vs. the
true text (text inputs). pyctcdecode returns text only (and merges BPE segmentations of a text):
its token ids are the tokenizer's encoding of that text, or the reference's ids when the texts are
equal and those are likelier.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

_TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_TOOLS)))  # asrkit from a checkout without installing
if _TOOLS not in sys.path:  # the bench_decode_* siblings (tools/bench); appended, so they shadow nothing
    sys.path.append(_TOOLS)
import asrkit.search.ctc_prefix as ctc_prefix  # noqa: E402
import asrkit.search.prefix_loop as prefix_loop  # noqa: E402
from asrkit.search.api import decode_ctc  # noqa: E402
from asrkit.search.ctc_prefix import ctc_prefix_beam_search  # noqa: E402
from asrkit.search.greedy import greedy_search  # noqa: E402
from bench_decode_inputs import (AUDIO_SECONDS, FRAME_SECONDS, Hyp, Setup, pick_texts,  # noqa: E402
                                 peaky_log_probs, text_log_probs)
from bench_decode_peers import (Unsupported, check_peers, flashlight_decoder,  # noqa: E402
                                flashlight_lexicon_decoder, pyctcdecode_decoder)

LM_KINDS = ("none", "token", "word")


# ----------------------------------------------------------------------------- inputs

def random_setup(vocab: int, args: argparse.Namespace) -> Setup:
    lp = peaky_log_probs(args.batch, args.frames, vocab, args.seed).contiguous()
    # Symbols that are single characters, so text <-> ids is exact (pyctcdecode returns text).
    tokens = ["<blank>"] + [chr(0x4E00 + i) for i in range(1, vocab)]
    return Setup(f"V={vocab} random", lp, torch.full((args.batch,), args.frames, dtype=torch.long), tokens)


def text_setup(name: str, args: argparse.Namespace) -> Setup:
    from asrkit.text.tokenizer import load_tokenizer

    folder = os.path.join(args.lm_dir, name)
    tok_path = os.path.join(folder, "tokenizer.json")
    heldout = os.path.join(args.lm_dir, "heldout.txt")
    for path in (tok_path, heldout):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: run tools/bench/make_bench_lm.py --out {args.lm_dir}")
    tok = load_tokenizer(tok_path)
    with open(heldout, encoding="utf-8") as fh:
        sentences = [line.strip() for line in fh if line.strip()]
    chars = int(round(args.chars_per_second * args.frames * FRAME_SECONDS))
    texts = pick_texts(sentences, args.batch, chars, args.seed)
    seqs = [tok.encode(t) for t in texts]
    competitors = [i for i in range(3, tok.vocab_size)]  # never the specials
    lp = text_log_probs(seqs, args.frames, tok.vocab_size, args.seed, args.confusion, competitors).contiguous()
    lm_paths = {"token": os.path.join(folder, f"{args.order}gram.arpa"),
                "word": os.path.join(args.lm_dir, f"word_{args.order}gram.arpa")}
    truth = [" ".join(t.split()) for t in texts]
    return Setup(f"{name} V={tok.vocab_size}", lp, torch.full((args.batch,), args.frames, dtype=torch.long),
                 list(tok.token_list), tok, truth, lm_paths)


# ----------------------------------------------------------------------------- decoders
# A decoder is a function rows -> list of top hypotheses (ids or text) for those batch rows of
# the setup; it is built once per setting (outside the timing) and may run in forked workers.

def _asrkit_decoder(name: str, setup: Setup, beam: int, lm: str, args: argparse.Namespace,
                    trace: bool = False, device: str = "cpu") -> Callable[[range], List[Hyp]]:
    scorers, weights = {}, {}
    if lm != "none":
        scorer = setup.asrkit_lm(lm, args.unk_offset, lexicon=name == "prefix-lexicon", device=device)
        scorers, weights = {"lm": _traced(scorer) if trace else scorer}, {"lm": args.lm_weight}
    if name in ("prefix", "api", "prefix-lexicon"):
        prune = dict(token_topk=args.token_topk, token_min_logp=args.token_min_logp,
                     blank_skip_threshold=args.blank_skip)
        if name == "prefix-lexicon":  # no floor: it cuts the tokens that spell listed words near an OOV word
            prune["token_min_logp"] = None
    else:
        prune = dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None)

    all_lp, all_lens = setup.lp.to(device), setup.lens.to(device)
    graph = device != "cpu" and args.cuda_graph

    def run(rows: range) -> List[Hyp]:
        lp, lens = all_lp[rows.start:rows.stop], all_lens[rows.start:rows.stop]
        if name == "greedy":
            nbest = greedy_search(lp, lens)
        elif name == "api":  # the checked entry point: same search plus input validation and text
            found = decode_ctc(lp, lens, setup.token_list, beam=beam, blank_id=0, lm=scorers.get("lm"),
                               lm_weight=args.lm_weight, cuda_graph=graph, **prune)
            return [h[0].tokens for h in found]
        else:
            nbest = ctc_prefix_beam_search(lp, lens, beam=beam, nbest=1, scorers=scorers, weights=weights,
                                           native=NATIVE[args.native], cuda_graph=graph, **prune)
        return [h.tokens for h in nbest.best()]

    return run


def _traced(scorer: Any) -> Any:
    """The scorer with its score/select_state calls marked as profiler ranges."""
    from torch.profiler import record_function

    for method in ("score", "select_state", "final_score"):
        inner = getattr(scorer, method)

        def wrapped(*a: Any, _inner: Any = inner, _name: str = f"lm.{method}", **k: Any) -> Any:
            with record_function(_name):
                return _inner(*a, **k)

        setattr(scorer, method, wrapped)
    return scorer


def split_times(run: Callable[[], Any], repeats: int = 3) -> Dict[str, float]:
    """Best-of-`repeats` seconds of the parts of ctc_prefix_beam_search in one call of `run`: input
    checks, per-batch setup (top-k candidate tables), the frame loop, the end (sort, backtrack)."""
    parts = {"checks": (ctc_prefix, "check_ctc_inputs"), "setup": (prefix_loop, "FrameTables"),
             "loop": (prefix_loop, "frame_loop"), "end": (prefix_loop, "finish")}
    best = {k: float("inf") for k in parts}
    real = {k: getattr(module, attr) for k, (module, attr) in parts.items()}
    for _ in range(repeats):
        spent = {k: 0.0 for k in parts}

        def timed(key: str) -> Callable[..., Any]:
            def call(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return real[key](*a, **k)
                finally:
                    spent[key] += time.perf_counter() - start
            return call

        try:
            for key, (module, attr) in parts.items():
                setattr(module, attr, timed(key))
            start = time.perf_counter()
            run()
            total = time.perf_counter() - start
        finally:
            for key, (module, attr) in parts.items():
                setattr(module, attr, real[key])
        for key in parts:
            best[key] = min(best[key], spent[key])
        best["total"] = min(best.get("total", float("inf")), total)
    return best


def profile_asrkit(name: str, setup: Setup, beam: int, lm: str, args: argparse.Namespace) -> None:
    """One batch of an asrkit decoder under torch.profiler: the top ops by self CPU time, calls per
    search step, and the share of the LM scorer's calls."""
    from torch.profiler import ProfilerActivity, profile

    fn = _asrkit_decoder(name, setup, beam, lm, args, trace=True)
    fn(range(args.batch))
    split = split_times(lambda: fn(range(args.batch)))
    print(f"  split {name} {setup.name} lm={lm} beam={beam} (no profiler): " +
          ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in split.items()))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn(range(args.batch))
        total = time.perf_counter() - start
    events = prof.key_averages()
    ops = [e for e in events if not e.key.startswith("lm.")]
    calls = sum(e.count for e in ops if e.key.startswith("aten::"))
    steps = args.frames
    if name in ("prefix", "prefix-lexicon") and args.blank_skip is not None:  # the loop visits only the kept frames
        steps = int((setup.lp[..., 0] <= math.log(args.blank_skip)).sum(1).max())
    print(f"  profile {name} {setup.name} lm={lm} beam={beam}: {total * 1000:.1f} ms under the profiler, "
          f"{calls} aten calls = {calls / steps:.0f} per step ({steps} steps)")
    for e in events:
        if e.key.startswith("lm."):
            print(f"    {e.key:18s} {e.count:6d} calls {e.cpu_time_total / 1000:9.1f} ms incl. children "
                  f"({100 * e.cpu_time_total / 1e6 / total:.0f}% of the batch)")
    top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.profile]
    for e in top:
        print(f"    {e.key:34s} {e.count:7d} calls {e.self_cpu_time_total / 1000:8.1f} ms self "
              f"{e.self_cpu_time_total / max(1, e.count):7.1f} us/call")



@dataclass(frozen=True)
class Decoder:
    """One decoder row of the benchmark. ``build(setup, beam, lm, args, tmpdir)`` runs outside the
    timing and returns the function that decodes batch rows; ``lms``: the LM kinds it takes;
    ``peer``: the module an optional peer needs (None: asrkit); ``beamless``: one row per setting."""

    build: Callable[[Setup, int, str, argparse.Namespace, str], Callable[[range], List[Hyp]]]
    lms: Tuple[str, ...]
    peer: Optional[str] = None
    beamless: bool = False


def _asrkit(name: str) -> Callable[[Setup, int, str, argparse.Namespace, str], Callable[[range], List[Hyp]]]:
    return lambda setup, beam, lm, args, tmpdir: _asrkit_decoder(name, setup, beam, lm, args, device=args.device)


# Adding a decoder row = one builder function and one entry here (LM kinds: LM_KINDS).
DECODERS: Dict[str, Decoder] = {
    "prefix": Decoder(_asrkit("prefix"), LM_KINDS),
    "prefix-exact": Decoder(_asrkit("prefix-exact"), LM_KINDS),
    "api": Decoder(_asrkit("api"), ("none", "token", "word")),
    "greedy": Decoder(_asrkit("greedy"), ("none",), beamless=True),
    "pyctcdecode": Decoder(lambda setup, beam, lm, args, tmpdir: pyctcdecode_decoder(setup, beam, lm, args),
                           ("none", "word"), peer="pyctcdecode"),
    "flashlight": Decoder(flashlight_decoder, ("none", "token"), peer="flashlight.lib.text.decoder"),
    "prefix-lexicon": Decoder(_asrkit("prefix-lexicon"), ("word",)),
    "flashlight-lexicon": Decoder(flashlight_lexicon_decoder, ("word",), peer="torchaudio.models.decoder"),
}


# ----------------------------------------------------------------------------- running

_JOB: Optional[Callable[[range], List[Hyp]]] = None  # the decoder a forked worker runs


def _worker(rows: range) -> Tuple[List[Hyp], float]:
    start = time.process_time()
    assert _JOB is not None
    out = _JOB(rows)
    return out, time.process_time() - start


class Runner:
    """Runs one decoder on the batch, in-process (1 worker) or in N forked workers (shards)."""

    def __init__(self, fn: Callable[[range], List[Hyp]], batch: int, workers: int) -> None:
        global _JOB
        self.fn, self.batch, self.workers, self.pool = fn, batch, workers, None
        bounds = [round(i * batch / workers) for i in range(workers + 1)]
        self.shards = [range(bounds[i], bounds[i + 1]) for i in range(workers)]
        if workers > 1:
            _JOB = fn
            self.pool = multiprocessing.get_context("fork").Pool(workers)

    def __call__(self) -> Tuple[List[Hyp], float]:
        """(hypotheses, CPU seconds of all processes)."""
        if self.pool is None:
            start = time.process_time()
            out = self.fn(range(self.batch))
            return out, time.process_time() - start
        parts = self.pool.map(_worker, self.shards, chunksize=1)
        return [h for part, _ in parts for h in part], sum(cpu for _, cpu in parts)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


def bench(run: Callable[[], Tuple[List[Hyp], float]], repeats: int) -> Tuple[float, float, List[Hyp]]:
    """Best-of-`repeats` (wall, CPU) seconds for one batch after one warm-up, and the last output."""
    out, _ = run()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out, cpu = run()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, cpu)
    return best, best_cpu, out


def ctc_log_likelihood(lp: torch.Tensor, lens: torch.Tensor, hyps: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B,) exact log P_ctc(hyp | x), summed over alignments (float64; -inf if impossible)."""
    targets = torch.tensor([t for h in hyps for t in h], dtype=torch.long)
    target_lens = torch.tensor([len(h) for h in hyps], dtype=torch.long)
    nll = torch.nn.functional.ctc_loss(lp.double().transpose(0, 1), targets, lens, target_lens,
                                       blank=0, reduction="none", zero_infinity=False)
    return -nll


def word_errors(ref: str, hyp: str) -> int:
    """Levenshtein distance between the word sequences."""
    r, h = ref.split(), hyp.split()
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1]


@dataclass
class Quality:
    texts: List[str]
    ll: torch.Tensor  # (B,)
    from_text: bool  # the decoder gave text; ll is of the tokenizer's encoding of it


def quality(setup: Setup, hyps: List[Hyp]) -> Quality:
    texts = [setup.text(h) if not isinstance(h, str) else " ".join(h.split()) for h in hyps]
    ids = [h if not isinstance(h, str) else setup.ids(t) for h, t in zip(hyps, texts)]
    from_text = any(isinstance(h, str) for h in hyps)
    return Quality(texts, ctc_log_likelihood(setup.lp, setup.lens, ids), from_text)


def compare(q: Quality, ref: Quality, truth: Optional[List[str]]) -> Dict[str, float]:
    same = torch.tensor([a == b for a, b in zip(q.texts, ref.texts)])
    agree = float(same.double().mean())
    ll = q.ll
    if q.from_text:  # a text has several BPE segmentations: the reference's counts when the text is equal
        ll = torch.where(same, torch.maximum(ll, ref.ll), ll)
    diff = ll - ref.ll
    finite = torch.isfinite(diff)
    dll = float(diff[finite].mean()) if bool(finite.any()) else float("nan")
    out = {"agree": agree, "dll": dll, "impossible": int((~finite).sum())}
    if truth is not None:
        errors = sum(word_errors(t, h) for t, h in zip(truth, q.texts))
        out["wer"] = errors / max(1, sum(len(t.split()) for t in truth))
    return out


NATIVE = {"auto": None, "on": True, "off": False}  # --native -> ctc_prefix_beam_search(native=...)


def row_name(name: str, args: argparse.Namespace) -> str:
    """The decoder's label in the output: asrkit's rows on a GPU or forced onto the torch loop say so."""
    if args.device != "cpu" and not DECODERS[name].peer:
        return f"{name}/cuda-graph" if args.cuda_graph and name != "greedy" else f"{name}/{args.device}"
    return f"{name}/torch" if args.native == "off" and name.startswith("prefix") else name


MD_HEADER = ("| vocab | LM | beam | workers | decoder | utt/s | RTF | ms/batch (CPU ms) | agree | dll | WER |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|\n")


def _float_or_none(text: str) -> Optional[float]:
    return None if text.lower() == "none" else float(text)


def _int_or_none(text: str) -> Optional[int]:
    return None if text.lower() == "none" else int(text)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_decode.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--vocabs", nargs="+", default=["29", "500", "5000"],
                   help="integers: random log-probs of that size; names: text mode from LM_DIR/NAME")
    p.add_argument("--beams", type=int, nargs="+", default=[10, 50])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="worker processes (see above)")
    p.add_argument("--decoders", nargs="+", default=["prefix"], help="from " + " ".join(DECODERS))
    p.add_argument("--lms", nargs="+", default=["none"], choices=LM_KINDS)
    p.add_argument("--lm-dir", default="exp/bench_decode", help="tools/bench/make_bench_lm.py output")
    p.add_argument("--order", type=int, default=4, help="n-gram order of the LM files")
    p.add_argument("--lm-weight", type=float, default=0.5, help="weight of ln P_lm (all decoders)")
    p.add_argument("--unk-offset", type=float, default=0.0,
                   help="asrkit word LM: ln offset for out-of-vocabulary words (pyctcdecode: unk_score_offset)")
    p.add_argument("--chars-per-second", type=float, default=12.0, help="text mode: speaking rate")
    p.add_argument("--confusion", type=float, default=0.1, help="text mode: fraction of tokens with a rival")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-topk", type=_int_or_none, default=8, help="tokens per frame, or 'none'")
    p.add_argument("--token-min-logp", type=_float_or_none, default=-12.0, help="log-prob floor, or 'none'")
    p.add_argument("--blank-skip", type=_float_or_none, default=0.999,
                   help="blank-frame skip threshold, or 'none'")
    p.add_argument("--fl-token-beam", type=int, default=None,
                   help="flashlight beam_size_token (default: --token-topk + 1, or the vocabulary)")
    p.add_argument("--no-reference", action="store_true", help="skip the exact-search reference and quality")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing an asrkit beam search (1 worker), profile one batch: top N ops")
    p.add_argument("--device", default="cpu", help="where asrkit's searches run: cpu or cuda[:N] (see above)")
    p.add_argument("--cuda-graph", action="store_true", help="--device cuda: the frame loop as one CUDA graph")
    p.add_argument("--native", choices=sorted(NATIVE), default="auto",
                   help="asrkit prefix rows: the C++ frame loop (on), the torch loop (off), or auto")
    p.add_argument("--markdown", help="append one table row per setting to this file")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    known = list(DECODERS)
    unknown = [d for d in args.decoders if d not in known]
    if unknown:
        print(f"bench_decode.py: unknown decoder(s) {unknown}; choose from {list(known)}", file=sys.stderr)
        return 2
    if args.device != "cpu":
        peers = [d for d in args.decoders if DECODERS[d].peer]
        if not args.device.startswith("cuda") or not torch.cuda.is_available() or peers:
            print(f"bench_decode.py: --device {args.device}: needs a visible CUDA device and asrkit's decoders only"
                  f"{f' (not {peers})' if peers else ''}", file=sys.stderr)
            return 2
        if args.threads != [1]:
            print("bench_decode.py: --device cuda runs one process: pass --threads 1", file=sys.stderr)
            return 2
    if args.cuda_graph and args.device == "cpu":
        print("bench_decode.py: --cuda-graph needs --device cuda", file=sys.stderr)
        return 2
    message = check_peers([(d, DECODERS[d].peer) for d in args.decoders if DECODERS[d].peer])
    if message:
        print(f"bench_decode.py: {message}", file=sys.stderr)
        return 2
    if any(w < 1 for w in args.threads):
        print("bench_decode.py: --threads must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # every decoder runs one intra-op thread per process (see --threads)
    md = open(args.markdown, "a", encoding="utf-8") if args.markdown else None
    if md is not None and md.tell() == 0:
        md.write(MD_HEADER)
    print(f"batch {args.batch} x {args.frames} frames ({AUDIO_SECONDS * args.frames / 250:g} s audio each), "
          f"topk {args.token_topk}, min_logp {args.token_min_logp}, blank_skip {args.blank_skip}, "
          f"lm_weight {args.lm_weight}, load {os.getloadavg()[0]:.2f}", flush=True)
    audio = args.batch * args.frames * FRAME_SECONDS
    tmpdir = tempfile.mkdtemp(prefix="bench_decode_")
    try:
        for vocab in args.vocabs:
            try:
                setup = random_setup(int(vocab), args) if vocab.isdigit() else text_setup(vocab, args)
            except (FileNotFoundError, ValueError) as exc:
                print(f"bench_decode.py: {exc}", file=sys.stderr)
                return 1
            for lm in args.lms:
                if lm != "none" and setup.tokenizer is None:
                    continue  # random tokens: an LM means nothing
                if lm != "none" and not os.path.exists(setup.lm_paths[lm]):
                    print(f"bench_decode.py: {setup.lm_paths[lm]} is missing: run tools/bench/make_bench_lm.py",
                          file=sys.stderr)
                    return 1
                for beam in args.beams:
                    ref = None
                    if not args.no_reference:
                        exact = _asrkit_decoder("prefix-exact", setup, beam, lm, args)
                        ref = quality(setup, exact(range(args.batch)))
                    for name in args.decoders:
                        spec = DECODERS[name]
                        if lm not in spec.lms or (spec.beamless and beam != args.beams[0]):
                            continue
                        for workers in args.threads:
                            try:
                                fn = spec.build(setup, beam, lm, args, tmpdir)
                            except Unsupported as exc:  # a decoder that cannot take this input: say so, go on
                                print(f"{name:12s} {setup.name:13s} lm={lm:5s} beam={beam:3d}: skipped ({exc})")
                                break
                            runner = Runner(fn, args.batch, workers)
                            try:
                                sec, cpu, hyps = bench(runner, args.repeats)
                            finally:
                                runner.close()
                            b = 1 if spec.beamless else beam
                            line = (f"{row_name(name, args):12s} {setup.name:13s} lm={lm:5s} beam={b:3d} workers={workers}: "
                                    f"{args.batch / sec:8.1f} utt/s  RTF {sec / audio:.5f}  "
                                    f"({sec * 1000:.1f} ms/batch wall, {cpu * 1000:.1f} ms CPU)")
                            cells = ["-", "-", "-"]
                            if ref is not None:
                                c = compare(quality(setup, hyps), ref, setup.truth)
                                line += f"  agree {100 * c['agree']:.1f}%  dll {c['dll']:+.3f}"
                                cells = [f"{100 * c['agree']:.1f}%", f"{c['dll']:+.3f}", "-"]
                                if c["impossible"]:
                                    line += f" ({c['impossible']} impossible)"
                                    cells[1] += f" ({c['impossible']} inf)"
                                if "wer" in c:
                                    line += f"  WER {100 * c['wer']:.1f}%"
                                    cells[2] = f"{100 * c['wer']:.1f}%"
                            print(line, flush=True)
                            if args.profile and name in ("prefix", "prefix-exact", "prefix-lexicon") \
                                    and workers == 1:
                                profile_asrkit(name, setup, beam, lm, args)
                            if md is not None:
                                md.write(f"| {setup.name} | {lm} | {b} | {workers} | {row_name(name, args)} | "
                                         f"{args.batch / sec:.1f} | {sec / audio:.5f} | "
                                         f"{sec * 1000:.1f} ({cpu * 1000:.0f}) | {' | '.join(cells)} |\n")
                                md.flush()
    finally:
        if md is not None:
            md.close()
        for f in os.listdir(tmpdir):
            os.remove(os.path.join(tmpdir, f))
        os.rmdir(tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
