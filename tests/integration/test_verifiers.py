"""examples/environments/verifiers.yaml: 2 GRPO steps on the micro model against the example's
verifiers environment (vf_sums.py), each episode played by verifiers' null harness against the
rollout model's OpenAI-compatible server.

Each stored experience must be one episode: the prompt the chat template writes for the task's
question, the sampled reply trained on, and the reward the environment's own reward function
gives that reply. Then 2 GRPO steps on the multi-turn ``calc`` environment (a tool served over
MCP) with a micro model taught to call the tool: each episode one experience, the model's turns
trained on, the tool's results (the real sums of the arguments the model wrote) masked out.
The checks before start refuse an environment that is not installed, a config without the
OpenAI-compatible API, and tools without tool-call parsing, naming the keys.
"""

import importlib.util
import json
import os
import re
import shutil
import sys

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

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


@pytest.fixture(scope="module")
def tool_caller(tmp_path_factory, micro32_model) -> str:
    """micro32 taught by plain supervised steps to play ``calc``'s episode: call ``calc_add``
    after the question, answer after the tool's result. It learns the tokens verifiers and the
    server make of those replies with the model's own chat template: the run's prompts."""
    from tests.unit.test_verifiers import TOOL_CALL, scripted_tool_episode

    exp = scripted_tool_episode(micro32_model, [TOOL_CALL, "It is 5."], chat_template=None)
    tokens = exp.tokens.unsqueeze(0)
    labels = tokens.clone()
    labels[0, : exp.prompt_length] = -100
    labels[0, exp.prompt_length :][~exp.action_mask.bool()] = -100
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(micro32_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        model(input_ids=tokens, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    out = str(tmp_path_factory.mktemp("model") / "tool_caller")
    shutil.copytree(micro32_model, out)
    model.save_pretrained(out)
    return out


def turns(tokenizer, exp) -> list:
    """An experience's response as (trained, text) runs: the model's turns and the rest."""
    response = exp.tokens[exp.prompt_length :].tolist()
    runs: list = []
    for token, trained in zip(response, exp.action_mask.bool().tolist(), strict=True):
        if runs and runs[-1][0] == trained:
            runs[-1][1].append(token)
        else:
            runs.append((trained, [token]))
    return [(trained, tokenizer.decode(ids)) for trained, ids in runs]


def test_two_grpo_steps_of_a_tool_episode(tmp_path, tool_caller, ray_cluster):
    """The example's config with the ``calc`` environment in place of ``sums``."""
    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "train.jsonl").write_text('{"task_index": 0}\n' * 4)
    explorer_input = config["buffer"]["explorer_input"]
    explorer_input["taskset"]["path"] = str(rows)
    explorer_input["taskset"]["workflow_args"] = {
        "env_id": "vf_calc",
        "env_dir": os.path.join(ROOT, "tests", "unit", "vf_envs"),
        "env_config": {"agent": {"harness": {"id": "null"}}},
    }
    del explorer_input["eval_tasksets"]
    config["explorer"]["eval_on_startup"] = False
    calc = tmp_path / "calc.yaml"
    calc.write_text(yaml.safe_dump(config))
    more = ["model.max_prompt_tokens=700", "model.max_response_tokens=120"]
    with pytest.raises(ConfigError) as caught:  # tool calls are parsed only where asked
        run(str(calc), overrides(tmp_path, tool_caller, *more), [])
    assert caught.value.problems == [
        "buffer.explorer_input.tasksets[0].workflow_args: verifiers_workflow offers the model "
        "tools here: set explorer.rollout_model.enable_auto_tool_choice: true (its "
        "tool_call_parser 'hermes' reads the model's calls)"
    ]
    more.append("explorer.rollout_model.enable_auto_tool_choice=true")
    (result,) = run(str(calc), overrides(tmp_path, tool_caller, *more), [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    steps = [r for r in records(result.job_dir, "explorer") if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]

    tokenizer = build_char_tokenizer(1024)
    episodes = stored_experiences(result.job_dir, "sums_buffer")
    assert len(episodes) == 2 * 2 * 3
    called = 0
    for exp in episodes:
        runs = turns(tokenizer, exp)
        replies = [text for trained, text in runs if trained]
        assert runs[0][0] and len(replies) == exp.info["turns"] == exp.metrics["turns"]
        assert exp.reward == float("5" in replies[-1]) == exp.metrics["correct"]
        for (_, reply), (trained, context) in zip(runs[::2], runs[1::2], strict=False):
            assert not trained and context.endswith("<|im_start|>assistant\n")
            call = re.search(r"<tool_call>\s*(\{.*\})\s*</tool_call>", reply, re.S)
            call = json.loads(call.group(1))
            if call["name"] != "calc_add":  # a sampled reply can misspell the tool's name
                assert f"<|im_start|>tool\nerror: unknown tool '{call['name']}'" in context
                continue
            args = call["arguments"]
            assert f"<|im_start|>tool\n{args['a'] + args['b']}<|im_end|>" in context
            called += 1
    assert called >= 3  # the model calls the tool (9 of 12 episodes when written), the tool answers
