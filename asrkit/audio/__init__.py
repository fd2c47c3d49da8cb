"""Audio feature layer: extractors, CMVN and augmentation as batched modules on the model's device.

Waveform I/O lives in :mod:`asrkit.audio.io`. Import the submodules directly
(``from asrkit.audio.frontend import Frontend``); this package imports nothing
eagerly so that ``asrkit.audio.io`` does not pull in torchaudio's kernels.
"""
