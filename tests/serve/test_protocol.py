"""The WebSocket protocol's pure parts (issue 32): start messages checked key by key with the close code that
answers each fault, PCM frames of any byte count decoded as the whole byte string at once, and the final and done
messages in the shape transcribe --format jsonl writes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from asrkit.pipeline.formats import result_to_dict
from asrkit.pipeline.results import Alternative, Result, Segment, Word
from asrkit.serve.protocol import (CLOSE_POLICY, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, PcmDecoder, ProtocolError,
                                   StartMessage, done_message, final_message, parse_message, parse_start)


def test_a_start_message_gives_its_settings():
    assert parse_start({"type": "start", "sample_rate": 16000, "format": "f32le", "name": "mic 1"}) == \
        StartMessage(16000, "f32le", "mic 1")
    assert parse_start({"type": "start", "sample_rate": 8000, "chunk_ms": 320, "hotwords": []}) == \
        StartMessage(8000, "s16le", None, 320)  # s16le by default; a chunk and no hotwords may be given
    # a stream's own list: spaces collapsed, pairs as tuples, so the same list keys the same recognizer
    assert parse_start({"type": "start", "sample_rate": 8000, "hotwords": [" anna  lee", ["BOB", 2]]}).hotwords == \
        ("anna lee", ("BOB", 2.0))
    assert len(parse_start({"type": "start", "sample_rate": 8000, "hotwords": ["x" * 100] * 1000}).hotwords) == 1000


@pytest.mark.parametrize("msg, error", [
    ({"type": "end"}, 'the first message must be {"type": "start", ...}, got type \'end\''),
    ({"type": "start", "format": "s16le"}, "sample_rate is missing"),
    ({"type": "start", "sample_rate": "16000"}, "sample_rate must be an integer from 8000 to 192000, got '16000'"),
    ({"type": "start", "sample_rate": 16000.0}, "sample_rate must be an integer"),
    ({"type": "start", "sample_rate": True}, "sample_rate must be an integer"),
    ({"type": "start", "sample_rate": MIN_SAMPLE_RATE - 1}, "from 8000 to 192000, got 7999"),
    ({"type": "start", "sample_rate": MAX_SAMPLE_RATE + 1}, "got 192001"),
    ({"type": "start", "sample_rate": 16000, "format": "mp3"}, "format 'mp3' is unknown (choose from s16le, f32le)"),
    ({"type": "start", "sample_rate": 16000, "chunk_ms": 320.5}, "chunk_ms must be an integer number of milliseconds"),
    ({"type": "start", "sample_rate": 16000, "chunk_ms": True}, "chunk_ms must be an integer number of milliseconds"),
    ({"type": "start", "sample_rate": 16000, "hotwords": "ANNA"}, "hotwords must be a list of phrases, got str"),
    ({"type": "start", "sample_rate": 16000, "hotwords": ["A"] * 1001}, "hotwords lists 1001 phrases, over the "
                                                                          "limit of 1000"),
    ({"type": "start", "sample_rate": 16000, "hotwords": ["A", " "]}, "hotwords[1]: a phrase must be a non-empty"),
    ({"type": "start", "sample_rate": 16000, "hotwords": ["x" * 101]}, "hotwords[0]: a phrase must be a non-empty "
                                                                         "string of at most 100 characters"),
    ({"type": "start", "sample_rate": 16000, "hotwords": [7]}, "hotwords[0]: a phrase is a string or a [phrase, "),
    ({"type": "start", "sample_rate": 16000, "hotwords": [["A", 0]]}, "hotwords[0]: the weight must be a number > 0"),
    ({"type": "start", "sample_rate": 16000, "hotwords": [["A", True]]}, "the weight must be a number > 0, got True"),
    ({"type": "start", "sample_rate": 16000, "name": 7}, "name must be a string"),
    ({"type": "start", "sample_rate": 16000, "name": "x" * 201}, "name must be a string of at most 200"),
    ({"type": "start", "sample_rate": 16000, "rate": 16000}, "unknown key 'rate'"),
])
def test_a_bad_start_message_is_refused_naming_the_key(msg, error):
    with pytest.raises(ProtocolError) as exc:
        parse_start(msg)
    assert error in str(exc.value) and exc.value.code == CLOSE_POLICY


@pytest.mark.parametrize("text, error", [
    ('{"type": "start", ', "malformed JSON in a text message: Expecting property name"),
    ("[1, 2]", 'must be a JSON object with a "type"'),
    ('{"sample_rate": 16000}', 'must be a JSON object with a "type"'),
    ('{"type": 3}', 'must be a JSON object with a "type"'),
])
def test_a_text_message_must_be_a_json_object_with_a_type(text, error):
    with pytest.raises(ProtocolError, match=None) as exc:
        parse_message(text)
    assert error in str(exc.value) and exc.value.code == CLOSE_POLICY
    assert parse_message('{"type": "end"}') == {"type": "end"}


@pytest.mark.parametrize("fmt, dtype, scale", [("s16le", "<i2", 32768.0), ("f32le", "<f4", 1.0)])
def test_frames_of_any_byte_count_decode_as_the_bytes_at_once(fmt, dtype, scale):
    rng = np.random.default_rng(0)
    samples = rng.uniform(-1, 1, 1001)
    data = (samples * 32767).astype(dtype).tobytes() if fmt == "s16le" else samples.astype(dtype).tobytes()
    expected = np.frombuffer(data, dtype=dtype).astype(np.float64) / scale
    decoder = PcmDecoder(fmt)
    cuts = np.sort(rng.integers(0, len(data), 40))
    pieces = [decoder.decode(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)])]
    assert all(p.dtype == np.float32 for p in pieces)
    assert any(len(data[a:b]) % np.dtype(dtype).itemsize for a, b in zip([0, *cuts], [*cuts, len(data)]))
    np.testing.assert_allclose(np.concatenate(pieces), expected, rtol=1e-6, atol=1e-7)
    assert decoder.decode(b"\x01").size == 0  # an incomplete sample waits for the next frame


def test_f32le_frames_with_nan_or_infinity_are_refused():
    for bad in (np.nan, np.inf):
        with pytest.raises(ProtocolError, match="f32le audio holds NaN or infinite samples"):
            PcmDecoder("f32le").decode(np.array([0.1, bad], dtype="<f4").tobytes())


def test_final_and_done_messages_are_the_jsonl_objects_parts():
    words = [Word("HELLO", 1.2345, 1.5, 0.87654), Word("WORLD", 1.6, 2.0, 1.0)]
    seg = Segment(1.2, 2.0004, "HELLO WORLD", words, [Alternative("HELLO WORLD", -1.5, -2.25),
                                                       Alternative("HELLO WORD", -3.0, float("-inf"))])
    msg = final_message(seg)
    assert msg == {"type": "final", "text": "HELLO WORLD", "start": 1.2, "end": 2.0,
                   "words": [{"word": "HELLO", "start": 1.234, "end": 1.5, "confidence": 0.8765},
                             {"word": "WORLD", "start": 1.6, "end": 2.0, "confidence": 1.0}],
                   "nbest": [{"text": "HELLO WORLD", "score": -1.5, "ctc_score": -2.25},
                             {"text": "HELLO WORD", "score": -3.0, "ctc_score": None}]}
    json.dumps(msg, allow_nan=False)  # JSON has no -inf: None stands for it, as in JSONL
    result = Result("mic", "HELLO WORLD", words, [seg], seg.nbest, 2.5)
    assert done_message(result) == {"type": "done", "result": result_to_dict(result)}
