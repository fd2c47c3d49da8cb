"""Decoding pipeline: experiment dir -> frontend -> encoder -> search (per a DecodeConfig) -> transcripts."""
from asrkit.pipeline.searcher import Searcher, check_decode_config, load_lm_scorer
from asrkit.pipeline.transcriber import Transcriber, Transcript, load_from_dir, pad_waveforms
from asrkit.pipeline.tuning import tune_fusion

__all__ = ["Searcher", "Transcriber", "Transcript", "check_decode_config", "load_from_dir", "load_lm_scorer",
           "pad_waveforms", "tune_fusion"]
