"""External models: any OpenAI-compatible API in place of a local engine.

An ``ExternalModel`` is where the API is (the URL and key read from the environment variables
that ``external_model.base_url_env`` / ``api_key_env`` name) and the model name sent to it.
As an auxiliary model (``explorer.auxiliary_models[i].engine_type: external``) it only makes
``openai`` clients for workflows. As the rollout model (``model.external_model``, allowed in
``mode: explore`` only) it is also the ``InferenceModel`` behind ``ModelWrapper``: ``chat`` and
``generate`` call the API's chat completions and completions and return one ``Experience``
per choice. Its tokens are the local tokenizer's (``model.model_path``) encoding of the
rendered prompt and of the reply *text*: not the tokens the API's model sampled, and without
logprobs, so they serve evaluation and inspection, never training.

The object is plain (no Ray actor): it is pickled to each runner, which opens its own
clients and tokenizer on first use.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from trinity.common.config.config import external_models
from trinity.common.experience import Experience
from trinity.common.models.model import InferenceModel
from trinity.common.models.sampling import SamplingParams
from trinity.engine.registry import ENGINES

if TYPE_CHECKING:
    import openai

# The openai package refuses to start without a key; servers that check none accept any.
NO_KEY = "EMPTY"


def external_env(config: Any) -> Dict[str, str]:
    """Name -> value of the set environment variables that the config's external models
    read. The launcher hands them to the explorer: a Ray worker of a cluster started before
    this process set them would not see them."""
    names = []
    for _, _, served, external in external_models(config):
        if served.engine_type == "external":
            names += [external.base_url_env, external.api_key_env]
    return {name: os.environ[name] for name in names if os.environ.get(name)}


@ENGINES.register_module("external")
class ExternalModel(InferenceModel):
    """An OpenAI-compatible API as a model; see the module docstring."""

    hosted = False  # no weights here: the runners call the API themselves

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        tokenizer_path: Optional[str] = None,
        chat_template: Optional[str] = None,
    ) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.tokenizer_path, self.chat_template = tokenizer_path, chat_template
        self._client: Optional[openai.OpenAI] = None
        self._tokenizer: Any = None

    @classmethod
    def from_config(
        cls, external: Any, key: str, fallback_name: Optional[str], **kwargs: Any
    ) -> ExternalModel:
        """The API an ``external_model`` section (at YAML path ``key``) points at, read from
        this process's environment; the model name is ``model_name``, else ``fallback_name``."""
        base_url = os.environ.get(external.base_url_env)
        if not base_url:
            raise ValueError(
                f"{key}.base_url_env = {external.base_url_env}: the environment variable "
                f"{external.base_url_env} is not set; export it to the API's base URL"
            )
        api_key = os.environ.get(external.api_key_env) or NO_KEY
        name = external.model_name or fallback_name
        return cls(base_url, api_key, name, **kwargs)

    def __getstate__(self) -> Dict[str, Any]:
        # Clients hold connections and the tokenizer is large: each process opens its own.
        return {**self.__dict__, "_client": None, "_tokenizer": None}

    def openai_client(self, is_async: bool = False) -> Any:
        """A new ``openai.OpenAI`` (``openai.AsyncOpenAI`` if ``is_async``) for the API;
        ``client.model_path`` is the model name to send, as for the project's own servers."""
        # Imported on use: naming the engine (the registry) must not load the openai package.
        import openai

        make = openai.AsyncOpenAI if is_async else openai.OpenAI
        client = make(base_url=self.base_url, api_key=self.api_key)
        client.model_path = self.model
        return client

    @property
    def client(self) -> openai.OpenAI:
        """The client ``chat`` and ``generate`` use (thread-safe; calls run in threads)."""
        if self._client is None:
            self._client = self.openai_client()
        return self._client

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if not self.tokenizer_path:
                raise ValueError(
                    f"the external model {self.model} has no tokenizer to make experiences "
                    "with; set model.model_path to a local tokenizer folder"
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            if self.chat_template is not None:
                tokenizer.chat_template = self.chat_template
            self._tokenizer = tokenizer
        return self._tokenizer

    def _sampling(self, params: SamplingParams) -> Dict[str, Any]:
        """``params`` as OpenAI request fields. ``min_tokens`` and prompt truncation do not
        apply to an API (as on the project's own server); a request that needs the API's
        token ids (``top_logprobs``, ``stop_token_ids``) cannot be served."""
        if params.top_logprobs or params.stop_token_ids:
            raise ValueError(
                "top_logprobs and stop_token_ids need the model's own token ids, which an "
                f"external model ({self.model}) does not share with the local tokenizer"
            )
        fields: Dict[str, Any] = {
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        optional = {"max_tokens": params.max_tokens, "stop": params.stop, "seed": params.seed}
        fields.update({k: v for k, v in optional.items() if v is not None})
        if params.top_k > 0:  # not an OpenAI field: vLLM's (and this project's) extra body
            fields["extra_body"] = {"top_k": params.top_k}
        return fields

    def _experience(self, prompt_ids: List[int], prompt_text: str, text: str, info: Dict) -> Any:
        response_ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Experience(
            tokens=list(prompt_ids) + response_ids,
            prompt_length=len(prompt_ids),
            prompt_text=prompt_text,
            response_text=text,
            info=info,
        )

    def _chat(
        self, messages: List[Dict[str, Any]], params: SamplingParams, tools: Optional[List]
    ) -> List[Experience]:
        extra = {"tools": tools} if tools else {}
        reply = self.client.chat.completions.create(
            model=self.model, messages=messages, **extra, **self._sampling(params)
        )
        prompt_text, prompt_ids = self._prompt(messages, tools)
        experiences = []
        for choice in reply.choices:
            info: Dict[str, Any] = {"finish_reason": choice.finish_reason}
            if choice.message.tool_calls:
                info["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls]
            text = choice.message.content or ""
            experiences.append(self._experience(prompt_ids, prompt_text, text, info))
        return experiences

    def _prompt(self, messages: List[Dict[str, Any]], tools: Optional[List]) -> tuple:
        """(text, ids) of the prompt as the local tokenizer renders it: what the experiences
        of ``chat`` hold, since the API does not return its own token ids."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        return text, self.tokenizer.encode(text, add_special_tokens=False)

    def _complete(self, prompt: str, prompt_ids: List[int], params: SamplingParams) -> List:
        reply = self.client.completions.create(
            model=self.model, prompt=prompt, **self._sampling(params)
        )
        return [
            self._experience(prompt_ids, prompt, c.text, {"finish_reason": c.finish_reason})
            for c in reply.choices
        ]

    async def chat(
        self,
        messages: List[Dict[str, Any]],
        params: SamplingParams,
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> List[Experience]:
        """Sample ``params.n`` replies through chat completions (``session`` is unused: the
        API keeps no conversation tokens)."""
        # A thread, not an AsyncOpenAI: the wrapper may run this under a fresh event loop
        # per call, which a pooled async client must not outlive.
        return await asyncio.to_thread(self._chat, messages, params, tools)

    async def prompt_length(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> int:
        """Tokens of the prompt as ``chat``'s experiences hold it (the local tokenizer's)."""
        _, ids = await asyncio.to_thread(self._prompt, messages, tools)
        return len(ids)

    async def generate(self, prompt: str, params: SamplingParams) -> List[Experience]:
        """Sample ``params.n`` continuations of a raw prompt through completions."""
        prompt_ids = await asyncio.to_thread(self.tokenizer.encode, prompt)
        return await asyncio.to_thread(self._complete, prompt, prompt_ids, params)

    async def generate_ids(self, prompt_ids: List[int], params: SamplingParams) -> List[Experience]:
        """``generate`` of the prompt the ids decode to (the API reads text, not these ids)."""
        prompt = self.tokenizer.decode(prompt_ids)
        return await asyncio.to_thread(self._complete, prompt, list(prompt_ids), params)

    async def load_weights(self, weights: Any, version: int) -> None:
        raise RuntimeError(
            f"the external model {self.model} takes no weights (no weight sync to an API)"
        )

    async def model_version(self) -> int:
        """Always 0: the API's weights are not this run's."""
        return 0
