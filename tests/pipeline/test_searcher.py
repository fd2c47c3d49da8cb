"""Every decoding mode through the pipeline, on a joint CTC/attention model overfitted to four espeak utterances."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from asrkit.cli import main
from asrkit.config import ConfigError, DecodeConfig, load_config, load_decode_config, save_config
from asrkit.data.dataset import AsrDataset, collate
from asrkit.data.table import read_table
from asrkit.models.registry import build_model
from asrkit.pipeline import Transcriber, load_lm_scorer
from asrkit.pipeline.searcher import Searcher
from asrkit.search import WordCount
from asrkit.score.wer import score_texts
from asrkit.text.tokenizer import CharTokenizer
from asrkit.checkpoint import save_model_weights

REPO = Path(__file__).resolve().parents[2]
MODES = ("greedy", "ctc_prefix", "attention", "joint", "rescore")


def _tiny_config(ctc_only: bool = False):
    parts = ["model.ctc_weight=1.0", "model.decoder={kind: none}"] if ctc_only else [
        "model.decoder.dropout=0.0", "model.decoder.num_layers=1", "model.decoder.ffn_dim=128", "model.ctc_weight=0.5"]
    return load_config(REPO / "conf" / "tiny_transformer.yaml", [
        "specaug.enabled=false", "model.encoder.dropout=0.0", "model.encoder.d_model=64", "model.encoder.num_layers=2",
        "model.encoder.ffn_dim=128", "model.lsm_weight=0.0", "frontend.n_mels=40", "tokenizer.path=tokenizer.json",
        "cmvn=null", *parts])


@pytest.fixture(scope="module")
def overfit(tiny_corpus, tmp_path_factory):
    """(exp dir, model, cfg, tokenizer, 4 waveforms, their texts): greedy CTC and greedy attention both exact."""
    torch.manual_seed(0)
    cfg = _tiny_config()
    tok = CharTokenizer.train(read_table(tiny_corpus / "train" / "text").values())
    ds = AsrDataset(tiny_corpus / "train", 16000, tokenizer=tok)
    batch = collate([ds[i] for i in range(4)])
    model = build_model(cfg, tok.vocab_size)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    wavs = [batch["wav"][i, : int(n)] for i, n in enumerate(batch["wav_lens"])]
    exact_at = None
    for step in range(900):
        model.train()
        loss = model(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        if step % 25 == 24:
            model.eval()
            exact = all(_texts(Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=1)), wavs)
                        == batch["texts"] for mode in ("greedy", "attention"))
            exact_at = step if exact and exact_at is None else exact_at
            # Not at the first exact pass but 100 steps on, exact again: a model that is only just exact
            # under greedy decoding can still lose to another path in a beam search (a change of audio or
            # kernels is enough to tip it).
            if exact and step >= exact_at + 100:
                break
    model.eval()
    exp = tmp_path_factory.mktemp("overfit_exp")
    save_config(cfg, exp / "config.yaml")
    tok.save(exp / "tokenizer.json")
    save_model_weights(model, exp / "model.pt")
    return exp, model, cfg, tok, wavs, batch["texts"]


def _best(transcriber: Transcriber, wavs) -> list:
    """The best Transcript of each waveform, decoded as one utterance."""
    return [hyps[0] for hyps in transcriber.transcribe_nbest(wavs)]


def _texts(transcriber: Transcriber, wavs) -> list:
    return [t.text for t in _best(transcriber, wavs)]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_transcribes_the_overfitted_utterances(overfit, mode):
    _, model, cfg, tok, wavs, texts = overfit
    tr = Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=4))
    assert _texts(tr, wavs) == texts
    # batching does not change a result
    assert [_texts(tr, [w])[0] for w in wavs] == texts


@pytest.mark.parametrize("mode", ["attention", "joint"])
def test_length_penalty_is_wired_into_the_label_synchronous_search(overfit, mode):
    """A GNMT length penalty keeps the overfitted transcripts, and its normalised scores are what the N-best
    reports: score / ((5 + |Y|) / 6) ** alpha of the unpenalised search's raw score."""
    _, model, cfg, tok, wavs, texts = overfit
    plain = _best(Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=4)), wavs)
    penalised = Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=4, length_penalty=1.0))
    out = _best(penalised, wavs)
    assert [t.text for t in out] == texts
    for p, q in zip(plain, out):
        assert q.score == pytest.approx(p.score / ((5 + len(p.tokens)) / 6), rel=1e-4)


def test_nbest_is_sorted_and_distinct(overfit):
    _, model, cfg, tok, wavs, texts = overfit
    for mode in ("ctc_prefix", "joint", "rescore"):
        tr = Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=4, nbest=3))
        for alternatives, ref in zip(tr.transcribe_nbest(wavs), texts):
            assert alternatives[0].text == ref
            assert 1 < len(alternatives) <= 3
            scores = [a.score for a in alternatives]
            assert scores == sorted(scores, reverse=True), mode
            assert len({tuple(a.tokens) for a in alternatives}) == len(alternatives), mode


def test_timestamps_follow_the_tokens_in_every_mode(overfit):
    _, model, cfg, tok, wavs, _ = overfit
    times = {}
    for mode in MODES:
        out = _best(Transcriber(model, cfg, tok, decode=DecodeConfig(mode=mode, beam=4)), wavs)
        for t, wav in zip(out, wavs):
            assert len(t.token_times) == len(t.tokens) and t.token_times == sorted(t.token_times), mode
            assert 0 <= t.token_times[0] and t.token_times[-1] <= len(wav) / 16000, mode
        times[mode] = [t.token_times for t in out]
    # The attention modes get their times from a CTC forced alignment (Viterbi). Here they find the greedy
    # tokens, whose best path is the unconstrained best path: the times must be greedy's exactly.
    assert times["attention"] == times["joint"] == times["greedy"]


def _unigram_arpa(path: Path, tok: CharTokenizer, banned: str) -> None:
    """A token-unit unigram LM: every token equally likely except ``banned`` (log10 prob -6)."""
    words = [t for t in tok.token_list[3:]] + ["</s>", "<unk>"]
    lines = ["\\data\\", f"ngram 1={len(words) + 1}", "", "\\1-grams:", "-99\t<s>"]
    lines += [f"{-6.0 if w == banned else -1.0}\t{w}" for w in words]
    lines += ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def test_lm_fusion_through_the_pipeline(overfit, tmp_path):
    _, model, cfg, tok, wavs, texts = overfit
    arpa = tmp_path / "uni.arpa"
    banned = max("".join(texts).replace(" ", ""), key="".join(texts).count)  # the most frequent letter
    _unigram_arpa(arpa, tok, banned)
    plain = _texts(Transcriber(model, cfg, tok, decode=DecodeConfig(mode="ctc_prefix", beam=4)), wavs)
    for mode, full in (("ctc_prefix", False), ("joint", False), ("joint", True)):
        zero = DecodeConfig(mode=mode, beam=4, lm=str(arpa), lm_units="token", lm_weight=0.0, lm_full=full)
        assert _texts(Transcriber(model, cfg, tok, decode=zero), wavs) == plain
        # lm_full: the LM's scores also choose the pre-beam (of one candidate here, so it decides alone)
        strong = DecodeConfig(mode=mode, beam=4, lm=str(arpa), lm_units="token", lm_weight=5.0, lm_full=full,
                              pre_beam=1 if full else 0)
        fused = _texts(Transcriber(model, cfg, tok, decode=strong), wavs)
        assert sum(t.count(banned) for t in fused) < sum(t.count(banned) for t in texts), mode


@pytest.mark.parametrize("change, key", [
    (dict(mode="beam"), "decode.mode"),
    (dict(mode="ctc_prefix", beam=2, nbest=3), "decode.nbest"),
    (dict(mode="greedy", lm="x.arpa"), "decode.lm"),
    (dict(mode="ctc_prefix", lm="/no/such/lm.arpa"), "/no/such/lm.arpa"),
    (dict(mode="joint", ctc_weight=1.5), "decode.ctc_weight"),
    (dict(mode="ctc_prefix", lm_units="words"), "decode.lm_units"),
    (dict(mode="ctc_prefix", length_penalty=0.5), "decode.length_penalty"),
    (dict(mode="joint", length_penalty=float("nan")), "decode.length_penalty"),
    (dict(mode="joint", lm_full=True), "decode.lm_full"),
    # Non-finite weights emptied every hypothesis (exit 0, no text): refused, the key named.
    (dict(mode="ctc_prefix", lm_weight=float("nan")), "decode.lm_weight must be a finite number, got nan"),
    (dict(mode="joint", length_bonus=float("-inf")), "decode.length_bonus must be a finite number, got -inf"),
    (dict(mode="ctc_prefix", lm_unk_offset=float("inf")), "decode.lm_unk_offset"),
    (dict(mode="ctc_prefix", token_min_logp=float("nan")), "decode.token_min_logp"),
])
def test_bad_settings_are_named(overfit, change, key):
    _, model, cfg, tok, _, _ = overfit
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        Transcriber(model, cfg, tok, decode=DecodeConfig(**change))


@pytest.mark.parametrize("mode", ["joint", "attention", "rescore"])
def test_modes_the_model_cannot_run_are_refused(mode):
    cfg = _tiny_config(ctc_only=True)
    model = build_model(cfg, 10)
    with pytest.raises(ConfigError, match="attention decoder"):
        Transcriber(model, cfg, CharTokenizer(list("ABCDEFG")), decode=DecodeConfig(mode=mode))


def test_attention_model_without_ctc_head_needs_attention_mode():
    cfg = load_config(REPO / "conf" / "tiny_blstm_location_attention.yaml", ["model.ctc_weight=0.0"])
    model = build_model(cfg, 10)
    assert model.ctc is None  # ctc_weight 0 builds no CTC head (an untrained one could not decode)
    with pytest.raises(ConfigError, match="CTC head"):
        Transcriber(model, cfg, CharTokenizer(list("ABCDEFG")), decode=DecodeConfig(mode="joint"))
    Transcriber(model, cfg, CharTokenizer(list("ABCDEFG")), decode=DecodeConfig(mode="attention"))


def test_decode_cli_writes_text_nbest_and_settings(overfit, tiny_corpus, tmp_path, capsys):
    exp, _, _, _, _, texts = overfit
    data = tmp_path / "data"
    shutil.copytree(tiny_corpus / "train", data)
    refs = read_table(data / "text")
    out = tmp_path / "dec"
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(out),
                 "--decode-config", str(REPO / "conf" / "decode_joint.yaml"), "--beam", "4",
                 "--set", "nbest=2", "--set", "ctc_weight=0.4"]) == 0
    hyps = read_table(out / "text")
    assert set(hyps) == set(refs)
    assert sum(hyps[u] == refs[u] for u in refs) >= 4  # the 4 overfitted ones at least
    used = load_decode_config(out / "decode.yaml")
    assert (used.mode, used.beam, used.nbest, used.ctc_weight) == ("joint", 4, 2, 0.4)
    rows = [json.loads(line) for line in (out / "nbest.jsonl").read_text().splitlines()]
    assert {r["utt"] for r in rows} == set(refs) and {r["rank"] for r in rows} <= {1, 2}
    assert all(r["text"] == hyps[r["utt"]] for r in rows if r["rank"] == 1)

    capsys.readouterr()
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(out), "--set", "beam=0"]) == 1
    assert "decode.beam" in capsys.readouterr().err
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(out), "--set", "bogus=1"]) == 1
    assert "bogus" in capsys.readouterr().err


def test_transcribe_cli_json_nbest(overfit, tiny_corpus, capsys):
    exp, *_ = overfit
    wav = sorted(read_table(tiny_corpus / "train" / "wav.scp").values())[0]
    capsys.readouterr()
    assert main(["transcribe", "--model", str(exp), "--format", "jsonl", "--segmenter", "none", "--mode", "rescore",
                 "--beam", "3", "--set", "nbest=2", "--no-progress", wav]) == 0
    obj = json.loads(capsys.readouterr().out.strip())
    assert obj["text"] == obj["nbest"][0]["text"] and len(obj["nbest"]) == 2
    assert " ".join(w["word"] for w in obj["words"]) == obj["text"]


def test_decode_config_file_and_overrides(tmp_path):
    cfg = load_decode_config(REPO / "conf" / "decode_ctc_prefix_lm.yaml", ["beam=20", "lm=lm/x.arpa"])
    assert cfg.mode == "ctc_prefix" and cfg.beam == 20 and cfg.lm == "lm/x.arpa" and cfg.lm_weight == 0.5
    assert load_decode_config() == DecodeConfig()
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: joint\nbeam_size: 3\n")
    with pytest.raises(ConfigError, match="beam_size"):
        load_decode_config(bad)


def test_out_of_memory_batches_are_split_in_half(overfit, monkeypatch):
    _, model, cfg, tok, wavs, texts = overfit
    tr = Transcriber(model, cfg, tok, decode=DecodeConfig(mode="joint", beam=2), segmenter="none")
    real, sizes = tr.searcher.search, []
    whole = [(r.text, r.words) for r in tr.transcribe(wavs)]

    def flaky(model_, enc, enc_lens, log_probs=None):
        sizes.append(enc.shape[0])
        if enc.shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model_, enc, enc_lens, log_probs)

    monkeypatch.setattr(tr.searcher, "search", flaky)
    assert _texts(tr, wavs) == texts
    assert sizes == [4, 2, 1, 1, 2, 1, 1]
    sizes.clear()  # the same through transcribe(), which batches segments
    assert [(r.text, r.words) for r in tr.transcribe(wavs)] == whole
    assert sizes == [4, 2, 1, 1, 2, 1, 1]

    def always(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(tr.searcher, "search", always)
    with pytest.raises(torch.cuda.OutOfMemoryError):  # a single utterance cannot be split
        tr.transcribe_nbest(wavs[:1])


def test_tune_fusion_picks_the_best_weight_and_matches_plain_decoding(overfit, tiny_corpus, tmp_path, capsys):
    exp, model, cfg, tok, wavs, texts = overfit
    arpa = tmp_path / "uni.arpa"
    banned = max("".join(texts).replace(" ", ""), key="".join(texts).count)
    _unigram_arpa(arpa, tok, banned)
    data = tmp_path / "data"
    shutil.copytree(tiny_corpus / "train", data)
    out = tmp_path / "tune"
    capsys.readouterr()
    assert main(["tune-fusion", "--model", str(exp), "--data", str(data), "--out", str(out), "--mode", "ctc_prefix",
                 "--beam", "4", "--lm", str(arpa), "--set", "lm_units=token", "--lm-weights", "5", "0",
                 "--length-bonuses", "0", "1"]) == 0
    rows = [line.split("\t") for line in (out / "results.tsv").read_text().splitlines()[1:]]
    assert [(float(w), float(b)) for w, b, _ in rows] == [(5, 0), (5, 1), (0, 0), (0, 1)]
    best = load_decode_config(out / "decode.yaml")
    assert best.lm_weight == 0.0 and best.lm == str(arpa) and best.beam == 4
    assert "<- best" in capsys.readouterr().out
    # each row's WER is what decoding the data dir with that setting scores
    refs = read_table(data / "text")
    for weight, bonus, wer in rows:
        dec = tmp_path / f"dec_{weight}_{bonus}"
        assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(dec), "--mode", "ctc_prefix",
                     "--beam", "4", "--lm", str(arpa), "--lm-weight", weight, "--set", f"length_bonus={bonus}",
                     "--set", "lm_units=token"]) == 0
        assert float(wer) == pytest.approx(100 * score_texts(refs, read_table(dec / "text")).wer, abs=0.01)
    assert main(["tune-fusion", "--model", str(exp), "--data", str(data), "--out", str(out),
                 "--lm-weights", "0.5"]) == 1  # no LM configured


def test_attention_window_for_long_utterances_reaches_the_location_aware_decoder():
    """decode.attention_window sets the window of a lstm_location decoder (Chorowski et al.'s windowing) and
    decoding runs with it; a Transformer decoder has no such window and is refused by name."""
    cfg = load_config(REPO / "conf" / "tiny_blstm_location_attention.yaml",
                      ["model.decoder.sharpening=2.0", "model.decoder.smoothing=true"])
    torch.manual_seed(0)
    model = build_model(cfg, 10).eval()
    attention = model.decoder.attention
    assert attention.sharpening == 2.0 and attention.smoothing and attention.window == 0  # config -> attention
    tok = CharTokenizer(list("ABCDEFG"))
    tr = Transcriber(model, cfg, tok, decode=DecodeConfig(mode="attention", beam=2, attention_window=5))
    assert attention.window == 5
    wav = 0.1 * torch.randn(48000, generator=torch.Generator().manual_seed(2))  # 3 s: 75 encoder frames
    assert len(tr.transcribe_nbest([wav])) == 1
    with pytest.raises(ConfigError, match="decode.attention_window needs a location-aware attention decoder"):
        Transcriber(build_model(_tiny_config(), 10), _tiny_config(), tok,
                    decode=DecodeConfig(mode="attention", attention_window=5))


def test_lexicon_in_the_decode_config_constrains_the_search(overfit, tmp_path):
    """decode.lexicon reaches the search: the texts come out when every word is listed; a word left out of the
    list never appears; greedy search with a lexicon is refused by name."""
    _, model, cfg, tok, wavs, texts = overfit
    vocab = sorted({w for t in texts for w in t.split()})
    full, partial = tmp_path / "full.txt", tmp_path / "partial.txt"
    full.write_text("\n".join(vocab) + "\n")
    dropped = vocab[0]
    partial.write_text("\n".join(vocab[1:]) + "\n")
    constrained = Transcriber(model, cfg, tok, decode=DecodeConfig(mode="ctc_prefix", beam=8, lexicon=str(full)))
    assert _texts(constrained, wavs) == texts
    narrower = Transcriber(model, cfg, tok, decode=DecodeConfig(mode="ctc_prefix", beam=8, lexicon=str(partial)))
    out = _texts(narrower, wavs)
    assert all(w in vocab[1:] for t in out for w in t.split())
    assert any(dropped in t.split() for t in texts) and out != texts
    with pytest.raises(ConfigError, match="decode.lexicon"):
        Transcriber(model, cfg, tok, decode=DecodeConfig(mode="greedy", lexicon=str(full)))
    with pytest.raises(ConfigError, match="no such file"):
        Transcriber(model, cfg, tok, decode=DecodeConfig(mode="ctc_prefix", lexicon=str(tmp_path / "none.txt")))


def test_an_lm_of_the_other_units_is_refused_naming_both_settings():
    # A word 3-gram (asrkit train-ngram's default) under decode.lm_units: token took the machine down.
    words = REPO / "tests" / "lm" / "fixtures" / "words_3gram.arpa"
    tok = CharTokenizer.train(["THE CAT SAT ON A MAT", "A DOG RAN"])
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=rf"^decode.lm {words}: a word LM \(asrkit train-ngram --units word\): "
                                         r".*, but decode.lm_units is 'token': set decode.lm_units: word$"):
        load_lm_scorer(DecodeConfig(mode="ctc_prefix", lm=str(words), lm_units="token"), tok, cpu)
    chars = REPO / "tests" / "lm" / "fixtures" / "chars_2gram.arpa"
    with pytest.raises(ConfigError, match=r"a token LM \(asrkit train-ngram --units token\): .*, but "
                                         r"decode.lm_units is 'word': set decode.lm_units: token$"):
        load_lm_scorer(DecodeConfig(mode="ctc_prefix", lm=str(chars), lm_units="word"), tok, cpu)
    assert load_lm_scorer(DecodeConfig(mode="ctc_prefix", lm=str(words)), tok, cpu) is not None  # the default: word


def test_the_word_bonus_counts_words_not_boundaries():
    # With a word LM the bonus is beta per word. It counted tokens that start with the boundary mark: with the
    # char tokenizer one per space (words - 1), and a leading, trailing or doubled space earned one, no word.
    words = REPO / "tests" / "lm" / "fixtures" / "words_3gram.arpa"
    tok = CharTokenizer.train(["THE CAT SAT ON A MAT", "A DOG RAN"])
    searcher = Searcher(DecodeConfig(mode="ctc_prefix", lm=str(words), length_bonus=1.5), None, tok,
                        torch.device("cpu"))
    scorers, weights = searcher.fusion()
    bonus = scorers["length_bonus"]
    assert weights["length_bonus"] == 1.5 and isinstance(bonus, WordCount)
    for text in ("THE CAT", " THE  CAT ", "A", " ", "", "THE DOG SAT ON A MAT "):
        ids = [tok.token_list.index("\u2581" if c == " " else c) for c in text]
        state, total = bonus.init_state(1, 1, torch.device("cpu")), 0.0
        for i in ids:
            total += float(bonus.score(state, torch.tensor([[i]]))[0, 0])
            state = bonus.select_state(state, torch.tensor([0]), torch.tensor([i]))
        assert total + float(bonus.final_score(state)[0]) == len(text.split()), text
