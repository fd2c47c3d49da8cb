"""tools/espnet/espnet_budget.py and bench_espnet.sh --budget-minutes: ESPnet and asrkit at equal training time.

ESPnet is never run: the probe's logs are written here in each toolkit's log format, and the budget arithmetic
is checked against sums done by hand. The shell script's argument checks run before it looks for the venvs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tool_loader import load_tool

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "espnet" / "bench_espnet.sh"


@pytest.fixture(scope="module")
def bench():
    return load_tool("espnet/espnet_bench")


@pytest.fixture(scope="module")
def budget(bench):
    """Loaded after espnet_bench, so its ``from espnet_bench import`` binds the module the tests hold."""
    return load_tool("espnet/espnet_budget")


@pytest.fixture(scope="module")
def report(bench):
    return load_tool("espnet/espnet_report")


def asrkit_log(ends):
    """asrkit's train.log: a step line and an epoch line (its end, after validation) per stamp ``HH:MM:SS,mmm``."""
    lines = ["2026-11-28 10:00:00,001 INFO asrkit.train: model conformer+none: 1.85M parameters\n"]
    for i, stamp in enumerate(ends):
        lines.append(f"2026-11-28 {stamp} INFO asrkit.train: epoch {i} step 40: loss 263.4 lr 0.0003\n")
        lines.append(f"2026-11-28 {stamp} INFO asrkit.train: epoch {i}: train loss 80.1 (503 updates to step "
                     f"{503 * (i + 1)}, 290.2s, 57.9 audio_s/s, 0 non-finite updates skipped), valid loss 70.0\n")
    return "".join(lines)


def espnet_log(ends):
    """ESPnet2's trainer log ('[host] asctime (module:line) LEVEL: message')."""
    lines = ["[vm] 2026-11-28 10:00:02,500 (asr:523) INFO: Vocabulary size: 31\n"]
    for i, stamp in enumerate(ends):
        lines.append(f"[vm] 2026-11-28 {stamp} (trainer:762) INFO: {i + 1}epoch:train:1-25batch: iter_time=0.1\n")
        lines.append(f"[vm] 2026-11-28 {stamp} (trainer:338) INFO: {i + 1}epoch results: [train] iter_time=0.008, "
                     "loss=197.9, time=4 minutes and 40.1 seconds, total_count=503, [valid] loss=184.1, "
                     "time=3.1 seconds, total_count=6\n")
    return "".join(lines)


def test_epochs_in_budget_by_hand(budget):
    # 3 probe epochs ending 50 s apart in a 160 s command: 50 s per epoch, 160 - 3 x 50 = 10 s start-up;
    # an hour leaves (3600 - 10) / 50 = 71.8 -> 71 epochs
    fit = budget.epochs_in_budget(3600.0, 160.0, [1000.0, 1050.0, 1100.0], 3, "asrkit")
    assert (fit.epochs, fit.per_epoch_s, fit.startup_s, fit.probe_wall_s) == (71, 50.0, 10.0, 160.0)
    # exactly 72 epochs' worth fits 72; a millisecond less fits 71
    assert budget.epochs_in_budget(3610.0, 160.0, [1000.0, 1050.0, 1100.0], 3, "asrkit").epochs == 72
    assert budget.epochs_in_budget(3609.999, 160.0, [1000.0, 1050.0, 1100.0], 3, "asrkit").epochs == 71
    # one probe epoch: the whole command is the epoch (start-up counted in every epoch: fewer, never more)
    fit = budget.epochs_in_budget(600.0, 80.0, [5.0], 1, "espnet")
    assert (fit.epochs, fit.per_epoch_s, fit.startup_s) == (7, 80.0, 0.0)
    # stamps closer than the wall time allows (start-up would be negative): start-up 0, not a bonus
    fit = budget.epochs_in_budget(100.0, 15.0, [0.0, 10.0], 2, "asrkit")
    assert (fit.per_epoch_s, fit.startup_s, fit.epochs) == (10.0, 0.0, 10)


@pytest.mark.parametrize("args, message", [
    ((100.0, 160.0, [0.0, 50.0, 100.0], 3), "asrkit: one epoch takes 50 s after 10 s of start-up; the budget of "
                                            "100 s fits less than 2 epochs"),
    ((0.0, 160.0, [0.0, 50.0, 100.0], 3), "the budget must be > 0 s, got 0"),
    ((600.0, 160.0, [0.0, 50.0], 3), "asrkit: the probe trained 3 epochs but its log ends 2"),
    ((600.0, 160.0, [0.0, 50.0, 50.0], 3), "asrkit: the log's epoch ends are not increasing"),
    ((600.0, 160.0, [], 0), "the probe must train at least 1 epoch, got 0"),
])
def test_epochs_in_budget_errors(budget, args, message):
    with pytest.raises(budget.BenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        budget.epochs_in_budget(*args, "asrkit")


def test_a_budget_of_one_epoch_is_refused(budget):
    """Less than 2 epochs cannot tell the toolkits' speeds apart in WER; it is named, not run."""
    assert budget.epochs_in_budget(111.0, 160.0, [0.0, 50.0, 100.0], 3, "asrkit").epochs == 2
    with pytest.raises(budget.BenchError, match="fits less than 2 epochs"):
        budget.epochs_in_budget(109.0, 160.0, [0.0, 50.0, 100.0], 3, "asrkit")


def test_epoch_end_times_of_both_logs(budget, tmp_path):
    a = tmp_path / "a.log"
    a.write_text(asrkit_log(["10:01:00,000", "10:02:30,500"]))
    ends = budget.epoch_end_times(str(a), "asrkit")
    assert len(ends) == 2 and ends[1] - ends[0] == pytest.approx(90.5)
    e = tmp_path / "e.log"
    e.write_text(espnet_log(["10:05:00,250", "10:09:00,250", "11:09:00,250"]))
    ends = budget.epoch_end_times(str(e), "espnet")
    assert [b - a for a, b in zip(ends, ends[1:])] == pytest.approx([240.0, 3600.0])
    # a line without a time stamp cannot be placed in time: named, not skipped
    e.write_text("INFO: 1epoch results: [train] loss=1.0, [valid] loss=1.0\n")
    with pytest.raises(budget.BenchError, match=f"{e}:1: an epoch line without a time stamp"):
        budget.epoch_end_times(str(e), "espnet")


def make_probe(tmp_path, asrkit_ends, espnet_ends, walls):
    out = tmp_path / "out"
    (out / "probe" / "asrkit" / "exp").mkdir(parents=True)
    (out / "probe" / "espnet").mkdir(parents=True)
    (out / "probe" / "asrkit" / "exp" / "train.log").write_text(asrkit_log(asrkit_ends))
    (out / "probe" / "espnet" / "train.log").write_text(espnet_log(espnet_ends))
    (out / "timings.json").write_text(json.dumps({"asrkit_probe": walls[0], "espnet_probe": walls[1]}))
    return out


def test_plan_writes_each_toolkits_epochs(budget, tmp_path, capsys):
    # asrkit: 60 s per epoch, 130 - 120 = 10 s start-up -> (1800 - 10) / 60 = 29.8 -> 29
    # ESPnet: 90 s per epoch, 200 - 180 = 20 s start-up -> (1800 - 20) / 90 = 19.8 -> 19
    out = make_probe(tmp_path, ["10:01:10,000", "10:02:10,000"], ["10:01:50,000", "10:03:20,000"], (130.0, 200.0))
    plan = out / "budget.json"
    assert budget.main(["plan", "--budget-minutes", "30", "--probe-epochs", "2", "--out-dir", str(out),
                        "--cores", "0 1"]) == 0
    assert capsys.readouterr().out == "29 19\n"
    got = json.loads(plan.read_text())
    assert got["budget_s"] == 1800.0 and got["probe_epochs"] == 2 and got["cores"] == {"asrkit": 0, "espnet": 1}
    assert got["asrkit"] == {"epochs": 29, "per_epoch_s": 60.0, "startup_s": 10.0, "probe_wall_s": 130.0}
    assert got["espnet"] == {"epochs": 19, "per_epoch_s": 90.0, "startup_s": 20.0, "probe_wall_s": 200.0}
    assert budget.main(["show", "--plan", str(plan)]) == 0
    assert capsys.readouterr().out == "29 19\n"


def test_plan_errors_name_the_file(budget, tmp_path, capsys):
    out = make_probe(tmp_path, ["10:01:10,000", "10:02:10,000"], ["10:01:50,000"], (130.0, 200.0))
    args = ["plan", "--budget-minutes", "30", "--probe-epochs", "2", "--out-dir", str(out), "--cores", "0 1"]
    assert budget.main(args) == 1
    log = out / "probe" / "espnet" / "train.log"
    assert f"espnet_budget.py plan: espnet: the probe trained 2 epochs but its log ends 1 ({log})" \
        in capsys.readouterr().err
    (out / "timings.json").write_text(json.dumps({"asrkit_probe": 130.0}))
    assert budget.main(args) == 1
    assert f"{out / 'timings.json'} has no espnet_probe: run stage 2 (the probe) first" in capsys.readouterr().err
    assert not (out / "budget.json").exists()
    assert budget.main(["show", "--plan", str(out / "budget.json")]) == 1
    assert "no plan: run stage 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        budget.main(["plan", "--budget-minutes", "x", "--probe-epochs", "2", "--out-dir", str(out), "--cores", "0 1"])


def test_a_probe_is_reused_by_another_run(budget, tmp_path, capsys):
    """reuse-probe (bench_espnet.sh --probe-from: a second seed on the same machine) copies the probe's logs and
    wall times, so the plan is the first run's, and says whose probe it was; a run with a probe of its own, or a
    source without one, is refused by name."""
    src = make_probe(tmp_path, ["10:01:10,000", "10:02:10,000"], ["10:01:50,000", "10:03:20,000"], (130.0, 200.0))
    dst = tmp_path / "seed2"
    dst.mkdir()
    (dst / "timings.json").write_text(json.dumps({"other": 1.0}))
    assert budget.main(["reuse-probe", "--from", str(src), "--out-dir", str(dst)]) == 0
    assert budget.main(["reuse-probe", "--from", str(src), "--out-dir", str(dst)]) == 0  # a rerun: nothing to do
    assert json.loads((dst / "timings.json").read_text()) == {"other": 1.0, "asrkit_probe": 130.0,
                                                              "espnet_probe": 200.0}
    args = ["--budget-minutes", "30", "--probe-epochs", "2", "--cores", "0 1"]
    assert budget.main(["plan", *args, "--out-dir", str(dst)]) == 0
    assert capsys.readouterr().out == "29 19\n"  # as test_plan_writes_each_toolkits_epochs
    assert json.loads((dst / "budget.json").read_text())["probe_from"] == str(src)
    assert budget.main(["plan", *args, "--out-dir", str(src)]) == 0
    assert "probe_from" not in json.loads((src / "budget.json").read_text())
    capsys.readouterr()
    assert budget.main(["reuse-probe", "--from", str(dst), "--out-dir", str(src)]) == 1
    assert f"{src}: has a probe of its own" in capsys.readouterr().err
    assert budget.main(["reuse-probe", "--from", str(tmp_path / "none"), "--out-dir", str(tmp_path / "x")]) == 1
    assert f"{tmp_path / 'none' / 'timings.json'} has no asrkit_probe" in capsys.readouterr().err


def test_config_gives_asrkit_its_own_epochs(bench, tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    durs = {f"u{i:03d}": 1.0 + 0.05 * i for i in range(60)}
    (train / "utt2dur").write_text("".join(f"{u} {d}\n" for u, d in durs.items()))
    (train / "text").write_text("".join(f"{u} HELLO WORLD\n" for u in durs))
    (train / "wav.scp").write_text("".join(f"{u} /data/{u}.wav\n" for u in durs))
    out = tmp_path / "esp"
    assert bench.main(["config", "--asrkit-config", str(ROOT / "conf" / "tiny_ctc.yaml"), "--epochs", "19",
                       "--asrkit-epochs", "29", "--train", str(train), "--out", str(out)]) == 0
    assert yaml.safe_load((out / "asr.yaml").read_text())["max_epoch"] == 19
    overrides = (out / "asrkit_overrides.txt").read_text().split()
    assert "train.epochs=29" in overrides and "train.epochs=19" not in overrides


def test_report_of_an_equal_time_run(report, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    for d in (data / "test", data / "train", out / "asrkit" / "decode_test", out / "espnet" / "decode_test_greedy"):
        d.mkdir(parents=True)
    (data / "test" / "text").write_text("u1 A B\nu2 C D\n")
    (data / "train" / "utt2dur").write_text("t1 50.0\nt2 50.0\n")
    (out / "timings.json").write_text(json.dumps({"asrkit_train": 1790.0, "espnet_train": 1795.0}))
    (out / "asrkit" / "decode_test" / "text").write_text("u1 A B\nu2 C D\n")
    (out / "espnet" / "decode_test_greedy" / "text").write_text("u1 A B\nu2 C X\n")
    plan = {"budget_s": 1800.0, "probe_epochs": 2, "cores": {"asrkit": 0, "espnet": 1},
            "asrkit": {"epochs": 29, "per_epoch_s": 60.0, "startup_s": 10.0, "probe_wall_s": 130.0},
            "espnet": {"epochs": 19, "per_epoch_s": 90.0, "startup_s": 20.0, "probe_wall_s": 200.0}}
    (out / "budget.json").write_text(json.dumps(plan))
    assert report.main(["--out", str(out), "--data", str(data), "--budget-plan", str(out / "budget.json")]) == 0
    table = (out / "results.md").read_text()
    # 100 s of audio: asrkit 29 epochs = 2900 s in 1790 s, ESPnet 19 epochs = 1900 s in 1795 s
    assert "| asrkit, best path | 0.00 | 0.00 | 1790 | 1.6 | - | - |" in table
    assert "| ESPnet2, best path | 25.00 | 25.00 | 1795 | 1.1 | - | - |" in table  # C D -> C X: 1 of 4 words, letters
    # throughput is audio per second, not the ratio of wall times: (2900 / 1790) / (1900 / 1795) = 1.53
    assert "asrkit / ESPnet training throughput: 1.53" in table
    assert "asrkit 29, ESPnet 19 epochs" in table
    assert ("Equal training time: a budget of 1800 s each, both trainings at once (asrkit on core 0, ESPnet on "
            "core 1); epochs from a 2-epoch probe run the same way: asrkit 60 s per epoch + 10 s start-up -> 29 "
            "epochs, ESPnet 90 s per epoch + 20 s start-up -> 19 epochs.") in table
    plan["probe_from"] = "/runs/seed1"  # bench_espnet.sh --probe-from
    (out / "budget.json").write_text(json.dumps(plan))
    assert report.main(["--out", str(out), "--data", str(data), "--budget-plan", str(out / "budget.json")]) == 0
    assert "epochs from the 2-epoch probe of /runs/seed1, run the same way: asrkit 60 s" in (out / "results.md").read_text()
    with pytest.raises(SystemExit):  # --epochs and --budget-plan exclude each other
        report.main(["--out", str(out), "--data", str(data), "--epochs", "3", "--budget-plan", "x"])


def bench_sh(*args, tmp_path):
    return subprocess.run(["bash", str(SCRIPT), "--asrkit-config", "conf/tiny_ctc.yaml", "--data",
                           str(tmp_path / "nodata"), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)


@pytest.mark.parametrize("args, message", [
    (["--budget-minutes", "60", "--epochs", "5"], "--epochs and --budget-minutes exclude each other"),
    (["--budget-minutes", "ten"], "--budget-minutes must be a number of minutes > 0, not 'ten'"),
    (["--budget-minutes", "0"], "--budget-minutes must be a number of minutes > 0, not '0'"),
    (["--budget-minutes", "60", "--probe-epochs", "0"], "--probe-epochs must be an integer >= 1, not '0'"),
    (["--budget-minutes", "60", "--cores", "0"], "--cores needs two different CPUs (asrkit's, ESPnet's), not '0'"),
    (["--budget-minutes", "60", "--cores", "1 1"], "--cores needs two different CPUs (asrkit's, ESPnet's), not '1 1'"),
    (["--budget-minutes", "60", "--cores", "0 100000"], "--cores: CPU 100000 is not one this process may run on"),
    ([], "--epochs is required (or --budget-minutes)"),
    (["--epochs", "5", "--probe-from", "x"], "--probe-from belongs to --budget-minutes"),
    (["--epochs", "5", "--lm-weights", "0.5 1"], "--lm-weights tunes the fusion of --lm-decode-config's LM"),
    (["--epochs", "5", "--lm-decode-config", "conf/tiny_ctc.yaml", "--lm-weights", "0.5 high"],
     "--lm-weights and --length-bonuses take numbers, not 'high'"),
    (["--epochs", "5", "--lm-decode-config", "conf/tiny_ctc.yaml", "--lm-weights", "1", "--length-bonuses", "0 x"],
     "--lm-weights and --length-bonuses take numbers, not 'x'"),
])
def test_bench_sh_budget_arguments(tmp_path, args, message):
    res = bench_sh(*args, tmp_path=tmp_path)
    assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin the toolkits to")
def test_bench_sh_budget_arguments_accepted(tmp_path):
    """Valid equal-time arguments get past the checks: the next thing refused is the missing data dir."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    res = bench_sh("--budget-minutes", "7.5", "--probe-epochs", "2", "--cores", f"{cpus[0]} {cpus[1]}",
                   tmp_path=tmp_path)
    assert res.returncode == 1 and f"{tmp_path / 'nodata'}/train: no such Kaldi data dir" in res.stderr


def test_timed_records_of_two_trainings_at_once_both_land(bench, tmp_path):
    """The equal-time mode times both trainings at once into one timings.json: no update may be lost."""
    record = tmp_path / "timings.json"
    code = ("import sys; sys.path.insert(0, {tools!r}); import espnet_bench as b\n"
            "for i in range(40): b.add_to_record({record!r}, f'{{sys.argv[1]}}{{i}}', float(i))\n")
    code = code.format(tools=str(ROOT / "tools" / "espnet"), record=str(record))
    procs = [subprocess.Popen([sys.executable, "-c", code, name]) for name in ("asrkit", "espnet")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    got = json.loads(record.read_text())
    assert sorted(got) == sorted(f"{n}{i}" for n in ("asrkit", "espnet") for i in range(40))
