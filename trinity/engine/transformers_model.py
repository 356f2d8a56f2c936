"""The embedded rollout engine behind ``InferenceModel``: ``TransformersEngine`` + batching.

Workflow runners call ``chat``/``generate`` concurrently. On the one worker thread a decode
loop (the engine's ``stream``, ``streaming.py``) samples every request in flight together:
a request that arrives while others decode joins them at the next step when slots are free,
and each caller gets its samples as soon as its own rows end. When the loop is idle, the
first request waits until no new one came for ``batch_idle_s`` (``batch_wait_s`` at most),
so the runners' concurrent requests share one prefill. An engine without ``stream`` (the
tinker engine) gets the requests gathered so far as one ``generate`` call per step
(``_WholeBatches``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple, Union

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
        batch_idle_s: float = 0.002,
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
        self._pending: Deque[_Request] = deque()  # appended on the loop, taken by the worker
        self._wakeup: Optional[asyncio.Event] = None
        self._loop_task: Optional[asyncio.Task] = None
        # One worker thread: generation and weight loading never overlap. While a load or
        # release waits for it (``_hold``), the decode loop takes no new request and ends
        # once its rows do, so no request's rows mix two model versions.
        # Named after the thread that builds it (a ``LocalEngine``'s loop carries the
        # engine's name), so what it logs goes to the engine's file (``roles.RoleLogs``).
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=threading.current_thread().name
        )
        self._hold = 0
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
            self._wakeup.clear()  # before the check: a later request sets it again
            if self._pending and not self._hold:
                await loop.run_in_executor(self._executor, self._decode, loop)

    def _stream(self) -> Any:
        stream = getattr(self.engine, "stream", None)
        return stream() if stream is not None else _WholeBatches(self.engine, self.max_batch_rows)

    # On the one worker thread, so a request's version is the weights that sampled it: loads
    # wait for this loop, which ends once nothing runs or, with a load waiting, its rows end.
    def _decode(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the decode loop until it is empty, feeding it the pending requests."""
        stream, version, start, served = self._stream(), self._version, loop.time(), [0, 0]
        try:
            while True:
                if not self._hold:
                    self._feed(stream, loop)
                if not stream.busy:
                    break
                for request, samples in stream.step():
                    served[0], served[1] = served[0] + 1, served[1] + len(samples)
                    loop.call_soon_threadsafe(_settle, request.future, (version, samples), None)
        except Exception as exc:  # hand the failure to every caller in the loop
            for request in stream.tags():
                loop.call_soon_threadsafe(_settle, request.future, None, exc)
        finally:
            # Frees the thread's OpenMP workers: in a one-process stage the trainer's ops
            # would otherwise run throttled (utils/openmp.py).
            release_workers()
        logger.debug(
            "generated %d request(s), %d row(s) in %.3fs; %d waiting",
            *served,
            loop.time() - start,
            len(self._pending),
        )

    def _feed(self, stream: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Move pending requests into ``stream`` while its slots have room (in order; a
        request wider than every slot goes alone into an empty stream). A request of another
        loop (a local caller's next ``asyncio.run``) is left to that loop's decode run."""
        while self._pending:
            request = self._pending[0]
            if request.future.get_loop() is not loop:
                return
            if stream.busy and stream.room() < request.params.n:
                return
            self._pending.popleft()
            stream.add(request.prompt_ids, request.params, request)

    async def _exclusive(self, work: Any, *args: Any) -> Any:
        """Run ``work`` on the worker thread once the decode loop in hand has ended; the
        loop admits nothing new meanwhile, and resumes after."""
        self._hold += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
        finally:
            self._hold -= 1
            if self._wakeup is not None:
                self._wakeup.set()

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
            await self._exclusive(load, weights, version)
        finally:
            self._loading = None
        logger.info("rollout engine now at model version %d", version)

    async def sync_phase(self) -> str:
        """``load`` while weights that reached this engine are read or loaded, else ``idle``
        (a caller still waiting then waits for the weights to arrive: ``send``)."""
        return "idle" if self._loading is None else "load"

    async def release(self) -> int:
        """Free the weights' device memory until the next ``load_weights`` (bytes freed)."""
        return await self._exclusive(self.engine.release)

    async def model_version(self) -> int:
        return self._version


def _settle(future: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
    """Resolve a caller's future on its loop (a caller that gave up has cancelled it)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _WholeBatches:
    """The stream surface over an engine that has ``generate`` only: the requests added
    before a step (``max_rows`` rows at most) are sampled by one ``generate`` call."""

    def __init__(self, engine: Any, max_rows: int) -> None:
        self.engine, self.max_rows = engine, max_rows
        self.queue: List[Tuple[List[int], SamplingParams, Any]] = []

    def add(self, prompt: List[int], params: SamplingParams, tag: Any) -> None:
        self.queue.append((prompt, params, tag))

    def room(self) -> int:
        return self.max_rows - sum(params.n for _, params, _ in self.queue)

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def tags(self) -> List[Any]:
        return [tag for _, _, tag in self.queue]

    def step(self) -> List[Tuple[Any, List[Any]]]:
        outputs = self.engine.generate([q[0] for q in self.queue], [q[1] for q in self.queue])
        done, self.queue = self.tags(), []
        return list(zip(done, outputs, strict=True))
