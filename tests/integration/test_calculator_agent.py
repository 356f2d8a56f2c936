"""examples/calculator_agent: an agent that only knows openai.OpenAI, with a tool, trained
unmodified: SFT warm-up on tool-use dialogues, then 2 GRPO steps through the endpoint with
``enable_history``. Each stored experience must be one whole episode whose trained tokens are
exactly the replies the model sampled; the tool's results are context."""

import os

import sqlalchemy as sa

from tests.integration.test_guess_number import expected_mask
from tests.integration.test_run import records, weights_changed
from trinity.buffer.codec import decode_experience
from trinity.demo.calculator import prepare_calculator
from trinity.demo.tiny import build_char_tokenizer
from trinity.runtime.launcher import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "calculator_agent")


def test_sft_then_grpo_through_the_openai_client(tmp_path, monkeypatch, ray_cluster):
    paths = prepare_calculator(
        str(tmp_path / "calculator"), preset="micro", n_train=32, n_test=8, n_sft=64
    )
    monkeypatch.setenv("TRINITY_CALCULATOR_DIR", str(tmp_path / "calculator"))
    overrides = [
        f"checkpoint_root_dir={tmp_path}",
        "stages.0.buffer.total_epochs=1",
        "buffer.batch_size=4",
        "algorithm.repeat_times=4",
        "buffer.total_steps=2",
        "explorer.eval_interval=2",
        "buffer.explorer_input.taskset.rollout_args.max_tokens=16",
        "buffer.explorer_input.eval_tasksets.0.rollout_args.max_tokens=16",
    ]
    config = os.path.join(EXAMPLE, "calculator_agent.yaml")
    sft, grpo = run(config, overrides, [EXAMPLE])
    assert weights_changed(paths["model_path"], sft.final_hf)
    assert [r["step"] for r in records(grpo.job_dir, "trainer")] == [1, 2]
    assert weights_changed(sft.final_hf, grpo.final_hf)

    explorer = records(grpo.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert [r["step"] for r in explorer if "eval/calculator_test/accuracy/mean" in r] == [0, 2]

    engine = sa.create_engine(f"sqlite:///{grpo.job_dir}/buffer/calculator_buffer.db")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT data FROM calculator_buffer ORDER BY id")).fetchall()
    episodes = [decode_experience(row.data) for row in rows]
    assert len(episodes) == 2 * 4 * 4  # steps x questions x episodes
    tokenizer = build_char_tokenizer()
    for exp in episodes:
        # A call per reply: the agent's first call, then one after each tool round.
        assert exp.action_mask.tolist() == expected_mask(tokenizer, exp, max_tokens=16)
        assert exp.reward == exp.metrics["accuracy"] in (0.0, 1.0)
        text = tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
        assert text.startswith("<|im_start|>system\n<tools>calc(expression)</tools>")
