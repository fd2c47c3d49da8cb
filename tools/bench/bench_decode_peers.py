"""The peer CTC decoders of tools/bench/bench_decode.py: pyctcdecode and flashlight (torchaudio's ctc_decoder).

Not a script: tools/bench/bench_decode.py imports the builders for its DECODERS table and checks with
:func:`check_peers` that their modules import (they are optional: tools/install/setup_bench_env.sh makes
.venv-bench with them). A builder takes the setup (tools/bench/bench_decode_inputs.py), beam, LM kind and
the parsed arguments, runs outside the timing, and returns a function rows -> top hypotheses:
  pyctcdecode_decoder         pyctcdecode.build_ctcdecoder(...).decode_beams; LM: word (KenLM)
  flashlight_decoder          lexicon-free ctc_decoder (flashlight-text directly if torchaudio lacks it); LM: token
  flashlight_lexicon_decoder  ctc_decoder with a lexicon of the word LM's words
                              (:func:`write_flashlight_lexicon`); LM: word
"""
from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

_TOOLS = os.path.dirname(os.path.abspath(__file__))
if _TOOLS not in sys.path:  # bench_decode_inputs beside this file; appended, so it shadows nothing
    sys.path.append(_TOOLS)
from bench_decode_inputs import Hyp, Setup  # noqa: E402


class PeerMissing(RuntimeError):
    """An optional peer decoder is not installed."""


class Unsupported(ValueError):
    """A decoder cannot be set up for this input (the run skips its row and says why)."""


def pyctcdecode_decoder(setup: Setup, beam: int, lm: str, args: argparse.Namespace
                        ) -> Callable[[range], List[Hyp]]:
    """pyctcdecode's beam search with its default pruning; LM "word": the word ARPA through KenLM,
    alpha = --lm-weight, beta = 0. Hypotheses: text."""
    try:
        from pyctcdecode import build_ctcdecoder
    except ImportError as exc:
        raise PeerMissing(f"pyctcdecode is not installed ({exc})") from exc
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)  # alphabet notes, unigram warnings
    # pyctcdecode: blank is ""; it renames <unk> itself. Known quirk (0.5.0, BPE mode): a piece
    # ending in "▁" (its "▁⁇▁" for <unk>, the lone "▁") sets a word-break flag shared by all
    # beams, so another beam's next piece can start a new word ("ANOTHER W AY"); kept as is.
    labels = [""] + setup.token_list[1:]
    if setup.tokenizer is not None and "\u2581" in labels and not any(len(t) > 1 and t[0] == "\u2581" for t in labels):
        labels = [" " if t == "\u2581" else t for t in labels]  # char tokenizer: its space
    kw: Dict[str, Any] = {}
    if lm == "word":
        kw = dict(kenlm_model_path=setup.lm_paths["word"], alpha=args.lm_weight, beta=0.0)
    decoder = build_ctcdecoder(labels, **kw)
    arrays = [setup.lp[b, :int(setup.lens[b])].numpy() for b in range(setup.lp.shape[0])]

    def run(rows: range) -> List[Hyp]:
        return [decoder.decode_beams(arrays[b], beam_width=beam)[0][0] for b in rows]

    return run


def flashlight_decoder(setup: Setup, beam: int, lm: str, args: argparse.Namespace,
                       tmpdir: str) -> Callable[[range], List[Hyp]]:
    """torchaudio's lexicon-free ctc_decoder (flashlight-text's LexiconFreeDecoder directly if torchaudio
    lacks it), log_add, beam_size_token = --fl-token-beam or --token-topk + 1; LM "token": the token
    ARPA, its words the token list (written to `tmpdir`). Hypotheses: token ids."""
    vocab = setup.vocab
    token_beam = args.fl_token_beam or min(vocab, (args.token_topk or vocab) + 1)
    lm_path, lm_dict = None, None
    if lm == "token":
        # Lexicon-free: the LM is queried with token indices; lm_dict maps them to LM words.
        lm_path = setup.lm_paths["token"]
        lm_dict = os.path.join(tmpdir, f"lm_dict_{vocab}.txt")
        with open(lm_dict, "w", encoding="utf-8") as fh:
            fh.write("\n".join(setup.token_list) + "\n")
    opts = dict(beam_size=beam, beam_size_token=token_beam, lm_weight=args.lm_weight * math.log(10),
                sil_score=0.0, log_add=True)
    blank = setup.token_list[0]
    try:
        from torchaudio.models.decoder import ctc_decoder

        decoder = ctc_decoder(lexicon=None, tokens=setup.token_list, lm=lm_path, lm_dict=lm_dict, nbest=1,
                              blank_token=blank, sil_token=blank, **opts).decoder
    except (ImportError, RuntimeError, AttributeError):
        decoder = _flashlight_text_decoder(setup.token_list, lm_path, opts)
    return _flashlight_runner(setup, decoder)


def write_flashlight_lexicon(setup: Setup, path: str, sil: str) -> int:
    """Write flashlight's lexicon file for the word LM's words (``WORD t1 t2 ... sil`` a line, spelled by
    the setup's tokenizer; words it can spell only with ``<unk>`` are left out). Returns the words written."""
    unk, count = setup.tokenizer.unk_id, 0
    with open(path, "w", encoding="utf-8") as fh:
        for word in setup.lexicon_words():
            ids = setup.tokenizer.encode(word)
            if ids and unk not in ids:
                fh.write(f"{word} {' '.join(setup.token_list[i] for i in ids)} {sil}\n")
                count += 1
    return count


def flashlight_lexicon_decoder(setup: Setup, beam: int, lm: str, args: argparse.Namespace,
                               tmpdir: str) -> Callable[[range], List[Hyp]]:
    """torchaudio's ctc_decoder with a lexicon (flashlight-text's LexiconDecoder) and the word LM.

    The lexicon is the word LM's vocabulary (:meth:`Setup.lexicon_words`), each word spelled with the
    setup's tokenizer (words it cannot spell without ``<unk>`` are left out) and, as flashlight's
    lexicons are written, ending in the silence token, here the lone word-boundary token "▁". A word
    is only complete after its separator, and the inputs have none after the last word (flashlight
    then drops it: 1 error per utterance), so this decoder's inputs get one more frame, "▁" with
    probability 1 - 1e-5. Same beam, token beam, LM weight (w ln 10 on KenLM's log10) and log_add as
    the lexicon-free row; word score 0, unk score -inf (only listed words). Hypotheses: the words."""
    try:
        from torchaudio.models.decoder import ctc_decoder
    except ImportError as exc:
        raise PeerMissing(f"torchaudio's ctc_decoder is not usable ({exc})") from exc
    if setup.tokenizer is None or lm != "word":
        raise Unsupported("flashlight-lexicon needs a text setup and the word LM")
    sil = "\u2581"
    if sil not in setup.token_list or any(t.startswith(sil) and t != sil for t in setup.token_list):
        # Sentencepiece pieces carry the separator at the start of the next word, so no word of these inputs
        # ends in it (measured: 92% WER with these spellings, 52% spelled without the separator).
        raise Unsupported(f"set up for tokens with a lone {sil!r} between words (char), not word pieces")
    sil_id = setup.token_list.index(sil)
    lexicon = os.path.join(tmpdir, f"lexicon_{setup.vocab}.txt")
    write_flashlight_lexicon(setup, lexicon, sil)
    token_beam = args.fl_token_beam or min(setup.vocab, (args.token_topk or setup.vocab) + 1)
    wrapper = ctc_decoder(lexicon=lexicon, tokens=setup.token_list, lm=setup.lm_paths["word"], nbest=1,
                          beam_size=beam, beam_size_token=token_beam, beam_threshold=50.0,
                          lm_weight=args.lm_weight * math.log(10), word_score=0.0, unk_score=float("-inf"),
                          sil_score=0.0, log_add=True, blank_token=setup.token_list[0], sil_token=sil)
    decoder, word_dict = wrapper.decoder, wrapper.word_dict
    batch, frames, vocab = setup.lp.shape
    lp = torch.full((batch, frames + 1, vocab), math.log(1e-5 / (vocab - 1)))
    lp[:, :frames] = setup.lp
    lp[torch.arange(batch), setup.lens, sil_id] = math.log1p(-1e-5)  # the separator after the last word
    lens = (setup.lens + 1).tolist()
    base, stride = lp.data_ptr(), lp.stride(0) * lp.element_size()

    def run(rows: range, _keep: torch.Tensor = lp) -> List[Hyp]:  # _keep: decode reads lp's memory
        out = []
        for b in rows:  # word ids -> text (-1: no word)
            words = decoder.decode(base + b * stride, lens[b], vocab)[0].words
            out.append(" ".join(word_dict.get_entry(w) for w in words if w >= 0))
        return out

    return run


def _flashlight_runner(setup: Setup, decoder: Any) -> Callable[[range], List[Hyp]]:
    """Decode batch rows with a flashlight decoder straight from the input's memory: token ids of the
    CTC collapse of the best hypothesis's path."""
    vocab = setup.vocab
    lp, lens = setup.lp, setup.lens.tolist()
    base, stride = lp.data_ptr(), lp.stride(0) * lp.element_size()

    def run(rows: range) -> List[Hyp]:
        out = []
        for b in rows:
            path = decoder.decode(base + b * stride, lens[b], vocab)[0].tokens[1:-1]  # drop begin/end states
            ids, prev = [], 0
            for tok in path:  # CTC collapse of the best path of the best prefix
                if tok != prev and tok != 0:
                    ids.append(tok)
                prev = tok
            out.append(ids)
        return out

    return run


def _flashlight_text_decoder(tokens: List[str], lm_path: Optional[str], opts: Dict[str, Any]) -> Any:
    """flashlight-text's LexiconFreeDecoder without torchaudio (blank = silence = id 0)."""
    try:
        from flashlight.lib.text.decoder import (CriterionType, LexiconFreeDecoder, LexiconFreeDecoderOptions,
                                                 ZeroLM)
        from flashlight.lib.text.dictionary import Dictionary
    except ImportError as exc:
        raise PeerMissing(f"neither torchaudio's ctc_decoder nor flashlight-text is usable ({exc})") from exc
    options = LexiconFreeDecoderOptions(beam_size=opts["beam_size"], beam_size_token=opts["beam_size_token"],
                                        beam_threshold=50.0, lm_weight=opts["lm_weight"], sil_score=0.0,
                                        log_add=True, criterion_type=CriterionType.CTC)
    if lm_path is None:
        lm = ZeroLM()
    else:
        from flashlight.lib.text.decoder import KenLM

        lm = KenLM(lm_path, Dictionary(tokens))
    return LexiconFreeDecoder(options, lm, 0, 0, [])


def check_peers(needs: Sequence[Tuple[str, str]]) -> Optional[str]:
    """A message naming the missing peers and how to install them, or None. ``needs``: (decoder
    name, the module it imports) pairs."""
    missing = []
    for name, module in needs:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if not missing:
        return None
    return (f"peer decoder(s) not installed: {', '.join(missing)}. They are optional benchmark "
            f"dependencies: run tools/install/setup_bench_env.sh and use .venv-bench/bin/python "
            f"(or pip install -e '.[bench]' where numpy<2 is acceptable).")
