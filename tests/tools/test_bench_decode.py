"""tools/bench/bench_decode.py and its siblings bench_decode_inputs.py (log-probs, Setup) and bench_decode_peers.py
(pyctcdecode, flashlight): runs tiny with asrkit's decoders only (no peers, no KenLM binaries)."""
from __future__ import annotations

import itertools
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from asrkit.search.ctc_prefix import ctc_prefix_beam_search
from asrkit.search.greedy import greedy_search
from asrkit.text.tokenizer import CharTokenizer
from tool_loader import load_tool

SENTENCES = ["THE CAT SAT ON THE MAT", "A DOG RAN IN THE PARK", "SHE READ A GOOD BOOK",
             "WE WALKED HOME TOGETHER", "THE SUN IS VERY WARM", "HE DRANK A CUP OF TEA"]


@pytest.fixture(scope="module")
def inputs():
    return load_tool("bench/bench_decode_inputs")


@pytest.fixture(scope="module")
def peers(inputs):
    return load_tool("bench/bench_decode_peers")


@pytest.fixture(scope="module")
def tool(inputs, peers):
    # After its siblings: bench_decode imports the modules load_tool registered, so
    # peers.Unsupported is the class bench_decode catches.
    return load_tool("bench/bench_decode")


def _write_bigram_arpa(path: Path, sentences, split) -> None:
    """A small but valid back-off bigram ARPA (maximum-likelihood bigrams, flat back-off)."""
    uni, bi = Counter(), Counter()
    for s in sentences:
        units = ["<s>"] + split(s) + ["</s>"]
        uni.update(units)
        bi.update(zip(units, units[1:]))
    uni["<unk>"] += 1
    total = sum(uni.values())
    lines = ["\\data\\", f"ngram 1={len(uni)}", f"ngram 2={len(bi)}", "", "\\1-grams:"]
    for w, c in sorted(uni.items()):
        prob = -99.0 if w == "<s>" else math.log10(c / total)
        lines.append(f"{prob:.4f}\t{w}\t-0.3010")
    lines += ["", "\\2-grams:"]
    for (a, b), c in sorted(bi.items()):
        lines.append(f"{math.log10(c / uni[a]):.4f}\t{a} {b}")
    lines += ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> Path:
    """What tools/bench/make_bench_lm.py writes, for a char tokenizer, with hand-made order-2 LMs."""
    root = tmp_path_factory.mktemp("bench_lm")
    (root / "heldout.txt").write_text("\n".join(SENTENCES) + "\n")
    tok = CharTokenizer.train(SENTENCES)
    (root / "char").mkdir()
    tok.save(root / "char" / "tokenizer.json")
    _write_bigram_arpa(root / "char" / "2gram.arpa", SENTENCES, lambda s: tok.pieces(tok.encode(s)))
    _write_bigram_arpa(root / "word_2gram.arpa", SENTENCES, str.split)
    return root


def test_text_log_probs_spell_the_tokens(inputs):
    seqs = [[5, 5, 7, 3, 9], [4], [], [6, 8, 8, 8]]
    lp = inputs.text_log_probs(seqs, frames=20, vocab=12, seed=1, confusion=0.0)
    assert lp.shape == (4, 20, 12)
    assert torch.allclose(lp.double().logsumexp(-1), torch.zeros(4, 20, dtype=torch.float64), atol=1e-5)
    best = greedy_search(lp, torch.full((4,), 20)).best()
    assert [h.tokens for h in best] == seqs  # repeats got their blank, nothing else competes


def test_ctc_log_likelihood_sums_all_alignments(tool):
    lp = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64).log_softmax(-1)
    lens = torch.tensor([5, 4])
    hyps = [[1, 2, 2], [2, 1]]
    expect = []
    for b, hyp in enumerate(hyps):  # brute force over all 3**T frame paths
        total = 0.0
        for path in itertools.product(range(3), repeat=int(lens[b])):
            collapsed = [k for i, k in enumerate(path) if k != 0 and (i == 0 or k != path[i - 1])]
            if collapsed == hyp:
                total += math.exp(sum(float(lp[b, t, k]) for t, k in enumerate(path)))
        expect.append(math.log(total))
    assert torch.allclose(tool.ctc_log_likelihood(lp, lens, hyps), torch.tensor(expect, dtype=torch.float64))
    # A beam search's own CTC score only counts alignments that stayed in its beam: a lower bound.
    best = ctc_prefix_beam_search(lp, lens, beam=2, token_topk=None, token_min_logp=None,
                                  blank_skip_threshold=None).best()
    ll = tool.ctc_log_likelihood(lp, lens, [h.tokens for h in best])
    assert all(float(a) >= h.ctc_score - 1e-9 for a, h in zip(ll, best))


def test_tiny_matrix_with_lms(tool, lm_dir, tmp_path, capsys):
    md = tmp_path / "results.md"
    rc = tool.main(["--vocabs", "7", "char", "--batch", "3", "--frames", "40", "--beams", "4",
                    "--threads", "1", "--decoders", "prefix", "prefix-exact", "greedy",
                    "--lms", "none", "token", "word", "--order", "2", "--lm-dir", str(lm_dir),
                    "--repeats", "1", "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ") and "utt/s" not in line]
    # random V=7: 3 decoders, no LM; char: 3 decoders without LM + 2 per LM kind (greedy has none)
    assert len(rows) == 3 + 3 + 2 + 2, md.read_text()
    exact_rows = [r for r in rows if "| prefix-exact |" in r]
    assert all("| 100.0% | +0.000 |" in r for r in exact_rows)  # the reference agrees with itself
    assert "lm=token" in out and "lm=word" in out and "WER" in out


@pytest.mark.parametrize("argv,match", [
    (["--cuda-graph"], "--cuda-graph needs --device cuda"),
    (["--device", "cuda", "--decoders", "prefix", "pyctcdecode"], "asrkit's decoders only (not ['pyctcdecode'])"),
    (["--device", "cpu:0"], "needs a visible CUDA device"),
])
def test_device_options_are_checked(tool, capsys, argv, match):
    assert tool.main(["--vocabs", "6", "--batch", "2", "--frames", "10", "--threads", "1"] + argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph", [[], ["--cuda-graph"]])
def test_tiny_matrix_on_cuda(tool, lm_dir, tmp_path, capsys, graph):
    md = tmp_path / "results.md"
    rc = tool.main(["--vocabs", "7", "char", "--batch", "3", "--frames", "40", "--beams", "4", "--threads", "1",
                    "--decoders", "prefix", "prefix-exact", "api", "--lms", "none", "token", "word", "--order", "2",
                    "--lm-dir", str(lm_dir), "--repeats", "1", "--device", "cuda", "--markdown", str(md)] + graph)
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ") and "utt/s" not in line]
    label = "/cuda-graph" if graph else "/cuda"
    assert len(rows) == 3 + 3 * 3 and all(f"{label} |" in r for r in rows), md.read_text()
    # the GPU's exact search agrees with the CPU reference
    assert all("| 100.0% | +0.000 |" in r for r in rows if f"| prefix-exact{label} |" in r)


def test_worker_processes(tool, capsys):
    rc = tool.main(["--vocabs", "6", "--batch", "4", "--frames", "30", "--beams", "3", "--threads", "2",
                    "--decoders", "prefix", "--repeats", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "workers=2" in out and "agree 100.0%" in out


def test_missing_peer_is_a_clear_error(tool, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyctcdecode", None)  # import fails as if not installed
    rc = tool.main(["--vocabs", "6", "--batch", "2", "--frames", "10", "--decoders", "prefix", "pyctcdecode"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "pyctcdecode" in err and "setup_bench_env.sh" in err


def test_check_peers_names_only_the_missing_modules(peers, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyctcdecode", None)  # import fails as if not installed
    assert peers.check_peers([("prefix-ish", "math")]) is None and peers.check_peers([]) is None
    message = peers.check_peers([("pyctcdecode", "pyctcdecode"), ("fine", "math")])
    assert message is not None and message.startswith("peer decoder(s) not installed: pyctcdecode (")
    assert "fine" not in message and "setup_bench_env.sh" in message


def test_missing_lm_files_name_the_builder(tool, tmp_path, capsys):
    rc = tool.main(["--vocabs", "char", "--lm-dir", str(tmp_path), "--batch", "2", "--frames", "10"])
    assert rc == 1
    assert "make_bench_lm.py" in capsys.readouterr().err


def test_api_row_and_a_registered_decoder_row(tool, monkeypatch, tmp_path, capsys):
    # Catches: the decode_ctc row not run or disagreeing with the exact search on peaky inputs; a
    # decoder added to DECODERS (what a new row needs) not picked up by --decoders, or run for an LM
    # kind it does not list.
    calls = []

    def build(setup, beam, lm, args, tmpdir):
        calls.append((setup.vocab, beam, lm))
        return lambda rows: [[] for _ in rows]  # always the empty transcript

    monkeypatch.setitem(tool.DECODERS, "empty", tool.Decoder(build, ("none",)))
    md = tmp_path / "r.md"
    rc = tool.main(["--vocabs", "6", "--batch", "4", "--frames", "30", "--beams", "3", "--threads", "1",
                    "--decoders", "api", "empty", "--repeats", "1", "--markdown", str(md)])
    assert rc == 0
    rows = {line.split(" | ")[4]: line for line in md.read_text().splitlines()[2:]}
    assert "| 100.0% | +0.000 |" in rows["api"]
    assert "| 0.0% |" in rows["empty"] and calls == [(6, 3, "none")]


def test_split_times_cover_the_search_parts(tool):
    # Catches: a part of the search (checks, setup, loop, end) not timed, or the real functions not
    # restored after timing.
    real = tool.prefix_loop.frame_loop
    lp = torch.randn(2, 20, 9).log_softmax(-1)
    split = tool.split_times(lambda: ctc_prefix_beam_search(lp, torch.tensor([20, 12]), beam=3, native=False),
                             repeats=2)  # the torch loop's parts
    assert set(split) == {"checks", "setup", "loop", "end", "total"}
    assert all(v > 0 for v in split.values()) and split["total"] >= split["loop"] + split["setup"]
    assert tool.prefix_loop.frame_loop is real


def test_lexicon_rows(tool, lm_dir, tmp_path, capsys):
    # prefix-lexicon: the word scorer constrained to the word LM's words, so every output word is one of them
    md = tmp_path / "results.md"
    rc = tool.main(["--vocabs", "char", "--batch", "4", "--frames", "60", "--beams", "4", "--threads", "1",
                    "--decoders", "prefix", "prefix-lexicon", "--lms", "word", "--order", "2",
                    "--lm-dir", str(lm_dir), "--repeats", "1", "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "prefix-lexicon" in out and md.read_text().count("| prefix-lexicon |") == 1
    args = tool.parse_args(["--vocabs", "char", "--batch", "4", "--frames", "60", "--order", "2",
                            "--lm-dir", str(lm_dir)])
    setup = tool.text_setup("char", args)
    words = set(setup.lexicon_words())
    assert words == {w for s in SENTENCES for w in s.split()}  # the LM's vocabulary, no <s> </s> <unk>
    hyps = tool._asrkit_decoder("prefix-lexicon", setup, 4, "word", args)(range(4))
    assert all(w in words for h in hyps for w in setup.text(h).split())


def test_flashlight_lexicon_file(tool, peers, lm_dir, tmp_path):
    args = tool.parse_args(["--vocabs", "char", "--order", "2", "--lm-dir", str(lm_dir)])
    setup = tool.text_setup("char", args)
    path = tmp_path / "lexicon.txt"
    assert peers.write_flashlight_lexicon(setup, str(path), "\u2581") == len(setup.lexicon_words())
    for line in path.read_text(encoding="utf-8").splitlines():
        word, *spelling = line.split(" ")
        assert spelling[-1] == "\u2581"  # flashlight's words end at their separator
        assert "".join(spelling[:-1]) == word  # char tokens spell the word letter by letter


def test_a_decoder_that_cannot_take_the_input_is_skipped_with_the_reason(tool, peers, monkeypatch, capsys):
    def build(setup, beam, lm, args, tmpdir):
        raise peers.Unsupported("no such input here")

    monkeypatch.setitem(tool.DECODERS, "picky", tool.Decoder(build, ("none",)))
    rc = tool.main(["--vocabs", "5", "--batch", "2", "--frames", "10", "--beams", "2", "--threads", "1",
                    "--decoders", "picky", "prefix", "--repeats", "1", "--no-reference"])
    out = capsys.readouterr().out
    assert rc == 0 and "picky" in out and "skipped (no such input here)" in out
    assert "prefix       V=5 random" in out  # the next decoder still ran
