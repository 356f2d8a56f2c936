"""One training experience from a whole multi-turn episode.

With ``enable_history``, every model call of an episode is recorded as the ``Experience`` the
engine returned: that call's exact prompt ids followed by the ids it sampled. Because each
turn's prompt continues the previous turn's tokens (``trinity.engine.conversation``), the last
call's tokens hold the whole episode, and the earlier calls say which spans the model sampled.

    history = self.model.extract_experience_from_history()
    exp = merge_turns(history, reward=final_reward)   # one experience, trained on every reply

The result's ``action_mask`` is 1 exactly on sampled tokens; tool results, user turns and
chat-template tokens between replies are 0 (kept as context, not trained on), and so are
their ``logprobs``. ``turn_starts`` says where each reply begins in the response; a workflow
that knows its environment's state before each reply passes it as ``states`` (one string per
call, equal strings for equal states), which GiGPO's step-level groups need.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from trinity.common.config import GenerationConfig
from trinity.common.experience import Experience


class EpisodeBreak(ValueError):
    """A turn's prompt does not continue the previous turn's tokens."""


def merge_turns(
    turns: Sequence[Experience],
    reward: Optional[float] = None,
    info: Optional[Dict[str, Any]] = None,
    states: Optional[Sequence[str]] = None,
) -> Experience:
    """The episode of ``turns`` (recorded calls, oldest first) as one ``Experience``.

    Tokens are the last call's prompt and reply; the prompt part is the first call's prompt.
    ``states``: the environment's state each call answered (``Experience.turn_states``).
    Raises ``EpisodeBreak`` naming the turn whose prompt does not start with the previous
    call's prompt and reply (the conversation was re-rendered, truncated or branched: split
    the episode there, e.g. one experience per branch).
    """
    if not turns:
        raise ValueError("merge_turns needs at least one recorded call")
    if states is not None and len(states) != len(turns):
        raise ValueError(f"merge_turns got {len(states)} states for {len(turns)} calls: one each")
    for k in range(1, len(turns)):
        before, now = turns[k - 1].tokens, turns[k].tokens
        if len(now) < len(before) or not torch.equal(now[: len(before)], before):
            raise EpisodeBreak(
                f"turn {k + 1}'s prompt does not continue turn {k}'s tokens: its conversation "
                "was not the previous one plus that reply (re-rendered, truncated or branched)"
            )
    last, prompt_length = turns[-1], turns[0].prompt_length
    mask = torch.zeros(len(last.tokens) - prompt_length, dtype=torch.bool)
    logprobs = torch.zeros(len(mask), dtype=torch.float)
    starts = []
    for turn in turns:
        start, end = turn.prompt_length - prompt_length, len(turn.tokens) - prompt_length
        starts.append(start)
        mask[start:end] = turn.action_mask
        if turn.logprobs is not None:
            logprobs[start:end] = turn.logprobs
    return Experience(
        tokens=last.tokens.clone(),
        prompt_length=prompt_length,
        reward=reward,
        logprobs=logprobs,
        action_mask=mask,
        info={"turns": len(turns), **(info or {})},
        prompt_text=turns[0].prompt_text,
        response_text=last.response_text,
        model_version=min(t.model_version for t in turns),
        turn_starts=starts,
        turn_states=[str(state) for state in states] if states is not None else None,
    )


def conversations(turns: Sequence[Experience]) -> List[List[Experience]]:
    """``turns`` (recorded calls, oldest first) grouped into conversations: a call joins the
    first conversation whose last call its tokens continue, else starts one. Calls of several
    agents, or a conversation re-rendered mid-episode (a harness compacting its history), so
    become several groups, each one ``merge_turns`` takes."""
    groups: List[List[Experience]] = []
    for turn in turns:
        for group in groups:
            last = group[-1].tokens
            if len(turn.tokens) >= len(last) and torch.equal(turn.tokens[: len(last)], last):
                group.append(turn)
                break
        else:
            groups.append([turn])
    return groups


def turn_sampling(args: GenerationConfig, **changes: Any) -> Dict[str, Any]:
    """``model.chat``'s sampling arguments for one turn of an episode, from a taskset's
    ``rollout_args``: one reply (each episode is its own conversation), ``changes`` applied."""
    sampling = dict(
        n=1,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop=args.stop or None,
    )
    return {**sampling, **changes}


async def reply_room(
    model: Any, messages: List[Dict[str, Any]], calls: Sequence[Experience], budget: Optional[int]
) -> Optional[int]:
    """Tokens the next reply of an episode may take: the episode's ``budget`` (a taskset's
    ``rollout_args.max_tokens``) less what the conversation holds after its first prompt, the
    new message included (``calls``: the episode's replies so far); None without a budget."""
    if budget is None or not calls:
        return budget
    prompt = await model.prompt_length_async(messages)
    return budget - (prompt - calls[0].prompt_length)
