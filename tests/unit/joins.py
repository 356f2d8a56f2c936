"""Test helper: what joined a transformers engine's decode loop together, step by step."""

from typing import Any, List


def record_joins(engine: Any) -> List[List[List[int]]]:
    """Make ``engine`` (a ``TransformersEngine``) record, for every step at which queued
    requests were waiting to join its decode loop, their prompts (token ids); with slots
    free for them all, they join at that step, sharing one prefill."""
    joins: List[List[List[int]]] = []
    make_stream = engine.stream

    def recording_stream() -> Any:
        stream = make_stream()
        step = stream.step

        def recorded_step() -> Any:
            if stream.queue:
                joins.append([list(request.prompt) for _, request in stream.queue])
            return step()

        stream.step = recorded_step
        return stream

    engine.stream = recording_stream
    return joins
