"""``steps.tsv``: one line per optimizer update (step, epoch, loss, lr, grad norm), flushed as written.

It is the exact training curve, for plots and for checking that a resumed run continues the curve
of an uninterrupted one: on resume, lines past the checkpoint's step (work that was redone) are cut.
"""
from __future__ import annotations

import os
from typing import Dict, List

COLUMNS = ("step", "epoch", "loss", "lr", "grad_norm")


class StepLog:
    def __init__(self, path: str, resume_step: int = 0):
        """Open ``path``; keep the lines up to ``resume_step`` (0: start a new file)."""
        self.path = path
        kept: List[str] = []
        if resume_step > 0 and os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            for line in lines[1:]:
                fields = line.split("\t")
                # A line torn by a kill has fewer fields; it is past the checkpoint anyway.
                if len(fields) == len(COLUMNS) and fields[0].isdigit() and int(fields[0]) <= resume_step:
                    kept.append(line)
        self._fh = open(path, "w", encoding="utf-8")
        self._fh.write("\t".join(COLUMNS) + "\n" + "".join(line + "\n" for line in kept))
        self._fh.flush()

    def write(self, step: int, epoch: int, loss: float, lr: float, grad_norm: float) -> None:
        self._fh.write(f"{step}\t{epoch}\t{loss:.9g}\t{lr:.9g}\t{grad_norm:.9g}\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_step_log(path: str) -> List[Dict[str, float]]:
    """The rows of a ``steps.tsv`` as dicts of numbers."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    header = lines[0].split("\t")
    return [{k: float(v) for k, v in zip(header, line.split("\t"))} for line in lines[1:] if line]
