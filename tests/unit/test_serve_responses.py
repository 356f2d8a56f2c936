"""Mode serve's bookkeeping: the served responses (``buffer/responses.py``) and how a commit
becomes a step of the experience queue (``runtime/queue_host.py``)."""

import torch

from trinity.buffer.responses import ResponseLog
from trinity.common.experience import Experience
from trinity.runtime.queue_host import QueueHost


def reply(prompt, sampled, logprobs, version=0):
    """An engine's sample: exact prompt and sampled ids, float32 logprobs."""
    return Experience(
        tokens=prompt + sampled,
        prompt_length=len(prompt),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
        response_text="x",
        model_version=version,
        info={"finish_reason": "stop"},
    )


def test_a_recorded_reply_comes_back_token_exact_with_its_reward_and_group(tmp_path):
    log = ResponseLog(f"sqlite:///{tmp_path / 'b.db'}", "buf")
    # logprobs that float32 holds exactly and one that it rounds: stored bit for bit
    first = reply([5, 6, 7], [8, 9], [-0.5, -1.0 / 3.0], version=2)
    log.record("chatcmpl-a", [first, reply([5, 6, 7], [4], [-0.25])])
    assert log.feedback(["chatcmpl-a"], 0.75, "q1", 3).updated == 2  # both choices
    [a0, a1] = log.commit(step=1)
    assert a0.tokens.tolist() == [5, 6, 7, 8, 9] and a0.prompt_length == 3
    assert torch.equal(a0.logprobs, first.logprobs)  # float32 bits, not re-rounded
    assert a0.model_version == 2 and a1.tokens.tolist() == [5, 6, 7, 4]
    assert (a0.reward, a1.reward) == (0.75, 0.75)
    assert a0.group_id == a1.group_id == "q1"
    assert a0.info["response_id"] == "chatcmpl-a" and (a0.info["choice"], a1.info["choice"]) == (
        0,
        1,
    )
    assert a0.info["run_id"] == 3 and a0.info["task_id"] == "q1"


def test_feedback_is_all_or_nothing_and_names_what_it_refuses(tmp_path):
    log = ResponseLog(f"sqlite:///{tmp_path / 'b.db'}", "buf")
    log.record("r1", [reply([1], [2], [-0.1])])
    log.record("r2", [reply([1], [3], [-0.1])])
    result = log.feedback(["r1", "nope", "r1"], 1.0, None, 0)
    assert (result.updated, result.unknown, result.committed) == (0, ["nope"], [])
    assert log.counts() == {"served": 2, "ready": 0, "committed": 0}  # r1 untouched
    assert log.feedback(["r1"], 0.0, None, 0).updated == 1
    assert log.feedback(["r1"], 1.0, None, 0).updated == 1  # a later reward replaces it
    assert [e.reward for e in log.commit(step=1)] == [1.0]
    refused = log.feedback(["r1", "r2"], 0.5, None, 0)
    assert (refused.updated, refused.committed) == (0, ["r1"])
    assert log.counts() == {"served": 2, "ready": 0, "committed": 1}


def test_commit_takes_one_task_or_all_rewarded_ones_with_groups_together(tmp_path):
    log = ResponseLog(f"sqlite:///{tmp_path / 'b.db'}", "buf")
    for i, task in enumerate(["a", "b", "a", "b", None]):
        log.record(f"r{i}", [reply([1], [i + 2], [-0.1])])
        if task is not None:
            log.feedback([f"r{i}"], float(i), task, 0)
    log.record("unrewarded", [reply([1], [9], [-0.1])])
    assert [e.info["response_id"] for e in log.commit(1, task_id="b")] == ["r1", "r3"]
    assert log.commit(2, task_id="b") == []  # nothing of b left
    log.feedback(["r4"], 4.0, None, 0)  # no task: the reply is its own group
    exps = log.commit(3)
    assert [e.info["response_id"] for e in exps] == ["r0", "r2", "r4"]  # a's together
    assert [e.group_id for e in exps] == ["a", "a", "r4"]
    assert log.commit(4) == []  # the unrewarded reply is never committed
    assert log.committed_steps() == [1, 3]
    assert [e.info["response_id"] for e in log.committed(3)] == ["r0", "r2", "r4"]


def test_each_commit_is_the_next_queue_step_and_a_lost_one_is_written_once(tmp_path):
    database = f"sqlite:///{tmp_path / 'b.db'}"
    host = QueueHost(database, "buf", serving=True)
    host.record("r1", [reply([1], [2], [-0.1])])
    host.record("r2", [reply([1], [3], [-0.1])])
    assert host.commit() == (0, 0)  # nothing rewarded: no step
    host.feedback(["r1"], 1.0, "t", 0)
    assert host.commit() == (1, 1)
    assert host.serve_counts() == {"served": 2, "ready": 0, "committed": 1, "step": 1}
    # The run dies after the log marked step 2 committed, before the queue wrote it.
    host.feedback(["r2"], 0.5, "t", 0)
    ResponseLog(database, "buf").commit(step=2)
    again = QueueHost(database, "buf", serving=True)  # the restarted run
    assert again.last_step() == 2
    assert [e.reward for e in again.get(10, timeout=0).experiences] == [1.0, 0.5]
    assert QueueHost(database, "buf", serving=True).last_step() == 2  # not written twice
