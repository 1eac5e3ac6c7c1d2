"""Chat tools, request side (§8.3): the tools a request offers, the JSON Schema that makes the
model answer `{"function": {"_name": <tool>, ...arguments}}`, the text appended to the prompt,
and the id of the call it produces.

`tool_choice` picks the offered set: a named function (422 `tool_error` if absent),
`required` (every tool), `auto` / absent (every tool plus TGI's synthetic `no_tool`), `none`
(no tools at all). Departures from TGI where TGI fails: a function without `parameters` takes
no arguments (TGI: 422 "missing field"); the grammar requires the outer `function` key and
nothing else, and says `"type": "object"` at both levels (TGI's leaves the type to outlines,
which assumes it, and lets the model emit `{}`, which then fails to parse); a tool's `$defs`
are kept (renamed per tool), so nested models resolve.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta

from server import errors
from server.fields import Fields, check, describe, deserialize_error

DEFAULT_TOOL_PROMPT = (
    "\nGiven the functions available, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt. Respond in the format {name: function "
    "name, parameters: dictionary of argument name and its value}.Do not use variables.\n"
)
NO_TOOL_NAME = "no_tool"


def compact(value: Any) -> str:
    """JSON as TGI's serde_json writes it: no spaces, keys in order, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Tool:
    """One function: its name, description and parameter schema (TGI's `arguments`)."""

    name: str
    description: str | None
    parameters: Any

    def openai(self) -> dict[str, Any]:
        """The OpenAI shape given to chat templates that render tools themselves."""
        function = {"name": self.name, "description": self.description or ""}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    def tgi(self) -> dict[str, Any]:
        """TGI's serialisation of the tool (`arguments` as a JSON string), for the prompt."""
        function = {"description": self.description, "name": self.name}
        return {"type": "function", "function": {**function, "arguments": compact(self.parameters)}}


NO_TOOL = Tool(
    NO_TOOL_NAME, "Open ended response with no specific tool selected", {"type": "object"}
)


def parse_tools(value: Any) -> list[Tool] | None:
    """`tools`: a list of `{"type": "function", "function": {"name", "description"?,
    "parameters"|"arguments"}}`."""
    if value is None:
        return None
    tools = []
    for i, item in enumerate(check(value, "list", "tools")):
        f = Fields(item, "Tool", f"tools[{i}]")
        f.optional("type", "str")
        function = f.nested("function", "FunctionDefinition")
        if function is None:
            raise deserialize_error(f.path, "missing field `function`")
        parameters = function.value.get("parameters", function.value.get("arguments"))
        if isinstance(parameters, dict):
            for key in ("$defs", "definitions"):
                if not isinstance(parameters.get(key, {}), dict):
                    raise deserialize_error(
                        f"tools[{i}].function.parameters.{key}",
                        f"invalid type: {describe(parameters[key])}, expected a map",
                    )
        tools.append(
            Tool(
                name=function.required("name", "str"),
                description=function.optional("description", "str"),
                parameters={} if parameters is None else parameters,
            )
        )
    return tools


def parse_tool_choice(value: Any) -> str | tuple[str, str]:
    """ "auto" (also for null), "none", "required", or ("function", name): any other string
    names a function, as does OpenAI's `{"type": "function", "function": {"name"}}`."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        return value if value in ("auto", "none", "required") else ("function", value)
    if isinstance(value, dict) and value.get("type") == "function":
        function = Fields(value, "ToolChoice", "tool_choice").nested("function", "FunctionName")
        if function is not None:
            return ("function", function.required("name", "str"))
    raise deserialize_error("tool_choice", "data did not match any variant of ToolChoice")


def offered(tools: list[Tool] | None, choice: str | tuple[str, str]) -> list[Tool] | None:
    """The tools the grammar chooses from (None: no tool grammar, a plain answer)."""
    if not tools or choice == "none":
        # TGI's auto mode with an empty list can only answer no_tool and then re-runs without
        # tools; answering without tools at once gives the same result.
        return None
    if choice == "required":
        return list(tools)
    if choice == "auto":
        return [*tools, NO_TOOL]
    name = choice[1]
    for tool in tools:
        if tool.name == name:
            return [tool]
    raise errors.tool(f"Tool with name {name} not found")


_DEF_REF = re.compile(r"#/(\$defs|definitions)/(.+)")


def _relocate(value: Any, prefix: str) -> Any:
    """`value` with its local `#/$defs/X` (or `#/definitions/X`) refs made `#/$defs/<prefix>X`."""
    if isinstance(value, list):
        return [_relocate(v, prefix) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _relocate(v, prefix) for k, v in value.items()}
    match = _DEF_REF.fullmatch(out["$ref"]) if isinstance(out.get("$ref"), str) else None
    if match:
        out["$ref"] = f"#/$defs/{prefix}{match.group(2)}"
    return out


def _hoisted_defs(tools: list[Tool]) -> dict[str, Any]:
    """Every tool's `$defs` / `definitions`, renamed `<tool>.<name>` and moved to the root,
    where the relocated refs of `_function_schema` find them (TGI drops them, so a tool with
    nested models, as pydantic writes them, cannot compile there)."""
    defs: dict[str, Any] = {}
    for tool in tools:
        if isinstance(tool.parameters, dict):
            for key in ("$defs", "definitions"):
                for name, schema in (tool.parameters.get(key) or {}).items():
                    defs[f"{tool.name}.{name}"] = _relocate(schema, f"{tool.name}.")
    return defs


def _function_schema(tool: Tool) -> dict[str, Any]:
    args = _relocate(tool.parameters, f"{tool.name}.")
    schema: dict[str, Any] = {"type": "object", "description": tool.description or ""}
    properties: dict[str, Any] = {"_name": {"type": "string", "const": tool.name}}
    required: list[Any] = ["_name"]
    if isinstance(args, dict):
        if isinstance(args.get("properties"), dict):
            properties.update(args["properties"])
        if isinstance(args.get("required"), list):
            required.extend(args["required"])
        # TGI's rule: extra arguments only when the schema says the *string* "true"
        schema["additionalProperties"] = args.get("additionalProperties") == "true"
    schema["properties"] = properties
    schema["required"] = required
    return schema


def grammar(tools: list[Tool]) -> dict[str, Any]:
    """The JSON grammar (normal form) for a call to one of `tools`."""
    schema = {
        "type": "object",
        "$functions": {tool.name: _function_schema(tool) for tool in tools},
        "properties": {
            "function": {"anyOf": [{"$ref": f"#/$functions/{tool.name}"} for tool in tools]}
        },
        "required": ["function"],
        "additionalProperties": False,
    }
    defs = _hoisted_defs(tools)
    if defs:
        schema["$defs"] = defs
    return {"type": "json", "value": schema}


@lru_cache(maxsize=16)
def _mentions_tools(template: str) -> bool:
    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateError:  # tags transformers adds (e.g. {% generation %}): a text search
        return re.search(r"\btools\b", template) is not None


def template_uses_tools(template: Any) -> bool:
    """Whether a chat template renders `tools` itself (TGI: an undeclared `tools` variable)."""
    if isinstance(template, dict):  # named templates
        return any(template_uses_tools(t) for t in template.values())
    return isinstance(template, str) and _mentions_tools(template)


def prompt_suffix(tools: list[Tool], tool_prompt: str, uses_tools: bool) -> str:
    """What TGI appends to the last message: the tool prompt, preceded by the tools as JSON
    when the template does not render them itself."""
    if uses_tools:
        return f"\n---\n{tool_prompt}"
    return f"\n---\n{compact([t.tgi() for t in tools])}\n{tool_prompt}"


def next_call_id(previous: list[str]) -> str:
    """One more than the largest integer id of the conversation's earlier tool calls ("0"
    for the first; a UUID when earlier ids are not integers)."""
    if not previous:
        return "0"
    if all(re.fullmatch(r"[0-9]+", i) for i in previous):
        return str(max(int(i) for i in previous) + 1)
    return str(uuid.uuid4())
