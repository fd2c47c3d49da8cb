#!/usr/bin/env python3
"""Mutation score of asrkit's core modules (mutmut), each module against its own tests only.

Usage: python tools/mutation.py [--module asrkit/score/wer.py ...] [--show-survivors] [--jobs N]
(``make mutation`` runs every module listed in tools/mutation/modules.yaml.)

For every module a scratch copy of asrkit/ and tests/ is made in a temporary directory, mutmut
mutates only that module and runs only the module's test paths (so the run takes minutes, not the
whole suite per mutant). Mutants listed in tools/mutation/equivalent.txt (one per line,
``mutant_name  # why it is equivalent``) are counted apart: the score is
killed / (mutants - equivalent). "No tests" mutants (code the module's tests never reach) count as
survivors. A listed equivalent that the tests now kill, or that no longer exists, is reported as
stale. It is a benchmark, not a CI step: the figures go in docs/development.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tools" / "mutation" / "modules.yaml"
EQUIVALENT = REPO / "tools" / "mutation" / "equivalent.txt"
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code).
KILLED_CODES = {1, 3}
SURVIVED_CODES = {0, 5, 33}
TIMEOUT_CODES = {24, -24, 36, 152, 255}


@dataclass
class ModuleResult:
    module: str
    killed: List[str] = field(default_factory=list)
    survived: List[str] = field(default_factory=list)
    equivalent: List[str] = field(default_factory=list)
    other: List[str] = field(default_factory=list)  # timeouts (counted as killed), segfaults, suspicious
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return len(self.killed) + len(self.survived) + len(self.equivalent) + len(self.other)

    @property
    def score(self) -> float:
        relevant = self.total - len(self.equivalent)
        return 100.0 * (len(self.killed) + len(self.other)) / relevant if relevant else 100.0


def read_equivalents(path: Path = EQUIVALENT) -> Dict[str, str]:
    """mutant name -> the reason it is equivalent."""
    out: Dict[str, str] = {}
    if not path.exists():
        return out
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, why = line.partition("#")
        name = name.strip()
        if not why.strip():
            raise SystemExit(f"{path}:{lineno}: '{name}' needs a reason ('name  # why it is equivalent')")
        out[name] = why.strip()
    return out


def _scratch_ignore(folder: str, names: List[str]) -> List[str]:
    """Left out of the scratch copy: caches, and a recipe's data/ and exp/ (generated, possibly gigabytes); the
    packages asrkit/data and tests/data are code and are copied."""
    recipe = Path(folder).parent.name == "recipes"
    return [n for n in names if n == "__pycache__" or (recipe and n in ("data", "exp"))]


def run_module(module: str, tests: List[str], jobs: int, work: Path) -> ModuleResult:
    import time

    for part in [module, *tests]:
        if not (REPO / part).exists():
            raise SystemExit(f"{CONFIG}: '{part}' does not exist")
    # Tests find configs and scripts relative to the repo root, which is mutants/ during the run.
    copied = ["asrkit", "tests", "tools", "conf", "recipes"]
    for name in copied:
        shutil.copytree(REPO / name, work / name, ignore=_scratch_ignore)
    shutil.copytree(REPO / "docs", work / "docs", ignore=_scratch_ignore)  # tests run its examples (decode_ctc's)
    selection = "\n    ".join(tests)
    also_copy = "\n    ".join(copied[2:] + ["docs"])
    (work / "setup.cfg").write_text(
        "[mutmut]\nsource_paths = asrkit\n"
        f"also_copy =\n    {also_copy}\n"
        f"only_mutate = {module}\n"
        f"pytest_add_cli_args_test_selection =\n    {selection}\n"
        "pytest_add_cli_args = -p no:cacheprovider -q -x\n", encoding="utf-8")
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.monotonic()
    log = work / "mutmut.log"
    with open(log, "w") as fh:
        proc = subprocess.run([str(mutmut), "run", "--max-children", str(jobs)], cwd=work, stdout=fh,
                              stderr=subprocess.STDOUT)
    meta = work / "mutants" / (module + ".meta")
    if proc.returncode != 0 or not meta.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"mutmut failed on {module} (exit {proc.returncode}):\n{tail}")
    result = ModuleResult(module, seconds=time.monotonic() - start)
    equivalents = read_equivalents()
    for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
        if name in equivalents and code not in KILLED_CODES:
            result.equivalent.append(name)
        elif code in KILLED_CODES:
            result.killed.append(name)
        elif code in SURVIVED_CODES:
            result.survived.append(name)
        else:
            result.other.append(f"{name} (exit {code})")
    return result


def show(work: Path, name: str) -> str:
    mutmut = Path(sys.executable).with_name("mutmut")
    return subprocess.run([str(mutmut), "show", name], cwd=work, capture_output=True, text=True).stdout


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", help="only this module (repeatable); default: all listed")
    parser.add_argument("--show-survivors", action="store_true", help="print the diff of every surviving mutant")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel (default 2)")
    parser.add_argument("--json", type=Path, help="also write the per-module figures to this file")
    args = parser.parse_args(argv)

    config: Dict[str, List[str]] = yaml.safe_load(CONFIG.read_text())
    modules = args.module or list(config)
    unknown = [m for m in modules if m not in config]
    if unknown:
        raise SystemExit(f"not in {CONFIG}: {', '.join(unknown)}")
    equivalents = read_equivalents()
    results = []
    for module in modules:
        with tempfile.TemporaryDirectory(prefix="asrkit-mutation-") as tmp:
            work = Path(tmp)
            res = run_module(module, config[module], args.jobs, work)
            results.append(res)
            print(f"{module}: {len(res.killed)}/{res.total - len(res.equivalent)} killed "
                  f"({res.score:.1f}%), {len(res.equivalent)} equivalent, {res.seconds:.0f} s", flush=True)
            if args.show_survivors:
                for name in res.survived:
                    print(show(work, name))
            prefix = module[:-3].replace("/", ".") + "."
            seen = set(res.killed) | set(res.survived) | set(res.equivalent) | {o.split()[0] for o in res.other}
            for name in equivalents:
                if name.startswith(prefix) and name not in res.equivalent:
                    state = "killed by the tests now" if name in seen else "no longer a mutant"
                    print(f"  stale entry in {EQUIVALENT.name}: {name} ({state})")

    print(f"\n{'module':38} {'mutants':>8} {'killed':>7} {'survived':>9} {'equiv.':>7} {'other':>6} {'score':>7}")
    for r in results:
        print(f"{r.module:38} {r.total:8d} {len(r.killed):7d} {len(r.survived):9d} {len(r.equivalent):7d} "
              f"{len(r.other):6d} {r.score:6.1f}%")
    if args.json:
        args.json.write_text(json.dumps([dict(module=r.module, mutants=r.total, killed=len(r.killed),
                                              survived=len(r.survived), equivalent=len(r.equivalent),
                                              other=len(r.other), score=round(r.score, 2))
                                         for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
