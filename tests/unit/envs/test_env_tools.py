"""Tool calling: schemas from type hints, Hermes / bare-JSON parsing, contained execution."""

from __future__ import annotations

from env_stubs import raising_tool, sentinel_tool, slow_tool

from tether.envs.tools import (
    ToolCall,
    compute_tool_info,
    compute_tool_messages,
    make_tool,
    parse_tool_calls,
    run_tool_calls,
)
from tether.policy.chat import render_chat
from tether.types import Outcome


def test_schema_from_type_hints_renders_through_the_chat_template(env_tokenizer):
    tool = make_tool(sentinel_tool)
    assert tool.name == "sentinel_tool"
    fn = tool.schema["function"]
    assert fn["parameters"]["properties"]["word"] == {"type": "string", "description": "any word"}
    assert fn["parameters"]["required"] == ["word"]
    text = render_chat(env_tokenizer, [{"role": "user", "content": "hi"}], [tool.schema])
    assert '"name": "sentinel_tool"' in text and text.startswith("<|im_start|>system\nTools:")


def test_parse_hermes_blocks_bare_json_and_fences():
    p = parse_tool_calls('think <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
                         '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert p.calls == (ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})) and p.errors == () and p.text == "think  and"
    assert parse_tool_calls('{"name": "a", "arguments": {"x": 1}}').calls == (ToolCall("a", {"x": 1}),)
    assert parse_tool_calls('[{"name": "a"}, {"function": {"name": "b", "arguments": {}}}]').calls == (
        ToolCall("a", {}), ToolCall("b", {}))
    assert parse_tool_calls('```json\n{"name": "a", "arguments": {}}\n```').calls == (ToolCall("a", {}),)
    plain = parse_tool_calls("Answer: 42")
    assert plain.calls == () and plain.errors == () and plain.text == "Answer: 42"


def test_malformed_calls_are_parse_errors_never_exceptions():
    cases = [
        '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "a"}',  # unclosed
        '{"name": "a", "arguments": ',  # truncated bare JSON
    ]
    for text in cases:
        p = parse_tool_calls(text)
        assert p.calls == () and len(p.errors) == 1, text
    msgs = compute_tool_messages([], parse_tool_calls(cases[0]).errors)
    assert msgs[0].role == "tool" and msgs[0].content.startswith("error: malformed tool call")


def test_raising_slow_unknown_and_misused_tools_are_contained():
    tools = {t.name: t for t in (make_tool(sentinel_tool), make_tool(raising_tool), make_tool(slow_tool, timeout_s=0.2))}
    calls = [ToolCall("sentinel_tool", {"word": "w"}), ToolCall("raising_tool", {"x": "1"}), ToolCall("slow_tool", {"x": "1"}),
             ToolCall("nope", {}), ToolCall("sentinel_tool", {"wrong": 1})]
    res = run_tool_calls(tools, calls, timeout_s=5.0)
    assert [r.outcome for r in res] == [Outcome.OK, Outcome.ERROR, Outcome.TIMEOUT, Outcome.ERROR, Outcome.ERROR]
    assert res[0].content == "w <|endoftext|>"
    assert "tool exploded" in res[1].content and "unknown tool 'nope'" in res[3].content
    assert "unexpected keyword" in res[4].content
    assert res[2].seconds < 10.0  # the 30 s sleeper was abandoned at its 0.2 s deadline (slack for a loaded box)
    info = compute_tool_info(res, ["bad"])
    assert info == {"tool_calls": 5, "tool_errors": 3, "tool_timeouts": 1, "parse_errors": 1}
    assert [m.content.split(":")[0] for m in compute_tool_messages(res)] == ["w <|endoftext|>", "error", "error", "error", "error"]
