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
