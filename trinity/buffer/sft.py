"""SFT data: rows (plaintext prompt/response or chat messages) -> tokenized ``Experience``s.

Every trained assistant turn is tokenized the way the model produces it at rollout time:
the chat template's generation prompt, then ``tokenize(content) + [eos]``. The text the
template puts between turns (turn separators, user/tool turns) is taken from rendering the
conversation prefixes, so it matches the template exactly, and it is masked out.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.buffer.file_reader import describe, load_checked
from trinity.buffer.row_checks import row_schema
from trinity.buffer.selector import build_cursor, feature_schema
from trinity.common.experience import Experience

logger = logging.getLogger("trinity.buffer")

Message = Dict[str, Any]


class PromptTooLongError(ValueError):
    """The prompt alone fills ``max_model_len``: no response token would be left to train on."""


class SFTFormatter:
    """Turns one SFT data row into an ``Experience`` (tokens, prompt_length, action_mask)."""

    def __init__(
        self, tokenizer: Any, format_config: Any, max_model_len: Optional[int] = None
    ) -> None:
        self.tokenizer = tokenizer
        self.format_config = format_config
        self.max_model_len = max_model_len
        self.chat_template = format_config.chat_template or None  # None: the tokenizer's own
        if self.chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "SFT formatting needs a chat template: set `format.chat_template` (or "
                "`model.custom_chat_template`), or use a tokenizer that has one"
            )
        if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
            raise ValueError("SFT formatting needs a tokenizer with an eos token")

    def format(self, row: Dict[str, Any]) -> Experience:
        """The experience of ``row``; the response is truncated to fit ``max_model_len``."""
        messages = self.messages(row)
        tools = row.get(self.format_config.tools_key) if self.format_config.tools_key else None
        assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        trained = assistant if self.format_config.enable_concatenated_multi_turn else assistant[-1:]
        segments = self._segments(messages[: assistant[-1] + 1], trained, tools or None)
        prompt = segments[0][0]
        tokens = [t for ids, _ in segments for t in ids]
        mask = [int(flag) for ids, flag in segments[1:] for _ in ids]
        truncated = False
        if self.max_model_len is not None and len(tokens) > self.max_model_len:
            if len(prompt) >= self.max_model_len:
                raise PromptTooLongError(
                    f"prompt has {len(prompt)} tokens, max_model_len is {self.max_model_len}"
                )
            tokens, mask = tokens[: self.max_model_len], mask[: self.max_model_len - len(prompt)]
            truncated = True
        return Experience(
            tokens=tokens,
            prompt_length=len(prompt),
            action_mask=mask,
            info={"truncated": truncated},
            prompt_text=self.tokenizer.decode(prompt),
            response_text=self.tokenizer.decode(tokens[len(prompt) :]),
        )

    def messages(self, row: Dict[str, Any]) -> List[Message]:
        """The conversation in ``row``, ending with (at least) one assistant turn."""
        fmt = self.format_config
        if fmt.prompt_type == "messages":
            messages = row.get(fmt.messages_key)
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise ValueError(f"'{fmt.messages_key}' must be a list of {{role, content}} dicts")
        elif fmt.prompt_type == "plaintext":
            system = row.get(fmt.system_prompt_key) if fmt.system_prompt_key else None
            system = system or fmt.system_prompt  # the row's system prompt wins over the config's
            messages = [{"role": "system", "content": system}] if system else []
            messages += [
                {"role": "user", "content": row.get(fmt.prompt_key)},
                {"role": "assistant", "content": row.get(fmt.response_key)},
            ]
        else:
            raise ValueError(
                f"format.prompt_type = {fmt.prompt_type!r} is not valid; "
                "choose plaintext or messages"
            )
        roles = [m.get("role") for m in messages]
        if "assistant" not in roles:
            raise ValueError("the conversation has no assistant turn to train on")
        if roles.index("assistant") == 0:
            raise ValueError("the conversation starts with an assistant turn: there is no prompt")
        return messages

    def _segments(
        self, messages: List[Message], trained: List[int], tools: Optional[list]
    ) -> List[Tuple[List[int], bool]]:
        """(token ids, is_action) pieces; the first piece is the prompt."""
        eos, eos_id = self.tokenizer.eos_token, self.tokenizer.eos_token_id
        segments: List[Tuple[List[int], bool]] = []
        consumed = ""  # template text already turned into segments
        for k in trained:
            turn = messages[k]
            if not isinstance(turn.get("content"), str) and not turn.get("tool_calls"):
                raise ValueError(f"assistant turn {k} has no text content: {turn.get('content')!r}")
            before = self._render(messages[:k], True, tools)
            self._check_prefix(before, consumed, k)
            # The reply is what the template writes for the turn (its content, then any tool
            # calls) up to its end-of-turn token: what a model answering ``before`` samples.
            after = self._render(messages[: k + 1], False, tools)
            self._check_prefix(after, before, k)
            end = after.find(eos, len(before))
            if end < 0 or not after[len(before) : end].startswith(turn.get("content") or ""):
                raise self._layout_error(k)  # the content must be written as given
            segments.append((self._encode(before[len(consumed) :]), False))
            segments.append((self._encode(after[len(before) : end]) + [eos_id], True))
            consumed = after[: end + len(eos)]
        self._check_prefix(self._render(messages, False, tools), consumed, trained[-1])
        return segments

    def _check_prefix(self, text: str, prefix: str, turn: int) -> None:
        if not text.startswith(prefix):
            raise self._layout_error(turn)

    def _layout_error(self, turn: int) -> ValueError:
        return ValueError(
            "the chat template does not render assistant turns as "
            f"<generation prompt><reply>{self.tokenizer.eos_token} (turn {turn}), so "
            "response tokens cannot be located; use a template that does"
        )

    def _render(self, messages: List[Message], generation_prompt: bool, tools: Any) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            chat_template=self.chat_template,
        )

    def _encode(self, text: str) -> List[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class SFTReader:
    """Reads an SFT dataset (``file`` storage) as batches of experiences, resumable.

    Rows whose prompt alone exceeds ``max_model_len`` are skipped (counted in
    ``num_dropped``) and the batch is refilled; truncated responses are counted in
    ``num_truncated``. Malformed rows are found at load: they fail it, or with
    ``skip_bad_rows`` are left out (``num_skipped``, the first few in ``skipped``).
    """

    def __init__(
        self,
        storage: Any,
        tokenizer: Any,
        batch_size: int,
        total_epochs: int = 1,
        total_steps: Optional[int] = None,
        max_model_len: Optional[int] = None,
    ) -> None:
        self.storage = storage
        self.batch_size = batch_size
        schema = {**row_schema(storage.format, "sft"), **feature_schema(storage.task_selector)}
        self.loaded = load_checked(storage, columns=schema)
        self.rows, self.num_skipped = self.loaded.rows, self.loaded.num_skipped
        self.skipped = self.loaded.skipped
        self.formatter = SFTFormatter(tokenizer, storage.format, max_model_len)
        self.cursor = build_cursor(storage.task_selector, self.rows, total_epochs, total_steps)
        self.num_truncated = 0
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self.rows)

    def read(
        self, batch_size: Optional[int] = None, timeout: Optional[float] = None
    ) -> List[Experience]:
        """The next batch; raises ``StopIteration`` when reading is over.

        ``timeout`` is accepted so this reads like the experience queue; file data is
        always available, so it is never waited on.
        """
        n = batch_size or self.batch_size
        indices = self.cursor.next_batch(n)
        batch: List[Experience] = []
        while indices:
            batch += [e for e in map(self._experience, indices) if e is not None]
            indices = self.cursor.take(n - len(batch))
        if not batch:
            raise StopIteration("the remaining SFT rows were all too long for max_model_len")
        return batch

    def num_steps(self, batch_size: Optional[int] = None) -> int:
        """Number of batches ``read`` hands out over the whole run."""
        return self.cursor.num_steps(batch_size or self.batch_size)

    def _experience(self, index: int) -> Optional[Experience]:
        try:
            exp = self.formatter.format(self.rows[index])
        except PromptTooLongError as exc:
            self.num_dropped += 1
            where = self.loaded.where(index)
            logger.warning("%s: skipping %s: %s", describe(self.storage), where, exc)
            return None
        except ValueError as exc:
            where = self.loaded.where(index)
            raise ValueError(f"{describe(self.storage)}: {where}: {exc}") from exc
        self.num_truncated += int(exp.info["truncated"])
        return exp

    def state_dict(self) -> Dict[str, int]:
        return self.cursor.state_dict()

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.cursor.load_state_dict(state)
