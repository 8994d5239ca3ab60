"""The command as a process: ``python -m specserve`` is the ``specserve`` command, and output cut
short by its reader (``specserve ... | head -1``) ends quietly, without a BrokenPipeError traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECSERVE = [sys.executable, "-m", "specserve"]
RUN = "benchmarks/native-full"          # a `specserve bench` run: compare prints a line per method


@pytest.mark.slow
def test_python_m_specserve_is_the_command():
    """The same parser, the same one-line error and the same exit status as ``main()``."""
    r = subprocess.run([*SPECSERVE, "generate", "--prompt", ""], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "specserve: error: empty prompt", r.stderr


@pytest.mark.slow
def test_help_cut_by_head_ends_quietly():
    r = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" --help | head -1', "_", *SPECSERVE], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("usage: specserve") and len(r.stdout.splitlines()) == 1
    assert r.stderr == "" and r.returncode in (0, 141), r.stderr


@pytest.mark.parametrize("argv,status", [(["--help"], (0, 141)),      # argparse drops a failed write itself
                                         (["bench", "compare", RUN, RUN], (141,))])
@pytest.mark.slow
def test_output_to_a_closed_pipe_ends_quietly(argv, status):
    """The reader gone before the first byte is written (what ``| head -1`` does to a longer
    output, without the race): no traceback, no "Exception ignored", status 141 as for SIGPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([*SPECSERVE, *argv], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    finally:
        os.close(write)
    assert r.stderr == "" and r.returncode in status, (r.returncode, r.stderr)
