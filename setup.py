"""asrkit: a speech recognition toolkit in PyTorch."""
import re
from pathlib import Path

from setuptools import find_packages, setup

version = re.search(r'__version__ = "([^"]+)"', Path("asrkit/__init__.py").read_text()).group(1)

# Optional dependencies, by what needs them. A command that needs one and finds it missing says which extra
# installs it (asrkit/extras.py, whose table must agree with this one: tests/test_packaging.py checks).
EXTRAS = {
    # asrkit export --format onnx, transcribe --model X.onnx: onnxruntime runs an exported model; onnx and
    # onnxscript are what torch.onnx.export(dynamo=True) writes it with.
    "export": ["onnx>=1.17", "onnxruntime>=1.20", "onnxscript>=0.5"],
    # asrkit train --train-shards and tools/make_shards.py: the tar shards
    "shards": ["webdataset>=1.0"],
    # train.plot_attention > 0: attention images
    "plot": ["matplotlib>=3.5"],
    # transcribe --segmenter silero, decode.endpoint.vad: silero: the Silero VAD's ONNX model (MIT, shipped in
    # the package: nothing is downloaded) run by onnxruntime
    "vad": ["silero-vad>=5.1", "onnxruntime>=1.20"],
    # tools/make_synthetic_corpus.py (make demo, the tests): resampling the synthesizers' speech
    "synth": ["scipy>=1.8"],
    # augment.reverb without a rir_list: impulse responses of simulated rooms (the image-source method)
    "augment": ["pyroomacoustics>=0.7"],
    # asrkit serve: the ASGI app (starlette) on uvicorn, WebSockets (uvicorn's websockets-sansio protocol and the
    # Python client); httpx backs starlette's TestClient (the serving tests)
    "serve": ["starlette>=0.37,<2", "uvicorn>=0.35", "websockets>=13", "httpx>=0.27"],
}

setup(
    name="asrkit",
    version=version,
    description="Speech recognition toolkit: Kaldi-style data, Transformer/LSTM CTC and attention models, batched GPU search",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",  # webdataset 1.x (the shards extra)
    packages=find_packages(include=["asrkit", "asrkit.*"]),
    # the native CTC prefix search's C++ source, compiled on first use (asrkit/search/native_build.py)
    # ... and the browser page of asrkit serve (served from the installed package: no CDN, no build step)
    package_data={"asrkit.search": ["native/*.cpp", "native/*.h"], "asrkit.serve": ["static/*"]},
    install_requires=[
        # torch and torchaudio must be builds that load together (docs/getting-started.md, Installing by hand).
        "torch>=2.1,<=2.14.1",
        "torchaudio>=2.1",
        "sentencepiece>=0.1.99",
        "jiwer>=4.0",
        "soundfile>=0.12",
        # live streams at another rate than the model's: a resampler that keeps its state between pieces
        "soxr>=0.3",
        "pyyaml>=6.0",
        "tqdm>=4.60",
        # Training writes its scalars for TensorBoard (with grpcio, protobuf, werkzeug: ~80 MB beside torch's GBs).
        "tensorboard>=2.10",
        "numpy>=1.23",
    ],
    extras_require={
        **EXTRAS,
        # make test: every extra above, and the references the tests compare against.
        "dev": [req for reqs in EXTRAS.values() for req in reqs] + [
            "pytest>=7", "pytest-timeout>=2.1", "mutmut>=3.8",
            # kenlm (built from source, ~75 s): the n-gram tests' reference; librosa: the mel filters' and
            # resampling tests' reference
            "kenlm>=0.2", "librosa>=0.10",
            # independent SRT and WebVTT parsers for the output-format tests
            "srt>=3.5", "webvtt-py>=0.6",
            # tests/serve/test_page.py drives Debian's chromium (tools/install/install_system_deps.sh) with it
            "selenium>=4.11",
            # make docs and tests/test_docs.py: the documentation site (mkdocs.yml, docs/)
            "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],
        # Peer CTC decoders for tools/bench/bench_decode.py only (pyctcdecode pins numpy<2: use a separate
        # venv, tools/install/setup_bench_env.sh); flashlight-text backs torchaudio's ctc_decoder.
        "bench": ["pyctcdecode>=0.5", "flashlight-text>=0.0.7", "kenlm>=0.2"],
    },
    entry_points={"console_scripts": ["asrkit=asrkit.cli:main"]},
)
