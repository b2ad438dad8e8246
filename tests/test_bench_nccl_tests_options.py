"""nccl-tests' short options that bench does not take say what does their work here, in the
same one line; other commands' unknown options, and bench's other unknown ones, are as
before."""

import pytest
from conftest import cli_error, one_line_cli_error


@pytest.mark.parametrize("args,hint", [
    (["-b", "8", "-e", "64M"], "No such option: -e; nccl-tests' -b, -e and -f are --sizes "
                               "MIN:MAX[:FACTOR] here (-b is --bandwidth)"),
    (["-f", "2"], "No such option: -f; nccl-tests' -b, -e and -f are --sizes"),
    (["-g", "4"], "No such option: -g; nccl-tests' -g is --hosts here (a rank per emulated "
                  "host)"),
    (["-w", "5"], "No such option: -w; nccl-tests' -w is --warmup here"),
    (["-d", "half"], "No such option: -d; nccl-tests' -d is --dtype here"),
    (["-c", "1"], "No such option: -c; nccl-tests' -c: bench checks every row"),
    # -m aggregates calls into one group; -n, the calls timed together, is --batch
    (["-m", "4"], "No such option: -m; nccl-tests' -m (calls aggregated in one group) has no "
                  "counterpart; its -n, the calls timed back to back, is --batch here"),
])
def test_nccl_tests_options_name_benchs_own(monkeypatch, capsys, args, hint):
    code, err = cli_error(monkeypatch, capsys, "bench", *args)
    one_line_cli_error(code, err, hint)


@pytest.mark.parametrize("args", [["bench", "-z"], ["train", "-e", "3"], ["whatif", "-g", "2"]])
def test_other_unknown_options_have_no_hint(monkeypatch, capsys, args):
    code, err = cli_error(monkeypatch, capsys, *args)
    one_line_cli_error(code, err, f"No such option: {args[1]}")
    assert err.strip().endswith(f"No such option: {args[1]}"), err
