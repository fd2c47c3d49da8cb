"""recipes/librispeech/run.sh from stage 1 to the end on a LibriSpeech-shaped tree of espeak-ng speech.

The tree has LibriSpeech's layout (<part>/<speaker>/<chapter>/<spk>-<chap>-<utt>.flac and <spk>-<chap>.trans.txt,
upper-case transcripts, a few speakers per part); the recipe runs with tiny settings given as flags (a tiny
Transformer through --train-opts, a 40-piece BPE, two epochs, --nj 2), never an edited copy of the script.
Checked: every stage's outputs, the WER in RESULTS.md against jiwer on the same files, a training run killed after
its first checkpoint resuming when stage 3 is rerun, a rerun of every stage changing no file, and --nj 2 decoding
giving the text of one process.

The slow part is the module fixture ``recipe`` (the recipe itself, about 1.5 min on 2 shared cores): it shows in
``pytest --durations`` as the setup of test_every_stage_leaves_its_outputs.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import jiwer
import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from asrkit.data.datadir import read_data_dir, validate_data_dir
from asrkit.data.table import read_table
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "recipes" / "librispeech" / "run.sh"
SETTINGS = "greedy ctc_prefix_lm attention"  # attention: the tiny model's only non-empty output
EVAL_SETS = ("dev-clean", "test-clean")
# (part, speakers, chapters per speaker, utterances per chapter); 24 training and 12 eval utterances in all
PARTS = (("train-clean-100", ("103", "1034", "1040"), 2, 4), ("dev-clean", ("1272", "1462"), 1, 3),
         ("test-clean", ("1089", "1188"), 1, 3))
VOICES = ("en-us+m3", "en-gb+f2", "en-us+f4", "en-gb-x-rp+m1", "en-029+m2", "en-gb-scotland+f3", "en-us+klatt",)
TINY = ("--set model.encoder.d_model=32 --set model.encoder.num_heads=2 --set model.encoder.ffn_dim=64 "
        "--set model.encoder.num_layers=1 --set model.decoder.num_layers=1 --set model.decoder.num_heads=2 "
        "--set model.decoder.ffn_dim=64 --set data.num_workers=0 --set data.max_batch_size=4 "
        "--set train.warmup_steps=10 --set train.save_every_steps=2 --set train.keep_best=2")
EPOCHS = 2


def _synth_module():
    return load_tool("make_synthetic_corpus")


def make_librispeech_tree(root: Path) -> Dict[str, Dict[str, str]]:
    """Write root/LibriSpeech/<part>/... of espeak-ng speech; returns {part: {utt: transcript}}."""
    synth = _synth_module()
    sentences = [s for s in synth.load_sentences(synth.DEFAULT_SENTENCES) if len(s.split()) in (3, 4)]
    rng = np.random.default_rng(9)
    order = rng.permutation(len(sentences))
    texts: Dict[str, Dict[str, str]] = {}
    n = 0
    for part, speakers, chapters, utts in PARTS:
        texts[part] = {}
        for s, spk in enumerate(speakers):
            voice = VOICES[(s + len(texts)) % len(VOICES)]
            for c in range(chapters):
                chapter = f"{int(spk) * 10 + c}"
                d = root / "LibriSpeech" / part / spk / chapter
                d.mkdir(parents=True)
                lines = []
                for u in range(utts):
                    utt, text = f"{spk}-{chapter}-{u:04d}", sentences[order[n]]
                    n += 1
                    audio, sr = synth.espeak(text, voice, int(rng.integers(150, 190)), 50, utt)
                    audio = resample_poly(audio, 16000 // np.gcd(sr, 16000), sr // np.gcd(sr, 16000))
                    sf.write(d / f"{utt}.flac", 0.5 * audio / np.max(np.abs(audio)), 16000, subtype="PCM_16")
                    lines.append(f"{utt} {text}\n")
                    texts[part][utt] = text
                (d / f"{spk}-{chapter}.trans.txt").write_text("".join(lines))
    return texts


def _lmplz_available() -> bool:
    from asrkit.cli.train_ngram import KenlmNotFoundError, find_kenlm_binary

    try:
        find_kenlm_binary("lmplz")
        return True
    except KenlmNotFoundError:
        return False


def _snapshot(*dirs: Path) -> Dict[str, Tuple[int, str]]:
    """{path: (mtime_ns, sha256)} of every file under dirs."""
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file():
                out[str(p)] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


class Recipe:
    """Runs run.sh in a work dir with the test's options."""

    def __init__(self, work: Path, corpus: Path, lm: str):
        self.work, self.corpus, self.lm = work, corpus, lm
        self.exp = work / "exp" / "tiny"
        self.env = dict(os.environ, OMP_NUM_THREADS="1",
                        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def cmd(self, *extra: str, epochs: int = EPOCHS) -> List[str]:
        return ["bash", str(RUN), "--corpus-dir", str(self.corpus), "--workdir", str(self.work),
                "--train-sets", "train-clean-100", "--eval-sets", " ".join(EVAL_SETS), "--valid-set", "dev-clean",
                "--config", str(REPO / "conf" / "tiny_transformer.yaml"), "--exp", "exp/tiny", "--bpe-size", "40",
                "--train-opts", f"{TINY} --set train.epochs={epochs}", "--average-best", "2",
                "--lm", self.lm, "--lm-order", "3", "--lm-weights", "0.3", "--length-bonuses", "0.5",
                "--decode-settings", SETTINGS, "--nj", "2", *extra]

    def run(self, *extra: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run(self.cmd(*extra, **kw), env=self.env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"run.sh {' '.join(extra)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
        return res


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Dict[str, object]:
    """The slow part: corpus, stages 1-2, a training run killed after its first checkpoint, stages 3-7."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (tools/install/install_system_deps.sh installs it)")
    root = tmp_path_factory.mktemp("librispeech")
    texts = make_librispeech_tree(root / "corpus")
    rec = Recipe(root / "work", root / "corpus", "ngram" if _lmplz_available() else "none")
    first = rec.run("--stage", "1", "--stop-stage", "2")

    # stage 3 with many epochs, killed (the whole process group) once the first checkpoint exists; the rerun
    # with the real epoch count resumes from it (train.epochs is a resumable setting)
    proc = subprocess.Popen(rec.cmd("--stage", "3", "--stop-stage", "3", epochs=50), env=rec.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    index = rec.exp / "checkpoints.json"
    deadline = time.time() + 300
    while not index.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    killed_out = proc.communicate(timeout=60)[0]
    killed_index = json.loads(index.read_text()) if index.exists() else None
    stamped_when_killed = (rec.exp / ".done" / "train").exists()

    rest = rec.run("--stage", "3")
    return {"rec": rec, "texts": texts, "first": first, "killed_out": killed_out, "killed_index": killed_index,
            "stamped_when_killed": stamped_when_killed, "rest": rest}


def test_every_stage_leaves_its_outputs(recipe):
    rec, texts = recipe["rec"], recipe["texts"]
    work, exp = rec.work, rec.exp
    out = recipe["first"].stdout + recipe["rest"].stdout
    for stage in (1, 2, 3, 4, 6, 7):
        assert f"[stage {stage}]" in out
    # stage 1: one valid Kaldi dir per part, holding exactly the tree's utterances and transcripts
    for part in [p for p, *_ in PARTS] + ["train"]:
        d = work / "data" / part.replace("-", "_")
        report = validate_data_dir(d, check_audio=True)
        assert report.ok, (d, report.problems)
        want = texts["train-clean-100"] if part == "train" else texts[part]
        assert read_table(d / "text") == want
        dd = read_data_dir(d)
        assert set(dd.utt2dur) == set(want) and all(0.5 < v < 5 for v in dd.utt2dur.values())
        assert all(dd.utt2spk[u] == u.split("-")[0] for u in want)
    # stage 2: a 40-piece BPE tokenizer and CMVN stats
    from asrkit.text.tokenizer import load_tokenizer

    assert load_tokenizer(str(work / "data" / "lang" / "tokenizer.json")).vocab_size == 40
    assert (work / "data" / "lang" / "cmvn.json").is_file()
    # stages 3-4: EPOCHS epochs, the 2 best averaged into model.pt
    index = json.loads((exp / "checkpoints.json").read_text())
    assert max(e["epoch"] for e in index["checkpoints"] if e.get("end_of_epoch")) == EPOCHS - 1
    import torch

    model = torch.load(exp / "model.pt", weights_only=True)
    assert len(model["averaged"]) == 2
    # stage 6: every decode dir has one hypothesis per utterance; stage 7: its scoring
    settings = SETTINGS.split() if rec.lm != "none" else [s for s in SETTINGS.split() if not s.endswith("_lm")]
    for setting in settings:
        for part in EVAL_SETS:
            d = exp / f"decode_{setting}" / part
            assert set(read_table(d / "text", allow_empty_value=True)) == set(texts[part])
            assert (d / "scoring" / "result.txt").is_file() and (d / "decode.yaml").is_file()


def test_results_md_has_the_wer_of_every_decode_dir(recipe):
    rec, texts = recipe["rec"], recipe["texts"]
    results = (rec.exp / "RESULTS.md").read_text()
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[1:-1]]
            for line in results.splitlines() if line.startswith("| ") and not line.startswith("| eval set")}
    settings = SETTINGS.split() if rec.lm != "none" else [s for s in SETTINGS.split() if not s.endswith("_lm")]
    assert set(rows) == {(part, s) for part in EVAL_SETS for s in settings}
    for (part, setting), cells in rows.items():
        hyps = read_table(rec.exp / f"decode_{setting}" / part / "text", allow_empty_value=True)
        refs = texts[part]
        # jiwer on the same utterances, an empty hypothesis as an empty string
        ref_list = [refs[u] for u in sorted(refs)]
        hyp_list = [hyps.get(u, "") for u in sorted(refs)]
        m = jiwer.process_words(ref_list, hyp_list)
        errors = m.substitutions + m.deletions + m.insertions
        n_ref = sum(len(r.split()) for r in ref_list)
        wer = float(re.sub(r"[*()A-Z ]", "", cells[10]))
        assert wer == pytest.approx(100 * errors / n_ref, abs=0.006), (part, setting, cells)
        assert [int(c) for c in cells[9:10] + cells[11:15]] == [n_ref, errors, m.substitutions, m.deletions,
                                                                 m.insertions]
        assert cells[2] == {"greedy": "greedy", "ctc_prefix_lm": "ctc_prefix", "attention": "attention"}[setting]
        if setting.endswith("_lm"):
            assert "word3gram" in cells[5] and cells[6] == "0.3" and cells[7] == "0.5"
    assert "model config: conf/tiny_transformer.yaml" in results and "train.epochs=2" in results
    assert "## Decoding configs" in results and "mode: attention" in results


def test_ngram_lm_fused(recipe):
    if recipe["rec"].lm == "none":
        pytest.skip("KenLM's lmplz is not installed (tools/install/install_kenlm.sh): the recipe ran with --lm none")
    exp = recipe["rec"].exp
    assert (recipe["rec"].work / "exp" / "lm" / "word3gram.arpa.gz").is_file()
    used = (exp / "decode_ctc_prefix_lm" / "test-clean" / "decode.yaml").read_text()
    assert "word3gram.arpa.gz" in used and "lm_weight: 0.3" in used


def test_killed_training_resumes(recipe):
    killed = recipe["killed_index"]
    assert killed is not None, recipe["killed_out"][-2000:]
    # killed long before its 50 epochs: a step checkpoint, no finished stage
    assert not any(e.get("end_of_epoch") and e["epoch"] >= EPOCHS - 1 for e in killed["checkpoints"])
    assert not recipe["stamped_when_killed"] and "[stage 3]" in recipe["killed_out"]
    latest = next(e["step"] for e in killed["checkpoints"] if e["file"] == killed["latest"])
    log = recipe["rest"].stdout + recipe["rest"].stderr
    assert re.search(rf"resumed from \S*{re.escape(killed['latest'])}", log), log[-3000:]
    # the loss curve continues the killed run's: every step once, in order, up to the final checkpoint's
    final = json.loads((recipe["rec"].exp / "checkpoints.json").read_text())
    steps = [int(line.split("\t")[0]) for line in (recipe["rec"].exp / "steps.tsv").read_text().splitlines()[1:]]
    assert steps == sorted(set(steps)) and steps[-1] == max(e["step"] for e in final["checkpoints"]) > latest


def test_rerunning_every_stage_changes_nothing(recipe):
    rec = recipe["rec"]
    before = _snapshot(rec.work / "data", rec.work / "exp")
    again = rec.run("--stage", "1")
    assert _snapshot(rec.work / "data", rec.work / "exp") == before
    assert "skipped" in again.stdout and "%WER" in again.stdout
    for stage in (1, 2, 3, 4, 6):
        assert re.search(rf"\[stage {stage}\] .*skipped", again.stdout), (stage, again.stdout)


def test_decoding_with_two_jobs_gives_the_text_of_one(recipe, tmp_path):
    rec = recipe["rec"]
    d = rec.exp / "decode_attention" / "test-clean"
    assert (d / "split2").is_dir()  # the recipe decoded it in 2 shards
    assert len(set(read_table(d / "text").values())) > 1  # not all empty: a comparison that can fail
    res = subprocess.run([sys.executable, "-m", "asrkit", "decode", "--model", str(rec.exp), "--data",
                          str(rec.work / "data" / "test_clean"), "--out", str(tmp_path / "one"), "--decode-config",
                          str(REPO / "conf" / "decode_attention.yaml"), "--nj", "1"],
                         env=rec.env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "one" / "text").read_text() == (d / "text").read_text()


def _launched(tmp_path: Path, *opts: str) -> List[str]:
    """The command stage 3 runs after $train_cmd, recorded by a stand-in for srun that runs nothing."""
    fake = tmp_path / "fake_srun"
    record = tmp_path / "argv"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    env = dict(os.environ, ASRKIT_TRAIN_CMD=str(fake))
    res = subprocess.run(["bash", str(RUN), "--corpus-dir", str(tmp_path), "--workdir", str(tmp_path / "w"),
                          "--stage", "3", "--stop-stage", "3", *opts], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return record.read_text().splitlines()


@pytest.mark.parametrize("opts,launcher", [
    ((), ["asrkit"]),
    (("--ngpu", "4"), ["torchrun", "--standalone", "--nproc_per_node", "4", "-m", "asrkit"]),
    (("--nproc", "2"), ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "asrkit"]),
    (("--ngpu", "8", "--nnodes", "2", "--rdzv-endpoint", "node01:29500", "--rdzv-id", "42"),
     ["torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
      "node01:29500", "--rdzv-id", "42", "-m", "asrkit"]),
])
def test_training_launcher_behind_train_cmd(tmp_path, opts, launcher):
    argv = _launched(tmp_path, *opts)
    assert argv[:len(launcher) + 1] == launcher + ["train"]
    assert argv[argv.index("--config") + 1] == str(REPO / "conf" / "transformer.yaml")
    assert argv[argv.index("--out") + 1] == "exp/transformer"


def test_nnodes_without_rendezvous_is_an_error(tmp_path):
    res = subprocess.run(["bash", str(RUN), "--corpus-dir", str(tmp_path), "--workdir", str(tmp_path / "w"),
                          "--stage", "3", "--stop-stage", "3", "--nnodes", "2"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "--nnodes 2 needs --rdzv-endpoint HOST:PORT" in res.stderr
