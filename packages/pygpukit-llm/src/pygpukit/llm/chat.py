"""Chat templates, reasoning ("thinking") splitting and stop conditions for pygpukit.llm.

:class:`ChatTemplate` renders a model's Jinja chat template the way transformers' ``apply_chat_template`` does:
a sandboxed, immutable Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the loop-control extension,
the ``{% generation %}`` tag, ``raise_exception``, ``strftime_now`` and a ``tojson`` filter that neither escapes
HTML nor non-ASCII text. Templates come from model files, so they are treated as untrusted code: the sandbox
refuses access to private attributes and mutation of the caller's data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypedDict

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox
import jinja2.utils

from pygpukit.core.errors import ArgumentError, PyGPUkitError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = [
    "ChatMessage",
    "ChatTemplate",
    "ChatTemplateError",
    "StopChecker",
    "ThinkingFilter",
    "split_thinking",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Older names of a message's reasoning text; templates (Qwen3) read "reasoning_content", gpt-oss reads "thinking".
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(PyGPUkitError):
    """A chat template failed to compile or to render (a syntax error, ``raise_exception`` in the template,
    an undefined value used wrongly, or an operation the sandbox forbids)."""


class _ChatMessageRequired(TypedDict):
    role: str
    content: str


class ChatMessage(_ChatMessageRequired, total=False):
    """One message of a conversation: ``role`` ("system", "user", "assistant", "tool") and ``content``.

    Optional keys are passed to the template as they are: ``reasoning_content`` (the thinking of an assistant
    turn), ``tool_calls``, ``name``, ``tool_call_id``."""

    reasoning_content: str
    tool_calls: list[dict[str, Any]]
    name: str
    tool_call_id: str


# -- the Jinja environment ------------------------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks assistant text for training masks; renders its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja reads this class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own filter HTML-escapes its output; chat templates need the plain JSON that json.dumps writes.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """The ``dict`` global: builds plain dicts, without giving templates the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attribute names, a route to interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # Same positional trick as jinja's Namespace so that namespace(self=...) still works.
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed (leading underscore)")


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, raising at once on an unsafe attribute (``x.__class__``) instead of quietly
    rendering it empty, so that a template probing for interpreter internals fails visibly."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed"
        )


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def _plain(value: Any, path: str) -> Any:
    """A copy of ``value`` made of JSON-like builtins only, so the template sees no methods of caller objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, path): _plain(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise ArgumentError(f"{path} has a value of type {type(value).__name__}; use str, numbers, bools, lists, dicts")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ArgumentError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ArgumentError("messages is empty: a chat template needs at least one message")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ArgumentError(f"messages[{i}] is a {type(message).__name__}, not a dict")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ArgumentError(f"messages[{i}]['role'] must be a non-empty str, got {role!r}")
        content = message.get("content")
        # A tool-calling assistant turn may have no text; multimodal content is a list of blocks.
        if not (
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(b, Mapping) for b in content))
            or (content is None and message.get("tool_calls"))
        ):
            raise ArgumentError(f"messages[{i}]['content'] must be a str, got {type(content).__name__}")
        # Keys set to None are dropped: templates test for a key's presence, and would render "None".
        plain = {str(k): _plain(v, f"messages[{i}][{k!r}]") for k, v in message.items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


class ChatTemplate:
    """A compiled chat template.

    ``bos_token`` / ``eos_token`` and ``extra`` (``unk_token``, ``pad_token`` ...) are template variables, as
    transformers passes a tokenizer's special tokens; keyword arguments of :meth:`render` override them. Use
    :meth:`from_tokenizer` to take all of them, and the template, from a :class:`~pygpukit.llm.Tokenizer`.
    """

    def __init__(self, source: str, bos_token: str | None = "", eos_token: str | None = "", **extra: Any) -> None:
        if not isinstance(source, str) or not source:
            raise ArgumentError("a chat template source must be a non-empty str")
        self.source = source
        self.variables: dict[str, Any] = {
            k: v for k, v in {"bos_token": bos_token, "eos_token": eos_token, **extra}.items() if v is not None
        }
        try:
            self._template = _compile(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, source: str | None = None) -> ChatTemplate:
        """The tokenizer's chat template (or ``source``) with its bos/eos/unk/pad tokens as variables."""
        template = source if source is not None else tokenizer.chat_template
        if template is None:
            raise ChatTemplateError("this tokenizer has no chat template; pass one as source")
        return cls(
            template,
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
            unk_token=tokenizer.unk_token,
            pad_token=tokenizer.pad_token,
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` into the prompt text.

        ``add_generation_prompt`` appends the header of an assistant turn. ``tools`` (JSON schemas) and
        ``documents`` reach templates that support them; other keywords (``enable_thinking=False`` for Qwen3)
        become template variables. ``continue_final_message`` leaves the last message open so the model continues
        it (incompatible with ``add_generation_prompt``).
        """
        chat = _check_messages(messages)
        if continue_final_message and add_generation_prompt:
            raise ArgumentError("continue_final_message and add_generation_prompt cannot both be set")
        if tools is not None and (isinstance(tools, (str, Mapping)) or not all(isinstance(t, Mapping) for t in tools)):
            raise ArgumentError("tools must be a list of JSON-schema dicts")
        if documents is not None and (
            isinstance(documents, (str, Mapping)) or not all(isinstance(d, Mapping) for d in documents)
        ):
            raise ArgumentError("documents must be a list of dicts")
        final_text: str | None = None
        if continue_final_message:
            last = chat[-1]
            if not isinstance(last.get("content"), str):
                raise ArgumentError("continue_final_message needs a final message with str content")
            final_text = last["content"]
            last["content"] = final_text + _CONTINUE_TAG
        context: dict[str, Any] = {
            **self.variables,
            **{k: _plain(v, k) for k, v in kwargs.items()},
            "messages": chat,
            "tools": _plain(list(tools), "tools") if tools is not None else None,
            "documents": _plain(list(documents), "documents") if documents is not None else None,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            rendered = self._template.render(**context)
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"chat template attempted a forbidden operation: {exc}") from exc
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        if final_text is not None:
            rendered = _cut_at_continue_tag(rendered, final_text)
        return rendered

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars, variables={sorted(self.variables)})"


def _cut_at_continue_tag(rendered: str, final_text: str) -> str:
    """Cut the render right after the final message's text, which was marked with a tag."""
    marker = _CONTINUE_TAG.strip()
    at = rendered.rfind(marker)
    if at < 0 or final_text.strip() not in rendered:
        raise ChatTemplateError("continue_final_message: the template did not render the final message's text verbatim")
    if rendered.startswith(_CONTINUE_TAG, at):
        return rendered[:at]
    # The template trimmed the text (and the tag's trailing space), so trailing spacing cannot be trusted.
    return rendered[:at].rstrip()


# -- thinking -------------------------------------------------------------------------------------------------------


def split_thinking(text: str, *, started: bool = False) -> tuple[str, str]:
    """Split a reasoning model's output into ``(thinking, answer)``.

    The thinking is the text of a leading ``<think>...</think>`` block (Qwen3, DeepSeek-R1), stripped; the answer
    is the rest, stripped. Without a leading think block the result is ``("", text)``. An unterminated block is
    all thinking. ``started=True`` is for prompts that already opened the block (their generation prompt ends in
    ``<think>``): then the text up to ``</think>`` is the thinking.
    """
    if not isinstance(text, str):
        raise ArgumentError(f"text must be a str, got {type(text).__name__}")
    if started:
        body = text
    else:
        stripped = text.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return "", text
        body = stripped[len(THINK_OPEN) :]
    end = body.find(THINK_CLOSE)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(THINK_CLOSE) :].strip()


class ThinkingFilter:
    """Streaming :func:`split_thinking`: :meth:`push` text pieces, get ``(thinking, answer)`` pieces back.

    Tags split across pieces are recognised. Whitespace is handled as :func:`split_thinking` strips it: leading
    whitespace of each part is dropped and trailing whitespace is held back until more text follows, so that the
    concatenated pieces (after :meth:`flush`) equal ``split_thinking(full_text)``.
    """

    def __init__(self, *, started: bool = False) -> None:
        self._state = "think" if started else "start"
        self._buffer = ""  # text not yet classified (a possible tag prefix, or held whitespace)
        self._at_part_start = True  # leading whitespace of the current part is still being dropped
        self._held = ""  # trailing whitespace of the current part, emitted only if more text follows

    @property
    def in_thinking(self) -> bool:
        """Whether the stream is inside the think block."""
        return self._state == "think"

    def push(self, piece: str) -> tuple[str, str]:
        """Feed the next piece of text; returns the new (thinking, answer) text."""
        if not isinstance(piece, str):
            raise ArgumentError(f"piece must be a str, got {type(piece).__name__}")
        self._buffer += piece
        thinking: list[str] = []
        answer: list[str] = []
        for part, text in self._drain(final=False):
            (thinking if part == "think" else answer).append(text)
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """End of stream: returns what is left (trailing whitespace of a stripped part is dropped)."""
        thinking: list[str] = []
        answer: list[str] = []
        for part, text in self._drain(final=True):
            (thinking if part == "think" else answer).append(text)
        return "".join(thinking), "".join(answer)

    def _drain(self, final: bool) -> Iterator[tuple[str, str]]:
        while True:
            if self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(THINK_OPEN):
                    self._buffer = head[len(THINK_OPEN) :]
                    self._state, self._at_part_start = "think", True
                    continue
                if not final and THINK_OPEN.startswith(head):
                    return  # still possibly "<think>" (or only whitespace so far)
                # No think block: the whole text is the answer, unstripped.
                self._state = "raw"
                continue
            if self._state == "raw":
                if self._buffer:
                    yield "answer", self._buffer
                    self._buffer = ""
                return
            # "think" or "answer": both strip their part.
            if self._state == "think":
                end = self._buffer.find(THINK_CLOSE)
                if end >= 0:
                    yield from self._emit("think", self._buffer[:end], final=True)
                    self._buffer = self._buffer[end + len(THINK_CLOSE) :]
                    self._state, self._at_part_start = "answer", True
                    continue
                keep = 0 if final else _partial_suffix(self._buffer, THINK_CLOSE)
                text, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
                yield from self._emit("think", text, final=final)
                return
            yield from self._emit("answer", self._buffer, final=final)
            self._buffer = ""
            return

    def _emit(self, part: str, text: str, *, final: bool) -> Iterator[tuple[str, str]]:
        """Yield ``text`` of a stripped part, holding back its trailing whitespace unless ``final``."""
        text = self._held + text
        if self._at_part_start:
            text = text.lstrip()
            if text:
                self._at_part_start = False
        body = text.rstrip()
        self._held = "" if final else text[len(body) :]
        if body:
            yield part, body


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (a tag possibly cut off)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


# -- stop conditions ------------------------------------------------------------------------------------------------


class StopChecker:
    """Stops generation on stop token ids or stop strings.

    :meth:`check` is called once per generated token with the text generated so far; stop strings are looked for
    only in the tail that the newest piece can have completed (its length plus the longest stop string), so the
    cost per token does not grow with the text.
    """

    def __init__(self, stop_ids: Iterable[int] = (), stop_strings: Sequence[str] = ()) -> None:
        if isinstance(stop_strings, str):
            raise ArgumentError("stop_strings must be a sequence of str, not a single str")
        self.stop_ids: frozenset[int] = frozenset(int(i) for i in stop_ids)
        strings = tuple(stop_strings)
        for s in strings:
            if not isinstance(s, str) or not s:
                raise ArgumentError(f"stop strings must be non-empty str, got {s!r}")
        self.stop_strings: tuple[str, ...] = strings
        self._longest = max((len(s) for s in strings), default=0)
        self._seen = 0  # length of the text at the previous check
        self.matched: str | int | None = None  # the stop string or id that fired

    def reset(self) -> None:
        """Forget the previous text (for a new generation)."""
        self._seen = 0
        self.matched = None

    def check(self, token_id: int, text_so_far: str) -> bool:
        """Whether generation should stop after ``token_id``, given all text generated so far."""
        if int(token_id) in self.stop_ids:
            self.matched = int(token_id)
            return True
        if not self.stop_strings:
            return False
        if len(text_so_far) < self._seen:
            self._seen = 0  # a new text: look at all of it
        start = max(0, self._seen - self._longest + 1)
        self._seen = len(text_so_far)
        tail = text_so_far[start:]
        for s in self.stop_strings:
            if s in tail:
                self.matched = s
                return True
        return False

    def find(self, text: str) -> int:
        """Index of the first stop string in ``text``, or -1."""
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits) if hits else -1

    def trim(self, text: str) -> str:
        """``text`` cut before the first stop string it contains (unchanged if none)."""
        at = self.find(text)
        return text if at < 0 else text[:at]
