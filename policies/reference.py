"""The policy reference of ``docs/policies.md``, written from the code: the view a policy decides
on (the Structs of ``events/view.py``: every field with its type, default and documentation), the
``Policy`` class's members, the helpers of ``policies/base.py``, the intents a policy returns and
the events it sees.

    python -m shunter.policies.reference            # rewrite the section in docs/policies.md
    python -m shunter.policies.reference --check    # exit 1 if the page is out of date

Invariant: what the page shows between its two markers is ``render()``'s output
(``tests/unit/test_docs.py`` compares them), and ``render()`` refuses — ``ValueError`` naming it
— a view field, ``Policy`` member or helper without its documentation in the code (an attribute
docstring, a docstring), and a public name of ``policies/base.py`` it neither shows nor lists in
``NOT_SHOWN``: a field or helper added to the code is added to the page, or the test fails.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from shunter.events import EVENT_TYPES, INTENT_TYPES, Message, tag_of
from shunter.events.view import BufferView, EngineView, ReplicaView, TrainerView
from shunter.policies import base

BEGIN = "<!-- reference: written by `python -m shunter.policies.reference` from the code; do not edit by hand -->"
END = "<!-- end of the reference -->"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "policies.md"

VIEWS: tuple[tuple[str, type[msgspec.Struct]], ...] = (
    ("view", EngineView),
    ("view.replicas[i]", ReplicaView),
    ("view.trainer", TrainerView),
    ("view.buffer", BufferView),
)
"""Each Struct of the view, with how a policy reaches it."""
POLICY_MEMBERS = ("name", "State", "ignores", "__init__", "check_setup", "decide", "snapshot", "restore", "state")
"""The members of ``Policy`` a policy author writes or calls, in the order the page shows them."""
HELPERS: tuple[Callable[..., Any], ...] = (
    base.train_or_publish,
    base.load_on_ready,
    base.validate_when_due,
    base.straggler_lane,
    base.live_ids,
    base.option_flag,
    base.option_number,
    base.option_sleep_level,
)
HELPER_VALUES = ("SAMPLE_EVENTS", "ValidationState", "LaneOptions", "LaneState")
"""Names of ``policies/base.py`` the helpers take or a policy declares."""
NOT_SHOWN = {
    "Policy": "the class has its own section",
    "NoState": "the default State",
    "unknown_keys": "what Policy.restore() checks a snapshot with",
    "checked_ignores": "how the coordinator reads a class's ignores",
}
"""Public names of ``policies/base.py`` that are not for a policy to call, and why."""
ENVELOPE = {f.name for f in msgspec.structs.fields(Message)}
"""Fields every message carries (``run_id``, ``source``, ``seq``, ``wall_time``): not repeated per row."""


def render() -> str:
    """The reference, Markdown, between (and with) its two markers."""
    out = [BEGIN, ""]
    for path, struct in VIEWS:
        out += _struct_section(path, struct)
    out += _policy_section()
    out += _helpers_section()
    out += _messages_section(
        "The intents a policy returns",
        "what `decide()` returns a list of, from `shunter.events`; the coordinator carries each out "
        "or refuses it (`coordinator.intent_rejected` in the event log, never shown to the policy)",
        INTENT_TYPES,
    )
    out += _messages_section(
        "The events a policy sees",
        "each is applied before `decide()` is called on it, so the view already shows it; the "
        "events about the policy itself (`policy.failed`, `policy.slow`, `coordinator.intent_rejected`) "
        "and the types in the class's `ignores` are not shown to it",
        tuple(t for t in EVENT_TYPES if t.to_policy),
    )
    return "\n".join([*out, END]) + "\n"


# -- sections ------------------------------------------------------------------------------------


def _struct_section(path: str, struct: type[msgspec.Struct]) -> list[str]:
    docs = _attribute_docs(struct)
    hints = typing.get_type_hints(struct)
    out = [f"### `{path}`: `{struct.__name__}`", "", _md(_doc(struct)), ""]
    out += ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in msgspec.structs.fields(struct):
        doc = docs.get(f.name) or _missing(f"{struct.__name__}.{f.name}")
        default = _default(f)
        default = default if default.startswith("(") else f"`{default}`"
        out.append(f"| `{f.name}` | {_cell(_type(hints[f.name]))} | {default} | {_cell(doc)} |")
    methods = [(n, m) for n, m in vars(struct).items() if inspect.isfunction(m) and not n.startswith("_")]
    if methods:
        out += ["", "| method | meaning |", "|---|---|"]
        for name, fn in methods:
            shown = _cell(_call(path, name, fn))
            out.append(f"| `{shown}` | {_cell(_doc(fn) or _missing(f'{struct.__name__}.{name}'))} |")
    return [*out, ""]


def _policy_section() -> list[str]:
    docs = _attribute_docs(base.Policy)
    out = [
        "### The `Policy` class (`shunter.policies.Policy`)",
        "",
        _md(_doc(base.Policy)),
        "",
        "| member | meaning |",
        "|---|---|",
    ]
    for name in POLICY_MEMBERS:
        member = inspect.getattr_static(base.Policy, name)
        if isinstance(member, property):
            shown, doc = f"`self.{name}`", _doc(member.fget)
        elif isinstance(member, classmethod | staticmethod) or inspect.isfunction(member):
            fn = member.__func__ if isinstance(member, classmethod | staticmethod) else member
            prefix = "@classmethod " if isinstance(member, classmethod) else ""
            shown, doc = f"`{_cell(prefix + _call('', name, fn))}`", _doc(fn)
        else:
            shown, doc = f"`{name}` (class attribute)", docs.get(name, "")
        out.append(f"| {shown} | {_cell(doc or _missing(f'Policy.{name}'))} |")
    return [*out, ""]


def _helpers_section() -> list[str]:
    shown = {fn.__name__ for fn in HELPERS} | set(HELPER_VALUES)
    public = {
        n
        for n, v in vars(base).items()
        if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == base.__name__
    } | {n for n in _module_docs() if not n.startswith("_")}
    unlisted = sorted(public - shown - set(NOT_SHOWN))
    if unlisted:
        raise ValueError(
            f"policies/base.py: {', '.join(unlisted)} neither in the policy reference (HELPERS, HELPER_VALUES) "
            "nor in NOT_SHOWN (shunter/policies/reference.py)"
        )
    out = [
        "### Helpers (`shunter.policies.base`)",
        "",
        "Pure functions of the event and the view that the built-in policies are made of; add their "
        "intents together (`load_on_ready(event, view) + train_or_publish(event, view)`).",
        "",
        "| helper | what it does |",
        "|---|---|",
    ]
    for fn in HELPERS:
        out.append(f"| `{_cell(_call('', fn.__name__, fn))}` | {_cell(_doc(fn) or _missing(fn.__name__))} |")
    values = _module_docs()
    for name in HELPER_VALUES:
        value = getattr(base, name)
        doc = _doc(value) if inspect.isclass(value) else values.get(name, "")
        out.append(f"| `{name}` | {_cell(doc or _missing(name))} |")
    return [*out, ""]


def _messages_section(title: str, about: str, kinds: tuple[type[Message], ...]) -> list[str]:
    out = [
        f"### {title}",
        "",
        f"{about[0].upper()}{about[1:]}.",
        "",
        "| type | tag | fields | meaning |",
        "|---|---|---|---|",
    ]
    for kind in kinds:
        fields = ", ".join(f.name for f in msgspec.structs.fields(kind) if f.name not in ENVELOPE)
        first = _doc(kind).split("\n\n", 1)[0]
        out.append(f"| `{kind.__name__}` | `{tag_of(kind)}` | {_cell(fields) or '—'} | {_cell(first)} |")
    return [*out, ""]


# -- reading the code ----------------------------------------------------------------------------


def _attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a class: the string right after each annotated name."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def _module_docs() -> dict[str, str]:
    """The values ``policies/base.py`` assigns at module level, with their docstrings ("" if none)."""
    body = ast.parse(inspect.getsource(base)).body
    out = {}
    for stmt, nxt in zip(body, [*body[1:], ast.Pass()], strict=True):
        targets = (
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else stmt.targets if isinstance(stmt, ast.Assign) else []
        )
        documented = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        for t in targets:
            if isinstance(t, ast.Name):
                out[t.id] = inspect.cleandoc(str(nxt.value.value)) if documented else ""  # type: ignore[attr-defined]
    return out


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if getattr(obj, "__doc__", None) else ""


class _Written:
    """An annotation as the source wrote it (``from __future__ import annotations``: a string)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _call(path: str, name: str, fn: Callable[..., Any]) -> str:
    """``path.name(args) -> returns`` as the source writes it, without ``self`` / ``cls``."""
    sig = inspect.signature(fn)
    params = [
        p.replace(annotation=_Written(str(p.annotation))) if p.annotation is not p.empty else p
        for p in sig.parameters.values()
        if p.name not in ("self", "cls")
    ]
    ret = sig.return_annotation
    shown = sig.replace(
        parameters=params,
        return_annotation=_Written(str(ret)) if ret is not sig.empty and name != "__init__" else sig.empty,
    )
    head = "Policy" if name == "__init__" else f"{path + '.' if path else ''}{name}"
    return f"{head}{shown}"


def _type(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else _type(a) for a in args)}]"
    if t is type(None):
        return "None"
    return t.__name__ if isinstance(t, type) else str(t)


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.default_factory is not msgspec.NODEFAULT:
        made = f.default_factory()
        return repr(made) if isinstance(made, list | dict | tuple) and not made else f"{f.default_factory.__name__}()"
    v = f.default
    if v is msgspec.NODEFAULT:
        return "(always set)"
    if isinstance(v, msgspec.Struct):
        return f"{type(v).__name__}()" if v == type(v)() else repr(v)
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _md(text: str) -> str:
    """A docstring as Markdown: ``code`` as `code`."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return " ".join(_md(text).split()).replace("|", "\\|")


def _missing(what: str) -> str:
    raise ValueError(f"{what} has no documentation in the code: the policy reference shows it (docs/policies.md)")


# -- the page ------------------------------------------------------------------------------------


def _split(page: str) -> Iterator[str]:
    """The page before the reference, the reference, the page after it."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"{PAGE}: the reference's markers are missing or out of order")
    head, rest = page.split(BEGIN)
    inside, tail = rest.split(END)
    yield from (head, BEGIN + inside + END + "\n", tail.removeprefix("\n"))


def shown(page: str) -> str:
    """The reference as a page holds it."""
    return list(_split(page))[1]


def with_reference(page: str) -> str:
    """The page with its reference rewritten from the code."""
    head, _, tail = _split(page)
    return head + render() + tail


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    page = PAGE.read_text()
    new = with_reference(page)
    if "--check" in args:
        if new != page:
            print(f"{PAGE} is out of date: run python -m shunter.policies.reference", file=sys.stderr)
            return 1
        return 0
    if new != page:
        PAGE.write_text(new)
        print(f"rewrote the reference in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
