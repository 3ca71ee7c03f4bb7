"""Conversational prompts rendered once, by unirl, with the tokenizer's chat template (or the
recipe's ``task.chat_template``), so every backend trains on the same text and token ids.

A backend never applies a template itself: TRL and OpenRLHF receive the rendered text as a plain
prompt, and verl's trainer mode gets the identity template (backends/unirl-verl/unirl_backends/verl/stage_command.py).
The rendering is transformers' ``apply_chat_template(..., tokenize=False,
add_generation_prompt=True)``, what TRL (trl/data_utils.py ``apply_chat_template``), verl
(verl/utils/tokenizer ``apply_chat_template``) and OpenRLHF (``--data.apply_chat_template``) do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unirl.errors import DataError

NO_TEMPLATE_FIX = ("Set task.chat_template to a Jinja chat template (the string itself), use a model whose tokenizer "
                   "has one, or give plain-text prompts with task.apply_chat_template=false")


def is_conversation(value: Any) -> bool:
    """A list of ``{"role": ..., "content": ...}`` messages (TRL's conversational format)."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))


def tokenizer_has_template(model_path: str | None) -> bool | None:
    """Whether the tokenizer in the local model folder ``model_path`` has a chat template (``None``:
    cannot tell without loading it, e.g. a hub id); the tiny model (``model_path`` null) has none."""
    if model_path is None:
        return False
    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            return bool(json.loads(config.read_text()).get("chat_template"))
        except (OSError, ValueError):
            return None
    return False


class ChatRenderer:
    """Prompts (and conversational completions) as text: rendered with a chat template when they
    are conversations, or always / never (``apply``: ``None`` = auto, ``True``, ``False``)."""

    def __init__(self, tokenizer: Any, template: str | None, apply: bool | None) -> None:
        self.tokenizer, self.template, self.apply = tokenizer, template, apply

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        if self.tokenizer is None:
            raise DataError(f"a conversational prompt needs a tokenizer to render its chat template, and none was "
                            f"given. {NO_TEMPLATE_FIX}.", key="task.chat_template", value=self.template)
        if not self.template and not getattr(self.tokenizer, "chat_template", None):
            raise DataError(f"a conversational prompt ({json.dumps(messages)[:120]}) needs a chat template, and the "
                            f"model's tokenizer has none. {NO_TEMPLATE_FIX}.", key="task.chat_template", value=None)
        text = self.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                                  chat_template=self.template or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)
        return text if isinstance(text, str) else str(text)

    def prompt(self, value: Any) -> str:
        if is_conversation(value):
            if self.apply is False:
                raise DataError(f"task.apply_chat_template=false, but a prompt is a conversation "
                                f"({json.dumps(value)[:120]}). Allow the template (task.apply_chat_template=null) or "
                                f"map task.columns.prompt to a plain-text column.",
                                key="task.apply_chat_template", value=False)
            return self._render(list(value), generation_prompt=True)
        if not isinstance(value, str):
            raise DataError(f"a prompt is {type(value).__name__} ({str(value)[:80]!r}): prompts are text or a list "
                            f"of {{role, content}} messages. Set task.columns.prompt to such a column.",
                            key="task.columns.prompt", value=None)
        if self.apply:
            return self._render([{"role": "user", "content": value}], generation_prompt=True)
        return value

    def completion(self, prompt: Any, value: Any) -> str:
        """A completion as text; a conversational one is what the template appends to the prompt
        (TRL's prompt-completion rendering)."""
        if not is_conversation(value):
            return "" if value is None else str(value)
        if not is_conversation(prompt) and not self.apply:
            return "".join(str(m["content"]) for m in value)
        messages = list(prompt) if is_conversation(prompt) else [{"role": "user", "content": prompt}]
        head = self._render(messages, generation_prompt=True)
        whole = self._render(messages + list(value), generation_prompt=False)
        if not whole.startswith(head):
            raise DataError("the chat template renders a conversation's prompt differently alone and followed by its "
                            "completion, so the completion cannot be cut from it. Use a template whose rendering of "
                            "the prompt is a prefix of the whole conversation (task.chat_template).",
                            key="task.chat_template", value=self.template)
        return whole[len(head):]
