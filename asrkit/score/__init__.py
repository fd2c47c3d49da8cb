"""Scoring: WER/CER between Kaldi text files, sclite-style alignment and per-speaker reports."""
from asrkit.score.wer import (Counts, Edit, ScoreError, ScoreReport, UttResult, format_pra, format_report,
                              score_files, score_texts, write_report)

__all__ = ["Counts", "Edit", "ScoreError", "ScoreReport", "UttResult", "format_pra", "format_report",
           "score_files", "score_texts", "write_report"]
