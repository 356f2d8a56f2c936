"""openenv_workflow: episodes of a real OpenEnv environment (tests/unit/openenv_envs.py, served
by openenv-core's create_app on loopback) played by a scripted stand-in model; each episode one
experience whose trained tokens are the replies, its reward what the environment's steps gave;
the failures that fail a task; the checks before start."""

import importlib.util
import textwrap

import pytest

from tests.unit.test_frozen_lake import TOKENIZER, ScriptedModel, trained
from tests.unit.test_preflight import BASE
from trinity.common.config import GenerationConfig, load_config
from trinity.common.config.base import ConfigError, validate_model
from trinity.demo.tiny import IM_END
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None,
    reason='openenv-core is not installed (pip install -e ".[openenv]")',
)
APP = "tests.unit.openenv_envs:app"
SEED = 3


@pytest.fixture(scope="module")
def url():
    """The test environment's server, as the workflow starts it (once for the module)."""
    from trinity.common.workflows.openenv_env import served_url

    return served_url(APP, None, startup_timeout=300)


def L():  # the letter of SEED's episodes
    from tests.unit.openenv_envs import letter

    return letter(SEED)


def play(model, url, n=1, row=None, max_tokens=None, **args):
    from trinity.common.workflows import Task

    task = Task(
        workflow="openenv_workflow",
        raw_task={"seed": SEED, **(row or {})},
        rollout_args=GenerationConfig(n=n, temperature=0.7, max_tokens=max_tokens),
        workflow_args={"url": url, **args},
        taskset_name="letters",
        index=1,
    )
    return task.to_workflow(model).run()


def test_an_episode_is_one_experience_with_the_sum_of_the_steps_rewards(url):
    x = L()
    replies = [f"{x}{x} {x}", "zz", f"stop {x}"]
    model = ScriptedModel(replies)
    (exp,) = play(model, url)
    # step rewards 3/10, 0, 1/10; "stop" ends the episode
    assert exp.reward == pytest.approx(0.4)
    assert exp.info["step_rewards"] == pytest.approx([0.3, 0.0, 0.1])
    assert exp.metrics == {"turns": 3.0, "env_done": 1.0}
    assert exp.info["end"] == "done" and exp.info["seed"] == SEED
    # the observations' prompt field as the user turns; the reset's is the first
    users = [m["content"] for m in model.sent[-1][0] if m["role"] == "user"]
    assert users == [f"Write words with many '{x}'.", "Turn 1: more.", "Turn 2: more."]
    # token-exact: the whole conversation as the chat template writes it, replies trained
    conversation = model.sent[-1][0] + [{"role": "assistant", "content": replies[-1]}]
    text = TOKENIZER.apply_chat_template(conversation, tokenize=False)
    assert TOKENIZER.decode(exp.tokens.tolist()) == text.removesuffix("\n")
    assert trained(exp) == "".join(r + IM_END for r in replies)


def test_reward_last_and_an_episode_cut_at_max_turns(url):
    x = L()
    (exp,) = play(ScriptedModel([f"{x}{x}", x]), url, reward="last", max_turns=2)
    assert exp.reward == pytest.approx(0.1)  # the second step's, not 0.2 + 0.1
    assert exp.info["end"] == "max_turns" and exp.metrics["env_done"] == 0.0
    (exp,) = play(ScriptedModel([f"{x}{x}", x]), url, max_turns=2)
    assert exp.reward == pytest.approx(0.3)  # the steps taken, though not done


def test_n_episodes_each_from_reset_and_the_system_prompt(url):
    model = ScriptedModel(["stop", "a stop"])
    first, second = play(model, url, n=2, system_prompt="Be brief.")
    assert first.metrics["turns"] == second.metrics["turns"] == 1.0
    assert [m[0][0] for m in model.sent] == [{"role": "system", "content": "Be brief."}] * 2


def test_reset_args_and_the_rows_column_reach_reset(url):
    model = ScriptedModel(["stop"])
    play(model, url, reset_args={"note": "from args"}, row={"reset_args": {"note": "row"}})
    assert model.sent[0][0][0]["content"] == f"Write words with many '{L()}' (row)."


def test_dotted_path_functions_render_observations_and_build_actions(url):
    model = ScriptedModel([L() * 4, "stop", "x"])  # capitals: no "stop"; the third step ends it
    (exp,) = play(
        model,
        url,
        observation_to_text="tests.unit.openenv_envs:turn_text",
        reply_to_action="tests.unit.openenv_envs:shouting",
    )
    assert model.sent[1][0][-1]["content"] == "#1 Turn 1: more."
    assert exp.reward == 0.0  # capitals: the environment counts small letters


def test_an_action_type_builds_the_action(url):
    (exp,) = play(
        ScriptedModel([f"stop {L()}"]), url, action_type="tests.unit.openenv_envs:LetterAction"
    )
    assert exp.reward == pytest.approx(0.1)


def test_an_observation_without_the_field_fails_naming_its_fields(url):
    from trinity.common.workflows.openenv_env import EnvError

    with pytest.raises(EnvError, match="no field 'text'; its fields: prompt, turn"):
        play(ScriptedModel(["x"]), url, observation_field="text")


def test_an_environment_that_raises_fails_the_episode_naming_the_url_and_step(url):
    from trinity.common.workflows.openenv_env import EnvError

    with pytest.raises(EnvError) as caught:
        play(ScriptedModel(["fine", "boom"]), url)
    assert f"at {url} failed at step 2" in str(caught.value)
    assert "the letter machine broke" in str(caught.value)


def test_a_server_that_does_not_answer_fails_the_task_naming_the_url():
    from trinity.common.workflows.openenv_env import EnvError, _free_port

    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(EnvError, match=f"server at {dead} did not answer \\(2 tries\\)"):
        play(ScriptedModel(["x"]), dead, connect_tries=2, connect_timeout=5)


def test_an_app_that_cannot_start_fails_each_task_with_its_output(tmp_path):
    from trinity.common.workflows.openenv_env import EnvError, served_url

    (tmp_path / "broken_app.py").write_text("import sys\napp = None\nsys.exit('no env here')\n")
    for _ in range(2):  # the second task gets the same error, not a second start
        with pytest.raises(EnvError, match="exited .code 1. before it answered: no env here"):
            served_url("broken_app:app", str(tmp_path), startup_timeout=300)


# ---- before start --------------------------------------------------------------------------
def args_problems(**args):
    from trinity.common.workflows.openenv import OpenEnvArgs

    try:
        validate_model(OpenEnvArgs, args, "workflow_args")
    except ConfigError as exc:
        return exc.problems
    return []


def test_workflow_args_checked_before_start():
    assert args_problems(app=APP) == []
    assert "url/app: set one of them" in args_problems()[0]
    assert "url/app: set one of them" in args_problems(url="http://h:1", app=APP)[0]
    assert "not a server URL" in args_problems(url="localhost:8000")[0]
    (problem,) = args_problems(app="no_such_env_pkg.server.app:app")
    assert problem.startswith("workflow_args.app: ")
    assert "no module named 'no_such_env_pkg'; install the package" in problem
    (problem,) = args_problems(app="tests.unit.openenv_envs:ap")
    assert "has no 'ap'; did you mean 'app'?" in problem
    (problem,) = args_problems(app=APP, action_type="tests.unit.openenv_envs:LetterAction",
                               action_field="msg")  # fmt: skip
    assert "LetterAction has no field 'msg' (its fields: metadata, message)" in problem
    (problem,) = args_problems(url="http://h:1", client="openenv.core:GenericEnvClient")
    assert "action_type: a typed client" in problem


def config_with(tmp_path, workflow_args):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE) + "    default_workflow_type: openenv_workflow\n")
    args = f"buffer.explorer_input.taskset.workflow_args={workflow_args}"
    config, _ = derive(load_config(str(path), [args]))
    return config


def test_an_app_that_does_not_import_is_refused_before_start(tmp_path):
    config = config_with(tmp_path, "{app: 'my_env.server.app:app'}")
    (problem,) = component_problems(config, construct=False)
    assert problem.startswith("buffer.explorer_input.tasksets[0].workflow_args.app: ")
    assert "no module named 'my_env'" in problem
    assert component_problems(config_with(tmp_path, f"{{app: '{APP}'}}"), construct=False) == []


def test_without_openenv_it_is_refused_before_start_naming_the_extra(monkeypatch, tmp_path):
    config = config_with(tmp_path, "{url: 'http://127.0.0.1:1'}")
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openenv" else found(name)
    )
    assert (
        "buffer.explorer_input.default_workflow_type = openenv_workflow needs the openenv "
        'package, which is not installed: pip install -e ".[openenv]"'
    ) in component_problems(config, construct=False)


def test_the_workflow_is_registered():
    from trinity.common.workflows import WORKFLOWS, OpenEnvWorkflow

    assert WORKFLOWS.get("openenv_workflow") is OpenEnvWorkflow
