"""OpenAI chat requests: parsing (TGI's ChatRequest), the prompt from the model's own chat
template, and the mapping to generation parameters (§2.6).

The template comes only from the tokenizer (the model or --tokenizer-config-path), never
from the request, and is rendered by transformers' sandboxed Jinja in the validation pool.
Deliberate differences from TGI, for OpenAI-SDK code: `top_p: 1` means "off" instead of a
422; `presence_penalty` is OpenAI's presence penalty, not `repetition_penalty = p + 2`;
`stop` may be a bare string. Grammar-constrained output (tools, response_format) is refused
with TGI's --disable-grammar-support error until the grammar engine lands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server import errors
from server.fields import Fields, check, deserialize_error
from server.schemas import GenerateParams, parse_grammar


@dataclass(slots=True, kw_only=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, Any]]  # {"role", "content"} ready for the template
    params: GenerateParams
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


def _content(f: Fields) -> str:
    """A message's content as text: chunks flattened, images as markdown (TGI)."""
    content = f.value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, chunk in enumerate(content):
            c = Fields(chunk, "MessageChunk", f"{f.path}.content[{i}]")
            kind = c.required("type", "str")
            if kind == "text":
                parts.append(c.required("text", "str"))
            elif kind == "image_url":
                image = c.nested("image_url", "Url") or Fields({}, "Url", c._path("image_url"))
                parts.append(f"![]({image.required('url', 'str')})")
            else:
                raise deserialize_error(
                    c._path("type"), f"unknown variant `{kind}`, expected `text` or `image_url`"
                )
        return "".join(parts)
    tool_calls = f.value.get("tool_calls")
    if content is None and isinstance(tool_calls, list):
        return json.dumps(tool_calls, ensure_ascii=False, separators=(",", ":"))
    if content is None:
        raise deserialize_error(
            f.path, "data did not match any variant of untagged enum MessageBody"
        )
    return check(content, "str", f"{f.path}.content")


def _messages(value: Any) -> list[dict[str, Any]]:
    items = check(value, "list", "messages")
    messages = []
    for i, item in enumerate(items):
        f = Fields(item, "Message", f"messages[{i}]")
        messages.append({"role": f.required("role", "str"), "content": _content(f)})
    return messages


def _stop(f: Fields) -> list[str]:
    value = f.value.get("stop")
    if isinstance(value, str):
        return [value]
    return f.optional("stop", "list[str]", [])


def sampling_params(f: Fields, *, max_tokens: int | None) -> GenerateParams:
    """The OpenAI knobs shared by chat and completions -> TGI's GenerateParameters."""
    temperature = f.optional("temperature", "f32")
    top_p = f.optional("top_p", "f32")
    return GenerateParams(
        do_sample=temperature != 0.0,  # exactly 0 is greedy; sampling otherwise (T=1)
        temperature=None if temperature == 0.0 else temperature,
        top_p=None if top_p == 1.0 else top_p,
        frequency_penalty=f.optional("frequency_penalty", "f32"),
        presence_penalty=f.optional("presence_penalty", "f32"),
        repetition_penalty=f.optional("repetition_penalty", "f32"),
        seed=f.optional("seed", "u64"),
        stop=_stop(f),
        max_new_tokens=max_tokens,
        details=True,
    )


def parse_chat(value: Any) -> ChatRequest:
    f = Fields(value, "ChatRequest")
    if not f.has("messages"):
        raise deserialize_error("", "missing field `messages`")
    max_tokens = f.optional("max_tokens", "u32")
    if max_tokens is None:
        max_tokens = f.optional("max_completion_tokens", "u32")
    params = sampling_params(f, max_tokens=max_tokens)
    params.top_n_tokens = f.optional("top_logprobs", "u32")
    options = f.nested("stream_options", "StreamOptions")
    tools = f.optional("tools", "list")
    return ChatRequest(
        model=f.optional("model", "str"),
        messages=_messages(f.value["messages"]),
        params=params,
        stream=f.flag("stream"),
        include_usage=options.flag("include_usage") if options else False,
        logprobs=bool(f.optional("logprobs", "bool", False)),
        tools=tools,
        tool_choice=f.value.get("tool_choice"),
        response_format=parse_grammar(f, "response_format"),
    )


def _tool_names(tools: list[Any]) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        function = Fields(tool, "Tool", f"tools[{i}]").nested("function", "FunctionDefinition")
        if function is None:
            raise deserialize_error(f"tools[{i}]", "missing field `function`")
        names.append(function.required("name", "str"))
    return names


def apply_tools(chat: ChatRequest) -> list[dict[str, Any]] | None:
    """TGI's tool rules (§8.3) up to the grammar; returns the tools to show the template.
    A request that needs a grammar gets one, which validation refuses for now."""
    choice = chat.tool_choice
    if isinstance(choice, dict):
        choice = ((choice.get("function") or {}).get("name")) or "auto"
    if chat.tools is not None and chat.response_format is not None:
        raise errors.tool("Grammar and tools are mutually exclusive")
    if chat.response_format is not None:
        chat.params.grammar = chat.response_format
        return None
    if not chat.tools or choice == "none":
        return None
    names = _tool_names(chat.tools)
    if choice not in (None, "auto", "required") and choice not in names:
        raise errors.tool(f"Tool with name {choice} not found")
    chat.params.grammar = {"type": "json", "value": {"tools": names}}
    return chat.tools


def render(tokenizer, messages: list[dict[str, Any]], tools: list[Any] | None) -> str:
    """The prompt text from the model's template (runs in the validation pool). A final
    assistant message is continued rather than closed (TGI's "continue final message")."""
    continue_final = bool(messages) and messages[-1]["role"] == "assistant"
    try:
        if continue_final:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=False, tools=tools, continue_final_message=True
            )
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except ValueError as exc:
        if "chat template" in str(exc) or not getattr(tokenizer, "chat_template", True):
            raise errors.template("template not found") from None
        raise errors.template(str(exc)) from None
    except Exception as exc:  # jinja errors, raise_exception() in the template
        raise errors.template(str(exc)) from None
