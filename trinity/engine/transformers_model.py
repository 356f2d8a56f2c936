"""The embedded rollout engine behind ``InferenceModel``: ``TransformersEngine`` + batching.

Workflow runners call ``chat``/``generate`` concurrently; requests that arrive close
together (or while a batch is being generated) are sampled together in one batched call,
which is what makes a small CPU model fast. A batch closes once no new request came for
``batch_idle_s``, or ``batch_wait_s`` after its first request at the latest.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from trinity.common.adapter_weights import Adapter, read_sync_weights
from trinity.common.experience import Experience
from trinity.common.models.model import InferenceModel
from trinity.common.models.sampling import SamplingParams
from trinity.common.weights import TransferOffer, unpack_state
from trinity.engine.conversation import Conversation, engine_conversation, record_turn
from trinity.engine.registry import ENGINES
from trinity.utils.openmp import release_workers

if TYPE_CHECKING:
    import torch

    from trinity.engine.hf_engine import SampleOutput

logger = logging.getLogger(__name__)

# Sessions whose recent turns an engine remembers (least recently used forgotten first).
MAX_SESSIONS = 1024


@dataclass
class _Request:
    prompt_ids: List[int]
    params: SamplingParams
    future: asyncio.Future


@ENGINES.register_module("transformers")
class TransformersInferenceModel(InferenceModel):
    """Batches concurrent requests into ``TransformersEngine.generate`` calls (or those of
    another engine with its surface: ``build_engine``)."""

    def __init__(
        self,
        batch_wait_s: float = 0.02,
        batch_idle_s: float = 0.01,
        max_batch_rows: int = 512,
        **engine_kwargs: Any,
    ):
        self.engine = self.build_engine(**engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self.batch_wait_s = batch_wait_s
        self.batch_idle_s = batch_idle_s
        self.max_batch_rows = max_batch_rows
        self._version = 0
        self._loading: Optional[int] = None  # the version being loaded (sync_phase)
        self._pending: List[_Request] = []
        self._wakeup: Optional[asyncio.Event] = None
        self._loop_task: Optional[asyncio.Task] = None
        # One worker thread: generation and weight loading never overlap.
        self._executor = ThreadPoolExecutor(max_workers=1)
        self._conversations: OrderedDict = OrderedDict()  # session -> Conversation
        self._receiver: Any = None  # sync_method nccl: this engine's end of the trainer's group

    @staticmethod
    def build_engine(**engine_kwargs: Any) -> Any:
        """The engine this model batches for: ``generate`` over token ids, ``fit``,
        ``load_state_dict``, ``release`` and ``PromptSide``'s prompt methods."""
        # Imported here, not above: registering the engine (``trinity.engine``) must not load
        # torch and transformers into processes that only name it (docs/performance.md).
        from trinity.engine.hf_engine import TransformersEngine

        return TransformersEngine(**engine_kwargs)

    def served_model(self, name: str) -> Any:
        """What the OpenAI-compatible server serves of this engine, as ``name``."""
        from trinity.engine.server import ServedModel

        return ServedModel.from_transformers(self, name)

    def close(self) -> None:
        """Stop what the engine runs outside this object (processes), if anything."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    async def _submit(self, prompt_ids: List[int], params: SamplingParams) -> tuple:
        """(model version, outputs) of one request, once its batch is generated."""
        loop = asyncio.get_running_loop()
        # A Ray actor keeps one loop; a local caller (asyncio.run per call) brings a new one.
        if (
            self._loop_task is None
            or self._loop_task.done()
            or self._loop_task.get_loop() is not loop
        ):
            self._wakeup = asyncio.Event()
            self._loop_task = loop.create_task(self._batch_loop())
        self.engine.fit(prompt_ids, params)  # a request that cannot be served fails alone
        request = _Request(prompt_ids, params, loop.create_future())
        self._pending.append(request)
        self._wakeup.set()
        return await request.future

    def _take_batch(self) -> List[_Request]:
        batch, rows = [], 0
        while self._pending and (
            not batch or rows + self._pending[0].params.n <= self.max_batch_rows
        ):
            request = self._pending.pop(0)
            batch.append(request)
            rows += request.params.n
        return batch

    async def _gather(self) -> None:
        """Let concurrent runners' requests arrive: return once none came for
        ``batch_idle_s`` or ``batch_wait_s`` has passed."""
        loop = asyncio.get_running_loop()
        deadline, seen = loop.time() + self.batch_wait_s, -1
        while len(self._pending) != seen and loop.time() < deadline:
            seen = len(self._pending)
            await asyncio.sleep(min(self.batch_idle_s, max(0.0, deadline - loop.time())))

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            await self._gather()
            batch = self._take_batch()
            if not self._pending:
                self._wakeup.clear()
            if not batch:
                continue
            try:
                start = loop.time()
                version, outputs = await loop.run_in_executor(
                    self._executor,
                    self._generate,
                    [r.prompt_ids for r in batch],
                    [r.params for r in batch],
                )
                logger.debug(
                    "generated %d request(s), %d row(s) in %.3fs; %d waiting",
                    len(batch),
                    sum(r.params.n for r in batch),
                    loop.time() - start,
                    len(self._pending),
                )
            except Exception as exc:  # hand the failure to every waiting caller
                for r in batch:
                    r.future.set_exception(exc)
                continue
            for r, out in zip(batch, outputs, strict=True):
                r.future.set_result((version, out))

    # Both run on the one worker thread, so a batch's version is the weights that sampled it.
    # Each then frees the thread's OpenMP workers: in a one-process stage the trainer's ops
    # would otherwise run throttled (utils/openmp.py).
    def _generate(self, prompts: List[List[int]], params: List[SamplingParams]) -> tuple:
        try:
            return self._version, self.engine.generate(prompts, params)
        finally:
            release_workers()

    def _load(self, weights: Union[Dict[str, torch.Tensor], Adapter], version: int) -> None:
        try:
            if isinstance(weights, Adapter):  # a LoRA run's checkpoint: merged over the base
                load_adapter = getattr(self.engine, "load_adapter", None)
                if load_adapter is None:
                    raise ValueError(
                        f"model version {version} is a LoRA adapter, which the "
                        f"{type(self.engine).__name__} engine cannot merge; use engine_type "
                        "transformers"
                    )
                load_adapter(weights)
            else:
                self.engine.load_state_dict(weights)
            self._version = version
        finally:
            release_workers()

    def _receive(self, offer: TransferOffer, version: int) -> None:
        """Take ``version`` from the trainer's broadcast (``weight_transfer.py``); this
        engine joins the group at its first sync and stays in it."""
        from trinity.common.weight_transfer import WeightReceiver

        try:
            if self._receiver is None:
                self._receiver = WeightReceiver(offer)
            self.engine.receive_weights(self._receiver, version)
            self._version = version
        finally:
            release_workers()

    def _to_experiences(
        self, version: int, outputs: List[SampleOutput], params: SamplingParams
    ) -> List[Experience]:
        # The engine reports the prompt it actually used (after any truncation); the samples
        # of one request share it, so it is decoded once.
        prompt_text = self.tokenizer.decode(outputs[0].prompt_token_ids) if outputs else ""
        return [self._experience(version, o, params, prompt_text) for o in outputs]

    def _experience(
        self, version: int, out: SampleOutput, params: SamplingParams, prompt_text: str
    ) -> Experience:
        """One sample: its exact tokens, and its text as a reply shows it (special tokens
        skipped, cut before a stop string that ended it; the tokens keep everything)."""
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        info: Dict[str, Any] = {"finish_reason": out.finish_reason}
        hits = [(text.find(s), s) for s in params.stop or [] if s in text]
        if hits and out.finish_reason == "stop":
            at, stop = min(hits)
            text, info["stop_reason"] = text[:at], stop
        if out.top_logprobs is not None:
            info["top_logprobs"] = [[list(pair) for pair in step] for step in out.top_logprobs]
        return Experience(
            tokens=out.prompt_token_ids + out.token_ids,
            prompt_length=len(out.prompt_token_ids),
            logprobs=out.logprobs,
            prompt_text=prompt_text,
            response_text=text,
            model_version=version,
            info=info,
        )

    async def chat(
        self,
        messages: List[Dict[str, Any]],
        params: SamplingParams,
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> List[Experience]:
        """Sample replies to ``messages``. With a ``session``, a conversation that continues
        one of the session's recent turns is continued from its tokens (``Conversation``)."""
        if session is None:
            return await self.generate_ids(self.engine.apply_chat_template(messages, tools), params)
        conversation = self.conversation(session)
        experiences = await self.generate_ids(conversation.prompt_ids(messages, tools), params)
        replies = [({"role": "assistant", "content": e.response_text}, e) for e in experiences]
        record_turn(conversation, messages, tools, replies)
        return experiences

    async def prompt_length(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        session: Optional[str] = None,
    ) -> int:
        """Tokens of the prompt ``chat`` would sample from for this conversation now."""
        if session is None:
            return len(self.engine.apply_chat_template(messages, tools))
        return len(self.conversation(session).prompt_ids(messages, tools))

    def conversation(self, session: str) -> Conversation:
        """The ``Conversation`` of ``session`` (the ``MAX_SESSIONS`` most recent are kept)."""
        found = self._conversations.pop(session, None)
        if found is None:
            found = engine_conversation(self.engine)
        self._conversations[session] = found
        while len(self._conversations) > MAX_SESSIONS:
            self._conversations.popitem(last=False)
        return found

    async def generate(self, prompt: str, params: SamplingParams) -> List[Experience]:
        return await self.generate_ids(self.engine.encode_prompt(prompt), params)

    async def generate_ids(self, prompt_ids: List[int], params: SamplingParams) -> List[Experience]:
        version, outputs = await self._submit(list(prompt_ids), params)
        return self._to_experiences(version, outputs, params)

    async def load_weights(self, weights: Any, version: int) -> None:
        self._loading = version
        try:
            load = self._load
            if isinstance(weights, TransferOffer):  # nccl sync: join the trainer's broadcast
                load = self._receive
            elif isinstance(
                weights, str
            ):  # a checkpoint's weights file: read here, off the trainer
                weights = read_sync_weights(weights)
            elif weights and isinstance(next(iter(weights.values())), tuple):  # memory sync
                weights = unpack_state(weights)
            loop = asyncio.get_running_loop()
            # waits for the generation batch in hand: the executor runs one thing at a time
            await loop.run_in_executor(self._executor, load, weights, version)
        finally:
            self._loading = None
        logger.info("rollout engine now at model version %d", version)

    async def sync_phase(self) -> str:
        """``load`` while weights that reached this engine are read or loaded, else ``idle``
        (a caller still waiting then waits for the weights to arrive: ``send``)."""
        return "idle" if self._loading is None else "load"

    async def release(self) -> int:
        """Free the weights' device memory until the next ``load_weights`` (bytes freed)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.engine.release)

    async def model_version(self) -> int:
        return self._version
