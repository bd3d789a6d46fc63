"""A paper added as a plugin: registered through the ``attnflow.systems`` entry-point group, never by editing
attnflow, it shows up in every command."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import plugin_environment

TOY = Path(__file__).parent / "toy_plugin"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """The environment of a process that sees the toy system as an installed distribution."""
    return plugin_environment(tmp_path_factory.mktemp("site"), "attnflow_toy", "toy = attnflow_toy:SYSTEM", TOY)


def attnflow(plugin_env, *args, expect=0):
    result = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", *args], capture_output=True, text=True,
                            timeout=600, env=plugin_env)
    assert result.returncode == expect, result.stderr
    return result


def test_the_plugin_is_listed_beside_the_built_in_systems(plugin_env):
    out = attnflow(plugin_env, "list").stdout
    assert "toy: Scalar least squares (a toy plugin)" in out and "toy.mean_matches_population" in out
    assert "gd_beta: " in out and "scb: " in out


def test_the_plugin_is_checked(plugin_env):
    document = json.loads(attnflow(plugin_env, "check", "toy", "--json", "--no-progress").stdout)
    assert [r["name"] for r in document["results"]] == ["toy.mean_matches_population"]
    assert document["results"][0]["status"] == "PASS"


def test_the_plugin_is_solved_and_simulated(plugin_env, tmp_path):
    solved = json.loads(attnflow(plugin_env, "solve", "toy", "--param", "a=2", "--param", "steps=10", "--json").stdout)
    assert solved["schema"] == "attnflow.solve/1"
    assert solved["values"]["population: final error"] == pytest.approx(2 * 0.9 ** 10)
    simulated = json.loads(attnflow(plugin_env, "simulate", "toy", "--param", "batch_size=8", "--seed", "3",
                                    "--json", "--plot", str(tmp_path / "toy.png")).stdout)
    assert simulated["values"]["minibatch: records"] == 51
    assert (tmp_path / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = attnflow(plugin_env, "simulate", "toy", "--param", "colour=3", expect=2)
    assert "unknown toy parameter(s) ['colour']" in refused.stderr


def test_the_plugin_is_swept(plugin_env, tmp_path):
    out = attnflow(plugin_env, "sweep", "toy.final_error", "--grid", "batch_size=4,64", "--seeds", "3", "--jobs",
                   "1", "--store", str(tmp_path), "--json", "--no-progress").stdout
    document = json.loads(out)
    assert document["computed"] == 6 and len(document["records"]) == 6


def test_only_the_system_asked_for_is_imported(plugin_env):
    """Running one system imports its module and no other system's."""
    code = ("import sys; from attnflow.validation import systems; systems.select(['toy']); "
            "print(sorted(m for m in sys.modules if m.startswith('attnflow.validation.') or m == 'attnflow_toy'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plugin_env, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    modules = eval(loaded.stdout)
    assert "attnflow_toy" in modules
    assert not {"attnflow.validation.gd_beta", "attnflow.validation.scb", "attnflow.validation.one_nn"} & set(modules)
