"""recipes/mini/compare_dejavu.sh's arms, read through its --reuse-seed1 check (which refuses an experiment, naming
every setting that differs from the arm's, before anything trains): each arm differs from the next by one idea."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asrkit.config import load_config, to_dict

REPO = Path(__file__).resolve().parents[2]
LAYER = 6
ARM_OPTS = {  # what each arm is meant to be, written out independently of the script
    "plain": ["model.encoder.interctc_layers=[]", "model.encoder.dejavu_layer=0", "model.interctc_weight=0.0"],
    "iterated": [f"model.encoder.interctc_layers=[{LAYER}]", "model.encoder.dejavu_layer=0",
                 "model.intermediate_loss=iterated", "model.interctc_weight=0.3"],
}


def _differences(workdir: Path, method: str, exp: str) -> set:
    """The keys the script says ``exp`` would have to change to be ``method``'s seed 1 (it trains nothing)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    run = subprocess.run(["bash", str(REPO / "recipes/mini/compare_dejavu.sh"), "--workdir", str(workdir),
                          "--layer", str(LAYER), "--methods", method, "--reuse-seed1", f"{method}={exp}"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"{exp} is not {method} seed 1" in run.stderr
    assert not (workdir / "exp/dejavu").exists()  # refused before anything trains
    return set(re.findall(r"config_matches: ([\w.]+): ", run.stderr))


@pytest.mark.parametrize("arm", sorted(ARM_OPTS))
def test_each_arm_is_one_idea_away_from_the_next(tmp_path, arm):
    cfg = load_config(REPO / "conf/mini_medium.yaml", ["train.seed=2"] + ARM_OPTS[arm])  # seed 2: never a match
    (tmp_path / "exp/run").mkdir(parents=True)
    (tmp_path / "exp/run/config.yaml").write_text(yaml.safe_dump(to_dict(cfg)), encoding="utf-8")
    if arm == "plain":
        # plain -> iterated: the auxiliary loss (an MLP head of its own at the layer, weight 0.3), nothing else.
        assert _differences(tmp_path, "iterated", "exp/run") == {
            "train.seed", "model.encoder.interctc_layers", "model.intermediate_loss", "model.interctc_weight"}
    else:
        # iterated -> dejavu: the same loss at the same layer, plus re-presentation there; nothing else.
        assert _differences(tmp_path, "dejavu", "exp/run") == {
            "train.seed", "model.encoder.interctc_layers", "model.encoder.dejavu_layer"}
