"""OpenAI's request and response shapes (pydantic models), how a request maps to `Pipeline.prepare`, and
OpenAI's error JSON with our one-line messages that name the bad value.

Requests are validated strictly (no "5" for 5, no true for 1). Unknown fields are accepted and ignored;
fields that would change the output and that we cannot honour (`REFUSED`) are a 400 unless neutral.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from blockdraft.api import GenerationOutput
from blockdraft.errors import BlockdraftError

_MAX_SHOWN = 80
MAX_JSON_DEPTH = 32
SAMPLING = ("temperature", "top_p", "top_k", "seed")  # passed through; the library validates their ranges

# Fields that would change the output and that we cannot honour: (accepted when, what is expected).
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v in (None, 1), "1 (one choice per request)"),
    "best_of": (lambda v: v in (None, 1), "1"),
    "presence_penalty": (lambda v: v in (None, 0), "0 (penalties are not supported)"),
    "frequency_penalty": (lambda v: v in (None, 0), "0 (penalties are not supported)"),
    "repetition_penalty": (lambda v: v in (None, 1), "1 (penalties are not supported)"),
    "logit_bias": (lambda v: not v, "null or {} (logit bias is not supported)"),
    "logprobs": (lambda v: v in (None, False, 0), "null or false (log probabilities are not returned)"),
    "top_logprobs": (lambda v: not v, "null or 0 (log probabilities are not returned)"),
    "echo": (lambda v: not v, "false"),
    "suffix": (lambda v: not v, "null (no insertion mode)"),
    "tools": (lambda v: not v, "null (tool calls are not supported)"),
    "tool_choice": (lambda v: v in (None, "none"), "null or \"none\""),
    "functions": (lambda v: not v, "null (function calls are not supported)"),
    "function_call": (lambda v: v in (None, "none"), "null or \"none\""),
    "response_format": (lambda v: v is None or v == {"type": "text"}, "{\"type\": \"text\"} (no structured output)"),
}


class ApiError(Exception):
    """An error answered with an HTTP status and OpenAI's error JSON; the message names the bad value."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def show(value: Any) -> str:
    """A request value as JSON, shortened for a one-line message."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


# ---------------------------------------------------------------------- request schemas
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _Completion(_Strict):
    model: str | None = Field(None, description="the served model id (or absent)")
    max_tokens: int | None = Field(None, ge=1, description="an integer >= 1")
    max_completion_tokens: int | None = Field(None, ge=1, description="an integer >= 1")
    # int | float: a number is passed on as written, so the library's error shows top_p=2, not top_p=2.0
    temperature: int | float | None = Field(None, description="a number >= 0 (0: greedy)")
    top_p: int | float | None = Field(None, description="a number in (0, 1]")
    top_k: int | None = Field(None, description="an integer >= 0 (0 or -1: off)")
    seed: int | None = Field(None, description="an integer")
    stop: str | list[str] | None = Field(None, description="a string or a list of strings")
    stream: bool | None = Field(None, description="true or false")
    stream_options: StreamOptions | None = Field(None, description="{\"include_usage\": true or false}")


class ChatCompletionRequest(_Completion):
    messages: list[Message] = Field(min_length=1, description="a non-empty list of {role, content} objects, role "
                                    "one of system/user/assistant, content a string or a list of text parts")


class CompletionRequest(_Completion):
    prompt: str | list[str] = Field(description="a string (one prompt per request)")


# ---------------------------------------------------------------------- response schemas
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Extension(BaseModel):
    """Our own figures for the request."""
    acceptance_length: float | None = Field(description="mean tokens committed per verify cycle (null: no drafts)")
    tokens_per_second: float
    decode_tokens_per_second: float
    queue_seconds: float


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length"]


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    blockdraft: Extension


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    blockdraft: Extension


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


# ---------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Request:
    """One parsed completion request: keywords for `Pipeline.prepare` and how to answer."""
    chat: bool
    stream: bool
    include_usage: bool
    kwargs: dict[str, Any]
    max_tokens_given: bool


def parse_json(body: bytes) -> Any:
    """The body as JSON: UTF-8, at most MAX_JSON_DEPTH levels deep."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start}): expected UTF-8 JSON") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise ApiError(400, f"request body is nested too deeply: expected at most {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON ({exc}): expected one JSON object") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ApiError(400, f"request body is nested too deeply: expected at most {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """Levels of containers in `value` (counted up to one past the limit)."""
    depth, level = 0, [value] if isinstance(value, (dict, list)) else []
    while level and depth <= MAX_JSON_DEPTH:
        depth += 1
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
    return depth


def parse_request(body: Any, *, chat: bool, model_id: str) -> Request:
    """Check an OpenAI request body and map it to `Pipeline.prepare` keywords (max tokens: None = the row's room)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"request body {show(body)}: expected a JSON object")
    _check_model(body.get("model"), model_id)
    for name, (accepted, expected) in REFUSED.items():
        if not accepted(body.get(name)):
            raise ApiError(400, f"{name}={show(body[name])}: not supported by this server, expected {expected}", name)
    schema = ChatCompletionRequest if chat else CompletionRequest
    try:
        req = schema.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc, body, schema) from None
    stream = bool(req.stream)
    include_usage = stream and bool(req.stream_options and req.stream_options.include_usage)
    if chat:
        source: dict[str, Any] = {"messages": [{"role": m.role, "content": _content(m.content)} for m in req.messages]}
    else:
        source = {"prompt": _prompt(req.prompt)}
    sampling = {k: getattr(req, k) for k in SAMPLING if getattr(req, k) is not None}
    if sampling.get("top_k") == -1:  # off, as in vLLM
        sampling["top_k"] = 0
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    stop = [] if req.stop is None else [req.stop] if isinstance(req.stop, str) else req.stop
    kwargs = {"temperature": 1.0, **sampling, **source, "stop": stop}
    if limit is not None:
        kwargs["max_new_tokens"] = limit
    return Request(chat, stream, include_usage, kwargs, limit is not None)


def _check_model(model: Any, model_id: str) -> None:
    if model is not None and model != model_id:
        raise ApiError(404, f"model={show(model)} is not served here: expected {show(model_id)}", "model",
                       "model_not_found")


def _validation_error(exc: ValidationError, body: dict[str, Any], schema: type[BaseModel]) -> ApiError:
    """The first problem as one line: the field (a message by its index) with its value, then what is expected."""
    err = exc.errors()[0]
    name = str(err["loc"][0])
    info = schema.model_fields.get(name)
    expected = info.description if info is not None and info.description else err["msg"].lower()
    if err["type"] == "missing":
        return ApiError(400, f"{name} is missing: expected {expected}", name)
    where, value = name, body.get(name)
    if name == "messages" and len(err["loc"]) > 1 and isinstance(err["loc"][1], int):
        i = err["loc"][1]
        where, value = f"messages[{i}]", value[i]
        expected = "an object with a role in ['system', 'user', 'assistant'] and a content string or list of " \
                   "{\"type\": \"text\", \"text\": ...} parts"
    return ApiError(400, f"{where}={show(value)}: expected {expected}", name)


def _content(content: str | list[TextPart]) -> str:
    """A message's text: a string, or its text parts joined by newlines (as vLLM does)."""
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


def _prompt(value: str | list[str]) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise ApiError(400, f"prompt={show(value)}: expected a string (one prompt per request)", "prompt")
        value = value[0]
    return value


def library_error(exc: BlockdraftError) -> ApiError:
    """A library error as a 400; `param` is the request field its message starts with ("top_p=2: ...")."""
    match = re.match(r"(\w+)=", str(exc))
    param = match.group(1) if match and match.group(1) in (*SAMPLING, "stop", "max_tokens") else None
    return ApiError(400, str(exc), param)


# ---------------------------------------------------------------------- responses
@dataclass(frozen=True)
class Reply:
    """Builds the response objects of one request (same id and creation time in every chunk)."""
    request: Request
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, choices: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.request.chat else "text_completion"
        if stream and self.request.include_usage:
            extra.setdefault("usage", None)  # as OpenAI: null in every chunk but the last
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, text: str | None, finish: str | None = None, **delta: str) -> dict[str, Any]:
        """A stream chunk carrying `text` (chat: in `delta`, with any extra delta fields) or a finish reason."""
        if self.request.chat:
            choice = {"index": 0, "delta": delta | ({} if text is None else {"content": text})}
        else:
            choice = {"index": 0, "text": text or ""}
        return self.envelope([choice | {"logprobs": None, "finish_reason": finish}], stream=True)

    def final_chunk(self, out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
        return self.chunk(None, out.finish_reason) | {"blockdraft": extension(out, queue_seconds)}

    def usage_chunk(self, out: GenerationOutput) -> dict[str, Any]:
        return self.envelope([], stream=True, usage=usage(out))

    def complete(self, out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
        """The whole (non-stream) response."""
        if self.request.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out.text}}
        else:
            choice = {"index": 0, "text": out.text}
        choice |= {"logprobs": None, "finish_reason": out.finish_reason}
        return self.envelope([choice], stream=False, usage=usage(out), blockdraft=extension(out, queue_seconds))


def usage(out: GenerationOutput) -> dict[str, int]:
    prompt, completion = out.stats.prompt_tokens, len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def extension(out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
    tau = out.stats.mean_acceptance_length
    return {"acceptance_length": None if tau is None else round(tau, 4),
            "tokens_per_second": round(out.stats.tokens_per_second, 3),
            "decode_tokens_per_second": round(out.stats.decode_tokens_per_second, 3),
            "queue_seconds": round(queue_seconds, 4)}
