"""Mode serve's endpoint in this process: the engine's OpenAI-compatible server with the serve
routes, over the queue host and synchronizer a stage gives it (``runtime/serve_role.py``),
driven over real HTTP by the ``openai`` client and urllib, as an outside client would."""

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Optional

import openai
import pytest

from tests.unit.serve_endpoint import USER, serve_endpoint
from trinity.common.models.reply_tokens import TOKENS_HEADER


@pytest.fixture()
def served(micro_model, tmp_path):
    """(base URL, openai client, queue host, synchronizer) of a fresh endpoint."""
    with serve_endpoint(micro_model, tmp_path) as endpoint:
        yield endpoint.url, endpoint.client, endpoint.queue, endpoint.sync


def post(url: str, body: Any, raw: Optional[bytes] = None) -> Dict[str, Any]:
    """POST JSON; the reply's JSON, with its HTTP status as "http" (errors included)."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return {"http": reply.status, **json.load(reply)}
    except urllib.error.HTTPError as exc:
        return {"http": exc.code, **json.load(exc)}


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        **{"model": client.models.list().data[0].id, "messages": USER, "max_tokens": 6, **kwargs}
    )


def test_each_reply_is_recorded_with_its_exact_tokens_and_logprobs(served):
    url, client, queue, _ = served
    reply = chat(client, n=2, logprobs=True, extra_headers={TOKENS_HEADER: "1"})
    prompt = reply.model_extra["trinity"]["prompts"][0]["token_ids"]
    given = post(f"{url}/feedback", {"reward": 0.5, "msg_ids": [reply.id], "task_id": 7})
    assert given == {"http": 200, "status": "success", "updated": 2}  # both choices
    result = post(f"{url}/commit", {"task_id": "7"})  # a number and its text: one task
    assert result == {"http": 200, "status": "success", "step": 1, "experiences": 2}
    exps = queue.get(2, timeout=0).experiences
    for choice, exp in zip(reply.choices, exps, strict=True):
        block = choice.model_extra["trinity"]
        assert exp.tokens.tolist() == prompt + block["token_ids"]  # what the engine sampled
        assert exp.prompt_length == len(prompt)
        assert exp.logprobs.tolist() == [t.logprob for t in choice.logprobs.content]
        assert (exp.reward, exp.group_id, exp.model_version) == (0.5, "7", 0)


def test_feedback_and_commit_refuse_what_they_cannot_do_and_name_it(served):
    url, client, _, _ = served
    reply = chat(client)
    unknown = post(f"{url}/feedback", {"reward": 1, "msg_ids": [reply.id, "chatcmpl-nope"]})
    assert unknown["http"] == 404 and "'chatcmpl-nope'" in unknown["error"]["message"]
    assert unknown["error"]["code"] == "response_not_found"
    for reward in ("1.0", True, None, float("nan")):
        body = json.dumps({"reward": reward, "msg_ids": [reply.id]}).encode()  # NaN: JSON ext.
        bad = post(f"{url}/feedback", None, raw=body)
        assert bad["http"] == 422 and bad["error"]["param"] == "reward", reward
        assert "reward must be a" in bad["error"]["message"]
    no_ids = post(f"{url}/feedback", {"reward": 1.0, "msg_ids": reply.id})
    assert no_ids["http"] == 422 and no_ids["error"]["param"] == "msg_ids"
    assert post(f"{url}/feedback", None, raw=b"{not json")["http"] == 400
    empty = post(f"{url}/commit", {})
    assert empty["http"] == 409 and "nothing to commit" in empty["error"]["message"]
    assert post(f"{url}/feedback", {"reward": 1, "msg_ids": [reply.id]})["updated"] == 1
    other = post(f"{url}/commit", {"task_id": "other"})
    assert other["http"] == 409 and "task_id 'other'" in other["error"]["message"]
    assert post(f"{url}/commit", {})["step"] == 1  # no body field: every rewarded reply
    again = post(f"{url}/feedback", {"reward": 0, "msg_ids": [reply.id]})
    assert again["http"] == 409 and reply.id in again["error"]["message"]
    metrics = json.load(urllib.request.urlopen(f"{url}/metrics"))
    assert metrics["rollout/total_experience_count"] == 1
    assert metrics["rollout/committed_experience_count"] == 1
    assert metrics["explore_step_num"] == 1 and metrics["rollout/model_0/model_version"] == 0


def test_requests_sample_at_the_trainers_temperature(served):
    _, client, _, _ = served
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, temperature=0.7)
    assert "model.temperature" in caught.value.message
    assert chat(client, temperature=1.0).choices  # the trainer's: accepted


def test_a_failed_trainer_is_a_503_with_its_error(served):
    url, client, _, sync = served
    reply = chat(client)
    sync.trainer_finished("Traceback ...\nRuntimeError: out of memory")
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client)
    assert caught.value.status_code == 503
    assert "the trainer failed (RuntimeError: out of memory)" in caught.value.message
    refused = post(f"{url}/feedback", {"reward": 1, "msg_ids": [reply.id]})
    assert refused["http"] == 503 and "log/trainer.log" in refused["error"]["message"]
    assert post(f"{url}/commit", {})["http"] == 503
