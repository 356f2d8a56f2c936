"""DPO data: rows with a prompt, a chosen and a rejected response -> pairs of ``Experience``s.

Each response is tokenized exactly like an SFT answer (``SFTFormatter``: the chat template's
generation prompt, then ``tokenize(response) + [eos]``), so both experiences of a pair share
the prompt tokens and their action mask covers the response including eos.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.buffer.file_reader import describe, load_checked
from trinity.buffer.row_checks import response_text, row_schema
from trinity.buffer.selector import build_cursor, feature_schema
from trinity.buffer.sft import PromptTooLongError, SFTFormatter
from trinity.common.experience import Experience

logger = logging.getLogger("trinity.buffer")

Pair = Tuple[Experience, Experience]


class _LastTurnOnly:
    """The storage's format with ``enable_concatenated_multi_turn`` off: a DPO response is the
    one final assistant turn, whatever the SFT setting says (the guide: SFT only)."""

    enable_concatenated_multi_turn = False

    def __init__(self, format_config: Any) -> None:
        self._format = format_config

    def __getattr__(self, name: str) -> Any:
        if name == "_format":  # not set yet (e.g. while copying): no recursion
            raise AttributeError(name)
        return getattr(self._format, name)


class DPOReader:
    """Reads a DPO dataset (``file`` storage) as interleaved [chosen, rejected] pairs, resumable.

    Every experience of a pair has ``group_id`` = the row index and ``info["is_chosen"]``.
    Rows whose prompt alone exceeds ``max_model_len`` are skipped (``num_dropped``) and the
    batch is refilled; truncated responses are counted in ``num_truncated`` (experiences).
    Malformed rows are found at load: they fail it, or with ``skip_bad_rows`` are left out
    (``num_skipped``, the first few in ``skipped``).
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
        schema = {**row_schema(storage.format, "dpo"), **feature_schema(storage.task_selector)}
        self.loaded = load_checked(storage, columns=schema)
        self.rows, self.num_skipped = self.loaded.rows, self.loaded.num_skipped
        self.skipped = self.loaded.skipped
        self.formatter = SFTFormatter(tokenizer, _LastTurnOnly(storage.format), max_model_len)
        self.cursor = build_cursor(storage.task_selector, self.rows, total_epochs, total_steps)
        self.num_truncated = 0
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, n: Optional[int] = None, timeout: Optional[float] = None) -> List[Experience]:
        """``n`` experiences (``n // 2`` pairs) ``[chosen_0, rejected_0, chosen_1, ...]``, fewer
        only at the end of the data; raises ``StopIteration`` when reading is over. Like every
        reader, ``n`` and ``batch_size`` count experiences. ``timeout`` is accepted for the
        reader interface; file data is never waited on."""
        n = max(1, (n or self.batch_size) // 2)
        indices = self.cursor.next_batch(n)
        pairs: List[Pair] = []
        while indices:
            pairs += [p for p in map(self._pair, indices) if p is not None]
            indices = self.cursor.take(n - len(pairs))
        if not pairs:
            raise StopIteration("the remaining DPO rows were all too long for max_model_len")
        return [exp for pair in pairs for exp in pair]

    def num_steps(self, n: Optional[int] = None) -> int:
        """Number of reads of ``n`` experiences ``read`` hands out over the whole run."""
        return self.cursor.num_steps(max(1, (n or self.batch_size) // 2))

    def _pair(self, index: int) -> Optional[Pair]:
        row, where = self.rows[index], self.loaded.where(index)
        try:
            chosen = self._experience(row, self.storage.format.chosen_key)
            rejected = self._experience(row, self.storage.format.rejected_key)
        except PromptTooLongError as exc:
            self.num_dropped += 1
            logger.warning("%s: skipping %s: %s", describe(self.storage), where, exc)
            return None
        except ValueError as exc:
            raise ValueError(f"{describe(self.storage)}: {where}: {exc}") from exc
        p = chosen.prompt_length
        if p != rejected.prompt_length or not chosen.tokens[:p].equal(rejected.tokens[:p]):
            raise ValueError(
                f"{describe(self.storage)}: {where}: chosen and rejected render different "
                "prompt tokens; the chat template must not depend on the response"
            )
        for exp, is_chosen in ((chosen, True), (rejected, False)):
            exp.group_id = str(index)
            exp.info["is_chosen"] = is_chosen
            self.num_truncated += int(exp.info["truncated"])
        return chosen, rejected

    def _experience(self, row: Dict[str, Any], key: str) -> Experience:
        """Format ``row`` as an SFT row whose answer is the response in column ``key``."""
        fmt = self.storage.format
        response = response_text(row[key], key, fmt.prompt_type)
        if fmt.prompt_type == "messages":
            turn = {"role": "assistant", "content": response}
            return self.formatter.format({**row, fmt.messages_key: [*row[fmt.messages_key], turn]})
        return self.formatter.format({**row, fmt.response_key: response})

    def state_dict(self) -> Dict[str, int]:
        return {
            **self.cursor.state_dict(),
            "num_dropped": self.num_dropped,
            "num_truncated": self.num_truncated,
        }

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.cursor.load_state_dict(state)
        self.num_dropped = int(state.get("num_dropped", 0))
        self.num_truncated = int(state.get("num_truncated", 0))
