"""tools/bench/bench_hotwords.py: the names set's plan, its metrics and the argument checks (the benchmark itself
needs the demo model and the synthesizers: not a test)."""
from __future__ import annotations

import pytest

from tests.tool_loader import load_tool

bench = load_tool("bench/bench_hotwords")
TEMPLATE_WORDS = {w for t in bench.TEMPLATES for w in t.split() if w != "{}"}


def test_the_plan_says_only_unknown_names_around_known_words() -> None:
    known = TEMPLATE_WORDS | {"NAKAMURA", "PATEL"}
    sentences, said, unsaid, phrases = bench.plan_names_set(known, 10, 4, seed=1)
    assert len(sentences) == len(set(sentences)) == 10 and len(said) == len(unsaid) == 4
    assert not set(said) & set(unsaid) and not (set(said) | set(unsaid)) & known
    for sentence in sentences:
        names = [w for w in sentence.split() if w not in known]
        assert len(names) == 1 and names[0] in said
    assert {w for s in sentences for w in s.split() if w in said} == set(said)  # every name said
    assert len(phrases) == len(set(phrases)) == 1000
    assert all(len(p.split()) == 2 and not set(p.split()) & known for p in phrases)
    assert bench.plan_names_set(known, 10, 4, seed=1) == (sentences, said, unsaid, phrases)


@pytest.mark.parametrize("known,utts,names,match", [
    (set(), 10, 4, "template words not in the known text: "),
    (TEMPLATE_WORDS | set(bench.NAMES[3:]), 10, 2, "only 3 names are outside the known text"),
    (TEMPLATE_WORDS, 3, 4, "--num-utts 3 must be at least --num-names 4"),
    (TEMPLATE_WORDS, 100, 2, "50 utterances per name, but only 20 templates"),
])
def test_bad_plans_are_refused(known, utts, names, match) -> None:
    with pytest.raises(ValueError, match=match):
        bench.plan_names_set(known, utts, names, seed=0)


def test_name_metrics() -> None:
    refs = {"a": "I SAW ZED AT HOME", "b": "ASK KAY NOW", "c": "GO HOME"}
    hyps = {"a": "I SAW ZED AT HOME", "b": "ASK ZED NOW", "c": "GO HOME KAY"}
    recall, alarms, others, wer = bench.name_metrics(refs, hyps, {"ZED", "KAY", "ELL"})
    assert recall == pytest.approx(1 / 3) and alarms == pytest.approx(2 / 3)
    assert others == 0.0 and wer == pytest.approx(2 / 10)


def test_arguments_are_checked(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main(["run", "--work", "w", "--model", "m"])
    assert "run needs --test DATA_DIR (or --skip-test)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["run", "--work", "w", "--model", "m", "--skip-test", "--class-scores", "low"])
    assert "--class-scores: 'low' is not a number or none" in capsys.readouterr().err


def test_a_tuning_set_has_other_sentences_and_leaves_the_other_sets_names_out() -> None:
    tune_words = {w for t in bench.TUNE_TEMPLATES for w in t.split() if w != "{}"}
    known = TEMPLATE_WORDS | tune_words
    report = bench.plan_names_set(known, 10, 4, seed=0)
    taken = set(report[1]) | set(report[2])
    sentences, said, unsaid, _ = bench.plan_names_set(known, 10, 4, seed=1, templates=bench.TUNE_TEMPLATES,
                                                      exclude=taken)
    assert not (set(said) | set(unsaid)) & taken and len(said) == len(unsaid) == 4
    assert not set(sentences) & set(report[0])
    assert {s.replace(n, "{}") for s in sentences for n in said if n in s.split()} <= set(bench.TUNE_TEMPLATES)
    assert not set(bench.TEMPLATES) & set(bench.TUNE_TEMPLATES)
    with pytest.raises(ValueError, match="outside the known text and the excluded names"):
        bench.plan_names_set(known, 10, 4, seed=1, exclude=set(bench.NAMES[7:]))
