"""frozen_lake_workflow (the original Trinity-RFT's FrozenLake): maps, the grid as text, the
answers read, and whole walks against a scripted stand-in model, each walk one experience."""

import importlib.util
import os
import sys
import textwrap
from collections import deque

import pytest

from tests.unit.test_multiturn import conversation
from tests.unit.test_preflight import BASE
from trinity.common.config import GenerationConfig, load_config
from trinity.common.config.base import ConfigError, validate_model
from trinity.common.experience import Experience
from trinity.common.workflows import WORKFLOWS, FrozenLakeWorkflow, Task
from trinity.common.workflows.frozen_lake import STUCK, FrozenLakeArgs
from trinity.common.workflows.frozen_lake_env import (
    FrozenLake,
    generate_map,
    parse_action,
    render,
)
from trinity.demo.tiny import IM_END, build_char_tokenizer
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive

needs_gymnasium = pytest.mark.skipif(
    importlib.util.find_spec("gymnasium") is None,
    reason='gymnasium is not installed (pip install -e ".[envs]")',
)

TOKENIZER = build_char_tokenizer(max_length=4096)
END_ID = TOKENIZER.convert_tokens_to_ids(IM_END)
CORPUS_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(__file__)),
    "corpus/trinity_rft/0.4.0/examples/grpo_frozen_lake/frozen_lake.yaml",
)
LAKE = ["SFF", "FHF", "FFG"]  # from the top left, right twice then down twice reaches G


def shortest_path(desc):
    """The fewest moves from S to G around the holes (breadth first), or None."""
    start = next((r, row.index("S")) for r, row in enumerate(desc) if "S" in row)
    todo, seen = deque([(start, 0)]), {start}
    while todo:
        (row, col), moves = todo.popleft()
        if desc[row][col] == "G":
            return moves
        for r, c in ((row + 1, col), (row - 1, col), (row, col + 1), (row, col - 1)):
            inside = 0 <= r < len(desc) and 0 <= c < len(desc[0])
            if inside and (r, c) not in seen and desc[r][c] != "H":
                seen.add((r, c))
                todo.append(((r, c), moves + 1))
    return None


class ScriptedModel:
    """What the workflow sees of ``ModelWrapper``: each call's prompt continues the earlier
    calls' exact tokens (``Conversation``, as the engines build it) and the reply is the next
    scripted text, cut at the call's ``max_tokens``."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.conversation = conversation(TOKENIZER)
        self.sent = []  # (messages, sampling) of each call

    def chat(self, messages, tools=None, **sampling):
        self.sent.append((messages, sampling))
        prompt = self.conversation.prompt_ids(messages)
        ids = TOKENIZER.encode(self.replies.pop(0), add_special_tokens=False) + [END_ID]
        sampled = ids[: sampling.get("max_tokens") or len(ids)]
        text = TOKENIZER.decode(sampled, skip_special_tokens=True)
        reply = {"role": "assistant", "content": text}
        self.conversation.record(messages, None, prompt, [(reply, sampled)])
        return [
            Experience(
                tokens=prompt + sampled,
                prompt_length=len(prompt),
                logprobs=[-0.5] * len(sampled),
                response_text=text,
            )
        ]

    async def chat_async(self, messages, tools=None, **sampling):
        return self.chat(messages, tools, **sampling)

    async def prompt_length_async(self, messages, tools=None):
        return len(self.conversation.prompt_ids(messages))


def walk(replies, n=1, max_tokens=None, row=None, **args):
    """The experiences of ``n`` walks on ``LAKE`` (or the row's lake) answered by
    ``replies``, and the model."""
    task = Task(
        workflow="frozen_lake_workflow",
        raw_task=row or {"seed": 7},
        rollout_args=GenerationConfig(n=n, temperature=0.7, max_tokens=max_tokens),
        workflow_args={"desc": LAKE, **args} if row is None else args,
        taskset_name="frozenlake",
        index=3,
    )
    model = ScriptedModel(replies)
    return task.to_workflow(model).run(), model


def trained(exp):
    """The response tokens the loss covers, as text."""
    response = exp.tokens[exp.prompt_length :].tolist()
    return TOKENIZER.decode(
        [t for t, m in zip(response, exp.action_mask.tolist(), strict=True) if m]
    )


# ---- the lake ------------------------------------------------------------------------------
@needs_gymnasium
@pytest.mark.parametrize("seed,size,p", [(42, 3, 0.8), (43, 4, 0.8), (44, 5, 0.6), (7, 6, 0.5)])
def test_a_drawn_lake_has_a_path_to_its_goal_and_the_seed_fixes_it(seed, size, p):
    desc = generate_map(size, p, seed, max_steps=8)
    assert desc == generate_map(size, p, seed, max_steps=8)
    assert len(desc) == size and all(len(row) == size for row in desc)
    assert "".join(desc).count("S") == 1 and "".join(desc).count("G") == 1
    assert set("".join(desc)) <= set("SFHG")
    moves = shortest_path(desc)
    assert moves is not None and moves <= 9  # within env_max_steps + 1
    assert generate_map(size, p, seed + 1000, max_steps=8) != desc  # another seed, another lake


def test_the_grid_shows_one_cell_a_tile_with_the_player():
    assert render(LAKE, (0, 0)) == " P \t _ \t _ \t\n _ \t O \t _ \t\n _ \t _ \t G \t"
    assert render(LAKE, (0, 2)) == " _ \t _ \t P \t\n _ \t O \t _ \t\n _ \t _ \t G \t"
    assert render(LAKE, (1, 1)).splitlines()[1] == " _ \t X \t _ \t"  # fallen in
    assert render(LAKE, (2, 2)).splitlines()[2] == " _ \t _ \t √ \t"  # on the goal


@pytest.mark.parametrize(
    "reply,action",
    [
        ("I will go up.\n```Up```", 4),
        ("```2```", 2),
        ("```\nleft\n```", 1),
        ("```RIGHT```", 3),
        ("First ```Up```, no: ```Down```", 2),  # the last block counts
        ("Up", None),  # no fenced block
        ("```jump```", None),
        ("```5```", None),
        ("```Up", None),
    ],
)
def test_the_move_is_the_last_fenced_block_by_word_or_number(reply, action):
    assert parse_action(reply) == action


@needs_gymnasium
def test_an_answer_naming_no_move_leaves_the_player_where_it_is():
    lake = FrozenLake(LAKE, is_slippery=False, seed=0)
    assert lake.step(None) == (0.0, False) and lake.player == (0, 0)
    assert lake.step(3) == (0.0, False) and lake.player == (0, 1)  # right
    assert lake.step(2) == (0.0, True) and lake.player == (1, 1)  # down, into the hole


@needs_gymnasium
def test_a_slippery_lake_slides_the_same_way_for_the_same_seed():
    def positions(seed):
        lake = FrozenLake(["SFFF", "FFFF", "FFFF", "FFFG"], is_slippery=True, seed=seed)
        return [(lake.step(3), lake.player)[1] for _ in range(6)]

    assert positions(5) == positions(5)
    assert any(positions(seed) != positions(5) for seed in range(6, 12))


# ---- walks ---------------------------------------------------------------------------------
@needs_gymnasium
def test_a_walk_to_the_goal_earns_1_and_trains_on_the_replies_only():
    moves = ["Go right.\n```Right```", "```Right```", "Now down ```Down```", "```2```"]
    (exp,), model = walk(moves)
    assert exp.reward == 1.0
    assert exp.metrics == {"env_steps": 4.0, "env_done": 1.0, "test_score": 1.0}
    assert exp.info["terminate_reason"] == "goal" and exp.info["turns"] == 4
    assert trained(exp) == "".join(m + IM_END for m in moves)
    replies = sum(len(TOKENIZER.encode(m, add_special_tokens=False)) + 1 for m in moves)
    assert int(exp.action_mask.sum()) == replies
    assert exp.logprobs.tolist() == [-0.5 if m else 0.0 for m in exp.action_mask.tolist()]
    # the system turn, then one grid a turn with the player where the moves took it
    system, first = model.sent[0][0]
    assert system["role"] == "system" and "```Left```" in system["content"]
    assert first["content"].startswith("Current observation (0):\n P \t _ \t _ \t\n")
    last = model.sent[3][0][-1]["content"]
    assert last.startswith("Current observation (3):\n _ \t _ \t _ \t\n _ \t O \t P \t\n")
    assert "at most 7 more move(s)" in last
    assert all(s["n"] == 1 and s["temperature"] == 0.7 for _, s in model.sent)
    assert exp.turn_states[0] == "P at (0, 0) with 10 move(s) left"


@needs_gymnasium
def test_a_walk_into_a_hole_ends_with_0():
    (exp,), _ = walk(["```Right```", "```Down```"])  # (1, 1) is a hole
    assert exp.reward == 0.0 and exp.info["terminate_reason"] == "hole"
    assert exp.metrics == {"env_steps": 2.0, "env_done": 1.0, "test_score": 0.0}


@needs_gymnasium
def test_answers_naming_no_move_until_the_last_reply_score_0():
    (exp,), model = walk(["I am not sure."] * 3, agent_max_steps=3)
    assert exp.reward == 0.0 and exp.info["terminate_reason"] == "max_steps_reached"
    assert exp.metrics == {"env_steps": 3.0, "env_done": 0.0, "test_score": 0.0}
    notes = [STUCK in sent[-1]["content"] for sent, _ in model.sent]
    assert notes == [False, True, True]  # the player did not move after the last reply
    assert "at most 1 more move(s)" in model.sent[2][0][-1]["content"]


@needs_gymnasium
def test_a_walk_stops_when_its_token_budget_is_spent():
    # the replies and the messages between them may take max_tokens tokens in all
    first = len(TOKENIZER.encode("```Right```", add_special_tokens=False)) + 1
    # the second turn's message alone takes more than 50: it is never sent
    (exp,), model = walk(["```Right```"] * 3, max_tokens=first + 50)
    assert [s["max_tokens"] for _, s in model.sent] == [first + 50]
    assert exp.info["terminate_reason"] == "max_tokens_reached"
    assert exp.metrics == {"env_steps": 1.0, "env_done": 0.0, "test_score": 0.0}
    assert trained(exp) == f"```Right```{IM_END}"
    # room for one more turn: its reply may take what the conversation left of the budget
    budget = first + 300
    (exp,), model = walk(["```Right```"] * 3, max_tokens=budget)
    assert [s["max_tokens"] for _, s in model.sent] == [budget, budget - exp.turn_starts[1]]
    assert exp.info["terminate_reason"] == "max_tokens_reached"
    assert exp.metrics["env_steps"] == 2.0 and len(exp.tokens) - exp.prompt_length <= budget


@needs_gymnasium
def test_each_of_n_walks_starts_afresh_and_run_async_plays_the_same():
    import asyncio

    moves = ["```Right```", "```Right```", "```Down```", "```Down```"]
    exps, _ = walk(moves * 2, n=2)
    assert [e.reward for e in exps] == [1.0, 1.0]
    task = Task(
        workflow="frozen_lake_workflow",
        raw_task={"seed": 7},
        rollout_args=GenerationConfig(n=1),
        workflow_args={"desc": LAKE},
    )
    (exp,) = asyncio.run(task.to_workflow(ScriptedModel(moves)).run_async())
    assert exp.tokens.tolist() == exps[0].tokens.tolist()


@needs_gymnasium
def test_a_row_draws_its_lake_from_size_p_and_seed():
    row = {"seed": 42, "size": 3, "p": 0.8, "index": 0, "uid": "42_0"}
    workflow = WORKFLOWS.get("frozen_lake_workflow")(
        model=None, task=Task(raw_task=row, workflow_args={"env_max_steps": 8})
    )
    assert workflow.desc == generate_map(3, 0.8, 42, 8) and workflow.seed == 42
    with pytest.raises(ValueError, match="row 0: a drawn lake needs the column 'size'"):
        WORKFLOWS.get("frozen_lake_workflow")(model=None, task=Task(raw_task={"seed": 1}))


def test_workflow_args_are_the_originals_and_are_checked():
    assert FrozenLakeArgs() == FrozenLakeArgs(
        env_max_steps=8, agent_max_steps=10, desc=None, is_slippery=False
    )
    with pytest.raises(ConfigError, match="one start S and a goal G"):
        validate_model(FrozenLakeArgs, {"desc": ["SF", "FF"]})


# ---- before start --------------------------------------------------------------------------
@needs_gymnasium
def test_the_corpus_config_is_accepted_before_start(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path))
    config, problems = derive(load_config(CORPUS_CONFIG))
    explorer_input = config.buffer.explorer_input
    workflows = [s.default_workflow_type for s in explorer_input.tasksets]
    workflows += [s.default_workflow_type for s in explorer_input.eval_tasksets]
    assert workflows == ["frozen_lake_workflow", "frozen_lake_workflow"]
    assert not [p for p in problems if "workflow" in p]
    assert component_problems(config, construct=False) == []


def test_without_gymnasium_it_is_refused_before_start_naming_the_extra(monkeypatch, tmp_path):
    path = tmp_path / "c.yaml"
    extra = "    default_workflow_type: frozen_lake_workflow\n"
    path.write_text(textwrap.dedent(BASE) + extra)
    config, _ = derive(load_config(str(path)))
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gymnasium" else found(name)
    )
    assert component_problems(config, construct=False) == [
        "buffer.explorer_input.default_workflow_type = frozen_lake_workflow needs the gymnasium "
        'package, which is not installed: pip install -e ".[envs]"'
    ]
    monkeypatch.setitem(sys.modules, "gymnasium.envs.toy_text.frozen_lake", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[envs\]"'):
        FrozenLake(LAKE, is_slippery=False, seed=0)


def test_the_workflow_is_registered_under_the_originals_name():
    assert WORKFLOWS.get("frozen_lake_workflow") is FrozenLakeWorkflow
