"""tools/espnet/espnet_lm.py: ESPnet's CTC posteriors (as espnet_bench.py posteriors dumps them) decoded by asrkit's
search with a word LM. ESPnet is never imported: the posteriors are made here, in ESPnet's column order, from
per-frame probabilities given by unit name; the reference is the same frames in asrkit's order."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from asrkit.config import DecodeConfig
from asrkit.pipeline.searcher import Searcher
from asrkit.text.tokenizer import CharTokenizer
from tool_loader import load_tool

TOK = CharTokenizer(["\u2581", "A", "B"])  # asrkit: <blank> <unk> <sos/eos> ▁ A B
ESPNET = ["<blank>", "<unk>", "<space>", "A", "B", "<sos/eos>"]  # espnet_bench.token_list's order for TOK
# Frames by unit name (the rest of each row's mass spread over the other units). Best path reads "BA ▁ AB": the
# first word's frames lean to B then A, so a word LM that knows "AB" and not "BA" turns it into "AB AB".
FRAMES = [{"B": 0.5, "A": 0.4}, {"A": 0.5, "B": 0.4}, {"<blank>": 0.9}, {"<space>": 0.9}, {"<blank>": 0.9},
          {"A": 0.9}, {"<blank>": 0.9}, {"B": 0.9}, {"<blank>": 0.9}]


@pytest.fixture(scope="module")
def lm_tool():
    load_tool("espnet/espnet_bench")
    return load_tool("espnet/espnet_lm")


def _log_probs(names):
    """(T, V) log-probabilities of FRAMES with columns in the order of ``names`` (▁ read as <space>)."""
    out = np.zeros((len(FRAMES), len(names)), dtype=np.float32)
    for t, frame in enumerate(FRAMES):
        rest = (1.0 - sum(frame.values())) / (len(names) - len(frame))
        for v, name in enumerate(names):
            out[t, v] = math.log(frame.get("<space>" if name == "\u2581" else name, rest))
    return out


def _dump(tmp_path, arrays, tokens=ESPNET):
    np.savez(tmp_path / "log_probs.npz", **arrays)
    (tmp_path / "tokens.txt").write_text("\n".join(tokens) + "\n")


def _word_lm(tmp_path):
    """A word unigram ARPA knowing AB only (BA is <unk>), and its word list."""
    arpa = tmp_path / "words.arpa"
    arpa.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-0.1\tAB\n-2.0\t<unk>\n-99\t<s>\n-0.5\t</s>\n\n\\end\\\n")
    words = tmp_path / "words.txt"
    words.write_text("AB\n")
    return DecodeConfig(mode="ctc_prefix", beam=8, lm=str(arpa), lm_units="word", lm_weight=2.0, lexicon=str(words))


def test_column_order_maps_units_by_name(lm_tool):
    order = lm_tool.column_order(ESPNET, TOK.token_list)
    assert [ESPNET[i] for i in order] == ["<blank>", "<unk>", "<sos/eos>", "<space>", "A", "B"]
    with pytest.raises(lm_tool.BenchError, match=r"missing there \['B'\]"):
        lm_tool.column_order([t for t in ESPNET if t != "B"], TOK.token_list)
    with pytest.raises(lm_tool.BenchError, match=r"not in the tokenizer \['C'\]"):
        lm_tool.column_order([*ESPNET, "C"], TOK.token_list)
    with pytest.raises(lm_tool.BenchError, match="twice"):
        lm_tool.column_order([*ESPNET, "A"], TOK.token_list)


def test_greedy_reads_the_best_path_of_espnet_columns(lm_tool):
    texts = lm_tool.decode_posteriors({"u1": _log_probs(ESPNET), "u0": _log_probs(ESPNET)[:2]}, ESPNET, TOK,
                                      DecodeConfig(mode="greedy"), batch_size=1)
    assert texts == {"u1": "BA AB", "u0": "BA"}


def test_the_word_lm_decodes_espnet_posteriors_as_asrkits_own(lm_tool, tmp_path):
    """With the LM the ESPnet columns give what the search gives on the same frames in asrkit's order, and
    the LM changes the best path's unknown word."""
    cfg = _word_lm(tmp_path)
    ours = torch.from_numpy(_log_probs(TOK.token_list))[None]  # (1, T, V) in asrkit's order
    best = Searcher(cfg, None, TOK, torch.device("cpu")).search(None, None, torch.tensor([len(FRAMES)]), ours).best()
    reference = TOK.decode(best[0].tokens)
    assert reference == "AB AB"
    texts = lm_tool.decode_posteriors({"u": _log_probs(ESPNET), "short": _log_probs(ESPNET)[:5]}, ESPNET, TOK, cfg)
    assert texts["u"] == reference and texts["short"] == "AB"


def test_main_writes_text_and_settings(lm_tool, tmp_path, capsys):
    cfg = _word_lm(tmp_path)
    post = tmp_path / "post"
    post.mkdir()
    _dump(post, {"utt-2": _log_probs(ESPNET), "utt-1": _log_probs(ESPNET)[:2]})
    (tmp_path / "tok.json").write_text('{"kind": "char", "tokens": ["\\u2581", "A", "B"]}')
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text(f"mode: ctc_prefix\nbeam: 8\nlm: {cfg.lm}\nlm_units: word\nlexicon: {cfg.lexicon}\n")
    out = tmp_path / "out"
    args = ["--posteriors", str(post), "--tokenizer", str(tmp_path / "tok.json"), "--decode-config",
            str(decode_yaml), "--out", str(out)]
    assert lm_tool.main([*args, "--set", "lm_weight=2.0"]) == 0
    assert (out / "text").read_text() == "utt-1 AB\nutt-2 AB AB\n"
    assert "lm_weight: 2.0" in (out / "decode.yaml").read_text()
    assert lm_tool.main([*args, "--set", "mode=greedy", "--set", "lm=null", "--set", "lexicon=null"]) == 0
    assert (out / "text").read_text() == "utt-1 BA\nutt-2 BA AB\n"


def test_bad_posteriors_are_named(lm_tool, tmp_path, capsys):
    args = ["--posteriors", str(tmp_path), "--tokenizer", "t.json", "--decode-config", "d.yaml", "--out",
            str(tmp_path / "o")]
    (tmp_path / "d.yaml").write_text("mode: greedy\n")
    args[5] = str(tmp_path / "d.yaml")
    assert lm_tool.main(args) == 1
    assert "log_probs.npz: no such file" in capsys.readouterr().err
    _dump(tmp_path, {"good": _log_probs(ESPNET), "bad": _log_probs(ESPNET)[:, :4]})
    assert lm_tool.main(args) == 1
    assert "utterance bad has shape (9, 4), not (frames, 6 units)" in capsys.readouterr().err


def test_posteriors_need_no_espnet_to_name_missing_inputs(lm_tool, tmp_path):
    bench = sys.modules["espnet_bench"]
    assert "espnet2" not in sys.modules
    rc = bench.main(["posteriors", "--config", "c.yaml", "--model", "m.pth", "--data", str(tmp_path),
                     "--out", str(tmp_path / "o")])
    assert rc == 1 and "espnet2" not in sys.modules and not (tmp_path / "o").exists()


def test_tuning_on_dev_scores_every_pair_as_a_search_of_its_own_and_keeps_the_first_best(lm_tool, tmp_path, capsys):
    """--tune-ref: each pair's WER equals that of a search built for that pair alone (not reweighted), the grid
    order is kept, and the best pair (the first of equals) goes into OUT/decode.yaml."""
    import dataclasses

    from asrkit.score.wer import score_texts

    cfg = _word_lm(tmp_path)
    arrays = {"u": _log_probs(ESPNET), "short": _log_probs(ESPNET)[:5]}
    refs = {"u": "AB AB", "short": "AB"}
    weights, bonuses = [0.0, 0.5, 2.0], [0.0, 3.0]
    results = lm_tool.tune_posteriors(arrays, ESPNET, TOK, cfg, refs, weights, bonuses)
    expected = [(w, b, score_texts(refs, lm_tool.decode_posteriors(
        arrays, ESPNET, TOK, dataclasses.replace(cfg, lm_weight=w, length_bonus=b))).wer) for w in weights for b in bonuses]
    assert [r[:2] for r in results] == [r[:2] for r in expected]
    assert [r[2] for r in results] == pytest.approx([r[2] for r in expected])
    assert [r[2] for r in results] == pytest.approx([2 / 3, 2 / 3, 0, 0, 0, 0])  # without the LM: BA AB, BA
    with pytest.raises(lm_tool.BenchError, match="different utterances, e.g. short"):
        lm_tool.tune_posteriors(arrays, ESPNET, TOK, cfg, {"u": "AB AB"}, weights, bonuses)
    with pytest.raises(lm_tool.BenchError, match="no LM to tune"):
        lm_tool.tune_posteriors(arrays, ESPNET, TOK, DecodeConfig(mode="ctc_prefix"), refs, weights, bonuses)

    post, out = tmp_path / "post", tmp_path / "tune"
    post.mkdir()
    _dump(post, arrays)
    (tmp_path / "tok.json").write_text('{"kind": "char", "tokens": ["\\u2581", "A", "B"]}')
    (tmp_path / "decode.yaml").write_text(f"mode: ctc_prefix\nbeam: 8\nlm: {cfg.lm}\nlm_units: word\n"
                                          f"lexicon: {cfg.lexicon}\nlm_weight: 2.0\n")
    (tmp_path / "ref.txt").write_text("short AB\nu AB AB\n")
    args = ["--posteriors", str(post), "--tokenizer", str(tmp_path / "tok.json"), "--decode-config",
            str(tmp_path / "decode.yaml"), "--out", str(out), "--tune-ref", str(tmp_path / "ref.txt")]
    assert lm_tool.main([*args, "--lm-weights", *map(str, weights), "--length-bonuses", "0", "3"]) == 0
    assert (out / "results.tsv").read_text().splitlines() == [
        "lm_weight\tlength_bonus\tWER", "0\t0\t66.67", "0\t3\t66.67", "0.5\t0\t0.00", "0.5\t3\t0.00", "2\t0\t0.00",
        "2\t3\t0.00"]
    chosen = (out / "decode.yaml").read_text()
    assert "lm_weight: 0.5" in chosen and "length_bonus: 0.0" in chosen and not (out / "text").exists()
    assert "lm_weight 0.5, length_bonus 0 (0.00% WER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lm_tool.main(args)  # --tune-ref without a grid
    assert "--tune-ref and --lm-weights go together" in capsys.readouterr().err
