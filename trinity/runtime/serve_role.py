"""``mode: serve``: the policy behind an OpenAI-compatible endpoint for outside clients, trained
in the same run on what they reward and commit.

``ServeRole`` takes the explorer's place in the stage: it starts the one rollout engine with
its OpenAI-compatible server bound at ``explorer.listen_address:explorer.proxy_port``, the
serve routes on (``engine/serve_routes.py``), and then only moves weights: each version the
trainer publishes is loaded into the engine between batches (the engine's one worker thread
never loads while it generates), so a request in flight finishes on the weights it started
with and none is dropped. The run ends when the trainer has trained ``buffer.total_steps``
steps. Once training stops, the endpoint answers 503 for ``STOP_NOTICE_S`` seconds saying
why (finished; or failed, with the trainer's error), so clients learn it rather than find
the port closed, then stops; a failed trainer then fails the run.

``EndpointHooks`` is what the server calls for each request, in the engine's process: the
bookkeeping is the queue host's (``queue_host.py``), the trainer's state the synchronizer's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Dict, List, Optional

from trinity.common.config.config import rollout_temperature
from trinity.engine.openai_protocol import APIError
from trinity.runtime.explorer_role import ExplorerRole
from trinity.runtime.failures import log_file
from trinity.runtime.roles import WAIT_SLICE_S, call, call_all
from trinity.utils.loop_host import LoopHost

logger = logging.getLogger(__name__)

# How long the endpoint answers 503 once training stopped, before it closes: long enough
# for clients in a loop to see why, short enough not to hold a finished or dead run.
STOP_NOTICE_S = 5.0


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread: the server's loop also batches generation."""
    return await asyncio.to_thread(fn, *args)


class EndpointHooks:
    """The serve routes' bookkeeping (``engine.serve_routes.ServeHooks``), over the stage's
    queue host (``record``, ``feedback``, ``commit``) and synchronizer (trainer state)."""

    def __init__(self, queue: Any, sync: Any, temperature: float, trainer_log: str) -> None:
        self.queue, self.sync, self.temperature = queue, sync, temperature
        self.trainer_log = trainer_log

    async def available(self) -> None:
        state = await _off_loop(call, self.sync, "trainer_state")
        if state == "running":
            return
        if state == "finished":
            why = "training has finished (buffer.total_steps trained); this run is stopping"
        else:
            lines = [line for line in state.splitlines() if line.strip()]
            why = (
                f"the trainer failed ({lines[-1].strip()}); this run is stopping, see "
                f"{self.trainer_log}"
            )
        raise APIError(503, why, code="training_stopped", kind="server_error")

    async def record(self, response_id: str, experiences: List[Any]) -> None:
        await _off_loop(call, self.queue, "record", response_id, experiences)

    async def feedback(
        self, msg_ids: List[str], reward: float, task_id: Optional[str], run_id: int
    ) -> Dict[str, Any]:
        result = await _off_loop(call, self.queue, "feedback", msg_ids, reward, task_id, run_id)
        if result.unknown:
            raise APIError(
                404,
                f"msg_ids: no reply with id {_listed(result.unknown)} was served by this run "
                "(use the `id` of a chat completion it returned)",
                "msg_ids",
                "response_not_found",
            )
        if result.committed:
            raise APIError(
                409,
                f"msg_ids: reply {_listed(result.committed)} was committed already; its "
                "reward can no longer change",
                "msg_ids",
                "already_committed",
            )
        return {"status": "success", "updated": result.updated}

    async def commit(self, task_id: Optional[str]) -> Dict[str, Any]:
        step, count = await _off_loop(call, self.queue, "commit", task_id)
        if not count:
            scope = f" of task_id '{task_id}'" if task_id is not None else ""
            raise APIError(
                409,
                f"nothing to commit: no reply{scope} got feedback since the last commit "
                "(POST /feedback first)",
                "task_id" if task_id is not None else None,
                "empty_commit",
            )
        return {"status": "success", "step": step, "experiences": count}

    async def metrics(self) -> Dict[str, Any]:
        counts = await _off_loop(call, self.queue, "serve_counts")
        return {
            "rollout/total_experience_count": counts["served"],
            "rollout/ready_experience_count": counts["ready"],
            "rollout/committed_experience_count": counts["committed"],
            "explore_step_num": counts["step"],
        }


def _listed(ids: List[str]) -> str:
    shown = ", ".join(f"'{i}'" for i in ids[:3])
    return shown + (f" (and {len(ids) - 3} more)" if len(ids) > 3 else "")


class ServeRole(ExplorerRole):
    """The explorer's place in a ``mode: serve`` stage (see the module docstring)."""

    def __init__(self, config: Any, plugin_dirs: List[str], queue: Any, sync: Any, *args: Any):
        super().__init__(config, plugin_dirs, queue, sync, *args)
        trainer_log = log_file(config, config.trainer.name)
        self.serve_hooks = EndpointHooks(queue, sync, rollout_temperature(config), trainer_log)

    def start_engines(self) -> None:
        """The rollout engine, serving at ``explorer.listen_address:proxy_port``."""
        cfg = self.config
        self.engines = self._start_engines(cfg.explorer.name, cfg.explorer.rollout_model)
        self.auxiliary: List[List[Any]] = []
        self.pool = None  # no runners: clients send the requests
        self.closed = False

    def prepare(self, start_step: int) -> int:
        """Say where clients reach the endpoint; the engine holds the weights of
        ``start_step`` (a resumed trainer publishes them before it trains)."""
        self.loaded_version = 0
        self._load_newer(0.0)
        address = call(self.engines[0], "api_address")
        self.report.event(
            f"serving {address['model']} at {address['url']}/v1 (OpenAI-compatible; rewards: "
            f"POST {address['url']}/feedback, episodes: POST {address['url']}/commit)"
        )
        return start_step

    def run(self) -> int:
        """Load each version the trainer publishes until it has stopped; the last version
        served."""
        try:
            while call(self.sync_actor, "trainer_state") == "running":
                self._load_newer(WAIT_SLICE_S)
            self._notice(call(self.sync_actor, "trainer_state"))
            return self.loaded_version
        except BaseException:
            logger.exception("the server failed")
            raise
        finally:
            self.close()

    def _load_newer(self, wait: float) -> None:
        """Load weights newer than the engine's, waiting up to ``wait`` seconds for them; an
        engine Ray restarted (with its initial weights) gets the current ones back."""
        try:
            found = call(self.sync_actor, "wait_for", self.loaded_version + 1, wait)
        except RuntimeError:  # the trainer failed before publishing that version
            return
        if found is None or found[0] <= self.loaded_version:
            if min(call_all(self.engines, "model_version")) >= self.loaded_version:
                return
            found = call(self.sync_actor, "wait_for", self.loaded_version, 0.0)
        if found is not None and found[1]:
            call_all(self.engines, "load_weights", found[1][0], found[0])
            self.loaded_version = found[0]
            logger.info("serving model version %d", found[0])

    def _notice(self, trainer_state: str) -> None:
        """Keep answering 503 (``EndpointHooks.available``) for a while, then end."""
        log = logger.info if trainer_state == "finished" else logger.error
        log(
            "training %s: the endpoint answers 503 for %gs, then stops",
            trainer_state,
            STOP_NOTICE_S,
        )
        time.sleep(STOP_NOTICE_S)

    def close(self) -> None:
        """Stop the endpoint (requests in flight are answered first) and, in this process,
        the engine's loop; once."""
        if self.closed:
            return
        self.closed = True
        call_all(self.engines, "close_server")
        for engine in self.engines:
            if isinstance(engine, LoopHost):
                engine.close()
