"""A paper added as a plugin: registered through the ``attnflow.systems`` entry-point group, never by editing
attnflow, it shows up in every command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOY = Path(__file__).parent / "toy_plugin"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A directory holding the metadata of an installed distribution that registers the toy system."""
    site = tmp_path_factory.mktemp("site")
    info = site / "attnflow_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnflow-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnflow.systems]\ntoy = attnflow_toy:SYSTEM\n")
    return os.pathsep.join([str(site), str(TOY)])


def attnflow(plugin_path, *args, expect=0):
    env = {**os.environ, "PYTHONPATH": plugin_path + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", *args], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == expect, result.stderr
    return result


def test_the_plugin_is_listed_beside_the_built_in_systems(plugin_path):
    out = attnflow(plugin_path, "list").stdout
    assert "toy: Scalar least squares (a toy plugin)" in out and "toy.mean_matches_population" in out
    assert "gd_beta: " in out and "scb: " in out


def test_the_plugin_is_checked(plugin_path):
    document = json.loads(attnflow(plugin_path, "check", "toy", "--json", "--no-progress").stdout)
    assert [r["name"] for r in document["results"]] == ["toy.mean_matches_population"]
    assert document["results"][0]["status"] == "PASS"


def test_the_plugin_is_solved_and_simulated(plugin_path, tmp_path):
    solved = json.loads(attnflow(plugin_path, "solve", "toy", "--param", "a=2", "--param", "steps=10", "--json").stdout)
    assert solved["schema"] == "attnflow.solve/1"
    assert solved["values"]["population: final error"] == pytest.approx(2 * 0.9 ** 10)
    simulated = json.loads(attnflow(plugin_path, "simulate", "toy", "--param", "batch_size=8", "--seed", "3",
                                    "--json", "--plot", str(tmp_path / "toy.png")).stdout)
    assert simulated["values"]["minibatch: records"] == 51
    assert (tmp_path / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = attnflow(plugin_path, "simulate", "toy", "--param", "colour=3", expect=2)
    assert "unknown toy parameter(s) ['colour']" in refused.stderr


def test_the_plugin_is_swept(plugin_path, tmp_path):
    out = attnflow(plugin_path, "sweep", "toy.final_error", "--grid", "batch_size=4,64", "--seeds", "3", "--jobs",
                   "1", "--store", str(tmp_path), "--json", "--no-progress").stdout
    document = json.loads(out)
    assert document["computed"] == 6 and len(document["records"]) == 6


def test_only_the_system_asked_for_is_imported(plugin_path):
    """Running one system imports its module and no other system's."""
    code = ("import sys; from attnflow.validation import systems; systems.select(['toy']); "
            "print(sorted(m for m in sys.modules if m.startswith('attnflow.validation.') or m == 'attnflow_toy'))")
    env = {**os.environ, "PYTHONPATH": plugin_path}
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    modules = eval(loaded.stdout)
    assert "attnflow_toy" in modules
    assert not {"attnflow.validation.gd_beta", "attnflow.validation.scb", "attnflow.validation.one_nn"} & set(modules)
