"""One local model served over the OpenAI-compatible API, in a process of its own.

A run can then use it as an external model (``engine_type: external`` with
``OPENAI_BASE_URL`` set to the printed URL), e.g. a judge shared by several runs::

    python -c "from trinity.engine.standalone import serve; serve('path/to/model')"

The served model name is ``model_path`` as given (its folder's basename is accepted too), as
for the engines a run starts itself.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from trinity.engine.server import RunningServer, build_app
from trinity.engine.transformers_model import TransformersInferenceModel


async def _serve_forever(model: TransformersInferenceModel, name: str, host: str, port: int):
    server = RunningServer(build_app(model.served_model(name)), host, port)
    # The first line a parent process reads: where to point OPENAI_BASE_URL.
    print(f"{server.url}/v1", flush=True)
    await server.task


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_model_len: int = 2048,
    max_response_tokens: int = 256,
    chat_template: Optional[str] = None,
) -> None:
    """Serve ``model_path`` on ``host:port`` (port 0: a free one) until the process is
    stopped; prints the API's base URL (``http://host:port/v1``) on one line first."""
    model = TransformersInferenceModel(
        model_path=model_path,
        max_model_len=max_model_len,
        max_prompt_tokens=None,
        max_response_tokens=max_response_tokens,
        chat_template=chat_template,
    )
    asyncio.run(_serve_forever(model, model_path, host, port))
