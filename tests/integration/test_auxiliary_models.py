"""explorer.auxiliary_models: engines that are not trained, served over the OpenAI API, given
to workflows as ``List[openai.OpenAI]`` (the developer guide's ``auxiliary_models``)."""

import os
import sqlite3

from tests.integration.conftest import HERE, base_overrides
from trinity.buffer.codec import decode_experience
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def test_llm_judge_workflow_trains_with_a_judge_model(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_workflow_type=llm_judge_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
        f"explorer.auxiliary_models=[{{model_path: {micro_model}, engine_num: 2, "
        "max_model_len: 256}]",
    ]
    (result,) = run(CONFIG, overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        assert len(f.readlines()) == 2
    db = os.path.join(result.job_dir, "buffer", "experience_buffer.db")
    with sqlite3.connect(db) as conn:
        rows = [
            decode_experience(blob)
            for (blob,) in conn.execute("SELECT data FROM experience_buffer")
        ]
    assert len(rows) == 2 * 4 * 4
    # every answer went to the judge, whose reply decided the reward
    for exp in rows:
        verdict = exp.info["judge_reply"]
        assert isinstance(verdict, str)
        assert exp.reward == float(verdict.strip().lower().startswith("yes"))
    logs = os.listdir(os.path.join(result.job_dir, "log"))
    assert {"explorer_auxiliary_0_engine_0.log", "explorer_auxiliary_0_engine_1.log"} <= set(logs)
