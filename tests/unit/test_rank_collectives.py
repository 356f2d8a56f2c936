"""The trainer ranks' collectives (``trinity/trainer/distributed.py``) in two gloo processes."""

from __future__ import annotations

import json
import os

import torch

from trinity.common.experience import Experience


def _experiences() -> list:
    return [
        Experience(
            tokens=[5, 6, 7, 8 + i],
            prompt_length=2,
            reward=0.5 * i,
            logprobs=[-0.25, -1.0 / 3.0],
            group_id=f"g{i // 2}",
            info={"is_expert": i == 1, "sample_weight": 0.75},
        )
        for i in range(3)
    ]


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    from trinity.trainer.distributed import (
        broadcast_experiences,
        close_group,
        gather_rows,
        init_group,
    )

    group = init_group(rank, world, port, timeout_s=120)
    got = broadcast_experiences(group, _experiences() if rank == 0 else None)
    end = broadcast_experiences(group, None)
    shares = [[0, 2], [1]]  # rank 0 holds rows 0 and 2, rank 1 row 1
    local = torch.tensor([[float(r), float(r) + 0.5] for r in shares[rank]])
    whole = gather_rows(group, local, shares)
    metrics = group.sum_metrics({"loss": 1.5, "kl": 0.25} if rank == 0 else {})
    result = {
        "tokens": [e.tokens.tolist() for e in got],
        "logprobs": [e.logprobs.tolist() for e in got],
        "rewards": [e.reward for e in got],
        "groups": [e.group_id for e in got],
        "info": [e.info for e in got],
        "end": end,
        "whole": whole.tolist(),
        "metrics": metrics,
        "total": group.total(rank + 1.0),
        "most": group.most(rank * 3),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    close_group()


def test_batch_broadcast_row_gather_and_metric_sums(tmp_path):
    import torch.multiprocessing as mp

    from trinity.trainer.distributed import free_port

    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2)
    sent = _experiences()
    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.json") as f:
            got = json.load(f)
        assert got["tokens"] == [e.tokens.tolist() for e in sent]
        assert got["logprobs"] == [e.logprobs.tolist() for e in sent]  # bit-exact floats
        assert got["rewards"] == [0.0, 0.5, 1.0]
        assert got["groups"] == ["g0", "g0", "g1"]
        assert [i["is_expert"] for i in got["info"]] == [False, True, False]
        assert got["end"] is None  # rank 0 said the buffer is exhausted
        assert got["whole"] == [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]]
        assert got["metrics"] == {"kl": 0.25, "loss": 1.5}  # rank 1 trained no row: adds 0
        assert got["total"] == 3.0 and got["most"] == 3
