"""CUDA checks of batches sized from GPU memory (asrkit.pipeline.autobatch), run by tools/bench/run_cuda_checks.sh
on a machine with a GPU: ``asrkit decode`` and ``transcribe`` with no batch size set give batch 1's transcripts,
batch several utterances, and the probed cost bounds a real batch's peak memory."""
from __future__ import annotations

import logging
import re

import pytest
import soundfile as sf
import torch

from asrkit.cli import main
from asrkit.data.table import read_table
from asrkit.pipeline import Transcriber
from asrkit.pipeline.autobatch import cuda_peak
from asrkit.pipeline.decode_dir import decode_data_dir
from tests.pipeline.tiny_exp import make_tiny_exp, tone, write_data_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

AUDIO = {f"u{i:02d}": tone(0.6 + 0.25 * i, 180 + 40 * i, seed=i) for i in range(12)}


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_tiny_exp(tmp_path_factory.mktemp("autobatch_cuda") / "exp")


def test_decode_on_cuda_with_the_batch_sized_from_memory_gives_batch_one_transcripts(exp, tmp_path, caplog):
    data = write_data_dir(tmp_path / "data", AUDIO)
    tr = Transcriber.from_dir(str(exp), device="cuda")
    assert tr.auto_batch is not None
    with caplog.at_level(logging.INFO, "asrkit.pipeline"):
        decode_data_dir(tr, str(data), str(tmp_path / "auto"))
    chosen = [int(m) for m in re.findall(r"batch sized from cuda memory: .*?: (\d+) utterances", caplog.text)]
    assert chosen and chosen[0] > 1, caplog.text  # a tiny model on a GPU: all 12 fit
    assert tr.auto_batch.cost.per_second > 0 and tr.auto_batch.budget > 0
    decode_data_dir(tr, str(data), str(tmp_path / "one"), batch_size=1)
    text = read_table(tmp_path / "auto" / "text")
    assert text == read_table(tmp_path / "one" / "text") and len(text) == len(AUDIO)
    assert sum(len(t) for t in text.values()) > len(AUDIO)  # the model says something: the comparison can fail


def test_transcribe_on_cuda_with_the_batch_sized_from_memory_gives_batch_one_results(exp):
    inputs = list(AUDIO.values())
    got = Transcriber.from_dir(str(exp), device="cuda", segmenter="none").transcribe(inputs)
    want = Transcriber.from_dir(str(exp), device="cuda", segmenter="none", batch_seconds=0.5).transcribe(inputs)
    assert [r.text for r in got] == [r.text for r in want] and any(r.text for r in got)


def test_transcribe_on_cuda_says_the_batch_it_chose(exp, tmp_path, caplog, capsys):
    path = tmp_path / "a.wav"
    sf.write(path, AUDIO["u05"], 16000, subtype="FLOAT")
    assert main(["transcribe", "--model", str(exp), "--device", "cuda", "--no-progress", str(path)]) == 0
    assert capsys.readouterr().out.strip()
    chosen = re.findall(r"batch sized from cuda memory: .*?: (\d+) utterances", caplog.text)
    assert chosen and int(chosen[0]) > 1, caplog.text  # (as many as would fit, had there been more)


def test_the_probed_cost_bounds_a_real_batch(exp):
    """A batch of n utterances of L seconds peaks below n x cost(L), the cost the batch was sized by."""
    tr = Transcriber.from_dir(str(exp), device="cuda")
    wavs = [torch.from_numpy(tone(8.0, 200 + 30 * i, seed=i)) for i in range(24)]
    tr.auto_batch.limit(8.0, lambda s: tr.transcribe_nbest([wavs[0][: round(s * 16000)]]), tr.searcher)
    peak = cuda_peak(tr.device)(lambda: tr.transcribe_nbest(wavs))
    assert 0 < peak <= len(wavs) * tr.auto_batch.cost.bytes(8.0)
