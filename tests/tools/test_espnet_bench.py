"""tools/espnet/espnet_bench.py (asrkit config -> ESPnet2 asr.yaml dict, token list, text shapes, timing, best path)
and tools/espnet/espnet_report.py (the table of stage 7).

ESPnet is never imported: its formulas (WarmupLR, randint's exclusive bound, the char tokenizer's
<space>) are written out here as the references.
"""
from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import math
import random
import sys
from pathlib import Path

import pytest
import yaml

from asrkit.config import ConfigError, load_config
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.optim import lr_factor
from tool_loader import load_tool

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "espnet" / "espnet_bench.py"


@pytest.fixture(scope="module")
def bench():
    return load_tool("espnet/espnet_bench")


@pytest.fixture(scope="module")
def report(bench):
    """Loaded after espnet_bench, so its ``from espnet_bench import`` binds the module the tests hold."""
    return load_tool("espnet/espnet_report")


# What the demo's config needs to map: no per-utterance normalisation, no VTLP (ESPnet has neither here).
DEMO_SETS = ["frontend.utterance_cmn=false", "augment.vtlp.prob=0"]


@pytest.fixture(scope="module")
def tiny():
    return load_config(ROOT / "conf" / "tiny_ctc.yaml")


def test_tiny_ctc_maps_to_the_same_model_and_training(bench, tiny):
    conf = bench.espnet_config(tiny, 10, median_frames=400.0)
    f, enc = tiny.frontend, tiny.model.encoder
    assert conf["frontend"] == "default"
    fc = conf["frontend_conf"]
    assert (fc["fs"], fc["n_fft"], fc["win_length"], fc["hop_length"], fc["n_mels"]) == (
        f.sample_rate, f.n_fft, f.win_length, f.hop_length, f.n_mels)
    assert fc["fmin"] == 20 and fc["fmax"] == 8000 and isinstance(fc["fmin"], int) and fc["htk"] is True
    ec = conf["encoder_conf"]
    assert conf["encoder"] == "transformer"
    assert (ec["output_size"], ec["attention_heads"], ec["linear_units"], ec["num_blocks"]) == (
        enc.d_model, enc.num_heads, enc.ffn_dim, enc.num_layers) == (144, 4, 576, 4)
    assert ec["dropout_rate"] == ec["positional_dropout_rate"] == 0.1 and ec["input_layer"] == "conv2d"
    # ctc_weight 1.0: no decoder at all
    assert conf["model_conf"]["ctc_weight"] == 1.0 and "decoder" not in conf
    assert conf["optim"] == "adamw" and conf["optim_conf"]["lr"] == 0.003
    assert conf["optim_conf"]["betas"] == [0.9, 0.98] and conf["optim_conf"]["eps"] == 1e-9
    assert conf["batch_type"] == "length" and conf["batch_bins"] == 4000 * 160  # frames -> samples
    assert conf["max_epoch"] == 10 and conf["seed"] == 1 and conf["num_att_plot"] == 0
    assert conf["normalize"] == "global_mvn"
    assert bench.espnet_config(tiny, 10, cmvn=False)["normalize"] is None
    yaml.safe_load(yaml.safe_dump(conf))  # plain YAML types only


def test_warmuplr_equals_asrkit_schedule(bench, tiny):
    conf = bench.espnet_config(tiny, 10)
    w, lr = conf["scheduler_conf"]["warmup_steps"], conf["optim_conf"]["lr"]
    ours = lr_factor(tiny.train.scheduler, tiny.train.warmup_steps)
    for s in range(1, 3000):
        espnet = lr * w ** 0.5 * min(s ** -0.5, s * w ** -1.5)  # espnet2/schedulers/warmup_lr.py
        assert espnet == pytest.approx(tiny.train.lr * ours(s), rel=1e-12)


@pytest.fixture(scope="module")
def demo():
    """The demo's model without per-utterance normalisation (which ESPnet cannot add to global MVN) nor VTLP."""
    return load_config(ROOT / "conf" / "mini_small.yaml", DEMO_SETS)


def test_interctc_and_self_conditioning_map(bench, demo):
    conf = bench.espnet_config(demo, 5, updates_per_epoch=100)
    ec = conf["encoder_conf"]
    assert tuple(demo.model.encoder.interctc_layers) == (2,) and demo.model.interctc_weight == 0.3
    assert ec["interctc_layer_idx"] == [2] and ec["interctc_use_conditioning"] is False
    assert conf["model_conf"]["interctc_weight"] == 0.3 and conf["encoder"] == "conformer"
    cond = load_config(ROOT / "conf" / "mini_small.yaml", [*DEMO_SETS, "model.encoder.interctc_layers=[3, 1]",
                                                          "model.encoder.self_condition=true"])
    ec = bench.espnet_config(cond, 5, updates_per_epoch=100)["encoder_conf"]
    assert ec["interctc_layer_idx"] == [1, 3] and ec["interctc_use_conditioning"] is True
    plain = bench.espnet_config(load_config(ROOT / "conf" / "tiny_ctc.yaml"), 1)
    assert "interctc_layer_idx" not in plain["encoder_conf"] and "interctc_weight" not in plain["model_conf"]
    iterated = load_config(ROOT / "conf" / "mini_small.yaml", [*DEMO_SETS, "model.intermediate_loss=iterated"])
    with pytest.raises(bench.BenchError, match="iterated"):
        bench.espnet_config(iterated, 5, updates_per_epoch=100)


def test_cosine_schedule_is_asrkits_one_update_later(bench, demo):
    t, epochs, per_epoch = demo.train, 5, 77
    conf = bench.espnet_config(demo, epochs, updates_per_epoch=per_epoch)
    assert conf["scheduler"] == "cosineannealingwarmuprestarts"
    sc = conf["scheduler_conf"]
    total = epochs * per_epoch
    assert sc == {"first_cycle_steps": total, "warmup_steps": t.warmup_steps, "max_lr": t.lr, "min_lr": 0.0}
    ours = lr_factor(t.scheduler, t.warmup_steps, total)
    w = sc["warmup_steps"]
    for s in range(1, total + 1):
        k = s - 1  # espnet2/schedulers/cosine_anneal_warmup_restart.py: update s runs at step_in_cycle s - 1
        espnet = sc["max_lr"] * k / w if k < w else sc["max_lr"] * (1 + math.cos(math.pi * (k - w) / (total - w))) / 2
        assert espnet == pytest.approx(t.lr * ours(s - 1), rel=1e-9, abs=1e-15)
    with pytest.raises(bench.BenchError, match="updates per epoch"):
        bench.espnet_config(demo, epochs)
    # A run no longer than the warm-up (the equal-time mode's probe: 2 epochs): asrkit warms up all along (its
    # cosine spans at least w + 1 updates), and ESPnet's cycle, which must be longer than its warm-up, the same.
    short = bench.espnet_config(demo, 2, updates_per_epoch=100)["scheduler_conf"]
    assert short["first_cycle_steps"] == t.warmup_steps + 1 == 301
    ours = lr_factor(t.scheduler, t.warmup_steps, 200)
    for s in range(1, 201):
        assert short["max_lr"] * (s - 1) / t.warmup_steps == pytest.approx(t.lr * ours(s - 1), rel=1e-9, abs=1e-15)


def test_config_command_sets_batches_and_cosine_length(bench, tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    durs = {f"u{i:03d}": 1.0 + 0.05 * i for i in range(120)}
    (train / "utt2dur").write_text("".join(f"{u} {d}\n" for u, d in durs.items()))
    (train / "text").write_text("".join(f"{u} HELLO WORLD\n" for u in durs))
    (train / "wav.scp").write_text("".join(f"{u} /data/{u}.wav\n" for u in durs))
    out = tmp_path / "esp"
    sets = [*DEMO_SETS, "data.max_frames=1500", "train.warmup_steps=50"]
    assert bench.main(["config", "--asrkit-config", str(ROOT / "conf" / "mini_small.yaml"),
                       *[a for kv in sets for a in ("--set", kv)], "--epochs", "4", "--train", str(train), "--cmvn",
                       "--out", str(out)]) == 0
    batches = json.loads((out / "batches.json").read_text())
    conf = yaml.safe_load((out / "asr.yaml").read_text())
    assert 1 < batches["espnet"] <= batches["asrkit"] and conf["batch_bins"] == batches["espnet_batch_bins"]
    assert conf["scheduler_conf"]["first_cycle_steps"] == 4 * batches["espnet"]
    assert conf["encoder_conf"]["interctc_layer_idx"] == [2]
    overrides = (out / "asrkit_overrides.txt").read_text().split()
    assert overrides[:len(sets)] == sets
    assert "train.epochs=4" in overrides and "model.encoder.conv_channels=144" in overrides


def test_specaug_mask_ranges(bench, tiny):
    s = tiny.specaug
    conf = bench.espnet_config(tiny, 1, median_frames=1000.0)["specaug_conf"]
    # ESPnet draws widths with torch.randint(lo, hi): the largest width is hi - 1
    assert conf["freq_mask_width_range"][1] - 1 == s.freq_mask_width
    assert conf["num_freq_mask"] == s.num_freq_masks and conf["num_time_mask"] == s.num_time_masks
    # 0.05 x 1000 frames = 50 > 20: the width cap binds
    assert conf["time_mask_width_range"][1] - 1 == s.time_mask_width
    assert "time_mask_width_ratio_range" not in conf
    # 0.05 x 300 = 15 < 20: the ratio binds
    short = bench.espnet_config(tiny, 1, median_frames=300.0)["specaug_conf"]
    assert short["time_mask_width_ratio_range"] == [0.0, s.time_mask_ratio] and "time_mask_width_range" not in short
    assert conf["apply_time_warp"] is False and conf["replace_with_zero"] is False
    off = dataclasses.replace(tiny, specaug=dataclasses.replace(s, enabled=False))
    conf_off = bench.espnet_config(off, 1)
    assert conf_off["specaug"] is None and "specaug_conf" not in conf_off


def test_overrides_make_asrkit_subsampling_espnet_sized(bench, tiny):
    assert tiny.model.encoder.conv_channels == 32
    assert bench.asrkit_overrides(tiny, 3) == ["train.epochs=3", "model.encoder.conv_channels=144"]
    full = load_config(ROOT / "conf" / "tiny_ctc.yaml", ["model.encoder.conv_channels=0"])
    assert bench.asrkit_overrides(full, 3) == ["train.epochs=3"]


def test_attention_decoder_and_conformer(bench):
    cfg = load_config(ROOT / "conf" / "tiny_conformer.yaml")
    conf = bench.espnet_config(cfg, 2)
    assert conf["encoder"] == "conformer" and conf["encoder_conf"]["cnn_module_kernel"] == cfg.model.encoder.conv_kernel
    # ConformerEncoder's keyword names (espnet2/asr/encoder/conformer_encoder.py); a wrong one fails ESPnet's build
    assert {"pos_enc_layer_type", "selfattention_layer_type", "macaron_style", "use_cnn_module",
            "cnn_module_kernel", "activation_type", "rel_pos_type"} <= set(conf["encoder_conf"])
    if cfg.model.ctc_weight < 1.0:
        assert conf["decoder"] == "transformer"
        assert conf["decoder_conf"]["num_blocks"] == cfg.model.decoder.num_layers
        assert conf["model_conf"]["lsm_weight"] == cfg.model.lsm_weight


@pytest.mark.parametrize("normalize, length_normalized", [("batch", False), ("token", True)])
def test_attention_loss_normalisation_maps(bench, normalize, length_normalized):
    cfg = load_config(ROOT / "conf" / "tiny_ctc.yaml", [f"model.lsm_normalize={normalize}", "frontend.n_fft=512"])
    assert bench.espnet_config(cfg, 1)["model_conf"]["length_normalized_loss"] is length_normalized


@pytest.mark.parametrize("override, key", [
    ("frontend.kind=kaldi_fbank", "frontend.kind"), ("speed_perturb.enabled=true", "speed_perturb"),
    ("train.scheduler=constant", "train.scheduler"), ("model.encoder.interctc_layers=[4]", "layers 1..3"),
    ("model.encoder.dejavu_layer=2", "dejavu_layer"),
    ("frontend.utterance_cmn=true", "frontend.utterance_cmn"), ("frontend.dither=1.0", "frontend.dither 1.0"),
    ("frontend.log_floor=1e-6", "frontend.log_floor 1e-06"), ("augment.vtlp.prob=0.5", "augment.vtlp"),
    ("augment.reverb.prob=0.2", "augment.reverb"), ("augment.noise.prob=1", "augment.noise"),
    ("augment.band.prob=0.1", "augment.band"), ("augment.gain.prob=0.3", "augment.gain")])
def test_unmappable_settings_are_named(bench, override, key):
    cfg = load_config(ROOT / "conf" / "tiny_ctc.yaml", [override, "frontend.n_fft=512"])
    with pytest.raises(bench.BenchError, match=key):
        bench.espnet_config(cfg, 1)


def test_every_conf_maps_or_says_why(bench):
    mapped = 0
    for path in sorted(glob.glob(str(ROOT / "conf" / "*.yaml"))):
        try:
            cfg = load_config(path)
        except ConfigError:
            continue  # decoding and LM configs
        try:
            bench.espnet_config(cfg, 1)
            mapped += 1
        except bench.BenchError as exc:
            assert "no ESPnet2 equivalent" in str(exc)
    assert mapped >= 3


def test_token_list_has_asrkit_units(bench):
    tok = CharTokenizer(["\u2581", "'", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"])
    tokens = bench.token_list(tok.token_list)
    assert len(tokens) == tok.vocab_size and tokens[:2] == ["<blank>", "<unk>"] and tokens[-1] == "<sos/eos>"
    index = {t: i for i, t in enumerate(tokens)}
    text = "HE'S  HERE"
    # ESPnet's char tokenizer: one token per character, a space as <space>
    espnet = [tokens[index.get("<space>" if c == " " else c, 1)] for c in " ".join(text.split())]
    asrkit = ["<space>" if t == "\u2581" else t for t in tok.pieces(tok.encode(text))]
    assert espnet == asrkit


def test_text_shapes_and_median(bench, tmp_path):
    for split in ("train", "valid"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "text_shape").write_text("a 12\nb 3\n")
    bench.text_shapes(str(tmp_path), 31)
    assert (tmp_path / "train" / "text_shape.char").read_text() == "a 12,31\nb 3,31\n"
    (tmp_path / "utt2dur").write_text("a 1.0\nb 3.0\nc 2.5\n")
    assert bench.median_frames(str(tmp_path / "utt2dur")) == pytest.approx(250.0)
    (tmp_path / "bad").write_text("a 1.0\nb\n")
    with pytest.raises(bench.BenchError, match=r"bad:2"):
        bench.median_frames(str(tmp_path / "bad"))


def test_timed_records_once_and_reports_failures(bench, tmp_path):
    record = tmp_path / "t.json"
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    assert bench.main(["timed", "--record", str(record), "--name", "x", "--", *cmd]) == 0
    assert bench.main(["timed", "--record", str(record), "--name", "x", "--", *cmd]) == 0
    assert marker.read_text() == "x"  # the second call did not run it again
    assert json.loads(record.read_text())["x"] > 0
    fail = [sys.executable, "-c", "raise SystemExit(3)"]
    assert bench.main(["timed", "--record", str(record), "--name", "y", "--", *fail]) == 1
    assert "y" not in json.loads(record.read_text())


def test_results_table_ratios(report):
    rows = {"asrkit": {"wer": 0.18, "cer": 0.05, "train_s": 100.0},
            "espnet": {"wer": 0.20, "cer": 0.06, "train_s": 150.0}}
    table = report.results_table(rows, 1000.0, 2, 1)
    assert "| asrkit, best path | 18.00 | 5.00 | 100 | 20.0 | - | - |" in table  # 1000 s x 2 epochs / 100 s
    assert "| ESPnet2, best path | 20.00 | 6.00 | 150 | 13.3 | - | - |" in table
    assert "both best path: 0.90" in table and "throughput: 1.50" in table
    assert "prefix search:" not in table.split("\n\n")[1]  # no ESPnet search row, no ratio against it
    # ESPnet decoded its own way too: its own labelled row, and the WER ratio is still against best path
    rows["espnet_search"] = {"wer": 0.16, "cer": 0.055, "train_s": 150.0}
    table = report.results_table(rows, 1000.0, 2, 1)
    assert "| ESPnet2, its beam-1 CTC prefix search | 16.00 | 5.50 | 150 | 13.3 | - | - |" in table
    assert "both best path: 0.90 (target <= 0.9); against ESPnet's beam-1 prefix search: 1.12;" in table
    assert math.isfinite(float(table.split("both best path: ")[1].split()[0]))


def test_espnet_batch_count_and_matching(bench):
    # ascending 10, 20: 2 x 20 = 40 <= 50; 30: 3 x 30 = 90 > 50 closes a batch of 3; 40 alone
    assert bench.espnet_batch_count([40, 10, 30, 20], 50) == 2
    assert bench.espnet_batch_count([40, 10, 30, 20], 1) == 4  # every utterance crosses the budget alone
    assert bench.espnet_batch_count([40, 10, 30, 20], 1000) == 1
    lengths = [16000 * k + 7 * k for k in range(1, 60)]
    for target in (5, 12, 30):
        bins = bench.match_batch_bins(lengths, target, start=100000)
        assert bench.espnet_batch_count(lengths, bins) <= target < bench.espnet_batch_count(lengths, bins - 1)


def test_asrkit_batch_count_is_the_samplers(bench, tiny):
    from asrkit.data.sampler import BucketBatchSampler

    durs = [0.2, *[1.0 + 0.1 * i for i in range(50)], 25.0]  # the first and last are outside min/max_duration
    kept = durs[1:-1]
    ref = BucketBatchSampler(kept, tiny.data.max_frames, tiny.data.max_batch_size, seed=tiny.train.seed,
                             num_replicas=1, rank=0, bucket_width=tiny.data.bucket_width)
    assert bench.asrkit_batch_count(tiny, durs) == len(list(iter(ref)))


def test_epoch_train_seconds_from_both_logs(report, tmp_path):
    asrkit = tmp_path / "asrkit.log"
    asrkit.write_text(
        "2026-11-25 06:11:29,453 INFO asrkit.train: model transformer+none: 1.59M parameters\n"
        "2026-11-25 06:11:54,274 INFO asrkit.train: epoch 0: train loss 200.3293 (23 updates to step 23, 22.8s, "
        "35.1 audio_s/s, 0 non-finite updates skipped), valid loss 186.3599 (best)\n"
        "2026-11-25 06:11:55,000 INFO asrkit.train: epoch 1 step 40: loss 263.4945 lr 0.0003 grad_norm 243\n"
        "2026-11-25 06:12:30,274 INFO asrkit.train: epoch 1: train loss 190.1 (23 updates to step 46, 30.2s, "
        "27.0 audio_s/s, 0 non-finite updates skipped), valid loss 180.0 (best)\n")
    assert report.epoch_train_seconds(str(asrkit), "asrkit") == pytest.approx(53.0)
    espnet = tmp_path / "espnet.log"
    espnet.write_text(
        "[vm] 2026 (trainer:394) INFO: 1epoch results: [train] iter_time=0.008, forward_time=0.303, loss=197.9, "
        "train_time=0.738, time=18.18 seconds, total_count=23, [valid] loss=184.1, time=3.1 seconds, total_count=6\n"
        "[vm] 2026 (trainer:394) INFO: 2epoch results: [train] iter_time=0.010, loss=180.0, "
        "time=1 minute and 3.5 seconds, total_count=46, [valid] loss=170.0, time=3.24 seconds, total_count=12\n")
    assert report.epoch_train_seconds(str(espnet), "espnet") == pytest.approx(18.18 + 63.5)
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    assert report.epoch_train_seconds(str(empty), "espnet") is None
    rows = {"asrkit": {"wer": 0.1, "cer": 0.05, "train_s": 100.0, "train_only_s": 80.0},
            "espnet": {"wer": 0.2, "cer": 0.1, "train_s": 150.0, "train_only_s": 120.0}}
    table = report.results_table(rows, 1000.0, 2, 1)
    assert "| asrkit, best path | 10.00 | 5.00 | 100 | 20.0 | 80 | 25.0 |" in table
    assert "in the epochs' training parts: 1.50" in table


# ------------------------------------------------------------------ best-path decoding of ESPnet's model
TOKENS = ["<blank>", "<unk>", "<space>", "'", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "<sos/eos>"]


def reference_best_path(ids, tokens):
    """Collapse runs with groupby, drop blanks, spell <space> as " ", split on whitespace."""
    kept = [tokens[i] for i, _ in itertools.groupby(ids) if i != 0]
    return "".join(" " if t == "<space>" else t for t in kept).split()


def ids_of(text):
    """Frame ids for a text with a blank between letters and doubled frames, as a CTC argmax could be."""
    index = {t: i for i, t in enumerate(TOKENS)}
    out = []
    for c in text:
        i = index["<space>" if c == " " else c]
        out += [i, i, 0]
    return out


@pytest.mark.parametrize("ids", [
    [],
    [0, 0, 0],
    ids_of("HELLO WORLD"),  # LL split by a blank stays two L's
    [2, 2, 0, 2] + ids_of("AB") + [2, 0, 2, 2],  # <space> runs at the start and the end
    ids_of("A") + [2, 0, 2, 2, 0, 2] + ids_of("B"),  # several spaces between words: one break
    [4, 4, 4, 5, 5, 4],  # repeats without a blank collapse: A B A
    [4, 0, 4, 0, 0, 4],  # repeats split by blanks do not: A A A
    [1, 3, 30, 2, 4],  # <unk>, the apostrophe and <sos/eos> are kept as spelled
])
def test_best_path_words_matches_groupby_reference(bench, ids):
    assert bench.best_path_words(ids, TOKENS, "u1") == reference_best_path(ids, TOKENS)


def test_best_path_words_random_against_reference(bench):
    rng = random.Random(0)
    for _ in range(300):
        # blank, <space> and A..C are frequent, so runs, repeats and space runs all occur
        ids = [rng.choice([0, 0, 0, 2, 2, 4, 5, 6, rng.randrange(len(TOKENS))]) for _ in range(rng.randrange(40))]
        assert bench.best_path_words(ids, TOKENS, "u") == reference_best_path(ids, TOKENS)


def test_best_path_words_concrete(bench):
    a, b, space = 4, 5, 2
    assert bench.best_path_words([space, a, a, 0, a, b, space, space, b, 0, space], TOKENS, "u") == ["AAB", "B"]


@pytest.mark.parametrize("bad", [len(TOKENS), -1])
def test_best_path_words_id_outside_token_list(bench, bad):
    with pytest.raises(bench.BenchError, match=rf"utterance spk1-utt7: token id {bad} is outside"):
        bench.best_path_words([4, 0, bad, 5], TOKENS, "spk1-utt7")


def test_read_wav_scp_errors_name_file_and_line(bench, tmp_path):
    (tmp_path / "wav.scp").write_text("a /x/a.wav\n\nb /x/b.flac\n")
    assert bench.read_wav_scp(str(tmp_path)) == [("a", "/x/a.wav"), ("b", "/x/b.flac")]
    (tmp_path / "wav.scp").write_text("a /x/a.wav\nb\n")
    with pytest.raises(bench.BenchError, match=r"wav.scp:2: expected 'utt path'"):
        bench.read_wav_scp(str(tmp_path))
    (tmp_path / "wav.scp").write_text("a /x/a.wav\nb sox b.wav -t wav - |\n")
    with pytest.raises(bench.BenchError, match=r"wav.scp:2: a command pipe"):
        bench.read_wav_scp(str(tmp_path))
    (tmp_path / "segments").write_text("s a 0 1\n")
    with pytest.raises(bench.BenchError, match="segments"):
        bench.read_wav_scp(str(tmp_path))


def test_greedy_needs_no_espnet_to_parse_and_names_missing_files(bench, tmp_path):
    """The module imports without espnet; a missing wav.scp is reported before espnet2 is imported."""
    assert "espnet2" not in sys.modules
    rc = bench.main(["greedy", "--config", "c.yaml", "--model", "m.pth", "--data", str(tmp_path),
                     "--out", str(tmp_path / "o")])
    assert rc == 1 and "espnet2" not in sys.modules


def test_report_reads_both_espnet_decodings(report, tmp_path, capsys):
    """Stage 7's files: asrkit's hypotheses, ESPnet's best path (decode_test_greedy) and its own search
    (decode_test/1best_recog); the WERs are counted by hand (4 reference words)."""
    data, out = tmp_path / "data", tmp_path / "out"
    for d in (data / "test", data / "train", out / "asrkit" / "decode_test", out / "espnet" / "decode_test_greedy",
              out / "espnet" / "decode_test" / "1best_recog"):
        d.mkdir(parents=True)
    (data / "test" / "text").write_text("u1 A B\nu2 C D\n")
    (data / "train" / "utt2dur").write_text("t1 50.0\nt2 50.0\n")
    (out / "timings.json").write_text(json.dumps({"asrkit": 0, "asrkit_train": 10.0, "espnet_train": 20.0}))
    (out / "asrkit" / "decode_test" / "text").write_text("u1 A X\nu2 C D\n")  # 1 sub: 25%
    (out / "espnet" / "decode_test_greedy" / "text").write_text("u1 A X\nu2 C\n")  # 1 sub + 1 del: 50%
    (out / "espnet" / "decode_test" / "1best_recog" / "text").write_text("u1 A B\nu2 C D\n")  # 0%
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2"]) == 0
    table = (out / "results.md").read_text()
    assert table == capsys.readouterr().out
    assert "| asrkit, best path | 25.00 |" in table and "| ESPnet2, best path | 50.00 |" in table
    assert "| ESPnet2, its beam-1 CTC prefix search | 0.00 |" in table
    assert "both best path: 0.50 (target <= 0.9); against ESPnet's beam-1 prefix search: inf" in table
    assert "throughput: 2.00" in table


def test_report_rows_with_the_same_lm(report, tmp_path, capsys):
    """--lm-decode-config's decodings (OUT/{asrkit,espnet}/decode_test_lm) get rows of their own and a ratio of
    their own; the best-path ratio stays the one against ESPnet's best path (WERs counted by hand, 4 words)."""
    data, out = tmp_path / "data", tmp_path / "out"
    hyps = {"asrkit/decode_test": "u1 A X\nu2 C D\n", "espnet/decode_test_greedy": "u1 A X\nu2 C\n",
            "asrkit/decode_test_lm": "u1 A B\nu2 C X\n", "espnet/decode_test_lm": "u1 A B\nu2 X\n"}
    for d in (data / "test", data / "train", *(out / h for h in hyps)):
        d.mkdir(parents=True)
    for h, text in hyps.items():
        (out / h / "text").write_text(text)
    (data / "test" / "text").write_text("u1 A B\nu2 C D\n")
    (data / "train" / "utt2dur").write_text("t1 50.0\n")
    (out / "timings.json").write_text(json.dumps({"asrkit_train": 10.0, "espnet_train": 20.0}))
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2"]) == 0
    table = capsys.readouterr().out
    assert "| asrkit, with the LM | 25.00 |" in table  # 1 substitution
    assert "| ESPnet2, with the LM (asrkit's search on its posteriors) | 50.00 |" in table  # 1 sub + 1 deletion
    assert "both best path: 0.50 (target <= 0.9); both with the same LM and search: 0.50;" in table
    assert "LM weight / length bonus" not in table  # the decodings' settings are not there
    # each LM row's weight and bonus from its decode.yaml; "chosen on dev" where --lm-weights tuned it (tune_dev)
    (out / "asrkit/decode_test_lm/decode.yaml").write_text("mode: ctc_prefix\nlm_weight: 1.2\nlength_bonus: 3.0\n")
    (out / "espnet/decode_test_lm/decode.yaml").write_text("mode: ctc_prefix\nlm_weight: 0.6\nlength_bonus: 1.0\n")
    (out / "asrkit/tune_dev").mkdir()
    (out / "asrkit/tune_dev/results.tsv").write_text("lm_weight\tlength_bonus\tWER\n1.2\t3\t10.00\n")
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2"]) == 0
    assert ("LM weight / length bonus of the LM rows: asrkit 1.2 / 3 (chosen on dev), ESPnet 0.6 / 1.\n"
            in capsys.readouterr().out)


def test_report_leaves_out_a_decoding_cut_short(report, tmp_path, capsys):
    """A decoding killed half-way (ESPnet's asr_inference writes 1best_recog/text as it goes) is no row: its
    missing utterances would count as deletions."""
    data, out = tmp_path / "data", tmp_path / "out"
    for d in (data / "test", data / "train", out / "asrkit" / "decode_test", out / "espnet" / "decode_test_greedy",
              out / "espnet" / "decode_test" / "1best_recog"):
        d.mkdir(parents=True)
    (data / "test" / "text").write_text("u1 A B\nu2 C D\n")
    (data / "train" / "utt2dur").write_text("t1 50.0\n")
    (out / "timings.json").write_text(json.dumps({"asrkit_train": 10.0, "espnet_train": 20.0}))
    (out / "asrkit" / "decode_test" / "text").write_text("u1 A B\nu2 C D\n")
    (out / "espnet" / "decode_test_greedy" / "text").write_text("u2 C D\nu1 A B\n")  # any order
    (out / "espnet" / "decode_test" / "1best_recog" / "text").write_text("u1 A B\n")
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2"]) == 0
    captured = capsys.readouterr()
    assert "| ESPnet2, best path | 0.00 |" in captured.out and "prefix search |" not in captured.out
    hyp = out / "espnet" / "decode_test" / "1best_recog" / "text"
    assert f"ESPnet2, its beam-1 CTC prefix search: {hyp} has 1 of the 2 test utterances (cut short?); left out" \
        in captured.err


def _bench_out(tmp_path):
    """OUT and DATA of a finished run: asrkit's hypotheses and training time only (ESPnet's rows missing)."""
    data, out = tmp_path / "data", tmp_path / "out"
    for d in (data / "test", data / "train", out / "asrkit" / "decode_test", out / "asrkit" / "exp"):
        d.mkdir(parents=True)
    (data / "test" / "text").write_text("u1 A B\nu2 C D\n")
    (data / "train" / "utt2dur").write_text("t1 50.0\nt2 50.0\n")
    (out / "timings.json").write_text(json.dumps({"asrkit_train": 10.0}))
    (out / "asrkit" / "decode_test" / "text").write_text("u1 A B\nu2 C D\n")
    return data, out


def test_report_step_times_batches_and_training_log(report, tmp_path, capsys):
    """The sections after the table, from step_time.json and batches.json, and the epochs' training parts
    from asrkit's exp/train.log; the missing ESPnet rows are left out with a line naming their files."""
    data, out = _bench_out(tmp_path)
    (out / "asrkit" / "exp" / "train.log").write_text(
        "x INFO asrkit.train: epoch 0: train loss 2.0 (3 updates to step 3, 2.5s, 1 audio_s/s)\n"
        "x INFO asrkit.train: epoch 1: train loss 1.0 (3 updates to step 6, 2.5s, 1 audio_s/s)\n")
    (out / "step_time.json").write_text(json.dumps({"asrkit": [[800.0, 40.0], [780.4, 41.5]],
                                                    "espnet": [[1600.0, 20.04], [1561.0, 19.0]]}))
    (out / "espnet").mkdir()
    (out / "espnet" / "batches.json").write_text(json.dumps({"asrkit": 7, "espnet": 7, "espnet_batch_bins": 123}))
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2", "--threads", "3"]) == 0
    captured = capsys.readouterr()
    table = (out / "results.md").read_text()
    assert table == captured.out
    # 100 s x 2 epochs: 200 / 10 s = 20.0 on the whole command, 200 / (2.5 + 2.5) s = 40.0 in the epochs
    assert "| asrkit, best path | 0.00 | 0.00 | 10 | 20.0 | 5 | 40.0 |" in table
    assert "ESPnet2" not in table.split("\n\n")[0] and "both best path" not in table
    assert "OMP_NUM_THREADS=3" in table
    assert table.endswith("\n- asrkit: 780 ms/step (41.5 audio s/s)\n- espnet: 1561 ms/step (20.0 audio s/s)\n"
                          "- ESPnet / asrkit step time: 2.00\n"  # 1561 / 780.4, the best of each
                          "Batches per epoch: asrkit 7, ESPnet 7 (ESPnet batch_bins 123, chosen for the same count).\n")
    assert f"ESPnet2, best path: no hypotheses at {out / 'espnet' / 'decode_test_greedy' / 'text'}" in captured.err


def test_report_with_nothing_to_score_names_the_dir(report, tmp_path, capsys):
    data, out = _bench_out(tmp_path)
    (out / "timings.json").write_text("{}")  # hypotheses but no training time: no row
    assert report.main(["--out", str(out), "--data", str(data), "--epochs", "2"]) == 1
    assert f"espnet_report.py: {out}: nothing to report yet" in capsys.readouterr().err
    assert not (out / "results.md").exists()
    with pytest.raises(report.BenchError, match="nothing to report"):
        report.write_report(str(out), str(data), 2)


def test_report_imports_from_bench_never_the_reverse(bench, report):
    """One direction: the report takes BenchError and load_record from espnet_bench (the same objects), and
    espnet_bench neither imports the report nor offers its subcommand any more."""
    assert report.BenchError is bench.BenchError and report.load_record is bench.load_record
    source = TOOL.read_text()
    assert "import espnet_report" not in source and "from espnet_report" not in source
    assert not hasattr(bench, "results_table") and not hasattr(bench, "cmd_report")
    with pytest.raises(SystemExit):
        bench.main(["report", "--out", "o", "--data", "d", "--epochs", "1"])
