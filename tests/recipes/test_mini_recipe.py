"""recipes/mini/run.sh end to end at toy size: synthesis -> tokenizer/CMVN -> train -> LM -> tuning on dev -> decode
(greedy, LM) -> score."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asrkit.config import VtlnConfig, load_decode_config
from asrkit.data.table import read_table
from asrkit.text.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY_TRAIN = ("--set train.epochs=1 --set model.encoder.d_model=32 --set model.encoder.num_heads=2 "
              "--set model.encoder.ffn_dim=64 --set model.encoder.num_layers=1 --set data.num_workers=0")


def _lmplz_built() -> bool:
    from asrkit.cli import train_ngram
    try:
        train_ngram.find_kenlm_binary("lmplz")
    except train_ngram.KenlmNotFoundError:
        return False
    return True


def _recording_stand_in(tmp_path: Path, program: str) -> dict:
    """An environment whose PATH finds a stand-in ``program`` first; it appends its arguments to calls.txt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / program
    fake.write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path / "calls.txt"}\n')
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_mini_recipe_runs_every_stage(tmp_path):
    if shutil.which("espeak-ng") is None or shutil.which("festival") is None:
        pytest.skip("espeak-ng/festival are not installed (make test installs them)")
    if not _lmplz_built():
        pytest.skip("KenLM's lmplz is not built (make install builds it: tools/install/install_kenlm.sh)")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path), "--num-train", "8",
           "--num-dev", "2", "--num-test", "2", "--num-test-unseen", "2", "--jobs", "1", "--extra-train",
           "flite_slt_m:1", "--train-opts", TINY_TRAIN + " --set model.encoder.num_layers=3", "--average", "1"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(read_table(tmp_path / "data/train/utt2spk").items())[-1] == ("flite_slt_m-train000008", "flite_slt_m")
    for stage in range(8):
        assert f"[stage {stage}]" in run.stdout
    assert "validating data/test_unseen" in run.stdout and len(read_table(tmp_path / "data/test_unseen/text")) == 2
    assert "averaging the best 1 epochs" in run.stdout
    exp = tmp_path / "exp" / "small"
    demo_model = yaml.safe_load((exp / "config.yaml").read_text())["model"]  # the demo's InterCTC at layer 2 of 3
    assert demo_model["encoder"]["interctc_layers"] == [2] and demo_model["interctc_weight"] == 0.3
    # test_reverb_noise: the test sentences (same ids) through held-out rooms and noises, decoded beside the others
    assert read_table(tmp_path / "data/test_reverb_noise/text") == read_table(tmp_path / "data/test/text")
    assert len(read_table(tmp_path / "data/test_reverb_noise/conditions")) == 2
    for split in ("test", "test_unseen", "test_reverb_noise"):
        refs = read_table(tmp_path / "data" / split / "text")
        for d in (f"decode_{split}", f"decode_{split}_lm"):
            assert f"{d}: %WER" in run.stdout
            assert set(read_table(exp / d / "text")) == set(refs)
    # The LM text: book text + train transcripts, never a dev/test sentence; the lexicon is its vocabulary.
    lm_text = set((tmp_path / "data/lm/text.txt").read_text().splitlines())
    assert set(read_table(tmp_path / "data/train/text").values()) <= lm_text and len(lm_text) > 20000
    for split in ("dev", "test", "test_unseen", "test_reverb_noise"):
        assert not set(read_table(tmp_path / "data" / split / "text").values()) & lm_text
    words = (tmp_path / "data/lm/words.txt").read_text().splitlines()
    assert words == sorted({w for line in lm_text for w in line.split()})
    used = load_decode_config(exp / "decode_test_lm" / "decode.yaml")
    tuned = load_decode_config(exp / "tune_dev" / "decode.yaml")
    assert tuned.beam == 100 and used.beam == 1000  # tuned at the config's beam, decoded at --decode-beam's
    # otherwise the setting chosen on dev, and decode-time VTLN (--vtln's default) with a factor per test speaker
    vtln = VtlnConfig(alphas=(0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15))
    assert used == dataclasses.replace(tuned, beam=1000, vtln=vtln)
    assert load_decode_config(exp / "decode_test" / "decode.yaml").vtln == vtln
    for d in ("decode_test", "decode_test_lm"):
        spk2warp = read_table(exp / d / "spk2warp")
        assert set(spk2warp) == set(read_table(tmp_path / "data/test/utt2spk").values())
        assert {float(a) for a in spk2warp.values()} <= set(vtln.alphas)
    # the LM and lexicon paths are written absolute: the decode.yaml works from any directory
    assert used.mode == "ctc_prefix" and used.lm_units == "word" and used.lm_weight in (0.4, 0.6, 0.8, 1.0)
    assert used.lm == str(tmp_path / "exp" / "lm_ngram" / "word3.arpa")
    assert used.lexicon == str(tmp_path / "data" / "lm" / "words.txt")
    assert len((exp / "tune_dev" / "results.tsv").read_text().splitlines()) == 1 + 4 * 3

    # a stage re-runs on its own (restartable), in the same work dir
    again = subprocess.run(cmd + ["--stage", "7"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "[stage 6]" not in again.stdout and "decode_test_lm: %WER" in again.stdout

    # --units bpe: a sentencepiece tokenizer in data/lang_bpe<N>, trained on beside the character one (one process:
    # the 2-process path is the first run's)
    bpe = subprocess.run(cmd + ["--stage", "2", "--stop-stage", "3", "--units", "bpe", "--vocab-size", "40",
                                "--exp", "exp/bpe", "--average", "0", "--nproc", "1"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bpe.returncode == 0, bpe.stderr[-3000:]
    assert "training a BPE tokenizer of 40 pieces" in bpe.stdout
    assert load_tokenizer(tmp_path / "data/lang_bpe40/tokenizer.json").vocab_size == 40
    assert load_tokenizer(tmp_path / "exp/bpe/tokenizer.json").vocab_size == 40 and (tmp_path / "exp/bpe/model.pt").is_file()
    assert load_tokenizer(tmp_path / "data/lang/tokenizer.json").vocab_size < 40  # the character one is kept

    # --size small-joint: the small recipe with an attention decoder (conf/mini_small_joint.yaml), also tuned on dev
    # and decoded by joint CTC/attention search without and with the word LM (stages 3-7 on the same data).
    joint = subprocess.run(cmd + ["--size", "small-joint", "--stage", "3", "--nproc", "1", "--average", "0",
                                  "--test-reverb-noise", "false", "--train-opts", TINY_TRAIN + " --set model.decoder.num_layers=1 "
                                  "--set model.decoder.num_heads=2 --set model.decoder.ffn_dim=64"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert joint.returncode == 0, joint.stderr[-3000:]
    exp_joint = tmp_path / "exp" / "small_joint"
    trained = yaml.safe_load((exp_joint / "config.yaml").read_text())["model"]
    assert trained["decoder"]["kind"] == "transformer" and trained["ctc_weight"] == 0.3
    for split in ("test", "test_unseen"):
        refs = read_table(tmp_path / "data" / split / "text")
        for d in (f"decode_{split}", f"decode_{split}_lm", f"decode_{split}_joint", f"decode_{split}_joint_lm"):
            assert f"{d}: %WER" in joint.stdout
            assert set(read_table(exp_joint / d / "text")) == set(refs)
        plain = load_decode_config(exp_joint / f"decode_{split}_joint" / "decode.yaml")
        assert plain.mode == "joint" and plain.lm is None and plain.ctc_weight == 0.3
        fused = load_decode_config(exp_joint / f"decode_{split}_joint_lm" / "decode.yaml")
        assert fused == load_decode_config(exp_joint / "tune_dev_joint" / "decode.yaml")
        assert fused.mode == "joint" and fused.lm_units == "word" and fused.lm_weight in (0.3, 0.6, 1.0)
        assert fused.lm == str(tmp_path / "exp" / "lm_ngram" / "word3.arpa")
        assert fused.lexicon == str(tmp_path / "data" / "lm" / "words.txt")
    assert len((exp_joint / "tune_dev_joint" / "results.tsv").read_text().splitlines()) == 1 + 3 * 1
    bad = subprocess.run(cmd + ["--stage", "7", "--joint-search", "yes"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "--joint-search must be true or false, not 'yes'" in bad.stderr

    # Deja-vu at depth (recipes/mini/compare_dejavu.sh) in the same work dir, at toy size: plain and Deja-vu train,
    # are tuned and scored; one table of both. An experiment stands in for a method's seed 1 only when its config
    # holds that method's settings: the small run (3 layers, not 2) is refused before anything trains.
    compare = ["bash", str(REPO / "recipes" / "mini" / "compare_dejavu.sh"), "--workdir", str(tmp_path), "--layer", "1",
               "--train-opts", TINY_TRAIN + " --set model.encoder.num_layers=2",
               "--run-opts", "--nproc 1 --lm-weights 0.5 --length-bonuses 0"]
    refused = subprocess.run(compare + ["--methods", "plain dejavu", "--reuse-seed1", "plain=exp/small"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "model.encoder.num_layers: 3 in exp/small/config.yaml, 2 wanted" in refused.stderr
    assert "exp/small is not plain seed 1 with these --train-opts" in refused.stderr
    assert not (tmp_path / "exp/dejavu").exists()
    bad = subprocess.run(compare + ["--reuse-seed1", "exp/small"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--reuse-seed1 must be METHOD=EXP" in bad.stderr
    cmp = subprocess.run(compare + ["--methods", "plain dejavu"], env=env, capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    plain = yaml.safe_load((tmp_path / "exp/dejavu/plain_seed1/config.yaml").read_text())["model"]
    assert plain["encoder"]["interctc_layers"] == [] and plain["encoder"]["dejavu_layer"] == 0
    assert plain["interctc_weight"] == 0.0 and plain["encoder"]["num_layers"] == 2
    dejavu = yaml.safe_load((tmp_path / "exp/dejavu/dejavu_seed1/config.yaml").read_text())
    assert dejavu["model"]["encoder"]["dejavu_layer"] == 1 and dejavu["model"]["intermediate_loss"] == "iterated"
    assert dejavu["model"]["encoder"]["interctc_layers"] == []  # the medium config's InterCTC is switched off
    assert dejavu["model"]["interctc_weight"] == 0.3 and dejavu["model"]["encoder"]["num_layers"] == 2
    rows = [line for line in cmp.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| method | runs | test greedy | test LM | test_unseen greedy | test_unseen LM |")
    assert rows[2].startswith("| plain | 1 | ") and rows[3].startswith("| dejavu | 1 | ") and len(rows) == 4
    # The trained plain run, moved elsewhere, stands in for plain seed 1: kept, not retrained.
    (tmp_path / "exp/dejavu/plain_seed1").rename(tmp_path / "exp/plain_run")
    kept = subprocess.run(compare + ["--methods", "plain", "--reuse-seed1", "plain=exp/plain_run"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "exp/dejavu/plain_seed1: scored already, kept" in kept.stdout
    assert (tmp_path / "exp/dejavu/plain_seed1").resolve() == (tmp_path / "exp/plain_run").resolve()
    assert [line for line in kept.stdout.splitlines() if line.startswith("| plain | 1 | ")] == [rows[2]]

    # The neural-LM variant of stages 4-5 in the same work dir: a character LSTM on the LM text
    # (a small corpus here, to keep the test short).
    corpus = tmp_path / "books.txt"
    corpus.write_text("IT WAS A DARK NIGHT\nSHE SAID NO MORE\n", encoding="utf-8")
    neural = subprocess.run(cmd + ["--stage", "4", "--stop-stage", "5", "--lm-kind", "neural", "--lm-corpus",
                                   str(corpus), "--lm-config", str(REPO / "conf" / "tiny_lm_lstm.yaml"),
                                   "--lm-opts", "--set train.epochs=1", "--length-bonuses", "1"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert neural.returncode == 0, neural.stderr[-3000:]
    assert (tmp_path / "exp" / "lm_neural" / "model.pt").is_file()
    assert (tmp_path / "data/lm/text.txt").read_text().splitlines()[:2] == ["IT WAS A DARK NIGHT", "SHE SAID NO MORE"]
    used = load_decode_config(exp / "tune_dev" / "decode.yaml")
    assert used.lm == str(tmp_path / "exp" / "lm_neural") and used.lm_units == "word" and used.lexicon is None


@pytest.mark.parametrize("size,config,exp", [("small", "mini_small.yaml", "exp/small"),
                                             ("small-streaming", "mini_streaming.yaml", "exp/small_streaming")])
def test_size_presets_pick_their_config(tmp_path, size, config, exp):
    """Catches a --size preset that trains another config or into another experiment dir (stage 3 with a
    stand-in asrkit on PATH that records its arguments), and an unknown size accepted."""
    env = _recording_stand_in(tmp_path, "asrkit")
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path / "work"), "--size", size,
           "--stage", "3", "--stop-stage", "3", "--nproc", "1", "--average", "0"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith(f"train --config {REPO / 'conf' / config} ")
    assert f" --out {exp} " in calls[0]
    bad = subprocess.run(cmd[:5] + ["--size", "streaming"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "small, medium, small-joint or small-streaming, not 'streaming'" in bad.stderr


def test_small_streaming_decodes_the_test_sets_as_live_streams_too(tmp_path):
    """Stage 6 of --size small-streaming (a stand-in asrkit records the calls): besides greedy and LM decoding,
    each test set is decoded with --streaming at 640 and 320 ms chunks, greedy and with the tuned LM config, into
    the decode_<set>_stream<ms>[_lm] dirs stage 7 scores; --streaming-chunks "" (or another size) has none."""
    env = _recording_stand_in(tmp_path, "asrkit")
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path / "work"), "--size",
           "small-streaming", "--stage", "6", "--stop-stage", "6", "--num-test-unseen", "0",
           "--test-reverb-noise", "false"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    streamed = [c for c in (tmp_path / "calls.txt").read_text().splitlines() if "--streaming" in c]
    assert [c.split(" --out ")[1].split()[0] for c in streamed] == [
        f"exp/small_streaming/decode_test_{d}" for d in ("stream640", "stream640_lm", "stream320", "stream320_lm")]
    chunks = [re.search(r"decode_test_stream(\d+)", c)[1] for c in streamed]
    assert all(c.endswith(f"--streaming --chunk-ms {ms}") for c, ms in zip(streamed, chunks))
    assert "--decode-config exp/small_streaming/tune_dev/decode.yaml --set beam=1000" in streamed[1]
    (tmp_path / "calls.txt").unlink()
    plain = subprocess.run(cmd + ["--streaming-chunks", ""], env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "--streaming" not in (tmp_path / "calls.txt").read_text()


def test_a_work_dir_without_test_reverb_noise_is_told_how_to_make_it(tmp_path):
    """A work dir from before test_reverb_noise existed: the stages that read the test sets say what to do."""
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path), "--stage", "6"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "data/test_reverb_noise is missing" in run.stderr and "--test-reverb-noise false" in run.stderr
    assert "tools/make_reverb_noise_set.py --src data/test --out data/test_reverb_noise --seed 1" in run.stderr


def test_derived_voices_reach_stage_0_and_a_bad_value_is_refused(tmp_path):
    """--derived-voices and --extra-train go to make_synthetic_corpus.py (a stand-in python records stage 0's
    call), off and flite_slt_m:800 by default; a derived-voices value other than true or false stops the recipe with a
    message naming the option (the tool itself refuses a bad --extra-train, tests/tools)."""
    env = _recording_stand_in(tmp_path, "python")
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path / "work"), "--stage", "0",
           "--stop-stage", "0", "--test-reverb-noise", "false"]
    for extra in ([], ["--derived-voices", "true", "--extra-train", ""]):
        run = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-3000:]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split("make_synthetic_corpus.py ")[1].split(" --derived-voices ")[1] for c in calls] == [
        "false --extra-train flite_slt_m:800", "true --extra-train "]
    bad = subprocess.run(cmd + ["--derived-voices", "yes"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--derived-voices must be true or false, not 'yes'" in bad.stderr
