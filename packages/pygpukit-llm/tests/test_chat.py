"""Tests of pygpukit.llm.chat: chat template rendering (as transformers' apply_chat_template renders), the
sandbox, thinking splitting (also streamed) and stop conditions."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pygpukit.core.errors import ArgumentError, PyGPUkitError
from pygpukit.llm.chat import ChatMessage, ChatTemplate, ChatTemplateError, StopChecker, ThinkingFilter, split_thinking

# The chat template of SmolLM2-135M-Instruct (tokenizer.chat_template of its GGUF).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

# The part of Qwen3's template that reads enable_thinking, in the same Jinja style.
QWEN3_STYLE_TEMPLATE = """\
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'assistant' and message.reasoning_content is defined %}
        {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
    {%- endif %}
    {{- message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def _user(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


# -- SmolLM2 --------------------------------------------------------------------------------------------------------


def test_smollm2_template_without_system_message() -> None:
    template = ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    messages = [_user("Hi!"), {"role": "assistant", "content": "Hello."}, _user("2+2?")]
    body = (
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    )
    assert template.render(messages) == SMOLLM2_SYSTEM + body + "<|im_start|>assistant\n"
    assert template.render(messages, add_generation_prompt=False) == SMOLLM2_SYSTEM + body


def test_smollm2_template_with_system_message() -> None:
    template = ChatTemplate(SMOLLM2_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, _user("Hi")]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(messages) == expected
    assert template.render(messages, add_generation_prompt=False) == expected.removesuffix("<|im_start|>assistant\n")


def test_smollm2_gguf_template_and_golden(smollm2_metadata: dict[str, Any]) -> None:
    from pygpukit.llm.tokenizer import Tokenizer

    assert smollm2_metadata["tokenizer.chat_template"] == SMOLLM2_TEMPLATE
    tok = Tokenizer.from_gguf_metadata(smollm2_metadata)
    template = ChatTemplate.from_tokenizer(tok)
    assert template.variables == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }
    golden_path = Path(__file__).resolve().parent / "data" / "tokenizer_golden_smollm2.json"
    if not golden_path.is_file():
        return
    for chat in json.loads(golden_path.read_text(encoding="utf-8"))["chats"]:
        rendered = template.render(chat["messages"], add_generation_prompt=chat["add_generation_prompt"])
        assert rendered == chat["rendered"]
        assert tok.encode(rendered, add_special_tokens=False) == chat["ids"]


# -- template variables and keyword arguments ----------------------------------------------------------------------


def test_bos_and_eos_tokens_are_variables() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ pad_token }}",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    assert template.render([_user("a"), _user("b")]) == "<s>a</s>b</s><pad>"
    # Keyword arguments override them, as in transformers.
    assert template.render([_user("a")], bos_token="[BOS]") == "[BOS]a</s><pad>"
    # A token given as None is undefined in the template.
    undefined = ChatTemplate("{{ 'yes' if bos_token is defined else 'no' }}", bos_token=None)
    assert undefined.render([_user("x")]) == "no"


def test_qwen3_enable_thinking_switch() -> None:
    template = ChatTemplate(QWEN3_STYLE_TEMPLATE)
    messages = [_user("Hi")]
    prefix = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(messages) == prefix
    assert template.render(messages, enable_thinking=True) == prefix
    assert template.render(messages, enable_thinking=False) == prefix + "<think>\n\n</think>\n\n"
    assert template.render(messages, add_generation_prompt=False, enable_thinking=False) == prefix.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_reasoning_fields_are_aliased() -> None:
    template = ChatTemplate(QWEN3_STYLE_TEMPLATE)
    turn = {"role": "assistant", "content": "4", "thinking": "2+2"}
    expected = "<|im_start|>assistant\n<think>\n2+2\n</think>\n\n4<|im_end|>\n"
    assert template.render([turn], add_generation_prompt=False) == expected
    assert template.render([{**turn, "thinking": None, "reasoning": "2+2"}], add_generation_prompt=False) == expected


def test_none_values_are_dropped_and_messages_not_mutated() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.keys() | list | sort | join(',') }};{% endfor %}")
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": "x", "tool_calls": None}]
    assert template.render(messages) == "content,role;"
    assert messages == [{"role": "assistant", "content": "x", "tool_calls": None}]


def test_tojson_behaves_like_transformers() -> None:
    template = ChatTemplate(
        "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ x | tojson(separators=(',',':')) }}"
    )
    tools = [{"name": "f\u00e9", "description": "<b>&</b>"}]
    out = template.render([_user("q")], tools=tools, x={"a": [1, 2]})
    first, second, third = out.split("|")
    assert first == '[{"name": "f\u00e9", "description": "<b>&</b>"}]'  # no \\u escapes, no HTML escaping
    assert second == '{\n  "name": "f\u00e9",\n  "description": "<b>&</b>"\n}'
    assert third == '{"a":[1,2]}'


def test_tools_and_documents_default_to_none() -> None:
    template = ChatTemplate("{{ tools is none }} {{ documents is none }}")
    assert template.render([_user("q")]) == "True True"
    assert template.render([_user("q")], tools=[{"name": "t"}], documents=[{"title": "d", "text": "x"}]) == (
        "False False"
    )


def test_globals_and_extensions() -> None:
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([_user("x")])
    assert year in {str(datetime.now().year), str(datetime.now().year - 1)}
    loops = ChatTemplate(
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
        "{% if loop.index0 == 3 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert loops.render([_user("a"), _user("b"), _user("c"), _user("d")]) == "ac"
    generation = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    assert generation.render([_user("a"), _user("b")]) == "[a][b]"
    ns = ChatTemplate(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    )
    assert ns.render([_user("a"), _user("b")]) == "2"
    assert ChatTemplate("{{ dict(a=1)['a'] }}").render([_user("x")]) == "1"


def test_trim_and_lstrip_blocks() -> None:
    template = ChatTemplate(
        "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    )
    assert template.render([_user("a"), _user("b")]) == "a\nb\n"


def test_continue_final_message() -> None:
    template = ChatTemplate(SMOLLM2_TEMPLATE)
    messages = [{"role": "system", "content": "S"}, _user("Q"), {"role": "assistant", "content": "The answer is"}]
    out = template.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert out.endswith("<|im_start|>assistant\nThe answer is")
    with pytest.raises(ArgumentError, match="cannot both be set"):
        template.render(messages, continue_final_message=True)


# -- errors and the sandbox ----------------------------------------------------------------------------------------


def test_raise_exception_becomes_chat_template_error() -> None:
    template = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="first must be user"):
        template.render([{"role": "assistant", "content": "x"}])
    assert template.render([_user("ok")]) == ""
    assert issubclass(ChatTemplateError, PyGPUkitError)


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{% for m in messages %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages[0].__class__.__init__ }}",
        "{% set x = messages.append(1) %}",
        "{% set x = messages[0].update({'role': 'x'}) %}",
        "{{ namespace(_secret=1) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_unsafe_access(source: str) -> None:
    template = ChatTemplate(source)
    with pytest.raises(ChatTemplateError):
        template.render([_user("x")])


def test_runtime_errors_are_wrapped() -> None:
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ messages[5].content.upper() }}").render([_user("x")])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ 1 // 0 }}").render([_user("x")])


@pytest.mark.parametrize(
    "messages",
    [
        "hello",
        [],
        {"role": "user", "content": "x"},
        ["not a dict"],
        [{"content": "no role"}],
        [{"role": 3, "content": "x"}],
        [{"role": "user", "content": 5}],
        [{"role": "user"}],
        [{"role": "user", "content": "x", "extra": object()}],
    ],
)
def test_message_validation(messages: Any) -> None:
    with pytest.raises(ArgumentError):
        ChatTemplate(SMOLLM2_TEMPLATE).render(messages)


def test_other_argument_errors() -> None:
    with pytest.raises(ArgumentError):
        ChatTemplate("")
    with pytest.raises(ArgumentError):
        ChatTemplate("x").render([_user("x")], tools={"name": "t"})  # type: ignore[arg-type]
    # A tool-calling turn may have no content.
    template = ChatTemplate("{{ messages[0].tool_calls[0].name }}")
    assert template.render([{"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}]) == "f"


# -- thinking -------------------------------------------------------------------------------------------------------


THINKING_CASES = [
    ("<think>\nLet me see.\n</think>\n\nParis.", ("Let me see.", "Paris.")),
    ("  <think>a</think>b  ", ("a", "b")),
    ("<think>\n\n</think>\n\nNo thoughts.", ("", "No thoughts.")),
    ("<think>unfinished", ("unfinished", "")),
    ("Plain answer <think>not leading</think>", ("", "Plain answer <think>not leading</think>")),
    ("  plain with spaces  ", ("", "  plain with spaces  ")),
    ("", ("", "")),
    ("<thin", ("", "<thin")),
    ("<think>x</think>y</think>z", ("x", "y</think>z")),
    ("<think> a  b </think> c  d ", ("a  b", "c  d")),
]


@pytest.mark.parametrize(("text", "expected"), THINKING_CASES)
def test_split_thinking(text: str, expected: tuple[str, str]) -> None:
    assert split_thinking(text) == expected


def test_split_thinking_started() -> None:
    assert split_thinking("reasoning\n</think>\n\nanswer", started=True) == ("reasoning", "answer")
    assert split_thinking("still thinking", started=True) == ("still thinking", "")


def _filter_all(pieces: list[str], started: bool = False) -> tuple[str, str]:
    f = ThinkingFilter(started=started)
    thinking, answer = [], []
    for piece in pieces:
        t, a = f.push(piece)
        thinking.append(t)
        answer.append(a)
    t, a = f.flush()
    return "".join(thinking) + t, "".join(answer) + a


@pytest.mark.parametrize(("text", "expected"), THINKING_CASES)
def test_thinking_filter_at_every_split(text: str, expected: tuple[str, str]) -> None:
    assert _filter_all([text]) == expected
    assert _filter_all(list(text)) == expected
    for i in range(len(text) + 1):
        assert _filter_all([text[:i], text[i:]]) == expected, i
    if len(text) <= 24:
        for i, j in itertools.combinations(range(len(text) + 1), 2):
            assert _filter_all([text[:i], text[i:j], text[j:]]) == expected, (i, j)


def test_thinking_filter_streams_early() -> None:
    f = ThinkingFilter()
    assert f.push("<think>") == ("", "")
    assert f.in_thinking
    assert f.push("Some thought ") == ("Some thought", "")
    assert f.push("more</thi") == (" more", "")
    assert f.push("nk>\n\nThe answer") == ("", "The answer")
    assert not f.in_thinking
    assert f.flush() == ("", "")
    started = ThinkingFilter(started=True)
    assert started.push("abc</think>def") == ("abc", "def")


# -- stop conditions ------------------------------------------------------------------------------------------------


def test_stop_ids() -> None:
    checker = StopChecker(stop_ids=[2, 0])
    assert checker.check(2, "")
    assert checker.matched == 2
    assert not checker.check(5, "text")


@pytest.mark.parametrize("stop", ["\nUser:", "###", "x"])
def test_stop_string_split_across_pieces(stop: str) -> None:
    text = "Hello there, friend." + stop + " trailing"
    first_end = text.index(stop) + len(stop)
    for cut_a in range(1, len(text)):
        for cut_b in range(cut_a, min(cut_a + 6, len(text))):
            pieces = [text[:cut_a], text[cut_a:cut_b], text[cut_b:]]
            checker = StopChecker([], ["never", stop])
            so_far = ""
            stopped_at = None
            for n, piece in enumerate(pieces):
                so_far += piece
                if checker.check(100 + n, so_far):
                    stopped_at = len(so_far)
                    break
            assert stopped_at is not None
            assert stopped_at >= first_end
            # It fires on the piece that completes the stop string, not later.
            assert stopped_at - len(pieces[n]) < first_end
            assert checker.matched == stop
            assert checker.trim(so_far) == "Hello there, friend."


def test_stop_checker_looks_only_at_the_tail() -> None:
    checker = StopChecker([], ["STOP"])
    text = "STOP is old news. " * 10
    # A stop string completed by an earlier check is not found again by a later one: only the new tail is read.
    checker._seen = len(text)
    assert not checker.check(1, text + "more")
    checker.reset()
    assert checker.check(1, text)


def test_stop_checker_new_text_resets() -> None:
    checker = StopChecker([], ["END"])
    assert not checker.check(1, "a long first text without it")
    assert checker.check(1, "END")  # shorter than before: a new generation, read from the start


def test_trim_and_find() -> None:
    checker = StopChecker([], ["<|im_end|>", "\n\n"])
    assert checker.trim("answer\n\nmore<|im_end|>") == "answer"
    assert checker.trim("answer<|im_end|>\n\n") == "answer"
    assert checker.trim("nothing") == "nothing"
    assert checker.find("nothing") == -1


def test_stop_checker_errors() -> None:
    with pytest.raises(ArgumentError):
        StopChecker([], "not a list")
    with pytest.raises(ArgumentError):
        StopChecker([], [""])
