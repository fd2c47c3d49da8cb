"""The streaming pipeline's search adapters: greedy CTC carried across chunks equals greedy_search on the whole
utterance; modes that cannot stream are refused; two-pass rescoring equals offline rescoring."""
from __future__ import annotations

import pytest
import torch

from asrkit.config import ConfigError, DecodeConfig
from asrkit.pipeline.streaming_search import GreedyStreamSearch, build_stream_search, check_streaming_mode, second_pass
from asrkit.search import LengthBonus, NBest, attention_rescore, greedy_search
from asrkit.search.streaming import StreamingCtcSearch


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
    one = second_pass(DecodeConfig(mode="rescore", beam=2, nbest=1, ctc_weight=0.3), nbest, encs, score_tokens)
    assert one.nbest == 1 and torch.equal(one.tokens, ref.tokens[:, :1])  # decode.nbest of the rescored list
    with pytest.raises(ConfigError, match=r"^decode.mode 'rescore' needs an attention decoder; this model has none$"):
        second_pass(cfg, nbest, encs, None)


def test_greedy_finish_pads_like_greedy_search():
    search = GreedyStreamSearch()
    spoken, silent = search.new_state(), search.new_state()
    lp = torch.full((2, 4, 5), -9.0)
    lp[0, [0, 1, 2, 3], [3, 0, 1, 1]] = -0.5  # 3 _ 1 1: tokens 3, 1 at frames 0, 2
    lp[1, :, 0] = -0.25  # all blank
    search.advance([spoken, silent], lp, torch.tensor([4, 4]))
    got = search.finish([spoken, silent])
    assert got.tokens.dtype == got.token_frames.dtype == got.lengths.dtype == torch.long
    assert got.tokens.tolist() == [[[3, 1]], [[-1, -1]]] and got.token_frames.tolist() == [[[0, 2]], [[-1, -1]]]
    assert got.lengths.tolist() == [[2], [0]]
    assert got.scores.dtype == torch.float32 and got.scores.tolist() == [[-2.0], [-1.0]]
    assert torch.equal(got.ctc_scores, got.scores) and got.ctc_scores.data_ptr() != got.scores.data_ptr()
    assert [(h.score, h.ctc_score) for h in search.partial([spoken, silent])] == [(-2.0, -2.0), (-1.0, -1.0)]
    assert search.finish([silent]).tokens.shape == (1, 1, 0)  # no token anywhere: an empty width
    ref = greedy_search(lp, torch.tensor([4, 4]))
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.token_frames, ref.token_frames)


def test_greedy_rows_without_frames_leave_their_state_and_not_the_others():
    search = GreedyStreamSearch()
    waiting, going = search.new_state(), search.new_state()
    lp = torch.full((2, 3, 4), -9.0)
    lp[:, :, 2] = -0.1
    search.advance([waiting, going], lp, torch.tensor([0, 3]))
    assert (waiting.tokens, waiting.seen, waiting.score) == ([], 0, 0.0)
    assert (going.tokens, going.frames, going.seen) == ([2], [0], 3) and going.score == pytest.approx(-0.3)
    search.advance([waiting, going], lp[:, :1], torch.tensor([1, 1]))  # the padding's 2 was not its last frame
    assert (waiting.tokens, waiting.frames, going.tokens) == ([2], [0], [2])


def test_the_decode_mode_picks_the_first_pass():
    assert isinstance(build_stream_search(DecodeConfig(mode="greedy"), lambda: ({}, {})), GreedyStreamSearch)
    bonus = LengthBonus()
    for mode, nbest in (("ctc_prefix", 3), ("rescore", 6)):  # rescore keeps the beam for the decoder
        search = build_stream_search(DecodeConfig(mode=mode, beam=6, nbest=3, token_topk=5, token_min_logp=-7.0,
                                                  blank_skip_threshold=0.99),
                                     lambda: ({"lm": bonus}, {"lm": 0.25, "length_bonus": 0.5}))
        assert isinstance(search, StreamingCtcSearch)
        assert (search.beam, search.nbest, search.topk, search.min_logp, search.skip) == (6, nbest, 5, -7.0, 0.99)
        assert search.scorers == {"lm": bonus} and search.weights == {"lm": 0.25} and search.bonus == 0.5
        assert search.device == torch.device("cpu")
    assert build_stream_search(DecodeConfig(mode="ctc_prefix"), lambda: ({}, {}), "meta").device.type == "meta"
    with pytest.raises(ConfigError, match=r"streaming takes greedy, ctc_prefix, rescore; rescore is the two-pass"):
        check_streaming_mode(DecodeConfig(mode="joint"))
