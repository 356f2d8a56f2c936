"""examples/environments/verifiers.yaml: 2 GRPO steps on the micro model against the example's
verifiers environment (vf_sums.py), each episode played by verifiers' null harness against the
rollout model's OpenAI-compatible server.

Each stored experience must be one episode: the prompt the chat template writes for the task's
question, the sampled reply trained on, and the reward the environment's own reward function
gives that reply. The checks before start refuse an environment that is not installed and a
config without the OpenAI-compatible API, naming the keys.
"""

import importlib.util
import os
import re
import sys

import pytest

from tests.integration.test_run import records, weights_changed
from tests.integration.test_textarena import stored_experiences
from trinity.common.config import ConfigError
from trinity.demo.tiny import build_char_tokenizer
from trinity.runtime.launcher import run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None,
    reason='verifiers is not installed (pip install -e ".[verifiers]")',
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "environments", "verifiers.yaml")
ENV_DIR = os.path.join(ROOT, "examples", "environments", "verifiers")


def overrides(tmp_path, model, *more):
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={model}",
        "model.max_prompt_tokens=120",
        "model.max_response_tokens=12",
        "buffer.batch_size=2",
        "algorithm.repeat_times=3",
        "algorithm.optimizer.lr=1e-3",
        "buffer.total_steps=2",
        "explorer.runner_per_model=2",
        *more,
    ]


def sums(seed: int, count: int) -> list:
    """The example environment's tasks of ``seed``: (prompt, answer), by verifiers' loader."""
    sys.path.insert(0, ENV_DIR)
    try:
        from vf_sums import SumConfig, SumTaskset
    finally:
        sys.path.remove(ENV_DIR)
    tasks = SumTaskset(SumConfig(id="vf_sums", seed=seed, num_tasks=count)).load()
    return [(t.data.prompt, t.data.answer) for t in tasks]


def test_two_grpo_steps_against_a_verifiers_environment(tmp_path, micro_model, ray_cluster):
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, "explorer.eval_interval=2"), [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)
    explorer = records(result.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert all(r["rollout/turns/mean"] == 1 for r in steps)
    assert [r["step"] for r in explorer if "eval/sums_test/correct/mean" in r] == [0, 2]

    tokenizer = build_char_tokenizer(1024)
    questions = dict(sums(0, 64))
    episodes = stored_experiences(result.job_dir, "sums_buffer")
    assert len(episodes) == 2 * 2 * 3  # steps x tasks x episodes
    for exp in episodes:
        prompt = tokenizer.decode(exp.tokens[: exp.prompt_length])
        (question,) = [q for q in questions if q in prompt]
        messages = [{"role": "user", "content": question}]
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert prompt == rendered
        assert exp.action_mask.all()
        numbers = re.findall(r"-?\d+", exp.response_text)
        right = bool(numbers) and int(numbers[-1]) == questions[question]
        assert exp.reward == float(right) == exp.metrics["correct"]
        assert exp.metrics["answered"] == float(bool(re.search(r"\d", exp.response_text)))


def test_what_verifiers_cannot_run_is_refused_before_start(tmp_path, micro_model):
    bad = overrides(
        tmp_path,
        micro_model,
        "buffer.explorer_input.taskset.workflow_args.env_id=vf_nothing",
        "explorer.rollout_model.enable_openai_api=false",
    )
    with pytest.raises(ConfigError) as caught:
        run(CONFIG, bad, [])
    text = "\n".join(caught.value.problems)
    key = "buffer.explorer_input.tasksets[0].workflow_args"
    assert f"{key}: env_id: verifiers environment 'vf_nothing' is not installed" in text
    assert "set explorer.rollout_model.enable_openai_api: true" in text
