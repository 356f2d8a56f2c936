"""examples/environments/openenv.yaml: 2 GRPO steps on the micro model against the example's
OpenEnv environment (guess_env.py), which the workflow serves on loopback for the run.

Each stored experience must be one whole episode: the tokens the conversation's chat template
writes, trained on the model's replies only, with the reward the environment gives when the
same replies are played again on a fresh episode of the row's seed. A second run against a
URL where no server answers fails its tasks, naming the URL, and goes on.
"""

import importlib.util
import json
import os
import shutil
import sys

import pytest

from tests.integration.test_guess_number import expected_mask
from tests.integration.test_run import records, weights_changed
from tests.integration.test_textarena import replies, stored_experiences
from trinity.demo.tiny import build_char_tokenizer
from trinity.runtime.launcher import run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None,
    reason='openenv-core is not installed (pip install -e ".[openenv]")',
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIG = os.path.join(ROOT, "examples", "environments", "openenv.yaml")
ENV_DIR = os.path.join(ROOT, "examples", "environments", "openenv")
REPLY = 8  # max_reply_tokens


def episode_folder(tmp_path, seeds=range(4)):
    data = tmp_path / "env"
    data.mkdir()
    shutil.copy(os.path.join(ENV_DIR, "guess_env.py"), data)
    for split, rows in (("train", seeds), ("test", (900, 901))):
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"seed": s}) + "\n" for s in rows))
    return data


def overrides(tmp_path, model, *more):
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={model}",
        "model.max_prompt_tokens=200",
        "model.max_response_tokens=240",
        f"buffer.explorer_input.taskset.workflow_args.max_reply_tokens={REPLY}",
        f"buffer.explorer_input.eval_tasksets.0.workflow_args.max_reply_tokens={REPLY}",
        "buffer.batch_size=2",
        "algorithm.repeat_times=4",
        "algorithm.optimizer.lr=1e-3",
        "buffer.total_steps=2",
        "explorer.runner_per_model=2",
        *more,
    ]


def replay(said, seed):
    """The example's environment, in this process, given the same replies: the user turns
    it shows and the rewards it gives."""
    sys.path.insert(0, ENV_DIR)
    try:
        from guess_env import GuessAction, GuessEnvironment
    finally:
        sys.path.remove(ENV_DIR)
    env = GuessEnvironment()
    shown, rewards = [env.reset(seed=seed).text], []
    for reply in said:
        observation = env.step(GuessAction(message=reply))
        shown.append(observation.text)
        rewards.append(observation.reward or 0.0)
    return shown, rewards


def test_two_grpo_steps_against_an_openenv_server(tmp_path, monkeypatch, micro_model, ray_cluster):
    monkeypatch.setenv("TRINITY_OPENENV_DIR", str(episode_folder(tmp_path)))
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, "explorer.eval_interval=2"), [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)
    explorer = records(result.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert all(1 <= r["rollout/turns/mean"] <= 6 for r in steps)
    assert [r["step"] for r in explorer if "eval/guess_test/turns/mean" in r] == [0, 2]

    tokenizer = build_char_tokenizer(1024)
    episodes = stored_experiences(result.job_dir)
    assert len(episodes) == 2 * 2 * 4  # steps x seeds x episodes
    system = "Guess the number. Reply with one number only."
    for exp in episodes:
        assert exp.action_mask.tolist() == expected_mask(tokenizer, exp, max_tokens=REPLY)
        said = replies(tokenizer, exp)
        assert len(said) == exp.info["turns"] == exp.metrics["turns"]
        # what the environment got: the reply text without the special tokens it holds
        sent = [tokenizer.decode(tokenizer.encode(r), skip_special_tokens=True) for r in said]
        shown, rewards = replay(sent, exp.info["seed"])
        assert exp.reward == pytest.approx(sum(rewards))
        messages = [{"role": "system", "content": system}]
        for text, reply in zip(shown[:-1], said, strict=True):  # the last one: after the end
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        text = tokenizer.decode(exp.tokens)
        if text.endswith("<|im_end|>"):  # the template writes a newline after the last turn
            expected = rendered.removesuffix("\n")
        else:  # the last reply was cut at max_reply_tokens (it may end with a newline itself)
            expected = rendered.removesuffix("<|im_end|>\n")
        assert text == expected


def test_a_dead_server_fails_its_tasks_naming_the_url_and_the_run_goes_on(
    tmp_path, monkeypatch, micro_model, ray_cluster
):
    from trinity.common.workflows.openenv_env import _free_port

    data = episode_folder(tmp_path)
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    rows = [{"seed": 0}, {"seed": 1, "url": dead}]  # a row's url overrides app
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("TRINITY_OPENENV_DIR", str(data))
    args = "buffer.explorer_input.taskset.workflow_args"
    more = [f"{args}.connect_tries=2", f"{args}.connect_timeout=2", "buffer.total_steps=1",
            "explorer.eval_interval=100", "explorer.eval_on_startup=false",
            "explorer.max_retry_times=0", "explorer.max_failed_ratio=0.9"]  # fmt: skip
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, *more), [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1]
    (step,) = [r for r in records(result.job_dir, "explorer") if "rollout/model_version" in r]
    assert step["rollout/tasks_failed"] == 4  # the dead row's 4 episodes, one task each
    logs = "".join(open(p, errors="replace").read() for p in _logs(result.job_dir))
    assert f"the OpenEnv server at {dead} did not answer (2 tries)" in logs


def _logs(job_dir):
    for folder, _, files in os.walk(job_dir):
        yield from (os.path.join(folder, f) for f in files if f.endswith(".log"))
