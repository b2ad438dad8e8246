"""A Ctrl-C while the ``gradwire`` command loads (torch's import takes seconds) ends in one line
and exit status 130, as one later does, not in the traceback of the import it stopped."""

import subprocess
import sys
from pathlib import Path

STOPPED_IN_TORCHS_IMPORT = """
import builtins, sys
real = builtins.__import__

def interrupted(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise KeyboardInterrupt  # as a Ctrl-C in the middle of it
    return real(name, *args, **kwargs)

builtins.__import__ = interrupted
sys.argv = ["gradwire", "models"]
from gradwire.entry import main
main()
"""


def test_a_ctrl_c_while_the_command_loads_is_one_line():
    done = subprocess.run([sys.executable, "-c", STOPPED_IN_TORCHS_IMPORT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "gradwire: interrupted by SIGINT\n", done.stderr


def test_the_installed_command_and_python_m_gradwire_use_the_guarded_entry():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '\ngradwire = "gradwire.entry:main"\n' in pyproject
    done = subprocess.run([sys.executable, "-m", "gradwire", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("gradwire "), done.stderr


# A SIGTERM as torch loads: the moment a `kill` or a CI job's stop can hit most easily.
TERMINATED_IN_TORCHS_IMPORT = """
import builtins, os, signal, sys
real = builtins.__import__

def terminated(name, *args, **kwargs):
    if name == "torch":
        os.kill(os.getpid(), signal.SIGTERM)
    return real(name, *args, **kwargs)

builtins.__import__ = terminated
sys.argv = ["gradwire", "models"]
from gradwire.entry import main
main()
"""

# A stop signal once the command is done, as gradwire exits (an atexit function runs then).
STOPPED_AS_IT_EXITS = """
import atexit, os, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.{sig}))
sys.argv = ["gradwire", "--version"]
from gradwire.entry import main
main()
"""


def test_a_sigterm_while_the_command_loads_is_one_line_and_status_143():
    """SIGTERM kept its default while torch loaded (seconds): gradwire died without a word,
    killed by the signal, not exit status 143."""
    done = subprocess.run([sys.executable, "-c", TERMINATED_IN_TORCHS_IMPORT],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, (done.returncode, done.stderr)
    assert done.stderr == "gradwire: interrupted by SIGTERM\n", done.stderr


def test_a_stop_signal_once_the_command_is_done_is_one_line_and_128_plus_its_number():
    """Once the command had run, Python's shutdown (half a second with torch loaded) took a
    Ctrl-C as a traceback ("Exception ignored in atexit callback ... KeyboardInterrupt") and
    exit status 0, or was killed by it without a word; a SIGTERM killed it."""
    for sig, status in (("SIGINT", 130), ("SIGTERM", 143)):
        done = subprocess.run([sys.executable, "-c", STOPPED_AS_IT_EXITS.format(sig=sig)],
                              capture_output=True, text=True, timeout=120)
        assert done.stdout.startswith("gradwire "), done.stdout  # the command's output first
        assert (done.returncode, done.stderr) == (status, f"gradwire: interrupted by {sig}\n")
