"""``scripts/setup.sh``: each step says what it does, and a failed install stops the set-up with one
line saying which.  The script is sourced (which only defines its functions) and its steps run on
commands that cannot touch the network or the environment: pip with ``--no-index`` (a name no
index holds, and a package already installed) and ``sleep``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"


def _bash(script: str) -> subprocess.CompletedProcess:
    """``script`` run by bash after sourcing setup.sh, with this interpreter's pip first on PATH."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", f". {SETUP}\n{script}"], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.slow
def test_a_failed_install_stops_the_setup_with_one_line():
    """A package name no index holds: pip's own error is shown, the step after never runs, the exit
    status is not 0 and the last line names the step that failed."""
    r = _bash("step 'installing no-such-package' pip_install --no-index specserve-no-such-package\n"
              "echo NEXT STEP")
    assert r.returncode != 0 and "NEXT STEP" not in r.stdout, r.stdout + r.stderr
    assert "No matching distribution found for specserve-no-such-package" in r.stderr     # pip's own words
    assert r.stderr.splitlines()[-1] == ("setup: failed: installing no-such-package "
                                         "(exit status 1; the errors are above)"), r.stderr
    assert r.stdout.splitlines() == ["setup: installing no-such-package ..."]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_quiet_install_that_succeeds_goes_on():
    """pip prints nothing, so the filter of its output passes nothing (grep's status 1): not a failure."""
    r = _bash("step 'installing numpy' pip_install --no-index numpy\necho NEXT STEP")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "setup: installing numpy ..." and lines[-1] == "NEXT STEP"
    assert lines[-2].startswith("setup: installing numpy: done in ") and lines[-2].endswith(" s")


@pytest.mark.slow
def test_a_long_step_says_it_is_still_running():
    """A line every BEAT seconds while a step runs (30 in the script; 1 here), and none after it ends."""
    r = _bash("BEAT=1\nstep 'waiting' sleep 2.5\nsleep 1.5\necho END")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "setup: waiting ..." and lines[-1] == "END" and lines[-2].startswith("setup: waiting: done in")
    still = [ln for ln in lines if ln.startswith("setup: ... still waiting (")]
    assert len(still) >= 1 and len(still) == len(lines) - 3, lines
