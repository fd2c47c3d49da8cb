"""The inputs of tools/bench/bench_decode.py: seeded CTC log-probs that every decoder row decodes alike.

Not a script: tools/bench/bench_decode.py imports it and builds its setups from its arguments (see its
--help for the two kinds of input): :func:`peaky_log_probs` (random "peaky" log-probs, an integer
vocab) and :func:`text_log_probs` spelling texts of :func:`pick_texts` (a tokenizer's name). A
:class:`Setup` holds one vocabulary's inputs, converts a decoder's hypotheses (:data:`Hyp`) between
token ids and text, and loads the asrkit LM scorers; tools/bench/bench_decode_peers.py reads it too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

AUDIO_SECONDS = 10.0
FRAME_SECONDS = AUDIO_SECONDS / 250  # 40 ms after subsampling
Hyp = Any  # a decoder's raw top hypothesis: token ids (List[int]) or text (str)


def peaky_log_probs(batch: int, frames: int, vocab: int, seed: int, nonblank: float = 0.35) -> torch.Tensor:
    """(B, T, V) CTC-like log-probs. Each frame has one dominant class: blank, or (with probability
    `nonblank`) a random token that often lasts two frames. The dominant class gets 1 - eps with
    eps log-uniform in [1e-5, 1e-1]; eps is spread over the other classes by a softmax of N(0, 2)
    logits, so peakiness does not depend on the vocabulary size."""
    g = torch.Generator().manual_seed(seed)
    is_token = torch.rand(batch, frames, generator=g) < nonblank
    token = torch.randint(1, vocab, (batch, frames), generator=g)
    repeat = torch.rand(batch, frames, generator=g) < 0.3
    token[:, 1:] = torch.where(repeat[:, 1:] & is_token[:, :-1], token[:, :-1], token[:, 1:])
    dominant = torch.where(is_token, token, 0)[..., None]
    eps = 10 ** (torch.rand(batch, frames, 1, generator=g) * 4 - 5)
    rest = (torch.randn(batch, frames, vocab, generator=g) * 2).scatter_(2, dominant, float("-inf"))
    lp = rest.log_softmax(-1) + eps.log()
    return lp.scatter_(2, dominant, torch.log1p(-eps))


def _align(n_tokens: int, repeats: Sequence[bool], frames: int, g: torch.Generator) -> List[Tuple[int, int]]:
    """Random CTC alignment: (start, length) frames of each token, a blank between equal neighbours."""
    dur = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), n_tokens, True, generator=g) + 1 if n_tokens else \
        torch.zeros(0, dtype=torch.long)
    need = int(sum(repeats))
    while int(dur.sum()) + need > frames and int(dur.max()) > 1:  # too long: shorten the longest
        dur[int(dur.argmax())] -= 1
    free = frames - int(dur.sum()) - need
    if free < 0:
        raise ValueError(f"{n_tokens} tokens do not fit in {frames} frames")
    # Spread the free blank frames over the n+1 gaps (a uniformly random composition).
    cuts = torch.sort(torch.randint(0, free + 1, (n_tokens,), generator=g)).values
    gaps = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([free])]))
    spans, t = [], 0
    for i in range(n_tokens):
        t += int(gaps[i]) + int(repeats[i])
        spans.append((t, int(dur[i])))
        t += int(dur[i])
    return spans


def text_log_probs(token_seqs: Sequence[Sequence[int]], frames: int, vocab: int, seed: int,
                   confusion: float = 0.1, competitors: Optional[Sequence[int]] = None) -> torch.Tensor:
    """(B, T, V) log-probs that spell the given token sequences (blank id 0).

    Each token covers 1-3 frames (60/30/10%) with blanks between (always between equal tokens).
    A fraction `confusion` of the tokens share their frames' mass with a competitor: a random
    token of `competitors` (80%) or blank (20%) gets a uniform 25-65% of it, so the best path is
    sometimes wrong and an LM can help. Every frame's dominant mass is 1 - eps as in
    :func:`peaky_log_probs`, eps spread over all classes."""
    g = torch.Generator().manual_seed(seed)
    batch = len(token_seqs)
    comp = torch.tensor(list(competitors) if competitors is not None else range(1, vocab))
    main = torch.zeros(batch, frames, dtype=torch.long)  # dominant class per frame (blank default)
    other = torch.zeros(batch, frames, dtype=torch.long)  # competitor class
    share = torch.zeros(batch, frames, dtype=torch.float64)  # competitor's share of the mass
    for b, seq in enumerate(token_seqs):
        repeats = [i > 0 and seq[i] == seq[i - 1] for i in range(len(seq))]
        for i, (start, length) in enumerate(_align(len(seq), repeats, frames, g)):
            main[b, start:start + length] = seq[i]
            if float(torch.rand((), generator=g)) < confusion:
                blank = float(torch.rand((), generator=g)) < 0.2
                rival = 0 if blank else int(comp[torch.randint(len(comp), (), generator=g)])
                if rival != seq[i]:
                    other[b, start:start + length] = rival
                    share[b, start:start + length] = 0.25 + 0.4 * float(torch.rand((), generator=g))
    eps = 10 ** (torch.rand(batch, frames, 1, generator=g, dtype=torch.float64) * 4 - 5)
    probs = eps * (torch.randn(batch, frames, vocab, generator=g, dtype=torch.float64) * 2).softmax(-1)
    mass = 1 - eps[..., 0]
    probs.scatter_add_(2, main[..., None], (mass * (1 - share))[..., None])
    probs.scatter_add_(2, other[..., None], (mass * share)[..., None])
    return probs.log().float()


def pick_texts(sentences: Sequence[str], batch: int, chars: int, seed: int) -> List[str]:
    """`batch` texts of about `chars` characters: consecutive sentences from a seeded start, cut
    at the first word end past `chars`."""
    g = torch.Generator().manual_seed(seed + 1)
    words = " ".join(sentences).split()
    texts = []
    for _ in range(batch):
        i = int(torch.randint(len(words), (), generator=g))
        out: List[str] = []
        while len(" ".join(out)) < chars:
            out.append(words[i % len(words)])
            i += 1
        texts.append(" ".join(out))
    return texts


@dataclass
class Setup:
    """One vocabulary's inputs and what the decoders need to read them."""

    name: str
    lp: torch.Tensor  # (B, T, V) float32, contiguous
    lens: torch.Tensor  # (B,)
    token_list: List[str]
    tokenizer: Any = None  # text mode: asrkit tokenizer
    truth: Optional[List[str]] = None  # text mode: the true texts
    lm_paths: Dict[str, str] = field(default_factory=dict)  # "token"/"word" -> ARPA path
    lms: Dict[str, Any] = field(default_factory=dict)  # loaded asrkit NgramLMs, by kind

    @property
    def vocab(self) -> int:
        return self.lp.shape[2]

    def text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is not None:
            return " ".join(self.tokenizer.decode(list(ids)).split())
        return "".join(self.token_list[i] for i in ids)

    def ids(self, text: str) -> List[int]:
        if self.tokenizer is not None:
            return self.tokenizer.encode(text)
        index = {t: i for i, t in enumerate(self.token_list)}
        return [index[c] for c in text if c in index]

    def asrkit_lm(self, kind: str, unk_offset: float = 0.0, lexicon: bool = False, device: str = "cpu") -> Any:
        """The asrkit scorer for LM `kind` on ``device`` (the ARPA is loaded once); ``lexicon``: the word scorer
        constrained to the word LM's own words (:meth:`lexicon_words`)."""
        from asrkit.lm import ngram_scorer

        words = self.lexicon_words() if lexicon else None
        return ngram_scorer(self.ngram(kind), self.token_list, units=kind, unk_offset=unk_offset, lexicon=words,
                            device=device)

    def ngram(self, kind: str) -> Any:
        """The loaded asrkit NgramLM of kind `kind`."""
        from asrkit.lm import load_ngram

        if kind not in self.lms:
            self.lms[kind] = load_ngram(self.lm_paths[kind])
        return self.lms[kind]

    def lexicon_words(self) -> List[str]:
        """The word LM's vocabulary without <s>, </s>, <unk>: the lexicon of the lexicon rows."""
        return [w for w in self.ngram("word").vocab if w not in ("<s>", "</s>", "<unk>")]

