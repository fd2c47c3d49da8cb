"""The streaming pipeline's search adapters: greedy CTC carried across chunks equals greedy_search on the whole
utterance; modes that cannot stream are refused; two-pass rescoring equals offline rescoring."""
from __future__ import annotations

import pytest
import torch

from asrkit.config import ConfigError, DecodeConfig
from asrkit.pipeline.streaming_search import GreedyStreamSearch, build_stream_search, check_streaming_mode, second_pass
from asrkit.search import NBest, attention_rescore, greedy_search


def _log_probs(batch: int, frames: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, vocab, generator=g) * 3
    logits[..., 0] += 2.0  # blank-heavy, as CTC outputs are: runs of blanks and repeats both occur
    return logits.log_softmax(-1)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_in_pieces_equals_greedy_at_once(seed):
    lp = _log_probs(3, 57, 6, seed)
    lengths = torch.tensor([57, 40, 1])
    search = GreedyStreamSearch()
    states = [search.new_state() for _ in range(3)]
    g = torch.Generator().manual_seed(100 + seed)
    t = 0
    while t < 57:  # pieces of 1..9 frames; each row's valid frames within the piece
        n = int(torch.randint(1, 10, (1,), generator=g))
        piece = lp[:, t: t + n]
        valid = (lengths - t).clamp(0, piece.shape[1])
        search.advance(states, piece, valid)
        t += n
    got = search.finish(states).to_lists()
    ref = greedy_search(lp, lengths).to_lists()
    for g_hyps, r_hyps in zip(got, ref):
        assert g_hyps[0].tokens == r_hyps[0].tokens
        assert g_hyps[0].token_frames == r_hyps[0].token_frames
        assert g_hyps[0].score == pytest.approx(r_hyps[0].score, abs=1e-4)
    # partial == the finished hypothesis; blank_run == trailing blank frames of the best path
    for b, (st, hyp, n) in enumerate(zip(states, search.partial(states), lengths.tolist())):
        assert hyp.tokens == got[b][0].tokens and hyp.token_frames == got[b][0].token_frames
        ids = lp[b, :n].argmax(-1).tolist()
        k = len(ids)
        while k > 0 and ids[k - 1] == 0:
            k -= 1
        assert search.blank_run([st]) == [len(ids) - k]


def test_greedy_blank_run_counts_across_pieces():
    search = GreedyStreamSearch()
    st = search.new_state()
    blank, token = torch.tensor([0.0, -9.0]), torch.tensor([-9.0, 0.0])
    search.advance([st], torch.stack([token, blank, blank])[None], torch.tensor([3]))
    assert search.blank_run([st]) == [2]
    search.advance([st], torch.stack([blank, blank])[None], torch.tensor([2]))
    assert search.blank_run([st]) == [4]
    search.advance([st], torch.stack([token])[None], torch.tensor([1]))
    assert search.blank_run([st]) == [0]
    assert st.tokens == [1, 1] and st.frames == [0, 5]  # a blank between two 1s: two tokens


@pytest.mark.parametrize("mode", ["attention", "joint"])
def test_label_synchronous_modes_cannot_stream(mode):
    with pytest.raises(ConfigError, match=f"decode.mode '{mode}' cannot stream"):
        check_streaming_mode(DecodeConfig(mode=mode))
    with pytest.raises(ConfigError, match="cannot stream"):
        build_stream_search(DecodeConfig(mode=mode), lambda: ({}, {}))


def test_second_pass_is_offline_rescoring_over_each_utterance():
    torch.manual_seed(0)
    tokens = torch.tensor([[[1, 2, -1], [2, -1, -1]], [[3, -1, -1], [1, 1, 2]]])
    nbest = NBest(tokens=tokens, lengths=torch.tensor([[2, 1], [1, 3]]),
                  scores=torch.tensor([[-1.0, -2.0], [-3.0, -3.5]]),
                  ctc_scores=torch.tensor([[-1.5, -2.0], [-3.0, -4.0]]), token_frames=tokens.clamp(min=0))
    encs = [torch.randn(5, 4), torch.randn(3, 4)]

    def score_tokens(enc, enc_lens, toks, lens):  # depends on the utterance's frames and the tokens
        pooled = torch.stack([e[: int(n)].sum() for e, n in zip(enc, enc_lens)])
        return pooled * 0.1 - (toks.clamp(min=0).sum(1).float() * 0.7) - lens.float()

    cfg = DecodeConfig(mode="rescore", beam=2, nbest=2, ctc_weight=0.3)
    got = second_pass(cfg, nbest, encs, score_tokens)
    enc = torch.nn.utils.rnn.pad_sequence(encs, batch_first=True)
    lens = torch.tensor([5, 3])
    ref = attention_rescore(nbest, lambda u, t, n: score_tokens(enc[u], lens[u], t, n), 0.3)
    assert torch.equal(got.tokens, ref.tokens)
    assert torch.allclose(got.scores, ref.scores)
    assert second_pass(DecodeConfig(mode="ctc_prefix"), nbest, encs, None) is nbest
    with pytest.raises(ConfigError, match="needs an attention decoder"):
        second_pass(cfg, nbest, encs, None)
