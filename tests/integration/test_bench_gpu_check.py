"""bench/gpu_check.py on CPU: the seam the GPU check runs through (CI has no GPU)."""

import json

from bench import gpu_check


def test_gpu_check_runs_its_colocated_stage_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    args = ["--preset", "micro", "--device", "cpu", "--steps", "2", "--tasks", "4"]
    args += ["--repeat", "4", "--response-tokens", "8", "--repeats", "1", "--batches", "8,16"]
    report = gpu_check.main(args + ["--out", str(out), "--work-dir", str(tmp_path)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert not {"engine_error", "decoder_errors", "stage_errors"} & set(report)
    assert report["card"] == "cpu" and report["model"]["parameters"] > 0
    # fp32 on both sides on CPU: each decoder's logprobs are the trainer's
    for decoder in ("auto", "static"):
        assert report["logprobs"][decoder]["tokens"] == 4 * 4 * 8
        assert report["logprobs"][decoder]["max_abs_diff"] < 1e-4
    for rows in ("8", "16"):
        figures = report["engine"]["batches"][rows]
        assert figures["generate"] > 0 and set(figures["speedup_vs_generate"]) == {"auto", "static"}
    assert report["trainer_pass"]["plain"]["tokens_per_s"] > 0
    params_bytes = report["model"]["parameters"] * 4
    assert abs(report["sync"]["released_gb"] * 1e9 - params_bytes) < 0.1 * params_bytes
    assert list(report["stages"]) == ["transformers"]  # the graphs engine's stage: CUDA only
    stage = report["stages"]["transformers"]
    assert stage["finished"] and stage["steps"] == 2
    assert abs(stage["actor_ppo_kl_step1"]) < 1e-4  # on-policy: engine and trainer agree
    assert stage["trainer"]["tokens_per_s"] > 0 and stage["trainer"]["mfu"] is None  # no peak
