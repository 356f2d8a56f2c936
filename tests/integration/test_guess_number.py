"""examples/guess_number: the SFT warm-up and 2 GRPO steps of the multi-turn game, micro model.

The GRPO stage records every model call (``enable_history``); each stored experience must be
one whole episode whose trained tokens are the model's guesses and nothing else.
"""

import os
import re

import sqlalchemy as sa

from tests.integration.test_run import records, weights_changed
from trinity.buffer.codec import decode_experience
from trinity.demo.guess_number import prepare_guess_number
from trinity.demo.tiny import IM_END, IM_START, build_char_tokenizer
from trinity.runtime.launcher import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIG = os.path.join(ROOT, "examples", "guess_number", "guess_number.yaml")


def stored_experiences(job_dir: str, name: str = "guess_number_buffer") -> list:
    """Every experience the explorer wrote to the queue ``name``'s store, trained on or not."""
    engine = sa.create_engine(f"sqlite:///{job_dir}/buffer/{name}.db")
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT data FROM {name} ORDER BY id")).fetchall()
    return [decode_experience(row.data) for row in rows]


def test_sft_then_grpo_on_whole_episodes(tmp_path, monkeypatch, ray_cluster):
    data = tmp_path / "guess_number"
    paths = prepare_guess_number(str(data), preset="micro", n_sft=64, n_train=32, n_test=8)
    monkeypatch.setenv("TRINITY_GUESS_NUMBER_DIR", str(data))
    overrides = [
        f"checkpoint_root_dir={tmp_path}",
        "stages.0.buffer.total_steps=2",
        "stages.0.buffer.train_batch_size=16",
        "buffer.batch_size=4",
        "algorithm.repeat_times=4",
        "buffer.total_steps=2",
        "buffer.explorer_input.eval_tasksets.0.repeat_times=1",
        "explorer.eval_interval=2",
    ]
    sft, grpo = run(CONFIG, overrides, [])
    assert weights_changed(paths["model_path"], sft.final_hf)
    assert [r["step"] for r in records(grpo.job_dir, "trainer")] == [1, 2]
    assert weights_changed(sft.final_hf, grpo.final_hf)

    explorer = records(grpo.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert all(1 <= r["rollout/turns/mean"] <= 4 for r in steps)
    evals = [r["step"] for r in explorer if "eval/guess_number_test/accuracy/mean" in r]
    assert evals == [0, 2]

    episodes = stored_experiences(grpo.job_dir)
    assert len(episodes) == 2 * 4 * 4  # steps x games x episodes: one experience per episode
    tokenizer = build_char_tokenizer()
    for exp in episodes:
        assert exp.action_mask.tolist() == expected_mask(tokenizer, exp, max_tokens=4)
        assert exp.info["turns"] == int(exp.metrics["turns"])
        assert exp.reward == exp.metrics["accuracy"] in (0.0, 1.0)
        response = zip(exp.tokens[exp.prompt_length :].tolist(), exp.action_mask, strict=True)
        context = tokenizer.decode([t for t, m in response if not m])
        assert len(re.findall(r"(higher|lower) \d+-\d+", context)) == exp.info["turns"] - 1
        assert len(exp.turn_states) == exp.info["turns"] == len(exp.turn_starts)

    # GiGPO from the same warm-up: the finished SFT stage is resumed, not trained again
    variant = ["algorithm.algorithm_type=gigpo", "stages.0.algorithm.algorithm_type=sft"]
    sft_again, gigpo = run(CONFIG, overrides + variant + ["stages.1.stage_name=gigpo"], [])
    assert sft_again.final_hf == sft.final_hf
    assert len(records(sft.job_dir, "trainer")) == len(records(sft_again.job_dir, "trainer"))
    trained = records(gigpo.job_dir, "trainer")
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["gigpo/anchor_groups_total"] >= 4 for r in trained)  # an opening per game


def expected_mask(tokenizer, exp, max_tokens: int) -> list:
    """1 on each reply: what follows a generation prompt, up to its end-of-turn token
    (included) or ``max_tokens`` tokens; 0 on everything the template and environment wrote."""
    tokens = exp.tokens.tolist()
    cue = tokenizer.encode(f"{IM_START}assistant\n", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids(IM_END)
    mask, at = [0] * len(tokens), 0
    while at < len(tokens):
        if tokens[at : at + len(cue)] != cue:
            at += 1
            continue
        at += len(cue)
        for k in range(at, min(at + max_tokens, len(tokens))):
            mask[k] = 1
            if tokens[k] == end:
                break
    return mask[exp.prompt_length :]
