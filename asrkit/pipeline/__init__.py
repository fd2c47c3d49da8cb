"""Decoding pipeline: experiment dir -> frontend -> encoder -> search (per a DecodeConfig) -> transcripts."""
from asrkit.pipeline.inputs import AudioInput
from asrkit.pipeline.results import Alternative, Result, Segment, Word
from asrkit.pipeline.searcher import Searcher, check_decode_config, load_lm_scorer
from asrkit.pipeline.model_dir import load_from_dir
from asrkit.pipeline.transcriber import Transcriber, TranscribeStats, Transcript, pad_waveforms
from asrkit.pipeline.tuning import save_tuning, tune_fusion

__all__ = ["Alternative", "AudioInput", "Result", "Searcher", "Segment", "TranscribeStats", "Transcriber", "Transcript",
           "Word", "check_decode_config", "load_from_dir", "load_lm_scorer", "pad_waveforms", "save_tuning", "tune_fusion"]
