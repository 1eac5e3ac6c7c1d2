"""OpenAI chat requests: parsing (TGI's ChatRequest), the prompt from the model's own chat
template, and the mapping to generation parameters (§2.6).

The template comes only from the tokenizer (the model or --tokenizer-config-path), never
from the request, and is rendered by transformers' sandboxed Jinja in the validation pool.
Deliberate differences from TGI, for OpenAI-SDK code: `top_p: 1` means "off" instead of a
422; `presence_penalty` is OpenAI's presence penalty, not `repetition_penalty = p + 2`;
`stop` may be a bare string. `response_format` and `tools` become a grammar on the request
(server.grammar, server.tools); a tool request's answer is read back by server.tool_calls.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from server import errors, tools
from server.fields import Fields, check, deserialize_error
from server.grammar import parse_response_format
from server.schemas import GenerateParams
from server.tools import DEFAULT_TOOL_PROMPT, Tool


@dataclass(slots=True, kw_only=True)
class ChatRequest:
    """A parsed chat request: the messages for the template, the generation parameters, and
    what shapes the answer (stream options, logprobs, tools, response_format)."""

    model: str | None
    messages: list[dict[str, Any]]  # {"role", "content"} ready for the template
    params: GenerateParams
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices, each its own generation (they share the prompt's cached pages)
    logprobs: bool = False
    tools: list[Tool] | None = None
    tool_choice: str | tuple[str, str] = "auto"
    tool_prompt: str = DEFAULT_TOOL_PROMPT
    response_format: dict[str, Any] | None = None  # normal form (server.grammar)
    call_ids: list[str] = field(default_factory=list)  # ids of earlier assistant tool calls
    last_is_call: bool = False  # the last message is a tool call (nothing is appended to it)

    def without_tools(self) -> ChatRequest:
        """The same request with no tools and no response format (TGI's no_tool re-run)."""
        params = dataclasses.replace(self.params, grammar=None, stop=list(self.params.stop))
        return dataclasses.replace(
            self, tools=None, tool_choice="auto", response_format=None, params=params
        )

    def for_choice(self, j: int) -> ChatRequest:
        """Choice j of `n` (GenerateParams.for_choice: its own seed when seeded)."""
        params = self.params.for_choice(j)
        return self if params is self.params else dataclasses.replace(self, params=params)


def _content(f: Fields) -> str | list[dict[str, str]]:
    """A message's content: text (text chunks joined), or with images a list of parts
    ({"type": "text", "text"} and {"type": "image", "url"}) for a vision model's template."""
    content = f.value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, chunk in enumerate(content):
            c = Fields(chunk, "MessageChunk", f"{f.path}.content[{i}]")
            kind = c.required("type", "str")
            if kind == "text":
                parts.append({"type": "text", "text": c.required("text", "str")})
            elif kind == "image_url":
                image = c.nested("image_url", "Url") or Fields({}, "Url", c._path("image_url"))
                parts.append({"type": "image", "url": image.required("url", "str")})
            else:
                raise deserialize_error(
                    c._path("type"), f"unknown variant `{kind}`, expected `text` or `image_url`"
                )
        if all(part["type"] == "text" for part in parts):
            return "".join(part["text"] for part in parts)
        return parts
    tool_calls = f.value.get("tool_calls")
    if content is None and isinstance(tool_calls, list):
        return json.dumps(tool_calls, ensure_ascii=False, separators=(",", ":"))
    if content is None:
        raise deserialize_error(
            f.path, "data did not match any variant of untagged enum MessageBody"
        )
    return check(content, "str", f"{f.path}.content")


def _call_ids(f: Fields) -> list[str]:
    """Ids of an assistant message's tool calls (when they are its body: content is null)."""
    calls = f.value.get("tool_calls")
    if f.value.get("content") is not None or f.value.get("role") != "assistant":
        return []
    if not isinstance(calls, list):
        return []
    return [str(c["id"]) for c in calls if isinstance(c, dict) and c.get("id") is not None]


def _messages(value: Any, chat: ChatRequest) -> list[dict[str, Any]]:
    items = check(value, "list", "messages")
    messages = []
    for i, item in enumerate(items):
        f = Fields(item, "Message", f"messages[{i}]")
        messages.append({"role": f.required("role", "str"), "content": _content(f)})
        chat.call_ids.extend(_call_ids(f))
        chat.last_is_call = f.value.get("content") is None
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
        ignore_eos=bool(f.optional("ignore_eos", "bool", False)),  # vLLM's extension
    )


def stream_usage(f: Fields, stream: bool) -> bool:
    """`stream_options.include_usage` (vLLM's rule: stream_options only with `stream`)."""
    options = f.nested("stream_options", "StreamOptions")
    if options is None:
        return False
    if not stream:
        raise errors.validation("`stream_options` can only be set when `stream` is true")
    return options.flag("include_usage")


def choice_count(f: Fields, limit: int) -> int:
    """`n`, bounded by the permits a request can ever hold (--max-concurrent-requests)."""
    n = f.optional("n", "u32", 1)
    if not 1 <= n <= limit:
        raise errors.validation(f"`n` must be >= 1 and <= {limit}. Given: {n}")
    return n


def parse_chat(value: Any, max_choices: int) -> ChatRequest:
    f = Fields(value, "ChatRequest")
    if not f.has("messages"):
        raise deserialize_error("", "missing field `messages`")
    max_tokens = f.optional("max_tokens", "u32")
    if max_tokens is None:
        max_tokens = f.optional("max_completion_tokens", "u32")
    params = sampling_params(f, max_tokens=max_tokens)
    params.top_n_tokens = f.optional("top_logprobs", "u32")
    stream = f.flag("stream")
    chat = ChatRequest(
        model=f.optional("model", "str"),
        messages=[],
        params=params,
        stream=stream,
        include_usage=stream_usage(f, stream),
        n=choice_count(f, max_choices),
        logprobs=bool(f.optional("logprobs", "bool", False)),
        tools=tools.parse_tools(f.value.get("tools")),
        tool_choice=tools.parse_tool_choice(f.value.get("tool_choice")),
        tool_prompt=f.optional("tool_prompt", "str") or DEFAULT_TOOL_PROMPT,
        response_format=parse_response_format(f, "response_format"),
    )
    chat.messages = _messages(f.value["messages"], chat)
    if not chat.tools and chat.tool_choice not in ("auto", "none"):
        raise errors.tool("`tool_choice` names a tool or requires one, but `tools` is empty")
    return chat


def apply_tools(chat: ChatRequest) -> list[Tool] | None:
    """TGI's rules (§8.3): sets the request's grammar from `response_format` or the tools and
    returns the tools offered to the model (None: a plain answer, no tool call to read)."""
    if chat.tools is not None and chat.response_format is not None:
        raise errors.tool("Grammar and tools are mutually exclusive")
    if chat.response_format is not None:
        chat.params.grammar = chat.response_format
        return None
    offered = tools.offered(chat.tools, chat.tool_choice)
    chat.params.grammar = None if offered is None else tools.grammar(offered)
    return offered


def _with_tools(tokenizer, chat: ChatRequest, offered: list[Tool]) -> list[dict[str, Any]]:
    """The messages with TGI's tool text appended to the last one (unless it is a call)."""
    if chat.last_is_call or not chat.messages:
        return chat.messages
    uses = tools.template_uses_tools(getattr(tokenizer, "chat_template", None))
    suffix = tools.prompt_suffix(offered, chat.tool_prompt, uses)
    last = chat.messages[-1]
    content = last["content"]
    if isinstance(content, list):
        content = [*content, {"type": "text", "text": suffix}]
    else:
        content = content + suffix
    return [*chat.messages[:-1], {**last, "content": content}]


def _vision_messages(messages: list[dict[str, Any]], placeholder: str | None):
    """Messages for the template with every content a list of parts (vision templates
    iterate them), and the image URLs in order. A text-only model refuses images."""
    urls = [
        part["url"]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image"
    ]
    if placeholder is None:
        if urls:
            raise errors.validation("this model does not take images: it has no vision encoder")
        return messages, urls
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        else:
            content = [{"type": "image"} if p["type"] == "image" else p for p in content]
        out.append({**m, "content": content})
    return out, urls


def _place_images(text: str, placeholder: str, urls: list[str]) -> str:
    """The rendered prompt with each image placeholder the template wrote replaced by that
    image's markdown (what validation reads back, as for /generate)."""
    pieces = text.split(placeholder)
    if len(pieces) - 1 != len(urls):
        raise errors.validation(
            f"the chat template wrote {len(pieces) - 1} image placeholders for {len(urls)} images"
        )
    out = [pieces[0]]
    for url, piece in zip(urls, pieces[1:], strict=True):
        out += [f"![]({url.replace(')', '%29')})", piece]
    return "".join(out)


def render(tokenizer, chat: ChatRequest, offered: list[Tool] | None) -> str:
    """The prompt text from the model's template (runs in the validation pool), with the
    offered tools. A final assistant message is continued rather than closed (TGI's
    "continue final message")."""
    messages = chat.messages if offered is None else _with_tools(tokenizer, chat, offered)
    placeholder = getattr(tokenizer, "image_token", None)  # a vision model's image token
    messages, urls = _vision_messages(messages, placeholder)
    tools = None if offered is None else [t.openai() for t in offered]
    continue_final = bool(messages) and messages[-1]["role"] == "assistant"
    try:
        if continue_final:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=False, tools=tools, continue_final_message=True
            )
        else:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except ValueError as exc:
        if "chat template" in str(exc) or not getattr(tokenizer, "chat_template", True):
            raise errors.template("template not found") from None
        raise errors.template(str(exc)) from None
    except Exception as exc:  # jinja errors, raise_exception() in the template
        raise errors.template(str(exc)) from None
    return text if placeholder is None else _place_images(text, placeholder, urls)
