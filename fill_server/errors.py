"""ApiError: what the client did wrong (or what the server cannot do now), as an HTTP
status and one message; the app turns it into an OpenAI-style error body."""

from __future__ import annotations


class ApiError(Exception):
    """An answer other than a fill: `status`, a message for the client, the field at
    fault (`param`) and headers such as Retry-After."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        """OpenAI's error shape (llama.cpp's and vLLM's clients read the same `message`)."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)
