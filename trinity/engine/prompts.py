"""``PromptSide``: what an engine does before it samples, read from its model folder.

The tokenizer, the chat template (tools rendered by it, or written into the text where it
ignores them: ``tool_prompt``), the token limits a request is fitted to, and the ids that end
a reply. Every engine that samples from a local folder (``hf_engine.TransformersEngine``,
``vllm_engine.VLLMEngine``) is one, so the same conversation becomes the same token ids
whichever engine samples it, and the OpenAI server and ``Conversation`` read any of them alike.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from trinity.common.models.sampling import SamplingParams
from trinity.engine.tool_prompt import renders_tools, with_tools_in_text

logger = logging.getLogger(__name__)


def eos_ids(model_path: str, tokenizer: Any) -> List[int]:
    """The ids that end a reply: the generation config's ``eos_token_id`` (the model config's
    where the folder has no generation config, as ``from_pretrained`` reads it) and the
    tokenizer's eos."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json in the folder
        try:
            generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))
        except OSError:  # a tokenizer folder only (a Tinker run's): the tokenizer's eos
            generation = GenerationConfig()
    ids = generation.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


class PromptSide:
    """Prompts as token ids, and requests fitted to the model's limits."""

    def __init__(
        self,
        model_path: str,
        *,
        max_model_len: int,
        max_prompt_tokens: Optional[int],
        max_response_tokens: int,
        min_response_tokens: int = 1,
        enable_prompt_truncation: bool = True,
        chat_template: Optional[str] = None,
        enable_thinking: bool = False,
        reasoning_parser: Optional[str] = None,
        tool_call_parser: str = "hermes",
        enable_auto_tool_choice: bool = False,
    ) -> None:
        from transformers import AutoTokenizer

        self.max_model_len = max_model_len
        self.max_prompt_tokens = max_prompt_tokens
        self.max_response_tokens = max_response_tokens
        self.min_response_tokens = min_response_tokens
        self.enable_prompt_truncation = enable_prompt_truncation
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
        self.eos_ids = eos_ids(model_path, self.tokenizer)
        self._renders_tools: Optional[bool] = None
        self._warned_truncation = False
        # A chat template variable (Qwen3's switch for its <think> block); templates that do
        # not read it ignore it, as Jinja ignores any unused variable.
        self.template_kwargs = {"enable_thinking": enable_thinking}
        # how its OpenAI API reads replies: <think> blocks, the tool-call format, and whether
        # it takes tool_choice auto (vLLM's --enable-auto-tool-choice)
        self.reasoning_parser, self.tool_call_parser = reasoning_parser, tool_call_parser
        self.enable_auto_tool_choice = enable_auto_tool_choice

    def apply_chat_template(
        self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
    ) -> List[int]:
        """Token ids of ``messages`` (and ``tools``, OpenAI's function schema list) plus a
        generation prompt, as ``render_chat`` writes them."""
        return self.tokenizer.encode(self.render_chat(messages, tools), add_special_tokens=False)

    def render_chat(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's text of ``messages``; tools and tool calls go through the
        template, or, when it ignores them, into the messages' text (``tool_prompt``)."""
        calls = any(m.get("tool_calls") for m in messages)
        if (tools or calls) and not self._template_renders_tools():
            messages, tools = with_tools_in_text(messages, tools), None
        return self._render(messages, tools or None, add_generation_prompt)

    def _render(self, messages: Any, tools: Any, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def _template_renders_tools(self) -> bool:
        if self._renders_tools is None:  # asked once, of the template in use
            self._renders_tools = renders_tools(self._render)
        return self._renders_tools

    def encode_prompt(self, prompt: str) -> List[int]:
        """Token ids of a raw text prompt (the tokenizer's own special-token rules apply)."""
        return self.tokenizer.encode(prompt)

    def fit(self, prompt: List[int], params: SamplingParams) -> Tuple[List[int], SamplingParams]:
        """Apply prompt truncation and resolve token limits so prompt + response fits.

        Raises ``ValueError`` for a prompt that cannot be served (empty, or no room left in
        ``max_model_len``). A request with ``truncate_prompt`` off is never cut.
        """
        if (
            params.truncate_prompt
            and self.enable_prompt_truncation
            and self.max_prompt_tokens is not None
            and len(prompt) > self.max_prompt_tokens
        ):
            if not self._warned_truncation:
                logger.warning(
                    "prompt of %d tokens truncated to its last max_prompt_tokens=%d tokens "
                    "(warned once)",
                    len(prompt),
                    self.max_prompt_tokens,
                )
                self._warned_truncation = True
            prompt = prompt[-self.max_prompt_tokens :]
        if not prompt:
            raise ValueError("cannot generate from an empty prompt")
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(
                f"prompt has {len(prompt)} tokens, leaving no room to generate within "
                f"max_model_len={self.max_model_len}; shorten the prompt, raise "
                "model.max_model_len, or truncate with model.enable_prompt_truncation and "
                "model.max_prompt_tokens < max_model_len"
            )
        max_tokens = min(params.max_tokens or self.max_response_tokens, room)
        min_tokens = self.min_response_tokens if params.min_tokens is None else params.min_tokens
        return prompt, replace(
            params, max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens)
        )
