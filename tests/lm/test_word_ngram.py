"""WordNgramScorer against KenLM and inside the CTC prefix search (no host sync); its state ids."""
import random

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.lm import WordNgramScorer, load_ngram, ngram_scorer
from asrkit.search import ctc_prefix_beam_search
from host_sync import no_host_sync
from test_ngram import (CHAR_TOKENS, FIXTURES, LN10, OOV_WORDS, SP_TOKENS, TOL, WORDS, RefLM, RefWordSearch,
                        spell, write_random_arpa)


def walk(scorer, seqs):
    """Score and take each token of ``seqs`` (one row each, -1 padded), then </s>: per-row totals."""
    n = len(seqs)
    state = scorer.init_state(n, 1, torch.device("cpu"))
    totals = torch.zeros(n, dtype=torch.float64)
    for t in range(max(map(len, seqs))):
        toks = torch.tensor([s[t] if t < len(s) else -1 for s in seqs])
        lp = scorer.score(state, toks.clamp(min=0).unsqueeze(1))[:, 0]
        totals += torch.where(toks >= 0, lp, 0.0).double()
        state = scorer.select_state(state, torch.arange(n), toks)
    return totals + scorer.final_score(state).double()


@pytest.mark.parametrize("units", ["char", "sp"])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_word_scorer_agrees_with_kenlm(tmp_path, units, order):
    """Spelled sentences (look-ahead on, no unk offset): the token scores telescope to KenLM's sentence score."""
    kenlm = pytest.importorskip("kenlm")
    path = write_random_arpa(tmp_path / "words.arpa", WORDS, order, seed=order + 30, closed=True)
    tokens = CHAR_TOKENS if units == "char" else SP_TOKENS
    scorer, model = ngram_scorer(path, tokens, units="word", unk_offset=0.0), kenlm.Model(str(path))
    rng = random.Random(order)
    sents = [rng.choices(WORDS + OOV_WORDS, k=rng.randint(0, 6)) for _ in range(16)]
    seqs = [spell(s, tokens, rng) for s in sents]
    got = walk(scorer, seqs)
    for r, (sent, seq) in enumerate(zip(sents, seqs)):
        words = "".join(tokens[t] for t in seq).replace("\u2581", " ").split()  # a <unk> token makes an OOV
        want = model.score(" ".join(words), bos=True, eos=True) * LN10
        assert float(got[r]) == pytest.approx(want, abs=1e-3), (sent, words)


def test_word_state_is_context_state_ids():
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    scorer = WordNgramScorer(lm, CHAR_TOKENS + ["M"])
    ids = {t: i for i, t in enumerate(CHAR_TOKENS + ["M"])}
    state = scorer.init_state(1, 1, torch.device("cpu"))
    assert state.hist_state.tolist() == state.closed_state.tolist() == [lm.bos_id]
    for ch in "THE":
        state = scorer.select_state(state, torch.tensor([0]), torch.tensor([ids[ch]]))
    assert state.hist_state.tolist() == [lm.bos_id] and state.node.tolist() != [0]
    _, closed = lm.state_logprob(torch.tensor([lm.bos_id]), torch.tensor([[lm.index("THE")]]))
    assert state.closed_state.tolist() == closed[:, 0].tolist()
    state = scorer.select_state(state, torch.tensor([0]), torch.tensor([ids["\u2581"]]))
    assert state.hist_state.tolist() == state.closed_state.tolist() == closed[:, 0].tolist()
    assert state.node.tolist() == [0]  # the empty word: the trie's root


def forbid_host_sync(monkeypatch, scorer, ran):
    """Make any host sync raise inside the search's frame loop and the scorer's final_score."""
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    monkeypatch.setattr(scorer, "final_score", no_host_sync(scorer.final_score, ran))


@pytest.mark.parametrize("units,lookahead,unk_offset", [("char", True, -5.0), ("sp", True, 0.0), ("char", False, 0.0)])
def test_word_scorer_in_prefix_search_never_syncs_and_matches_reference(tmp_path, monkeypatch, units, lookahead,
                                                                        unk_offset):
    """Inside ctc_prefix_beam_search, score/select_state never sync, and each returned hypothesis's LM
    part (score - ctc score) is the reference word-LM score of its tokens."""
    path = write_random_arpa(tmp_path / "words.arpa", WORDS, 4, seed=12, closed=False)
    tokens = CHAR_TOKENS if units == "char" else SP_TOKENS
    scorer = ngram_scorer(path, tokens, units="word", lookahead=lookahead, unk_offset=unk_offset)
    ref = RefWordSearch(RefLM(path), tokens, lookahead, unk_offset)
    ran = []
    forbid_host_sync(monkeypatch, scorer, ran)
    rng = random.Random(1)
    # log-probs that spell sentences (with noise) so the LM has words to score
    batch, frames, weight = 3, 60, 0.7
    gen = torch.Generator().manual_seed(5)
    lp = torch.randn(batch, frames, len(tokens), generator=gen)
    for b in range(batch):
        seq = spell(rng.choices(WORDS + OOV_WORDS, k=4), tokens, rng)
        for i, t in enumerate(seq[:frames // 2]):
            lp[b, 2 * i, t] += 6.0
            lp[b, 2 * i + 1, 0] += 6.0
    lp = lp.log_softmax(-1)
    lengths = torch.tensor([frames, 41, 52])
    out = ctc_prefix_beam_search(lp, lengths, beam=5, nbest=3, scorers={"lm": scorer}, weights={"lm": weight},
                                 native=False)  # the torch loop's host-sync guard
    assert ran == ["frame_loop", "final_score"]
    texts = []
    for hyps in out.to_lists():
        assert hyps
        texts.append("".join(tokens[t] for t in hyps[0].tokens))
        for h in hyps:
            want = ref.tokens_total(h.tokens)
            assert (h.score - h.ctc_score) / weight == pytest.approx(want, abs=1e-3)
    assert sum(text.count("\u2581") for text in texts) >= 4, texts  # words were closed along the way


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_word_scorer_cuda_matches_cpu(tmp_path):
    path = write_random_arpa(tmp_path / "words.arpa", WORDS, 4, seed=3, closed=False)
    rng = random.Random(4)
    seqs = [spell(rng.choices(WORDS + OOV_WORDS, k=3), SP_TOKENS, rng) for _ in range(5)]
    results = []
    for device in ("cpu", "cuda"):
        scorer = ngram_scorer(path, SP_TOKENS, units="word", device=device, unk_offset=-4.0)
        n, cand = len(seqs), torch.arange(len(SP_TOKENS), device=device).expand(len(seqs), -1)
        state = scorer.init_state(n, 1, torch.device(device))
        outs = []
        torch.cuda.set_sync_debug_mode("error" if device == "cuda" else 0)
        try:
            for t in range(max(map(len, seqs))):
                outs.append(scorer.score(state, cand))
                toks = torch.tensor([s[t] if t < len(s) else -1 for s in seqs]).to(device, non_blocking=True)
                state = scorer.select_state(state, torch.arange(n, device=device), toks)
            outs.append(scorer.final_score(state).unsqueeze(1))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        results.append(torch.cat(outs, 1).cpu())
    torch.testing.assert_close(results[0], results[1], atol=TOL, rtol=0)
