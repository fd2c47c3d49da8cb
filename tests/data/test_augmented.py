"""AugmentedDataset: what it hands the augmentation (the epoch's seed, the speaker, other utterances for babble)
and what it adds to the items; collate's VTLP factors and counts."""
import numpy as np
import torch

from asrkit.audio.waveaug import Augmented
from asrkit.data.augmented import AugmentedDataset
from asrkit.data.dataset import collate


def _item(utt, value):
    return {"utt": utt, "wav": torch.full((4,), value), "tokens": torch.tensor([1, 2]), "text": "x"}


class Recorder:
    """An augmentation that records its arguments, asks for 6 others, doubles the audio."""

    def __init__(self):
        self.calls = []

    def __call__(self, wav, utt, seed, speaker, others):
        got = others(6, np.random.default_rng(0))
        self.calls.append((utt, seed, speaker, [float(o[0]) for o in got]))
        return Augmented(wav * 2, ("noise", "vtlp"), 1.05)


def test_items_are_augmented_with_the_epoch_seed_speaker_and_others():
    base = [_item("a", 1.0), None, _item("b", 2.0)]
    rec, gen = Recorder(), torch.Generator()
    gen.manual_seed(2005)
    data = AugmentedDataset(base, rec, gen, {"a": "spk1"})
    assert len(data) == 3
    assert data[1] is None and rec.calls == []  # an unreadable item stays None
    item = data[0]
    assert torch.equal(item["wav"], torch.full((4,), 2.0))
    assert item["augmented"] == ("noise", "vtlp") and item["vtlp_alpha"] == 1.05
    assert item["text"] == "x" and torch.equal(item["tokens"], torch.tensor([1, 2]))
    utt, seed, speaker, others = rec.calls[0]
    assert (utt, seed, speaker) == ("a", 2005, "spk1")
    # babble's others: other readable utterances only (never itself, never an unreadable one)
    assert others and set(others) == {2.0}
    data[2]
    assert rec.calls[1][:3] == ("b", 2005, None) and set(rec.calls[1][3]) == {1.0}
    assert torch.equal(base[0]["wav"], torch.full((4,), 1.0))  # the base item is not changed
    gen.manual_seed(2006)
    data[0]
    assert rec.calls[2][1] == 2006  # the seed is read at each item: the trainer's per-epoch reseed reaches it


def test_collate_gathers_vtlp_factors_and_counts():
    items = [{**_item("a", 1.0), "augmented": ("noise", "vtlp"), "vtlp_alpha": 0.95},
             None,
             {**_item("b", 1.0), "augmented": (), "vtlp_alpha": 1.0},
             {**_item("c", 1.0), "augmented": ("noise",), "vtlp_alpha": 1.0}]
    batch = collate(items)
    assert batch["vtlp_alpha"].dtype == torch.float32
    assert torch.allclose(batch["vtlp_alpha"], torch.tensor([0.95, 1.0, 1.0]))
    assert batch["augmented"] == {"noise": 2, "vtlp": 1, "utts": 3}
    assert batch["num_skipped"] == 1
    plain = collate([_item("a", 1.0)])
    assert "vtlp_alpha" not in plain and "augmented" not in plain
