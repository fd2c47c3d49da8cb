"""decode.vtln: a warp factor per speaker, chosen by the summed CTC best-path log-posterior of the speaker's
utterances (asrkit.pipeline.vtln); factor 1 is the plain decode; entry points without speakers refuse it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from asrkit.audio.frontend import Frontend
from asrkit.cli import main
from asrkit.config import ConfigError, DecodeConfig, FrontendConfig, VtlnConfig, VtlpConfig, load_decode_config
from asrkit.data.table import read_table
from asrkit.pipeline import Transcriber
from asrkit.pipeline.decode_dir import decode_data_dir
from asrkit.pipeline.tuning import tune_fusion
from asrkit.pipeline.vtln import select_warps, speaker_warps
from tests.pipeline.tiny_exp import make_tiny_exp, tone, write_data_dir

# two speakers of two utterances and one of one; lengths differ so a fake scorer can tell the utterances apart
AUDIO = {f"{spk}-{i}": tone(0.5 + 0.1 * n, 200 + 90 * n, seed=n)
         for n, (spk, i) in enumerate([("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)])}
ALPHAS = (0.9, 1.0, 1.1)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_tiny_exp(tmp_path_factory.mktemp("vtln") / "exp")


@pytest.fixture()
def data(tmp_path):
    path = write_data_dir(tmp_path / "data", AUDIO)
    (path / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in sorted(AUDIO)))
    return path


def _vtln(alphas=ALPHAS) -> DecodeConfig:
    return DecodeConfig(vtln=VtlnConfig(alphas=tuple(alphas)))


def test_select_warps_takes_each_speakers_best_candidate_and_the_first_on_a_tie():
    scores = torch.tensor([[-5.0, -4.0, -6.0], [-1.0, -3.0, -2.0], [-7.0, -8.0, -6.5], [-2.0, -2.0, -2.0]])
    assert select_warps(scores, ALPHAS).tolist() == [1.0, 0.9, 1.1, 0.9]
    with pytest.raises(ValueError, match=r"scores must be \(speakers, 3 candidates\), got \(4, 2\)"):
        select_warps(scores[:, :2], ALPHAS)
    with pytest.raises(ValueError, match=r"got \(3,\)"):
        select_warps(scores[0], ALPHAS)


def test_a_speaker_gets_the_factor_its_utterances_favour_together(exp, data, monkeypatch, caplog):
    """A constructed scorer: each utterance's score peaks at its own factor, with its own weight. Speaker a's two
    utterances pull towards 0.9 (weight 3) and 1.1 (weight 1): the sum picks 0.9, though a mean of factors would
    pick 1.0; b's agree on 1.1; c has one."""
    favour = {"a-1": (0.9, 3.0), "a-2": (1.1, 1.0), "b-1": (1.1, 1.0), "b-2": (1.1, 2.0), "c-1": (1.0, 1.0)}
    by_length = {len(x): u for u, x in AUDIO.items()}
    tr = Transcriber.from_dir(str(exp))
    calls = []

    def scores(wavs, warp):
        calls.append(warp)
        return torch.tensor([-favour[by_length[w.numel()]][1] * abs(warp - favour[by_length[w.numel()]][0]) - 1.0
                             for w in wavs])

    monkeypatch.setattr(tr, "best_path_scores", scores)
    failed = {}
    with caplog.at_level("INFO", "asrkit.pipeline"):
        spk2warp, utt2warp = speaker_warps(tr, str(data), ALPHAS, None, failed, 60.0)
    assert spk2warp == {"a": 0.9, "b": 1.1, "c": 1.0}
    assert "decode.vtln: warp factors of 3 speakers: 0.9 x1, 1 x1, 1.1 x1" in caplog.messages
    assert utt2warp == {"a-1": 0.9, "a-2": 0.9, "b-1": 1.1, "b-2": 1.1, "c-1": 1.0}
    assert calls == list(ALPHAS) and failed == {}  # one batch: one pass per candidate
    (data / "utt2spk").unlink()  # without speakers each utterance is its own
    _, utt2warp = speaker_warps(tr, str(data), ALPHAS, None, failed, 60.0)
    assert utt2warp == {u: f for u, (f, _) in favour.items()}


def test_batches_the_length_limit_and_failing_utterances(exp, data, monkeypatch, caplog):
    """In batches of 2, longest first (utt2dur): c-1 and b-2 are over the limit of 0.7 s, so the first batch scores
    nothing; b-1, at exactly the limit, is scored, and raises: its batch is scored an utterance at a time and b-1 left
    out (the decode records why), a-2 after it kept; an unreadable file is recorded in ``failed``."""
    (data / "d-1.wav").write_bytes(b"RIFF, but not a wav file")
    with open(data / "wav.scp", "a") as fh:
        fh.write(f"d-1 {data / 'd-1.wav'}\n")
    (data / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in [*sorted(AUDIO), "d-1"]))
    (data / "utt2dur").write_text("".join(f"{u} {len(x) / 16000}\n" for u, x in AUDIO.items()) + "d-1 0.1\n")
    favour = {"a-1": (0.9, 3.0), "a-2": (1.1, 1.0)}
    by_length = {len(x): u for u, x in AUDIO.items()}
    tr = Transcriber.from_dir(str(exp))
    batches = []

    def scores(wavs, warp):
        utts = [by_length[w.numel()] for w in wavs]
        batches.append(utts)
        if "b-1" in utts:
            raise ValueError("log_probs contain NaN")
        return torch.tensor([-favour[u][1] * abs(warp - favour[u][0]) for u in utts])

    monkeypatch.setattr(tr, "best_path_scores", scores)
    failed = {}
    with caplog.at_level("INFO", "asrkit.pipeline"):
        spk2warp, utt2warp = speaker_warps(tr, str(data), ALPHAS, 2, failed, 11200 / 16000)
    assert spk2warp == {"a": 0.9} and utt2warp == {"a-1": 0.9, "a-2": 0.9}
    assert list(failed) == ["d-1"] and "d-1.wav" in failed["d-1"]
    assert batches == [["b-1", "a-2"], ["b-1"], ["a-2"], ["a-2"], ["a-2"]] + [["a-1"]] * 3
    assert "decode.vtln: warp factors of 1 speakers: 0.9 x1" in caplog.messages
    assert speaker_warps(tr, str(data), ALPHAS, 2, {}, 0.1) == ({}, {})  # nothing short enough


def test_best_path_scores_are_greedy_path_scores_and_depend_on_the_warp(exp):
    tr = Transcriber.from_dir(str(exp))
    wavs = [torch.from_numpy(x) for x in AUDIO.values()]
    greedy = [t[0].score for t in tr.transcribe_nbest(wavs)]
    assert tr.best_path_scores(wavs, 1.0).tolist() == pytest.approx(greedy, rel=1e-5)
    assert not np.allclose(tr.best_path_scores(wavs, 1.1).numpy(), greedy, rtol=1e-3)


def test_the_frontend_warps_at_decode_time_as_training_warps():
    front = Frontend(FrontendConfig(n_mels=20), vtlp=VtlpConfig(prob=0.5)).eval()
    wav = torch.from_numpy(np.stack([tone(0.5, 300), tone(0.5, 500, 1)]))
    lens = torch.tensor([8000, 6000])
    warp = torch.tensor([0.9, 1.1])
    assert torch.equal(front.warped(wav, lens, torch.ones(2))[0], front(wav, lens)[0])  # 1: the identity
    warped = front.warped(wav, lens, warp)[0]
    assert torch.allclose(warped, front.train()(wav, lens, warp)[0], atol=1e-6)  # no SpecAugment configured
    assert torch.equal(front.warped(wav, lens, warp)[0], warped)  # whatever the mode
    assert not torch.allclose(warped, front(wav, lens)[0], atol=1e-2)


def test_decode_writes_spk2warp_and_decodes_each_speaker_with_its_factor(exp, data, tmp_path):
    tr = Transcriber.from_dir(str(exp))
    wavs = {u: torch.from_numpy(x) for u, x in AUDIO.items()}
    sums = {}  # the criterion recomputed, an utterance at a time: per speaker, the summed path score per factor
    for u, w in wavs.items():
        scores = [float(tr.best_path_scores([w], a)[0]) for a in ALPHAS]
        sums[u[0]] = [x + y for x, y in zip(sums.get(u[0], [0.0] * len(ALPHAS)), scores)]
    want = {s: ALPHAS[int(np.argmax(v))] for s, v in sums.items()}
    out = tmp_path / "out"
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(out),
                 "--set", "vtln.alphas=[0.9,1.0,1.1]"]) == 0
    spk2warp = {s: float(a) for s, a in read_table(out / "spk2warp").items()}
    assert spk2warp == want
    assert load_decode_config(out / "decode.yaml").vtln.alphas == ALPHAS
    text = read_table(out / "text")
    for u, w in wavs.items():  # each alone with its speaker's factor
        assert text[u] == tr.transcribe_nbest([w], [spk2warp[u[0]]])[0][0].text, u
    assert sum(len(t) for t in text.values()) > 5  # the model says something: the comparison can fail
    # factor 1 alone is the plain decode; decoding without VTLN leaves no stale spk2warp
    assert decode_data_dir(Transcriber.from_dir(str(exp), decode=_vtln([1.0])), str(data), str(out))["failed"] == 0
    assert set(read_table(out / "spk2warp").values()) == {"1"}
    one = read_table(out / "text")
    decode_data_dir(tr, str(data), str(out))
    assert read_table(out / "text") == one and not (out / "spk2warp").exists()


def test_the_chosen_factors_differ_between_speakers_on_this_model(exp, data, tmp_path):
    """(So the test above compares more than one factor.)"""
    decode_data_dir(Transcriber.from_dir(str(exp), decode=_vtln()), str(data), str(tmp_path / "out"))
    assert len(set(read_table(tmp_path / "out" / "spk2warp").values())) > 1


def test_an_utterance_over_the_length_limit_fails_with_the_reason(exp, data, tmp_path):
    tr = Transcriber.from_dir(str(exp), decode=_vtln())
    counts = decode_data_dir(tr, str(data), str(tmp_path / "out"), max_seconds=0.75)  # a-1, a-2, b-1 are shorter
    failed = read_table(tmp_path / "out" / "failed")
    assert counts == {"decoded": 3, "failed": 2} and sorted(failed) == ["b-2", "c-1"]
    assert "decode.vtln warps whole utterances only (raise --max-utt-seconds" in failed["c-1"]
    assert set(read_table(tmp_path / "out" / "spk2warp")) == {"a", "b"}  # from the utterances it decodes


def test_transcribe_streams_and_tuning_refuse_vtln(exp, data):
    tr = Transcriber.from_dir(str(exp), decode=_vtln())
    wav = torch.from_numpy(AUDIO["a-1"])
    with pytest.raises(ConfigError, match=r"^decode.vtln warps the speakers of a data dir: asrkit decode only"):
        tr.transcribe(wav, sample_rate=16000)
    with pytest.raises(ConfigError, match="asrkit decode only"):
        tr.stream()
    with pytest.raises(ConfigError, match="asrkit decode only"):
        Transcriber.from_dir(str(exp)).transcribe(wav, sample_rate=16000, vtln={"alphas": [0.9]})
    with pytest.raises(ConfigError, match="^decode.vtln: tune-fusion tunes on unwarped features"):
        tune_fusion(tr, str(data), [0.5], [0.0], lambda hyps: 0.0)


@pytest.mark.parametrize("alphas, message", [
    ([0.4, 1.0], r"decode.vtln.alphas must lie within \[0.5, 2\], got \[0.4, 1.0\]"),
    ([1.0, 2.5], r"must lie within \[0.5, 2\], got \[1.0, 2.5\]"),
    ([0.9, 1.0, 0.9], r"decode.vtln.alphas lists a factor twice: \[0.9, 1.0, 0.9\]"),
])
def test_bad_factors_are_refused(alphas, message):
    with pytest.raises(ConfigError, match=message):
        load_decode_config(None, [f"vtln.alphas={alphas}"])
    assert dataclasses.replace(VtlnConfig(), alphas=(0.5, 2.0)).alphas == (0.5, 2.0)  # the ends are allowed
