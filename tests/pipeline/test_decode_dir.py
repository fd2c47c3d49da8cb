"""``asrkit decode`` of a data dir: one utterance's failure is its own (listed in OUT/failed, the rest written),
utterances over the length limit are segmented as ``transcribe`` segments them, and the errors that stop a
decode (a bad data dir, a full disk) are one line that leaves no temporary file."""
from __future__ import annotations

import base64
import errno
import json
import os
import shutil

import numpy as np
import pytest
import torch

import asrkit.atomic
from asrkit.cli import main
from asrkit.config import DecodeConfig
from asrkit.data.table import read_table
from asrkit.pipeline import Transcriber
from asrkit.pipeline.decode_dir import MAX_UTTERANCE_SECONDS
from asrkit.pipeline.sharded import DecodeJob, decode_shard, plan_shards, prepare_shard
from asrkit.pipeline.transcriber import _EagerAcoustic
from tests.full_disk import FullDisk
from tests.pipeline.tiny_exp import make_tiny_exp, tone, write_data_dir

SHORT = {f"s{i}": tone(0.5 + 0.2 * i, 220 + 60 * i, seed=i) for i in range(4)}
# 4.2 s: three bursts of tone between pauses of 0.6 s of silence
LONG = np.concatenate([np.zeros(4800, np.float32), tone(0.8, 300), np.zeros(9600, np.float32), tone(0.8, 500, 1),
                       np.zeros(9600, np.float32), tone(0.8, 400, 2), np.zeros(4800, np.float32)])


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_tiny_exp(tmp_path_factory.mktemp("decode_dir") / "exp")


def _decode(exp, data, out, *more) -> int:
    return main(["decode", "--model", str(exp), "--data", str(data), "--out", str(out), *more])


def _reference(exp, audio: dict) -> dict:
    """Each utterance decoded alone (batch of one, whole) through the Python API."""
    tr = Transcriber.from_dir(str(exp))
    return {u: tr.transcribe_nbest([torch.from_numpy(x)])[0][0].text for u, x in audio.items()}


def test_one_bad_utterance_fails_alone_and_the_rest_are_written(exp, tmp_path, capsys):
    """Huge finite float samples overflow the features to inf and the log-probs to NaN: the search refuses that
    utterance; it used to take the whole decode down with no text written."""
    huge = (1e30 * np.sin(np.arange(16000) / 5)).astype(np.float32)
    data = write_data_dir(tmp_path / "data", {**SHORT, "huge": huge, "broken": b"RIFF, but not a wav file"})
    assert _decode(exp, data, tmp_path / "out") == 0  # one batch of all six
    hyps = read_table(tmp_path / "out" / "text")
    assert hyps == _reference(exp, SHORT)
    assert sum(len(h) for h in hyps.values()) > 4  # the model says something: the comparison can fail
    failed = read_table(tmp_path / "out" / "failed")
    assert sorted(failed) == ["broken", "huge"]
    assert "NaN" in failed["huge"] and "broken.wav" in failed["broken"]
    err = capsys.readouterr().err
    assert "Traceback" not in err and "asrkit decode: 2 of 6 utterances failed" in err

    # a rerun into the same dir after the bad inputs are gone leaves no stale `failed`
    assert _decode(exp, write_data_dir(tmp_path / "good", SHORT), tmp_path / "out") == 0
    assert not (tmp_path / "out" / "failed").exists()


def test_nothing_decoded_is_an_error(exp, tmp_path, capsys):
    data = write_data_dir(tmp_path / "data", {"broken": b"RIFF, but not a wav file"})
    assert _decode(exp, data, tmp_path / "out") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"asrkit decode: no utterance could be decoded (1 failed, listed in {tmp_path / 'out'}/failed)"


def test_a_long_utterance_is_segmented_as_transcribe_does(exp, tmp_path, monkeypatch):
    data = write_data_dir(tmp_path / "data", {**SHORT, "long": LONG})
    longest = []
    call = _EagerAcoustic.__call__

    def spy(self, data, lens):
        longest.append(int(lens.max()))
        return call(self, data, lens)

    monkeypatch.setattr(_EagerAcoustic, "__call__", spy)
    assert _decode(exp, data, tmp_path / "whole") == 0  # under the default limit: decoded whole
    assert max(longest) >= 400  # feature frames (10 ms): 4.2 s went through the encoder at once
    longest.clear()
    assert _decode(exp, data, tmp_path / "split", "--max-utt-seconds", "2") == 0
    assert max(longest) <= 200  # nothing longer than the limit reached the encoder

    whole, split = read_table(tmp_path / "whole" / "text"), read_table(tmp_path / "split" / "text")
    assert {u: split[u] for u in SHORT} == {u: whole[u] for u in SHORT} == _reference(exp, SHORT)
    result = Transcriber.from_dir(str(exp)).transcribe([torch.from_numpy(LONG)])[0]
    assert len(result.segments) == 3 and split["long"] == result.text
    assert split["long"] != whole["long"]  # the untrained model reads the pauses differently: the test can fail
    # a shard's process (asrkit decode --nj) segments the same way
    job = DecodeJob(str(exp), DecodeConfig(), max_seconds=2.0)
    [(shard, sub)] = plan_shards(job, str(data), str(tmp_path / "nj"), 1)
    prepare_shard(shard, sub)
    decode_shard(job, shard)
    assert read_table(os.path.join(shard.out_dir, "text")) == split


def test_help_states_the_default_limit(capsys):
    with pytest.raises(SystemExit):
        main(["decode", "--help"])
    assert f"(default {MAX_UTTERANCE_SECONDS:g})" in " ".join(capsys.readouterr().out.split())


def test_the_limit_must_be_positive(exp, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _decode(exp, tmp_path, tmp_path / "out", "--max-utt-seconds", "0")
    assert "--max-utt-seconds must be > 0" in capsys.readouterr().err


def test_a_bad_data_dir_is_one_line_without_nj_as_with_it(exp, tmp_path, capsys):
    data = write_data_dir(tmp_path / "data", SHORT)
    (data / "wav.scp").write_text((data / "wav.scp").read_text() + "s0 again.wav\n")  # a duplicate key
    for more in ([], ["--nj", "2"]):
        assert _decode(exp, data, tmp_path / "out", *more) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "wav.scp" in err[0] and "duplicate key 's0'" in err[0], (more, err)




def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(exp, tmp_path, monkeypatch, capsys):
    data = write_data_dir(tmp_path / "data", SHORT)

    def opener(path, *a, **k):
        fh = open(path, *a, **k)
        return FullDisk(fh) if os.path.basename(path).startswith("text.tmp") else fh

    monkeypatch.setattr(asrkit.atomic, "open", opener, raising=False)
    out = tmp_path / "out"
    assert _decode(exp, data, out) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err  # the lines before the last are the progress bar's
    last = err.strip().splitlines()[-1]
    assert last == f"asrkit decode: [Errno {errno.ENOSPC}] No space left on device: '{out / 'text'}'"
    assert sorted(os.listdir(out)) == ["decode.yaml"]


@pytest.mark.parametrize("setting, message", [
    ("token_topk=0", "decode.token_topk must be >= 1 or null (no pruning), got 0"),
    ("blank_skip_threshold=1.5", "decode.blank_skip_threshold must be in (0, 1) or null, got 1.5"),
])
def test_pruning_settings_are_checked_before_any_work(exp, tmp_path, capsys, setting, message):
    """token_topk=0 was a traceback from inside the search, after the audio was read."""
    data = write_data_dir(tmp_path / "data", SHORT)
    assert _decode(exp, data, tmp_path / "out", "--mode", "ctc_prefix", "--set", setting) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"asrkit decode: {message}"]
    assert not (tmp_path / "out").exists()


def test_a_corrupt_sentencepiece_model_is_one_line(exp, tmp_path, capsys):
    broken = tmp_path / "exp"
    shutil.copytree(exp, broken)
    (broken / "tokenizer.json").write_text(json.dumps({"kind": "sentencepiece",
                                                       "model": base64.b64encode(b"\x0a\x05junk").decode()}))
    assert _decode(broken, write_data_dir(tmp_path / "data", SHORT), tmp_path / "out") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"asrkit decode: {broken / 'tokenizer.json'}: the sentencepiece model in it is corrupt (sentencepiece cannot "
        f"parse it)"]
