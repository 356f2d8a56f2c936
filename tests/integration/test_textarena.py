"""examples/environments/textarena.yaml: 2 GRPO steps of TextArena's GuessTheNumber-v0 on the
micro model (micro32: its 1024 positions hold the game's rules and a few turns).

Each stored experience must be one whole game: the tokens the conversation's chat template
writes, trained on the model's replies only, with the reward the game gives when the same
replies are played again on a fresh game of the row's seed.
"""

import json
import os

import pytest
import sqlalchemy as sa

from tests.integration.test_guess_number import expected_mask
from tests.integration.test_run import records, weights_changed
from trinity.buffer.codec import decode_experience
from trinity.demo.tiny import IM_END, build_char_tokenizer
from trinity.runtime.launcher import run

pytest.importorskip("textarena")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIG = os.path.join(ROOT, "examples", "environments", "textarena.yaml")
REPLY = 8  # max_reply_tokens


def stored_experiences(job_dir: str, buffer: str = "guess_buffer") -> list:
    engine = sa.create_engine(f"sqlite:///{job_dir}/buffer/{buffer}.db")
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT data FROM {buffer} ORDER BY id")).fetchall()
    return [decode_experience(row.data) for row in rows]


def replies(tokenizer, exp) -> list:
    """The model's replies in an experience: its trained spans, each up to end-of-turn."""
    response = exp.tokens[exp.prompt_length :].tolist()
    spans, current = [], []
    for token, trained in zip(response, exp.action_mask.tolist(), strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    spans += [current] if current else []
    return [tokenizer.decode(span).removesuffix(IM_END) for span in spans]


def test_two_grpo_steps_of_guess_the_number(tmp_path, monkeypatch, micro32_model, ray_cluster):
    from textarena.agents.basic_agents import STANDARD_GAME_PROMPT

    from trinity.common.workflows.textarena_env import Game

    data = tmp_path / "seeds"
    data.mkdir()
    for split, seeds in (("train", range(4)), ("test", (900, 901))):
        rows = "".join(json.dumps({"seed": s}) + "\n" for s in seeds)
        (data / f"{split}.jsonl").write_text(rows)
    monkeypatch.setenv("TRINITY_TEXTARENA_DIR", str(data))
    overrides = [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro32_model}",
        "model.max_prompt_tokens=760",  # the system turn and the rules: 714 characters
        "model.max_response_tokens=240",
        f"buffer.explorer_input.taskset.workflow_args.max_reply_tokens={REPLY}",
        f"buffer.explorer_input.eval_tasksets.0.workflow_args.max_reply_tokens={REPLY}",
        "buffer.batch_size=2",
        "algorithm.repeat_times=4",
        "algorithm.optimizer.lr=1e-3",
        "buffer.total_steps=2",
        "explorer.runner_per_model=2",
        "explorer.eval_interval=2",
    ]
    (result,) = run(CONFIG, overrides, [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert weights_changed(micro32_model, result.final_hf)
    explorer = records(result.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert all(1 <= r["rollout/turns/mean"] <= 6 for r in steps)
    assert [r["step"] for r in explorer if "eval/guess_test/turns/mean" in r] == [0, 2]

    tokenizer = build_char_tokenizer(1024)
    episodes = stored_experiences(result.job_dir)
    assert len(episodes) == 2 * 2 * 4  # steps x games x episodes
    assert any(exp.info["turns"] >= 2 for exp in episodes)  # games of several turns merged
    for exp in episodes:
        assert exp.action_mask.tolist() == expected_mask(tokenizer, exp, max_tokens=REPLY)
        said = replies(tokenizer, exp)
        assert len(said) == exp.info["turns"] == exp.metrics["turns"]
        # the same replies on a fresh game of the seed: the same conversation and reward
        game = Game("GuessTheNumber-v0", {}, 1, seed=exp.info["seed"])
        messages = [{"role": "system", "content": STANDARD_GAME_PROMPT}]
        for reply in said:
            _, seen = game.observe()
            text = "\n".join(f"[GAME] {m.strip()}" for p, m, _ in seen if p == -1)
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
            done = game.step(reply)
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        text = tokenizer.decode(exp.tokens)
        if text.endswith(IM_END):  # the template writes a newline after the last turn
            expected = rendered.removesuffix("\n")
        else:  # the last reply was cut at max_reply_tokens (it may end with a newline itself)
            expected = rendered.removesuffix(f"{IM_END}\n")
        assert text == expected
        if exp.info["end"] == "game_over":
            assert done and exp.reward == game.close()[0][0]
        else:
            assert exp.reward == 0.0
