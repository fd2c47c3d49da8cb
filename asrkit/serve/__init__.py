"""``asrkit serve``: a model over the network (docs/serving.md). :func:`build_app` makes the ASGI app of a
:class:`~asrkit.pipeline.Transcriber` and a :class:`~asrkit.config.ServeConfig`; starlette and uvicorn come with
``pip install -e '.[serve]'``."""
from asrkit.config import ServeConfig
from asrkit.serve.app import build_app

__all__ = ["ServeConfig", "build_app"]
