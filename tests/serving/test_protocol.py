"""Requests to `Pipeline.prepare` keywords and the response shapes (`blockdraft.serving.protocol`), without a
server (tests/serving/test_server.py sends the same over HTTP)."""
import pytest

from blockdraft.serving.protocol import ApiError, Reply, parse_json, parse_request


def test_a_chat_request_maps_to_prepare_keywords():
    req = parse_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                         "max_completion_tokens": 9, "max_tokens": 99, "top_k": -1, "seed": 3, "stop": "x",
                         "stream": True, "stream_options": {"include_usage": True}, "user": "ignored"},
                        chat=True, model_id="m")
    assert req.chat and req.stream and req.include_usage and req.max_tokens_given
    assert req.kwargs == {"messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "top_k": 0, "seed": 3,
                          "stop": ["x"], "max_new_tokens": 9}  # max_completion_tokens wins; top_k -1 is off


def test_a_completion_without_max_tokens_fills_its_row():
    req = parse_request({"prompt": ["once"], "temperature": 0}, chat=False, model_id="m")
    assert not req.stream and not req.include_usage and not req.max_tokens_given
    assert req.kwargs == {"prompt": "once", "temperature": 0, "stop": []}


@pytest.mark.parametrize("body, status, text", [
    ({"prompt": "x", "model": "other"}, 404, 'model="other" is not served here'),
    ({"prompt": "x", "n": 2}, 400, "n=2: not supported"),
    ({"prompt": "x", "temperature": "hot"}, 400, 'temperature="hot"'),
    ([1], 400, "expected a JSON object"),
])
def test_bad_requests_name_the_value(body, status, text):
    with pytest.raises(ApiError) as info:
        parse_request(body, chat=False, model_id="m")
    assert info.value.status == status and text in str(info.value)
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_parse_json_refuses_bad_bytes_and_deep_nesting():
    assert parse_json(b'{"a": [1]}') == {"a": [1]}
    for body, text in ((b"\xff", "not valid UTF-8 (byte 0)"), (b"{", "not valid JSON"),
                       (b"[" * 33 + b"]" * 33, "nested too deeply")):
        with pytest.raises(ApiError) as info:
            parse_json(body)
        assert info.value.status == 400 and text in str(info.value)


def test_stream_chunks_keep_the_reply_id_and_carry_usage_null_until_the_end():
    chat = Reply(parse_request({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                "stream_options": {"include_usage": True}}, chat=True, model_id="m"), "m", "chatcmpl-1")
    first = chat.chunk("", role="assistant")
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-1" and first["usage"] is None
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]
    text = Reply(parse_request({"prompt": "hi", "stream": True}, chat=False, model_id="m"), "m", "cmpl-1")
    assert text.chunk("ab")["choices"][0]["text"] == "ab" and "usage" not in text.chunk("ab")
    assert ApiError(503, "busy").body()["error"]["type"] == "server_error"
