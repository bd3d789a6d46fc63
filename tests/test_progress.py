"""Progress reporting: silent for a library user, shown by the command line's bar on a terminal only."""
import subprocess
import sys
import time

from attnflow.dynamics import progress
from attnflow.dynamics.montecarlo import monte_carlo_mean
from attnflow.validation import live


def test_reports_reach_the_listener_only_inside_the_block():
    heard = []
    progress.report(1, 2)  # nobody listens: nothing happens
    with progress.listening(lambda done, total: heard.append((done, total))):
        monte_carlo_mean(lambda rng, m: rng.standard_normal(m), 30, seed=0, chunk=10)
        progress.report(7, 5)  # clipped to the total
        progress.report(1, 0)  # an empty computation reports nothing
    progress.report(3, 4)
    assert heard == [(0.0, 3.0), (1.0, 3.0), (2.0, 3.0), (5.0, 5.0)]


def test_the_bar_shows_the_task_and_its_share_done(capsys):
    with live.LiveBar(True, total=2, desc="claims", unit="claim") as bar:
        bar.start("demo.claim")
        progress.report(1, 4)
        time.sleep(2.5 * live.TICK_SECONDS)
        bar.advance()
    err = capsys.readouterr().err
    assert "demo.claim" in err and "25%" in err and "1/2" in err


def test_no_bar_without_a_terminal():
    assert not live.wanted()  # pytest captures stdout: not a terminal
    done = subprocess.run([sys.executable, "-m", "attnflow.validation.cli", "solve", "gd-beta"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "\r" not in done.stderr and "solve" not in done.stderr
