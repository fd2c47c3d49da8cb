"""Batches sized from GPU memory (asrkit.pipeline.autobatch): the rule against a brute-force reference with fake
memory readers, and decoding with it on the CPU (the probe and the packing injected) against fixed batches."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from asrkit.config import ConfigError, DecodeConfig
from asrkit.data.table import read_table
from asrkit.pipeline import Transcriber
from asrkit.pipeline.autobatch import CPU_BATCH_SIZE, AutoBatch, BatchLimit, MemoryCost, measure_cost
from asrkit.pipeline.decode_dir import decode_data_dir
from asrkit.pipeline.sharded import DecodeJob, gpu_share
from tests.pipeline.tiny_exp import make_tiny_exp, tone, write_data_dir

MB = 1e6
# utterance ids in the order of their lengths, longest first (the data dir has no durations to sort by)
LENGTHS = {f"u{i}": s for i, s in enumerate([2.0, 1.8, 1.6, 1.4, 1.2, 1.0, 0.8])}


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_tiny_exp(tmp_path_factory.mktemp("autobatch") / "exp")


@pytest.fixture(scope="module")
def audio():
    return {u: tone(s, 200 + 50 * i, seed=i) for i, (u, s) in enumerate(LENGTHS.items())}


class FakeGpu:
    """A memory reader and a peak meter: the meter runs the probe's decoding and reports ``peaks`` in turn."""

    def __init__(self, free: float, peaks=(1 * MB, 3 * MB)):
        self.free, self.peaks, self.runs = free, list(peaks), []

    def mem_get_info(self):
        return int(self.free), int(4 * self.free)

    def peak(self, run) -> int:
        self.runs.append(run())
        return int(self.peaks[(len(self.runs) - 1) % len(self.peaks)])


def _largest_batch(cost, longest: float, budget: float, cap: float) -> int:
    """Brute force: the most utterances of ``cost(longest)`` bytes that fit the budget and the audio cap."""
    n = 1
    while (n + 1) * cost(longest) <= budget and (n + 1) * longest <= cap:
        n += 1
    return n


def test_the_fitted_cost_bounds_a_convex_growing_cost_up_to_the_longest_probed():
    def true_cost(s: float) -> float:  # fixed + linear + attention's quadratic term
        return 5 * MB + 2 * MB * s + 0.3 * MB * s * s

    probed = []
    cost = measure_cost(lambda s: probed.append(s) or true_cost(s), 20.0, peak=lambda run: run())
    assert probed == [1.0, 20.0] and cost.upto == 20.0
    for s in np.linspace(0.0, 20.0, 81):
        assert cost.bytes(s) >= true_cost(s) - 1e-6
    assert cost.bytes(20.0) == pytest.approx(true_cost(20.0) + cost.per_second * 1.0)  # tight up to the short probe
    # a short longest utterance is probed at half its length; a cost that does not grow is its larger probe
    assert measure_cost(lambda s: probed.append(s), 1.2, peak=lambda run: run() or 7).upto == 1.2 and probed[-2] == 0.6
    assert MemoryCost.fit((1.0, 9 * MB), (4.0, 6 * MB)) == MemoryCost(9 * MB, 0.0, 4.0)
    assert MemoryCost.fit((0.0, 2 * MB), (0.0, 3 * MB)) == MemoryCost(3 * MB, 0.0, 0.0)


@pytest.mark.parametrize("free", [200 * MB, 2000 * MB, 20000 * MB])
@pytest.mark.parametrize("peaks", [(1 * MB, 3 * MB), (4 * MB, 40 * MB)])
def test_the_batch_follows_the_free_memory_and_the_probed_cost(free, peaks):
    gpu = FakeGpu(free, peaks)
    auto = AutoBatch(0.6, gpu.mem_get_info, gpu.peak, max_seconds=3000.0)
    limit = auto.limit(10.0, lambda s: s)
    per_second = (peaks[1] - peaks[0]) / (10.0 - 1.0)

    def cost(s):
        return peaks[0] + per_second * s

    for longest in (10.0, 7.5, 3.0, 0.5):
        assert limit.count(longest) == _largest_batch(cost, longest, 0.6 * free, 3000.0)
    assert limit.count(10.0) * 10.0 <= 3000.0
    if free == 200 * MB and peaks[1] == 40 * MB:
        assert limit.count(10.0) == 2  # 120 MB of budget, 44 MB an utterance (40 + the 1 s probe's 4)
    if free == 20000 * MB and peaks[1] == 3 * MB:
        assert limit.count(10.0) == 300  # the cap: 3000 s of audio


def test_a_fixed_limit_counts_seconds_of_padded_audio_as_before():
    for longest, expected in ((0.5, 240), (2.5, 48), (7.25, 16), (200.0, 1), (0.75, 160)):
        assert BatchLimit(120.0).count(longest) == expected
        assert BatchLimit(120.0).audio(longest) == 120.0


def test_probed_again_only_for_a_longer_utterance_or_another_search():
    gpu = FakeGpu(1000 * MB)
    auto = AutoBatch(0.5, gpu.mem_get_info, gpu.peak)
    search = object()
    auto.limit(5.0, lambda s: s, search)
    auto.limit(3.0, lambda s: s, search)
    assert gpu.runs == [1.0, 5.0]
    auto.limit(8.0, lambda s: s, search)
    auto.limit(2.0, lambda s: s, object())
    assert gpu.runs == [1.0, 5.0, 1.0, 8.0, 1.0, 2.0]
    before = auto.current.count(2.0)
    auto.shrink()
    assert auto.budget == 250 * MB and auto.current.count(2.0) == before // 2
    auto.limit(9.0, lambda s: s, search)  # measured again: the halving stays
    assert auto.budget == 250 * MB and gpu.runs[-1] == 9.0


def _auto(tr: Transcriber, free: float) -> FakeGpu:
    """Size ``tr``'s batches as on a GPU with ``free`` bytes free (the probe decodes on the CPU)."""
    gpu = FakeGpu(free)
    tr.auto_batch = AutoBatch(0.5, gpu.mem_get_info, gpu.peak)
    return gpu


def _encoder_modes(monkeypatch, tr: Transcriber) -> list:
    """Whether each encoder call of ``tr`` ran in inference mode: a probe with autograd on would keep the
    activations, more memory than the batches it sizes take."""
    modes = []
    encode = tr.model.encode_features
    monkeypatch.setattr(tr.model, "encode_features", lambda *a: modes.append(torch.is_inference_mode_enabled())
                        or encode(*a))
    return modes


def test_decode_sized_from_memory_packs_by_the_rule_and_gives_the_fixed_batch_results(exp, audio, tmp_path,
                                                                                        monkeypatch):
    data = write_data_dir(tmp_path / "data", audio)
    fixed = Transcriber.from_dir(str(exp))
    assert fixed.auto_batch is None  # the CPU: 16 utterances a batch, as before
    assert [len(n) for n, _ in fixed.data_dir_batches(str(data), None, {})] == [len(audio)]
    tr = Transcriber.from_dir(str(exp))
    # probes: 1 MB at 1 s, 3 MB at 2 s -> 1 MB + 2 MB/s; 15 MB of budget: 3 of 2.0 s (5 MB), 3 of 1.4 s, 1 left
    gpu = _auto(tr, 30 * MB)
    modes = _encoder_modes(monkeypatch, tr)
    batches = [names for names, _ in tr.data_dir_batches(str(data), None, {})]
    assert batches == [["u0", "u1", "u2"], ["u3", "u4", "u5"], ["u6"]]
    assert len(gpu.runs) == 2 and all(len(r) == 1 and r[0] for r in gpu.runs)  # real decodes of one utterance
    assert modes == [True, True]
    assert decode_data_dir(tr, str(data), str(tmp_path / "auto")) == {"decoded": 7, "failed": 0}
    decode_data_dir(fixed, str(data), str(tmp_path / "one"), batch_size=1)
    auto_text = read_table(tmp_path / "auto" / "text")
    assert auto_text == read_table(tmp_path / "one" / "text")
    assert sum(len(t) for t in auto_text.values()) > 7  # the model says something: the comparison can fail


def test_decode_leaves_an_utterance_it_segments_out_of_the_sizing(exp, audio, tmp_path):
    data = write_data_dir(tmp_path / "data", audio)
    tr = Transcriber.from_dir(str(exp))
    gpu = _auto(tr, 30 * MB)
    batches = [names for names, _ in tr.data_dir_batches(str(data), None, {}, max_seconds=1.7)]
    assert batches[:2] == [["u0"], ["u1"]] and gpu.runs and len(gpu.runs[1][0]) == 1
    assert tr.auto_batch.cost.upto == pytest.approx(1.6)  # probed on the longest it batches


def test_transcribe_sized_from_memory_gives_the_fixed_batch_results(exp, audio, monkeypatch):
    inputs = list(audio.values())
    fixed = Transcriber.from_dir(str(exp), segmenter="none", batch_seconds=0.5)  # one segment a batch
    tr = Transcriber.from_dir(str(exp), segmenter="none")
    gpu = _auto(tr, 30 * MB)
    modes = _encoder_modes(monkeypatch, tr)
    sizes = []
    decode_batch = tr._decode_batch
    monkeypatch.setattr(tr, "_decode_batch", lambda searcher, batch: sizes.append(
        (len(batch), max(it.length for it in batch) / 100.0)) or decode_batch(searcher, batch))
    got, want = tr.transcribe(inputs), fixed.transcribe(inputs)
    assert [r.text for r in got] == [r.text for r in want] and any(r.text for r in got)
    assert [[(w.text, w.start, w.end) for w in r.words] for r in got] == \
        [[(w.text, w.start, w.end) for w in r.words] for r in want]
    assert sum(n for n, _ in sizes) == len(inputs) and max(n for n, _ in sizes) > 1
    # probed once (the first segment is the longest), in inference mode as the batches run
    assert len(gpu.runs) == 2 and len(modes) == 2 + len(sizes) and all(modes)
    limit = tr.auto_batch.current
    for n, longest in sizes:  # each batch within the budget, and full unless the buffer ran out
        assert n * limit.cost.bytes(longest) <= limit.budget
    assert sizes[0][0] == limit.count(sizes[0][1])


def test_a_batch_size_set_by_the_user_wins(exp, audio, tmp_path):
    data = write_data_dir(tmp_path / "data", audio)
    tr = Transcriber.from_dir(str(exp), decode=DecodeConfig(batch_size=2))
    gpu = _auto(tr, 30 * MB)
    assert [len(n) for n, _ in tr.data_dir_batches(str(data), None, {})] == [2, 2, 2, 1]
    assert [len(n) for n, _ in tr.data_dir_batches(str(data), 3, {})] == [3, 3, 1]  # --batch-size
    tr = Transcriber.from_dir(str(exp), segmenter="none", batch_seconds=60.0)
    _auto(tr, 1 * MB)  # room for no batch at all: only a user value could batch them
    sizes = []
    decode_batch = tr._decode_batch
    tr._decode_batch = lambda searcher, batch: sizes.append(len(batch)) or decode_batch(searcher, batch)
    tr.transcribe(list(audio.values()))
    assert sizes == [len(audio)] and gpu.runs == []


def test_running_out_of_memory_halves_the_batch_and_the_budget_after_it(exp, audio, tmp_path, monkeypatch, caplog):
    data = write_data_dir(tmp_path / "data", audio)
    tr = Transcriber.from_dir(str(exp))
    _auto(tr, 30 * MB)
    nbest = tr._nbest_batch
    tried = []

    def tight(wavs):  # a GPU where only two utterances fit
        tried.append(len(wavs))
        if len(wavs) > 2 and len(tried) > 2:  # (not the probes)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return nbest(wavs)

    monkeypatch.setattr(tr, "_nbest_batch", tight)
    with caplog.at_level(logging.WARNING, "asrkit.pipeline"):
        decode_data_dir(tr, str(data), str(tmp_path / "out"))
    # the probes, three of 2.0-1.6 s in halves, then batches sized from half the budget: 1.4 s alone (3.8 MB)
    assert tried == [1, 1, 3, 1, 2, 1, 2, 1]
    assert tr.auto_batch.budget == pytest.approx(15 * MB / 2)
    assert "half the budget" in caplog.text
    decode_data_dir(Transcriber.from_dir(str(exp)), str(data), str(tmp_path / "one"), batch_size=1)
    assert read_table(tmp_path / "out" / "text") == read_table(tmp_path / "one" / "text")


def test_an_utterance_whose_probe_runs_out_of_memory_is_decoded_alone_and_the_rest_go_on(exp, audio, tmp_path):
    data = write_data_dir(tmp_path / "data", audio)
    tr = Transcriber.from_dir(str(exp))
    _auto(tr, 30 * MB)
    peaks = iter([1 * MB, None, 1 * MB, 3 * MB])  # the longest utterance, whole, runs out of memory

    def peak(run):
        value = next(peaks)
        if value is None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        run()
        return value

    tr.auto_batch.peak = peak
    failed = {}
    batches = [names for names, _ in tr.data_dir_batches(str(data), None, failed)]
    # the next one is probed afresh: 0.9 s 1 MB, 1.8 s 3 MB -> 5 MB at 1.8 s, 3.67 MB at 1.2 s, in 15 MB
    assert batches == [["u0"], ["u1", "u2", "u3"], ["u4", "u5", "u6"]] and not failed
    assert tr.auto_batch.cost.upto == pytest.approx(1.8)


def test_shard_processes_sharing_a_gpu_split_its_memory():
    job = DecodeJob("exp", DecodeConfig(gpu_memory_fraction=0.6), device="cuda")
    assert gpu_share(job, ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]).decode.gpu_memory_fraction == 0.2
    assert gpu_share(job, ["cuda:0", "cuda:1"]) == job and gpu_share(job, ["cpu", "cpu", "cpu"]) == job
    assert gpu_share(job, ["cuda", "cuda"]).decode == DecodeConfig(gpu_memory_fraction=0.3)


def test_settings_out_of_range_are_refused_naming_the_key(exp):
    with pytest.raises(ConfigError, match="decode.gpu_memory_fraction must be in"):
        Transcriber.from_dir(str(exp), decode=DecodeConfig(gpu_memory_fraction=0.0))
    with pytest.raises(ConfigError, match="decode.batch_size must be >= 1 or null"):
        Transcriber.from_dir(str(exp), decode=DecodeConfig(batch_size=0))
    assert DecodeConfig().batch_size is None and CPU_BATCH_SIZE == 16
