"""A request's body within its size limit, as JSON: 413 past the limit (checked on the
declared length before reading, and on the bytes as they come for a chunked body), 400
for a body that is not UTF-8 JSON (too deep a nesting included)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from fill_server.errors import ApiError, bad_request


async def read_json(request: Request, limit: int) -> Any:
    """The body's JSON value; an ApiError when it is too large or not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise bad_request("the body is empty; send a JSON object")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("the body is not UTF-8") from None
    except RecursionError:
        raise bad_request("the body's JSON is nested too deeply") from None
    except ValueError as exc:
        raise bad_request(f"the body is not valid JSON ({exc})") from None


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the body is larger than {limit} bytes (the server's --max-body-bytes)")
