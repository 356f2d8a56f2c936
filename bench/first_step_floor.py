"""The floor under ``trinity run``'s first step: a fresh Python process that does only what
any trainer in one process must before its first SFT step on the quickstart, with plain
torch and transformers (no config, no checks, no data library)::

    python bench/first_step_floor.py QUICKSTART_DIR START_TIME

It imports torch and transformers' model code, loads the quickstart's model and tokenizer,
reads one batch of the SFT data, and takes one AdamW step on it. ``START_TIME`` is the
caller's ``time.time()`` just before it started this process, so the figures count the
interpreter's start as ``bench/startup.py`` counts ``trinity run``'s. Prints one JSON line:
seconds from the start to the imports done (``imports_s``), to the model ready
(``ready_s``) and to the first step done (``first_step_s``).
"""

from __future__ import annotations

import json
import sys
import time


def main(quickstart: str, start: float, batch_size: int = 64) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_utils import PreTrainedModel  # noqa: F401  (what loading needs)

    imported = time.time()
    model = AutoModelForCausalLM.from_pretrained(f"{quickstart}/model")
    tokenizer = AutoTokenizer.from_pretrained(f"{quickstart}/model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    with open(f"{quickstart}/data/sft/train.jsonl") as f:
        rows = [json.loads(line) for _, line in zip(range(batch_size), f, strict=False)]
    ready = time.time()
    texts = [
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": row["prompt"]},
                {"role": "assistant", "content": row["response"]},
            ],
            tokenize=False,
        )
        for row in rows
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model(**batch, labels=labels).loss.backward()
    optimizer.step()
    done = time.time()
    return {"imports_s": imported - start, "ready_s": ready - start, "first_step_s": done - start}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]))))
