"""Run configuration: TOML (or plain data) -> a checked :class:`EngineConfig`.

Invariant: a config that loads is internally consistent (``engine.config.checks``); unknown keys
are errors (a typo never silently falls back to a default), and an error names the field, the
value given and, for a typo, the closest field names — blaming an override where one set it.
Overrides combine with a file by one rule (:func:`merge`): a section field by field, a field's
value (a table too) whole, and a policy's options only with their policy.

Every field carries its documentation in ``msgspec.Meta(description=...)``; ``shunter
config-schema`` prints them as JSON schema (:func:`schema`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from shunter.engine.config.base import ConfigError
from shunter.engine.config.checks import check
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.run import RunConfig
from shunter.engine.replica import lengths

DEFAULT_POLICY = RunConfig().policy
"""``run.policy`` where a config names none: what an override's ``run.policy`` is compared with."""


def from_dict(data: dict[str, Any], *, origin: str = "config", overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Build and check a config from plain data (e.g. parsed TOML); a value refused that came
    from ``overrides`` (merged into ``data`` by the caller) is blamed on the override, not on
    ``origin``."""
    try:
        cfg = msgspec.convert(data, EngineConfig)
    except msgspec.ValidationError as e:
        where = _overridden(str(e), overrides or {})
        source = f"override {where} (over {origin})" if where else origin
        raise ConfigError(f"{source}: {e}{_value_of(str(e), data)}{_did_you_mean(str(e))}") from None
    try:
        check(cfg)
    except ConfigError as e:  # a rule across fields: say which of them the caller's overrides set
        given = [k for k in _leaves(overrides or {}) if k in str(e)]  # only fields the rule names
        if not given:
            raise
        raise ConfigError(f"{e} (overrides given over {origin}: {', '.join(given)})") from None
    return cfg


def _leaves(over: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys an overrides dict sets (``{"run": {"total_steps": 5}}`` -> ``run.total_steps``)."""
    out = []
    for k, v in over.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def _overridden(error: str, overrides: dict[str, Any]) -> str:
    """The dotted key msgspec's error is about (``- at `$.run.total_steps```, or an unknown
    field's own name) where ``overrides`` gave it; else ""."""
    import re

    m = re.search(r"- at `\$((?:\.\w+)*)`", error)
    keys = m.group(1).split(".")[1:] if m else []
    unknown = re.search(r"unknown field `([^`]+)`", error)
    keys += [unknown.group(1)] if unknown else []
    return ".".join(keys) if _lookup(overrides, keys) else ""


def _lookup(data: dict[str, Any], keys: list[str]) -> tuple[Any] | tuple[()]:
    """``(value,)`` at the nested ``keys`` of ``data``; ``()`` where a key is missing."""
    value: Any = data
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return ()
        value = value[key]
    return (value,)


def _value_of(error: str, data: dict[str, Any]) -> str:
    """For msgspec's "Expected `int` <= 256 - at `$.task.max_turns`": the value given, `` (got 1000000)``."""
    import re

    m = re.search(r"^Expected [^,]*? - at `\$((?:\.\w+)+)`$", error)
    found = _lookup(data, m.group(1).split(".")[1:]) if m else ()
    return f" (got {found[0]!r:.80})" if found else ""


def _did_you_mean(error: str) -> str:
    """For msgspec's "Object contains unknown field `x` - at `$.run`": the closest field names."""
    import difflib
    import re

    m = re.search(r"unknown field `([^`]+)`(?: - at `\$(?:\.(\w+))?`)?", error)
    if not m:
        return ""
    section = {f.name: f.type for f in msgspec.structs.fields(EngineConfig)}.get(m.group(2) or "")
    names = (
        [f.name for f in msgspec.structs.fields(section)]
        if section
        else [f.name for f in msgspec.structs.fields(EngineConfig)]
    )
    if "." in m.group(1):  # {"run.total_steps": 5}: a dotted key where a nested table is meant
        section, _, key = m.group(1).partition(".")
        return f" (nest it: {{{section!r}: {{{key!r}: ...}}}}, as a TOML table [{section}] does)"
    close = difflib.get_close_matches(m.group(1), names, n=3)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Load a TOML file; ``overrides`` (nested dict, section -> field -> value) is laid over it
    before checking, as :func:`merge` does: section by section, field by field, a field's value
    — a table such as ``run.policy_options`` too — replacing the file's whole, and an override
    naming another ``run.policy`` without ``run.policy_options`` dropping the file's options
    (they belong to its policy). ``{"run": {"policy": "separate", "policy_options": {}}}``
    runs ``separate`` with no options, whatever the file's policy and options.

    Import strings in the config (``run.policy``, ``task.name``, ``task.reward``,
    ``trainer.loss_fn``) are resolved from the config file's folder and the working directory
    first (both absolute, appended to ``run.import_paths``), then from installed packages."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    data = merge(data, overrides or {})
    run = data.setdefault("run", {}) if isinstance(data.get("run", {}), dict) else {}
    paths = list(run.get("import_paths", []))
    for folder in (p.resolve().parent, Path.cwd().resolve()):
        if str(folder) not in paths:
            paths.append(str(folder))
    run["import_paths"] = paths
    files = data.get("data")
    if isinstance(files, dict):  # dataset paths and globs from the config's folder
        for key in ("train_files", "val_files"):
            if isinstance(files.get(key), list):
                files[key] = [
                    f if not isinstance(f, str) or Path(f).expanduser().is_absolute() else str(p.resolve().parent / f)
                    for f in files[key]
                ]
    ro = data.get("rollout")
    if isinstance(ro, dict) and isinstance(ro.get("length_dist"), str):
        ro["length_dist"] = lengths.resolved(ro["length_dist"], p.resolve().parent)
    return from_dict(data, origin=str(p), overrides=overrides)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` (overrides) laid over ``base`` (a config's data, or other overrides); neither is changed.

    How they combine (docs/configuration.md, "Overrides"):

    - a section (``run``, ``rollout``, ...) merges field by field: the fields ``over`` gives
      replace the base's, the others are kept;
    - a field's value replaces the base's whole — a number, a string, a list and a table alike
      (``run.policy_options``, ``rollout.engine_args``, ``rollout.resources``,
      ``trainer.resources``): ``{"run": {"policy_options": {}}}`` clears the options,
      ``{"trainer": {"resources": {"node_b": 1}}}`` leaves no ``node_a``;
    - a policy's options belong to it: where ``over`` names another ``run.policy`` than the base's
      (its own, or the default) and gives no ``run.policy_options``, the base's options are dropped.
    """
    out = dict(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    run, new = base.get("run"), over.get("run")
    if isinstance(run, dict) and isinstance(new, dict) and _another_policy(run, new):  # out["run"]: their merge
        out["run"] = {k: v for k, v in out["run"].items() if k != "policy_options"}
    return out


def _another_policy(run: dict[str, Any], new: dict[str, Any]) -> bool:
    """``new`` (an override's ``run``) names another policy than ``run`` and gives it no options."""
    return "policy" in new and "policy_options" not in new and new["policy"] != run.get("policy", DEFAULT_POLICY)


def schema() -> dict[str, Any]:
    return msgspec.json.schema(EngineConfig)
