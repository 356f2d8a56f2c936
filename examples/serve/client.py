"""An outside client of a `mode: serve` run (examples/serve/serve.yaml): it needs only the
`openai` package and the standard library, as any application would.

Each episode is one addition question: the client asks it `--samples` times at once (one
chat completion each), scores every reply itself (1.0 for the right sum, else half the share
of digits in the reply: "answer with a number" earns something), posts each score to
/feedback under the question's task_id (so GRPO compares the replies to one question) and
closes the episode with /commit. It stops when the server answers 503 (training finished or
failed) or goes away, or after `--max-seconds`, and prints a JSON summary. When the server
requires an API key (explorer.api_server.api_key_env), the client sends the one in
TRINITY_API_KEY.

    python examples/serve/client.py --url http://127.0.0.1:8010
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import openai

# The server's API key, if it requires one; the openai package needs some key in any case.
API_KEY = os.environ.get("TRINITY_API_KEY") or "EMPTY"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}


class Stopped(Exception):
    """The server stopped taking work: training ended (503) or the run is gone."""


def post(url: str, body: Dict[str, Any]) -> Dict[str, Any]:
    """POST ``body`` as JSON; the JSON reply. ``Stopped`` when the server says training
    stopped (503) or is gone; another HTTP error raises ``HTTPError``."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            raise Stopped(json.load(exc)["error"]["message"]) from None
        raise
    except urllib.error.URLError as exc:  # connection refused: the run has ended
        raise Stopped(str(exc.reason)) from None


def get(url: str) -> Dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS), timeout=60) as reply:
        return json.load(reply)


def score(question: str, reply: str) -> float:
    """1.0 for the right sum; otherwise half the share of digits in the reply."""
    a, b = question.rstrip("=").split("+")
    if reply.strip() == str(int(a) + int(b)):
        return 1.0
    return 0.5 * sum(c.isdigit() for c in reply) / max(1, len(reply))


def ask(client: openai.OpenAI, model: str, question: str) -> Any:
    try:
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=8
        )
    except openai.APIStatusError as exc:
        if exc.status_code == 503:  # the server's own words, not openai's "Error code: 503 - ..."
            body = exc.body if isinstance(exc.body, dict) else {}
            raise Stopped(body.get("message") or exc.message) from None
        raise
    except openai.APIConnectionError as exc:
        raise Stopped(str(exc)) from None


def episode(
    url: str, client: openai.OpenAI, model: str, question: str, task_id: str, samples: int
) -> List[float]:
    """Ask, score, post the rewards, commit; the rewards."""
    with ThreadPoolExecutor(samples) as pool:
        replies = list(pool.map(lambda _: ask(client, model, question), range(samples)))
    rewards = []
    for reply in replies:
        reward = score(question, reply.choices[0].message.content or "")
        post(f"{url}/feedback", {"reward": reward, "msg_ids": [reply.id], "task_id": task_id})
        rewards.append(reward)
    post(f"{url}/commit", {"task_id": task_id})
    return rewards


def serve_metrics(url: str) -> Optional[Dict[str, Any]]:
    try:
        return get(f"{url}/metrics")
    except (urllib.error.URLError, ConnectionError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8010", help="the run's endpoint")
    parser.add_argument("--samples", type=int, default=8, help="replies per question")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key=API_KEY, max_retries=0)
    model = client.models.list().data[0].id
    rng, start = random.Random(args.seed), time.monotonic()
    summary: Dict[str, Any] = {"episodes": 0, "replies": 0, "mean_reward": [], "versions": []}
    try:
        while time.monotonic() - start < args.max_seconds:
            question = f"{rng.randrange(100)}+{rng.randrange(100)}="
            task_id = f"q{summary['episodes']}"
            rewards = episode(args.url, client, model, question, task_id, args.samples)
            summary["episodes"] += 1
            summary["replies"] += len(rewards)
            summary["mean_reward"].append(sum(rewards) / len(rewards))
            metrics = serve_metrics(args.url) or {}
            summary["versions"].append(metrics.get("rollout/model_0/model_version"))
    except Stopped as exc:
        summary["stopped"] = str(exc)
    summary["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
