"""The code passes ruff's small rule set (pyproject.toml, [tool.ruff]; ruff is in the test extra): syntax errors
and pyflakes' findings (unused imports and names, undefined names, f-strings without placeholders), notebooks
included."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
