"""Reverberation: simulated impulse responses (energy, direct-path delay, room draws), RIR lists, convolution."""
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio.io import AudioError
from asrkit.audio.reverb import (SPEED_OF_SOUND, WALL_MARGIN, Room, RirSource, normalize_rir, read_rir_list,
                                 reverberate, sample_room, simulate_bank, simulate_rir)
from asrkit.config import ConfigError, ReverbConfig

pytest.importorskip("pyroomacoustics")
RATE = 16000
# An asymmetric room and placement: no two image sources arrive together, so the direct path is the strongest.
ROOM = Room(size=(6.1, 4.7, 3.2), absorption=0.45, source=(1.3, 1.1, 1.4), mic=(3.9, 2.6, 1.7))


def test_pyroomacoustics_speed_of_sound_is_the_one_assumed():
    import pyroomacoustics as pra

    assert pra.constants.get("c") == SPEED_OF_SOUND


@pytest.mark.parametrize("order", [0, 12])
def test_simulated_rir_has_unit_energy_and_the_direct_path_at_distance_over_c(order):
    rir = simulate_rir(ROOM, RATE, max_order=order)
    assert rir.dtype == torch.float32
    assert float(rir.double().square().sum()) == pytest.approx(1.0, abs=1e-5)
    expected = ROOM.distance / SPEED_OF_SOUND * RATE  # samples
    peak = int(rir.abs().argmax())
    assert abs(peak - expected) <= 1.0
    # Nothing arrives before the direct path: the first sample above half the peak is the peak's neighbour at most.
    first = int(torch.nonzero(rir.abs() >= 0.5 * rir.abs().max())[0])
    assert abs(first - expected) <= 1.5
    if order:
        assert rir.numel() > 4 * expected  # reflections follow


def test_the_room_is_simulated_as_stated_without_air_absorption():
    import pyroomacoustics as pra

    box = pra.ShoeBox(list(ROOM.size), fs=RATE, materials=pra.Material(ROOM.absorption), max_order=6)
    box.add_source(list(ROOM.source))
    box.add_microphone(list(ROOM.mic))
    box.compute_rir()
    ref = torch.from_numpy(np.asarray(box.rir[0][0][40:], dtype=np.float32))  # 40: half the delay filter
    ref = ref / ref.double().square().sum().sqrt().float()
    got = simulate_rir(ROOM, RATE, max_order=6)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=1e-6)


def test_walls_that_absorb_less_reverberate_longer():
    late = []
    for absorption in (0.1, 0.5, 0.9):
        rir = simulate_rir(Room(ROOM.size, absorption, ROOM.source, ROOM.mic), RATE, max_order=8)
        direct = round(ROOM.distance / SPEED_OF_SOUND * RATE)
        late.append(float(rir[direct + 80:].double().square().sum()))  # energy 5 ms after the direct sound
    assert late[0] > late[1] > late[2] > 0


def test_simulation_without_pyroomacoustics_names_the_extra(monkeypatch):
    from asrkit.audio import reverb
    from asrkit.extras import MissingExtraError

    def missing(module, purpose):
        raise MissingExtraError(f"{purpose} needs {module}")

    monkeypatch.setattr(reverb, "require", missing)
    with pytest.raises(MissingExtraError, match=r"^augment.reverb \(simulated rooms\) needs pyroomacoustics$"):
        simulate_rir(ROOM, RATE, max_order=1)


def test_a_room_without_reflections_has_all_its_energy_around_the_direct_path():
    rir = simulate_rir(ROOM, RATE, max_order=0)
    expected = round(ROOM.distance / SPEED_OF_SOUND * RATE)
    near = rir[expected - 40: expected + 41]  # the fractional-delay filter's span
    assert float(near.double().square().sum()) == pytest.approx(1.0, abs=1e-3)


def test_rooms_are_drawn_inside_the_configured_ranges():
    cfg = ReverbConfig(prob=1.0, room_length=(3.0, 5.0), room_width=(4.0, 6.0), room_height=(2.5, 3.0),
                       absorption=(0.3, 0.4), distance=(0.5, 1.5))
    rng = np.random.default_rng(7)
    rooms = [sample_room(cfg, rng) for _ in range(200)]
    for r in rooms:
        (length, width, height), src, mic = r.size, np.array(r.source), np.array(r.mic)
        assert 3.0 <= length <= 5.0 and 4.0 <= width <= 6.0 and 2.5 <= height <= 3.0
        assert 0.3 <= r.absorption <= 0.4
        for p in (src, mic):
            assert (p >= WALL_MARGIN - 1e-9).all() and (p <= np.array(r.size) - WALL_MARGIN + 1e-9).all()
        assert r.distance == pytest.approx(math.dist(r.source, r.mic))
        assert 0.5 - 1e-9 <= r.distance <= 1.5 + 1e-9
    # The draws cover the ranges (not one value): spread over most of each, the microphone over the room.
    assert max(r.size[0] for r in rooms) - min(r.size[0] for r in rooms) > 1.5
    assert max(r.distance for r in rooms) - min(r.distance for r in rooms) > 0.8
    assert max(r.mic[0] for r in rooms) > 3.5 and max(r.mic[1] for r in rooms) > 4.5 and min(r.mic[0] for r in rooms) < 0.6


def test_a_distance_that_fits_no_direction_is_shortened_to_the_room():
    cfg = ReverbConfig(prob=1.0, room_length=(2.0, 2.0), room_width=(2.0, 2.0), room_height=(2.0, 2.0),
                       distance=(20.0, 20.0))
    r = sample_room(cfg, np.random.default_rng(0))
    assert 0.0 < r.distance < math.sqrt(3) * (2.0 - 2 * WALL_MARGIN) + 1e-9
    assert all(WALL_MARGIN - 1e-9 <= c <= 2.0 - WALL_MARGIN + 1e-9 for c in r.source)


def test_the_source_is_placed_at_the_drawn_distance_in_a_uniformly_drawn_direction():
    # A big room: every drawn distance fits, and is kept exactly; the direction is uniform among those that fit,
    # not the one reaching farthest (horizontal in a flat room): sources go up and down as much as a sphere does.
    flat = ReverbConfig(prob=1.0, room_length=(10.0, 10.0), room_width=(10.0, 10.0), room_height=(3.0, 3.0),
                        distance=(1.0, 1.0))
    rng = np.random.default_rng(0)
    rooms = [sample_room(flat, rng) for _ in range(100)]
    assert all(r.distance == pytest.approx(1.0, abs=1e-9) for r in rooms)
    assert np.mean([abs(r.source[2] - r.mic[2]) for r in rooms]) > 0.3  # uniform on a sphere: 0.5; farthest: 0.1
    # A room too small for the distance: the longest of the drawn directions (not the first one drawn).
    small = ReverbConfig(prob=1.0, room_length=(2.0, 2.0), room_width=(2.0, 2.0), room_height=(2.0, 2.0),
                         distance=(20.0, 20.0))
    rng = np.random.default_rng(0)
    distances = [sample_room(small, rng).distance for _ in range(30)]
    assert np.mean(distances) > 1.2 and min(distances) > 0.9  # the first drawn direction: 0.75 and 0.01


def test_the_bank_is_the_same_for_the_same_seed_and_differs_for_another():
    cfg = ReverbConfig(prob=1.0, num_rooms=3, max_order=3)
    a, b, c = simulate_bank(cfg, RATE, 5), simulate_bank(cfg, RATE, 5), simulate_bank(cfg, RATE, 6)
    assert len(a) == 3
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))


def test_reverberate_is_the_convolution_cut_to_the_utterance_at_its_power():
    g = torch.Generator().manual_seed(0)
    # 3398 + 700 - 1 = 4097 samples of full convolution: one more than an FFT size of 4096 would hold
    wav = torch.randn(3398, generator=g) * 0.1
    rir = normalize_rir(torch.randn(700, generator=g))
    out = reverberate(wav, rir)
    ref = np.convolve(wav.double().numpy(), rir.double().numpy())[:3398]
    ref *= math.sqrt(np.sum(wav.double().numpy() ** 2) / np.sum(ref ** 2))
    assert out.shape == wav.shape and out.dtype == wav.dtype
    np.testing.assert_allclose(out.double().numpy(), ref, atol=1e-5)
    assert torch.equal(reverberate(torch.zeros(100), rir), torch.zeros(100))
    quiet = torch.randn(100, generator=g, dtype=torch.float64) * 0.01  # power kept however small; float64 kept
    out = reverberate(quiet, rir)
    assert out.dtype == torch.float64
    assert float(out.square().sum()) == pytest.approx(float(quiet.square().sum()), rel=1e-5)


def test_normalize_rir_scales_to_unit_energy_and_refuses_silence():
    assert torch.allclose(normalize_rir(torch.tensor([3.0, 4.0])), torch.tensor([0.6, 0.8]))
    with pytest.raises(ValueError, match="^an impulse response of zero energy$"):
        normalize_rir(torch.zeros(5))


def _wav(path, samples, rate=RATE):
    sf.write(str(path), np.asarray(samples, dtype=np.float32), rate, subtype="FLOAT")
    return str(path)


def test_rir_lists_in_kaldis_format_and_plain(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rirs").mkdir()
    _wav(tmp_path / "rirs" / "a.wav", [0.0, 2.0, 1.0])
    _wav(tmp_path / "rirs" / "b.wav", [1.0, 0.0, 0.0, 0.5])
    kaldi = tmp_path / "rir_list"
    kaldi.write_text("--rir-id small-a --room-id small rirs/a.wav\n\n"
                     "--rir-id small-b --room-id small --rt-60 0.4 rirs/b.wav\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("rirs/b.wav\n")
    assert read_rir_list(str(kaldi)) == ["rirs/a.wav", "rirs/b.wav"]
    assert read_rir_list(str(plain)) == ["rirs/b.wav"]
    source = RirSource(ReverbConfig(prob=1.0, rir_list=str(kaldi)), RATE, seed=1)
    assert len(source) == 2 and source.bank == []
    drawn = {tuple(source.draw(np.random.default_rng(s)).tolist()) for s in range(20)}
    a = (0.0, 2.0 / math.sqrt(5), 1.0 / math.sqrt(5))
    b = (1.0 / math.sqrt(1.25), 0.0, 0.0, 0.5 / math.sqrt(1.25))
    assert {tuple(round(v, 5) for v in d) for d in drawn} == {tuple(round(v, 5) for v in x) for x in (a, b)}


@pytest.mark.parametrize("text, message", [
    ("--rir-id x --room-id rirs/a.wav\n", r"rir_list:1: expected '--rir-id ID --room-id ROOM path' \(options"),
    ("rirs/a.wav\nsmall 2 rirs/a.wav\n", r"rir_list:2: expected"),
    ("rirs/a.wav\nrirs/missing.wav\n", r"rir_list:2: rirs/missing.wav: no such file"),
    ("\n\n", r"rir_list: no impulse response listed"),
])
def test_a_bad_rir_list_is_one_line_naming_the_file_and_line(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rirs").mkdir()
    _wav(tmp_path / "rirs" / "a.wav", [1.0])
    (tmp_path / "rir_list").write_text(text)
    with pytest.raises(ConfigError, match=r"^augment.reverb.rir_list: rir_list" + message[8:]) as info:
        read_rir_list("rir_list")
    assert "\n" not in str(info.value)


def test_listed_files_read_as_named_and_their_errors_name_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _wav(tmp_path / "a.wav", [0.5, 0.5])
    (tmp_path / "odd|").write_bytes((tmp_path / "a.wav").read_bytes())  # a name ending like a pipe is a file
    _wav(tmp_path / "silent.wav", [0.0, 0.0])
    (tmp_path / "bad.wav").write_bytes(b"RIFF not audio")
    for name, error in (("odd|", None), ("silent.wav", "^utt rir: silent.wav: the impulse response is silent$"),
                        ("bad.wav", "^utt rir: bad.wav: ")):
        (tmp_path / "list").write_text(f"{name}\n")
        source = RirSource(ReverbConfig(prob=1.0, rir_list="list"), RATE, seed=1)
        if error is None:
            assert torch.allclose(source.draw(np.random.default_rng(0)), torch.tensor([0.5, 0.5]) / math.sqrt(0.5))
        else:
            with pytest.raises(AudioError, match=error):
                source.draw(np.random.default_rng(0))


def test_rir_lists_are_utf8_whatever_the_locale(tmp_path, monkeypatch, c_locale):
    monkeypatch.chdir(tmp_path)
    _wav(tmp_path / "salle_à_manger.wav", [1.0])
    (tmp_path / "list").write_bytes("--rir-id x --room-id y salle_à_manger.wav\n".encode("utf-8"))
    assert read_rir_list("list") == ["salle_à_manger.wav"]
    (tmp_path / "latin1").write_bytes("salle_\xe0.wav\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"^augment.reverb.rir_list: latin1: not a UTF-8 text file$"):
        read_rir_list("latin1")


def test_a_long_bad_line_is_quoted_cut(tmp_path):
    (tmp_path / "list").write_text("x" * 200 + " y\n")
    with pytest.raises(ConfigError) as info:
        read_rir_list(str(tmp_path / "list"))
    assert str(info.value).endswith(f"got {'x' * 80!r}")


def test_a_missing_rir_list_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^augment.reverb.rir_list: .*nope: No such file"):
        read_rir_list(str(tmp_path / "nope"))


def test_simulated_source_holds_its_bank():
    cfg = ReverbConfig(prob=1.0, num_rooms=2, max_order=2)
    source = RirSource(cfg, RATE, seed=3)
    assert len(source) == 2 and not source.paths
    assert all(torch.equal(a, b) for a, b in zip(source.bank, RirSource(cfg, RATE, seed=3).bank))  # seeded
    assert any(source.draw(np.random.default_rng(s)) is source.bank[1] for s in range(10))
