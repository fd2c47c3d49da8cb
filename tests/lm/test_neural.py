"""Neural LMs: incremental steps against the full forward pass, the training loss against the sentence
log-likelihoods, the batched scorer against a reference search, no host sync inside the CTC prefix search,
fusion behaviour, and training (by the one trainer) to a low perplexity."""
from __future__ import annotations

import math
import random
import re
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from typing import List

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.config import LMModelConfig, load_lm_config
from asrkit.lm import (LSTMLM, NeuralLMScorer, TransformerLM, build_lm, load_neural_lm, make_lm_batch,
                       sentence_log_likelihood)
from asrkit.search import ctc_prefix_beam_search
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.lm_task import train_lm

from host_sync import no_host_sync
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "search"))
from reference_ctc_prefix import reference_prefix_search  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"
V = 9
EXACT = dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None)


def make_lm(kind: str, vocab: int = V, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "lstm":
        lm = LSTMLM(vocab, embed_dim=16, hidden_size=24, num_layers=2, dropout=0.3)
    else:
        lm = TransformerLM(vocab, d_model=16, num_heads=4, ffn_dim=32, num_layers=2, dropout=0.3)
    return lm.eval()


def random_sentences(n: int, gen: torch.Generator, vocab: int = V) -> List[List[int]]:
    """Token ids 1 and 3.. (<unk> included; never the blank or <sos/eos>), lengths 0..8."""
    choices = [1] + list(range(3, vocab))
    return [[choices[int(i)] for i in torch.randint(0, len(choices), (int(k),), generator=gen)]
            for k in torch.randint(0, 9, (n,), generator=gen)]


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_incremental_steps_equal_the_forward_pass_with_pauses(kind: str) -> None:
    lm = make_lm(kind)
    gen = torch.Generator().manual_seed(1)
    ys_in, _ = make_lm_batch(random_sentences(5, gen))
    full = lm.logits(ys_in).log_softmax(-1)  # (B, L, V)
    # Rows pause (active False) at random moments; a pause must leave their state exactly as it was.
    b, length = ys_in.shape
    state = lm.zero_state(b, torch.device("cpu"))
    pos = torch.zeros(b, dtype=torch.long)
    got = torch.zeros_like(full)
    with torch.no_grad():
        while bool((pos < length).any()):
            active = (torch.rand(b, generator=gen) < 0.6) & (pos < length)
            logits, state = lm.step(ys_in.gather(1, pos.clamp(max=length - 1)[:, None])[:, 0], state, active)
            for r in torch.nonzero(active)[:, 0].tolist():
                got[r, pos[r]] = logits[r].log_softmax(-1)
            pos += active.long()
    torch.testing.assert_close(got, full.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_training_loss_is_the_mean_nll_per_target_token(kind: str) -> None:
    """forward(batch), what the trainer calls: total NLL / target tokens (<eos> in, padding out), the
    unit the trainer weighs batches by; a mean per sentence or over padded positions would differ."""
    lm = make_lm(kind)
    sentences = [[3, 4, 5, 6, 7, 8], [1], [], [5, 5, 3]]  # 7 + 2 + 1 + 4 targets
    ys_in, ys_out = make_lm_batch(sentences)
    with torch.no_grad():
        loss = lm({"ys_in": ys_in, "ys_out": ys_out})["loss"]
        nll = -sentence_log_likelihood(lm, ys_in, ys_out)  # (B,)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, nll.sum() / 14, atol=1e-5, rtol=0)
    assert abs(float(loss) - float((nll / torch.tensor([7.0, 2.0, 1.0, 4.0])).mean())) > 1e-3


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_scorer_scores_add_up_to_the_sentence_log_likelihood(kind: str) -> None:
    lm = make_lm(kind)
    scorer = NeuralLMScorer(lm)
    gen = torch.Generator().manual_seed(2)
    sentences = random_sentences(6, gen)
    ys_in, ys_out = make_lm_batch(sentences)
    with torch.no_grad():
        expected = sentence_log_likelihood(lm, ys_in, ys_out)  # (B,)
    state = scorer.init_state(2, 3, torch.device("cpu"))
    total = torch.zeros(6)
    rows = torch.arange(6)
    for i in range(ys_in.shape[1] - 1):
        tok = ys_out[:, i]
        tok = torch.where(tok == 2, -1, tok)  # a finished sentence stays where it is
        scored = scorer.score(state, tok.clamp(min=0)[:, None])[:, 0]
        total += torch.where(tok > 0, scored, 0.0)
        # Between two tokens: a "prefix unchanged" (-1) and a blank leave everything as it was.
        state = scorer.select_state(state, rows, torch.full((6,), -1))
        state = scorer.select_state(state, rows, torch.zeros(6, dtype=torch.long))
        state = scorer.select_state(state, rows, tok)
    total += scorer.final_score(state)
    torch.testing.assert_close(total, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_select_state_with_minus_one_keeps_rows_and_reorders(kind: str) -> None:
    scorer = NeuralLMScorer(make_lm(kind))
    state = scorer.init_state(1, 4, torch.device("cpu"))
    state = scorer.select_state(state, torch.arange(4), torch.tensor([3, 4, 5, 6]))
    index = torch.tensor([2, 0, 0, 3, 1])
    kept = scorer.select_state(state, index, torch.full((5,), -1))
    assert torch.equal(kept.logp, state.logp[index])
    if kind == "lstm":
        assert all(torch.equal(new, old[index]) for new, old in zip(kept.lm, state.lm))
    else:  # one more slot per row, never attended to: the valid slots and positions are the old ones
        kv, valid, pos = kept.lm
        assert torch.equal(kv[:, :, :, :-1], state.lm[0][index]) and not valid[:, -1].any()
        assert torch.equal(valid[:, :-1], state.lm[1][index]) and torch.equal(pos, state.lm[2][index])
    # ... and the next token scores as from the original rows.
    nxt = torch.tensor([7, 7, 8, 1, 3])
    a = scorer.select_state(kept, torch.arange(5), nxt)
    b = scorer.select_state(state, index, nxt)
    torch.testing.assert_close(a.logp, b.logp, atol=1e-6, rtol=0)


def test_blank_scores_zero_and_eos_scores_the_final_probability() -> None:
    scorer = NeuralLMScorer(make_lm("transformer"))
    state = scorer.init_state(1, 2, torch.device("cpu"))
    scores = scorer.score(state, torch.tensor([[0, 2, 5], [0, 2, 1]]))
    assert torch.equal(scores[:, 0], torch.zeros(2)) and scores.dtype == torch.float32
    torch.testing.assert_close(scores[:, 1], scorer.final_score(state))
    assert torch.allclose(state.logp.exp().sum(1), torch.ones(2))


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_fused_search_equals_the_reference_search_with_the_full_forward_lm(kind: str) -> None:
    lm = make_lm(kind, seed=3)
    scorer = NeuralLMScorer(lm)

    @lru_cache(maxsize=None)
    def next_logp(history: tuple) -> List[float]:
        ys = torch.tensor([[2] + [t for t in history if t != 2]])  # <sos/eos> never enters the history
        with torch.no_grad():
            return lm.logits(ys)[0, -1].log_softmax(-1).tolist()

    alpha, beta = 0.7, 0.4
    gen = torch.Generator().manual_seed(4)
    lp = (torch.randn(2, 10, V, generator=gen, dtype=torch.float64) * 2.5).log_softmax(-1)
    lengths = torch.tensor([10, 7])
    got = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"lm": scorer},
                                 weights={"lm": alpha, "length_bonus": beta}, **EXACT).to_lists()
    for b in range(2):
        ref = reference_prefix_search(lp[b, :int(lengths[b])].tolist(), 4,
                                      token_score=lambda p, c: alpha * next_logp(p)[c] + beta,
                                      final_score=lambda p: alpha * next_logp(p)[2])
        assert [tuple(h.tokens) for h in got[b]] == [r[0] for r in ref]
        assert [h.score for h in got[b]] == pytest.approx([r[1] for r in ref], abs=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_scorer_never_syncs_with_the_host(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = NeuralLMScorer(make_lm(kind))

    ran: list = []
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    gen = torch.Generator().manual_seed(5)
    lp = (torch.randn(3, 30, V, generator=gen) * 3).log_softmax(-1)
    for settings in ({}, EXACT):
        ctc_prefix_beam_search(lp, torch.tensor([30, 12, 21]), beam=5, scorers={"lm": scorer},
                               weights={"lm": 0.5}, **settings).to_lists()
    assert len(ran) == 2
    # init_state and final_score run outside the frame loop: check them directly.
    def calls() -> None:
        state = scorer.init_state(2, 3, torch.device("cpu"))
        state = scorer.select_state(state, torch.tensor([0, 0, 1, 5, 4, 3]), torch.tensor([-1, 3, 0, 2, 4, 1]))
        scorer.score(state, torch.tensor([[1, 2, 0]] * 6))
        scorer.final_score(state)

    no_host_sync(calls, ran)()
    assert len(ran) == 3


# ---------------------------------------------------------------- trained LMs
SUBJECTS = ["THE CAT", "A DOG", "THE BIRD", "MY FRIEND"]
VERBS = ["SAT ON", "RAN TO", "LOOKED AT", "WALKED PAST"]
OBJECTS = ["THE MAT", "THE PARK", "A TREE", "THE HOUSE"]


def corpus(n: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}" for _ in range(n)]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm_text")
    (root / "train.txt").write_text("\n".join(corpus(300, 0)) + "\n\n", encoding="utf-8")  # + an empty line
    (root / "dev.txt").write_text("\n".join(corpus(30, 1)) + "\n", encoding="utf-8")
    CharTokenizer.train(corpus(300, 0)).save(root / "tokenizer.json")
    return root


@pytest.fixture(scope="module")
def trained(texts: Path, tmp_path_factory) -> dict:
    """Both tiny LMs trained on the repetitive corpus: {kind: (lm dir, summary)}."""
    out = {}
    for kind in ("lstm", "transformer"):
        cfg = load_lm_config(CONF / f"tiny_lm_{kind}.yaml", ["train.epochs=7"])
        lm_dir = tmp_path_factory.mktemp(f"lm_{kind}")
        summary = train_lm(cfg, str(lm_dir), str(texts / "train.txt"), str(texts / "dev.txt"),
                           str(texts / "tokenizer.json"), plain_text=True, device="cpu")
        out[kind] = (lm_dir, summary)
    return out


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_tiny_lm_reaches_a_low_dev_perplexity(kind: str, trained: dict) -> None:
    lm_dir, summary = trained[kind]
    log = (lm_dir / "train.log").read_text(encoding="utf-8")
    ppl = [float(x) for x in re.findall(r"valid ppl ([0-9.]+)", log)]
    assert len(ppl) == 7 and ppl[-1] < ppl[0] / 3, ppl
    lm, tok = load_neural_lm(lm_dir)
    assert summary["best_valid_ppl"] < 2.5 < tok.vocab_size  # 25 chars; the corpus is nearly deterministic
    assert "1 empty lines skipped" in log
    # model.pt holds the best epoch: its dev perplexity recomputed from the loaded LM.
    dev = [tok.encode(t) for t in corpus(30, 1)]
    with torch.no_grad():
        nll = -sentence_log_likelihood(lm, *make_lm_batch(dev)).sum()
    assert math.exp(float(nll) / sum(len(s) + 1 for s in dev)) == pytest.approx(summary["best_valid_ppl"], rel=1e-4)


def test_weights_of_another_config_are_one_line_naming_the_file(trained: dict, tmp_path: Path) -> None:
    src = trained["lstm"][0]
    lm_dir = tmp_path / "lm"
    shutil.copytree(src, lm_dir)
    cfg = (lm_dir / "config.yaml").read_text(encoding="utf-8")
    layers = re.search(r"num_layers: (\d+)", cfg)
    (lm_dir / "config.yaml").write_text(cfg.replace(layers.group(0), f"num_layers: {int(layers.group(1)) + 1}"),
                                        encoding="utf-8")
    with pytest.raises(ValueError) as exc:
        load_neural_lm(lm_dir)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{lm_dir / 'model.pt'}: the weights do not fit")
    assert "missing" in message and "weight_ih_l" in message


def ambiguous_ctc(tok, text: str, position: int, rival: str) -> torch.Tensor:
    """(1, T, V) log-probs spelling ``text`` (one peaky frame per token, then a blank frame), except that
    at token ``position`` the rival character is slightly more likely than the true one."""
    ids = tok.encode(text)
    lp = torch.full((2 * len(ids), tok.vocab_size), -12.0)
    for i, t in enumerate(ids):
        lp[2 * i, t], lp[2 * i + 1, 0] = -0.01, -0.01
    lp[2 * position, ids[position]] = math.log(0.4)
    lp[2 * position, tok.encode(rival)[0]] = math.log(0.5)
    return lp.log_softmax(-1)[None]


def test_fusion_moves_the_result_towards_lm_likely_text(trained: dict) -> None:
    lm, tok = load_neural_lm(trained["lstm"][0])
    scorer = NeuralLMScorer(lm)
    lp = ambiguous_ctc(tok, "THE CAT SAT ON THE MAT", 6, "R")  # acoustically "THE CAR SAT ON THE MAT"
    lengths = torch.tensor([lp.shape[1]])
    plain = ctc_prefix_beam_search(lp, lengths, beam=4)
    zero = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"lm": scorer}, weights={"lm": 0.0})
    fused = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"lm": scorer}, weights={"lm": 0.5})
    assert tok.decode(plain.best()[0].tokens) == "THE CAR SAT ON THE MAT"
    assert zero.to_lists() == plain.to_lists()  # weight 0: exactly the search without an LM
    assert tok.decode(fused.best()[0].tokens) == "THE CAT SAT ON THE MAT"


def test_build_lm_rejects_bad_settings() -> None:
    with pytest.raises(Exception, match="model.name 'gru'"):
        build_lm(LMModelConfig(name="gru"), 10)
    with pytest.raises(Exception, match="model.hidden_size == model.embed_dim"):
        build_lm(LMModelConfig(tie_embeddings=True, embed_dim=8, hidden_size=16), 10)
    with pytest.raises(Exception, match="not divisible by model.num_heads"):
        build_lm(LMModelConfig(name="transformer", embed_dim=10, num_heads=4), 10)
