"""Import strings (``module:Name``) resolve where users keep their code: the config file's
folder and the working directory first, in the user's process and in every actor (each gets
``run.import_paths``); and every import string the README and the examples show resolves from
a fresh clone, as the CLI resolves it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shunter.engine.config import ConfigError, load_config
from shunter.policies.registry import import_object, import_paths

ROOT = Path(__file__).resolve().parents[4]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "examples").glob("*.py"))]
SHOWN = sorted({m for p in DOCS for m in re.findall(r"\b((?:examples|shunter)\.[\w.]+:\w+)", p.read_text())})


def test_the_docs_show_import_strings():
    assert "examples.custom_policy:EagerLendPolicy" in SHOWN and "examples.custom_loop:reinforce_loss" in SHOWN


@pytest.mark.parametrize("spec", SHOWN)
def test_every_import_string_shown_resolves_from_a_checkout(spec):
    code = f"from shunter.policies.registry import import_object; import_object({spec!r}, 'doc')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def _job(folder: Path, policy: str = "") -> Path:
    """A folder holding a config and, next to it, the policy module it names (a name unique to
    the test: a module imported once stays imported in this process)."""
    folder.mkdir(parents=True, exist_ok=True)
    module = f"my_policy_{folder.parent.name.replace('-', '_')}"
    policy = policy.replace("my_policy", module) if policy else f"{module}:Mine"
    (folder / f"{module}.py").write_text(
        textwrap.dedent("""
        from shunter.policies import SeparatePolicy

        class Mine(SeparatePolicy):
            name = "mine"
    """)
    )
    cfg = folder / "job.toml"
    cfg.write_text(f'[run]\npolicy = "{policy}"\n')
    return cfg


def test_an_import_string_the_docs_showed_before_the_engine_moved_still_resolves():
    """``task.reward = "shunter.engine.math_reward:compute_score"`` (the docs' spelling until the
    engine's modules moved into sub-packages) still loads the math reward."""
    from shunter.engine.tasks.math_reward import compute_score

    assert import_object("shunter.engine.math_reward:compute_score", "task.reward") is compute_score


def test_a_policy_next_to_the_config_loads_whatever_the_working_directory(tmp_path, monkeypatch):
    cfg_path = _job(tmp_path / "job")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(cfg_path)
    assert str((tmp_path / "job").resolve()) in cfg.run.import_paths
    code = textwrap.dedent(f"""
        import msgspec
        from shunter.engine.config import EngineConfig
        from shunter.policies import make_policy
        from shunter.policies.registry import use_import_paths
        cfg = msgspec.json.decode({msgspec_json(cfg)!r}, type=EngineConfig)
        use_import_paths(cfg.run.import_paths)   # what every actor of the run does first
        print(type(make_policy(cfg.run.policy)).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "Mine", out.stderr[-2000:]


def msgspec_json(cfg) -> str:
    import msgspec

    return msgspec.json.encode(cfg).decode()


def test_a_missing_module_says_where_it_looked(tmp_path):
    cfg = _job(tmp_path / "job", policy="not_here:Mine")
    with pytest.raises(ConfigError, match=r"cannot import module 'not_here'.*config file's folder"):
        load_config(cfg)


def test_a_module_that_raises_on_import_is_named_with_its_error(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('half-written module')\n")
    with (
        import_paths([str(tmp_path)]),
        pytest.raises(ValueError, match="importing module 'broken' raised RuntimeError"),
    ):
        import_object("broken:X", "policy")


def test_a_typo_in_the_name_says_what_the_module_lacks(tmp_path):
    cfg = _job(tmp_path / "job", policy="my_policy:Mien")
    with pytest.raises(ConfigError, match="has no attribute 'Mien'"):  # the module is found, the class is not
        load_config(cfg)


def test_a_module_that_imports_something_missing_says_so_not_that_it_is_missing(tmp_path):
    (tmp_path / "needs_dep.py").write_text("import nonexistent_pkg_xyz\n")
    with (
        import_paths([str(tmp_path)]),
        pytest.raises(
            ValueError,
            match="module 'needs_dep' was found, but it imports 'nonexistent_pkg_xyz', which is not installed",
        ),
    ):
        import_object("needs_dep:X", "policy")


def test_an_actor_that_died_in_its_constructor_is_reported_by_its_own_error():
    from shunter.actors.wire import root_cause

    class ActorDiedError(Exception):
        pass

    ray_text = (
        "The actor died because of an error raised in its creation task, ray::CoordinatorActor.__init__()\n"
        '  File "x.py", line 3, in f\n    raise ValueError(...)\n'
        "ValueError: group 480 has 8 samples per prompt; this run uses 4"
    )
    assert root_cause(ActorDiedError(ray_text)) == "ValueError: group 480 has 8 samples per prompt; this run uses 4"

    class Wrapped(Exception):
        cause = KeyError("x")

    assert root_cause(Wrapped("long ray text")) == "KeyError: 'x'"


def test_a_module_not_found_lists_the_users_folders_not_the_interpreters(monkeypatch, tmp_path):
    """The folders searched first, as a user can act on them: the working directory and the
    config's folder, not the venv's ``bin`` or what Ray puts under ``site-packages``."""
    import os

    venv_bin = os.path.join(sys.prefix, "bin")
    thirdparty = os.path.join(sys.prefix, "lib", "site-packages", "ray", "thirdparty_files")
    monkeypatch.setattr(sys, "path", [venv_bin, thirdparty, str(tmp_path), "", *sys.path])
    with pytest.raises(ValueError, match="cannot import module 'not_here'") as e:
        import_object("not_here:f", "reward")
    searched = str(e.value).split("searched ", 1)[1].split(" first", 1)[0]
    assert searched.split(", ")[:2] == [str(tmp_path), os.getcwd()]
    assert venv_bin not in searched and "thirdparty_files" not in searched
