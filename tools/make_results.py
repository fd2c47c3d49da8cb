#!/usr/bin/env python3
"""Write EXP/RESULTS.md: one table of WER per eval set and decoding setting, with each row's decoding config.

usage: tools/make_results.py [--config conf/transformer.yaml] [--train-opts "--set ..."]
                             [--settings "greedy ctc_prefix_lm ..."] [--out FILE] EXP

Reads every EXP/decode_<setting>/<eval set>/ that holds decode.yaml (written by ``asrkit decode``) and
scoring/result.txt (written by ``asrkit score --out``), in the layout of recipes/librispeech/run.sh, and writes
a Markdown report in the manner of ESPnet's RESULTS.md: the environment (date, asrkit version, model config,
training options), one table with a row per (eval set, setting): the main search settings (mode, beam, CTC
weight, LM, LM weight, length bonus), the error rate and its counts; then each setting's full decode.yaml.

The report is a function of those files alone (its date is the time of the newest scoring), and FILE is
replaced atomically only when its content changes, so rerunning on unchanged results changes nothing.
Exit status 1 (with a message naming the file) when no scored decode dir is found or a result.txt is malformed.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from asrkit import __version__  # noqa: E402
from asrkit.config import ConfigError, read_yaml  # noqa: E402

# "%WER 12.34 [ 5 / 40, 1 ins, 2 del, 2 sub ]" and "%SER 50.00 [ 1 / 2 ]": the first lines of asrkit score's report
_ERR_RE = re.compile(r"%(WER|CER) (\S+) \[ (\d+) / (\d+), (\d+) ins, (\d+) del, (\d+) sub \]")
_SER_RE = re.compile(r"%SER (\S+) \[ (\d+) / (\d+) \]")
# decode.yaml keys shown as table columns (the whole file follows the table)
COLUMNS = (("mode", "mode"), ("beam", "beam"), ("ctc_weight", "ctc_weight"), ("lm", "LM"),
           ("lm_weight", "lm_weight"), ("length_bonus", "length_bonus"))


CTC_WEIGHTED = ("joint", "rescore")  # the search modes that read ctc_weight


class ResultsError(ValueError):
    """A decode dir's files are missing or malformed; the message names the file."""


@dataclass(frozen=True)
class Score:
    """The totals of one ``asrkit score`` report."""
    unit: str        # "WER" or "CER"
    rate: float      # percent
    errors: int
    n_ref: int
    ins: int
    dele: int
    sub: int
    n_err_snt: int
    n_snt: int


@dataclass(frozen=True)
class Row:
    eval_set: str
    setting: str
    decode: Dict[str, Any]   # decode.yaml as read
    decode_yaml: str         # its text
    score: Score
    scored_at: float         # mtime of scoring/result.txt


def parse_result(path: str) -> Score:
    """The %WER (or %CER) and %SER lines of an ``asrkit score`` result.txt."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    err = _ERR_RE.fullmatch(lines[0].strip()) if lines else None
    if err is None:
        raise ResultsError(f"{path}:1: expected '%WER <rate> [ <errors> / <words>, <n> ins, <n> del, <n> sub ]', "
                           f"got {lines[0] if lines else 'an empty file'!r}")
    ser = _SER_RE.fullmatch(lines[1].strip()) if len(lines) > 1 else None
    if ser is None:
        raise ResultsError(f"{path}:2: expected '%SER <rate> [ <errors> / <sentences> ]'")
    unit, rate, errors, n_ref, ins, dele, sub = err.groups()
    return Score(unit, float(rate), int(errors), int(n_ref), int(ins), int(dele), int(sub),
                 int(ser.group(2)), int(ser.group(3)))


def collect(exp: str, settings: Sequence[str] = ()) -> List[Row]:
    """Every scored EXP/decode_<setting>/<set>/, sorted by eval set, then setting: those named in ``settings``
    in that order, then the others by name."""
    rows = []
    for result in glob.glob(os.path.join(glob.escape(exp), "decode_*", "*", "scoring", "result.txt")):
        set_dir = os.path.dirname(os.path.dirname(result))
        setting = os.path.basename(os.path.dirname(set_dir))[len("decode_"):]
        decode_path = os.path.join(set_dir, "decode.yaml")
        try:
            with open(decode_path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ResultsError(f"{decode_path}: cannot read ({exc.strerror}); {result} has no decoding config") from None
        try:
            decode = read_yaml(decode_path)  # the one loader for YAML from users: no aliases, short errors
        except ConfigError as exc:
            raise ResultsError(str(exc)) from None
        if not isinstance(decode, dict):
            raise ResultsError(f"{decode_path}: expected a mapping of decoding settings")
        rows.append(Row(os.path.basename(set_dir), setting, decode, text, parse_result(result),
                        os.path.getmtime(result)))
    rank = {s: i for i, s in enumerate(settings)}
    return sorted(rows, key=lambda r: (r.eval_set, rank.get(r.setting, len(rank)), r.setting))


def _shown_path(path: str) -> str:
    """A path relative to the working directory (the recipe's) or the repo when inside it, else as given."""
    full = os.path.abspath(path)
    for base in (os.getcwd(), str(REPO)):
        if full.startswith(base.rstrip(os.sep) + os.sep):
            return os.path.relpath(full, base)
    return path


def _cell(key: str, decode: Dict[str, Any]) -> str:
    value = decode.get(key)
    if value is None:
        return "-"
    if key == "lm":
        units = decode.get("lm_units")
        return f"{_shown_path(str(value))}{f' ({units})' if units and units != 'token' else ''}"
    if key == "lm_weight" and decode.get("lm") is None:  # no LM: its weight means nothing
        return "-"
    if key == "ctc_weight" and decode.get("mode") not in CTC_WEIGHTED:
        return "-"
    if key == "length_bonus" and decode.get("mode") == "greedy":  # no search: nothing to add a bonus to
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_results(rows: Sequence[Row], exp: str, config: Optional[str] = None, train_opts: str = "") -> str:
    """The Markdown report (see the module docstring)."""
    if not rows:
        raise ResultsError(f"{exp}: no decode_<setting>/<set>/scoring/result.txt found (run the decoding and "
                           f"scoring stages first)")
    date = datetime.datetime.fromtimestamp(max(r.scored_at for r in rows), datetime.timezone.utc)
    out = ["# RESULTS", "",
           f"<!-- written by tools/make_results.py from {exp}/decode_*/*/{{decode.yaml,scoring/result.txt}} -->", "",
           "## Environment", "",
           f"- date: {date:%Y-%m-%d %H:%M:%S} UTC (the newest scoring)",
           f"- asrkit version: {__version__}",
           f"- model config: {_shown_path(config) if config else '-'} (resolved: {exp}/config.yaml)",
           f"- training options: {train_opts.strip() or '-'}",
           f"- model: {exp}/model.pt", "",
           f"## {exp}", "",
           "Error rates in percent; Err = Sub + Del + Ins over #Wrd reference words; S.Err: sentences with an error.",
           ""]
    header = ["eval set", "setting"] + [name for _, name in COLUMNS] + [
        "#Snt", "#Wrd", "WER", "Err", "Sub", "Del", "Ins", "S.Err"]
    out += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        s = r.score
        rate = f"{s.rate:.2f}" if s.unit == "WER" else f"{s.rate:.2f} (CER)"
        cells = [r.eval_set, r.setting] + [_cell(key, r.decode) for key, _ in COLUMNS] + [
            str(s.n_snt), str(s.n_ref), f"**{rate}**", str(s.errors), str(s.sub), str(s.dele), str(s.ins),
            f"{100 * s.n_err_snt / max(s.n_snt, 1):.1f}"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "## Decoding configs", ""]
    # one block per distinct decode.yaml of a setting (the tuned LM weights are the same for every eval set)
    seen: Dict[str, Dict[str, List[str]]] = {}
    for r in rows:
        seen.setdefault(r.setting, {}).setdefault(r.decode_yaml, []).append(r.eval_set)
    for setting in seen:  # in row order
        for text, sets in seen[setting].items():
            out += [f"### {setting} ({', '.join(sets)})", "", "```yaml", text.rstrip("\n"), "```", ""]
    return "\n".join(out)


def write_if_changed(path: str, text: str) -> bool:
    """Replace ``path`` atomically by ``text`` unless it already holds exactly that; True if written."""
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                return False
    except FileNotFoundError:
        pass
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return True


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="make_results.py", description=__doc__.split("\n")[0])
    ap.add_argument("exp", help="experiment dir holding decode_<setting>/<set>/")
    ap.add_argument("--config", help="the model config the experiment was trained from (shown in the report)")
    ap.add_argument("--train-opts", default="", help="the extra training options (shown in the report)")
    ap.add_argument("--settings", default="", help="decode settings in the order of the table's rows (others follow)")
    ap.add_argument("--out", help="output file (default: EXP/RESULTS.md)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.exp):
        ap.error(f"{args.exp}: no such directory")
    out = args.out or os.path.join(args.exp, "RESULTS.md")
    try:
        text = format_results(collect(args.exp, args.settings.split()), args.exp.rstrip("/"), args.config, args.train_opts)
    except ResultsError as exc:
        print(f"make_results.py: {exc}", file=sys.stderr)
        return 1
    changed = write_if_changed(out, text)
    table = [line for line in text.splitlines() if line.startswith("|")]
    print("\n".join(table))
    print(f"{'wrote' if changed else 'unchanged:'} {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
