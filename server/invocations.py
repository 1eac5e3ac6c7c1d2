"""POST /invocations (SageMaker): the body is tried as a TGI compat request (`inputs`), then
a chat request (`messages`), then a completion request (`prompt`), as TGI's untagged enum."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.chat_routes import chat_value
from server.completions_routes import completions_value
from server.errors import PlainError
from server.fields import deserialize_error
from server.generate_routes import compat_value
from server.jsonio import read_json
from server.state import of


async def invocations(request: Request) -> Response:
    st = of(request)
    try:
        value = await read_json(request, st.settings.payload_limit)
    except PlainError as exc:
        return exc.response()
    if isinstance(value, dict):
        if "inputs" in value:
            return await compat_value(request, st, value)
        if "messages" in value:
            return await chat_value(request, st, value)
        if "prompt" in value:
            return await completions_value(request, st, value)
    return deserialize_error(
        "", "data did not match any variant of untagged enum SagemakerRequest"
    ).response()
