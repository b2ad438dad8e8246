"""`gradwire --help`, every command's and subcommand's --help, and a bad option value that
option parsing refuses answer at once: none of them imports torch (a second and more), which
the CLI loads only when a command runs and needs it."""

import json
import subprocess
import sys
import textwrap

# Run in a fresh interpreter: this one has torch loaded by other tests. It walks the command
# tree (not a list kept here), asks each command for --help, then gives each command's first
# number option a value StrictCommand refuses, and says what it saw as one JSON line.
SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys

    import typer

    from gradwire import cli

    def walk(cmd, path):
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    root = typer.main.get_command(cli.app)
    helped, refused = [], []
    for path in walk(root, []):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.app(args=[*path, "--help"], prog_name="gradwire", standalone_mode=False)
        helped.append({"path": path, "code": code, "out": out.getvalue()})
    for path in walk(root, []):
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        numbers = [p for p in cmd.params if p.param_type_name == "option"
                   and getattr(getattr(p, "type_descriptor", None), "annotation", None)
                   in (int, float)]
        if not numbers:
            continue
        sys.argv = ["gradwire", *path, numbers[0].opts[0], "1_0"]
        err, code = io.StringIO(), None
        with contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as e:
                code = e.code
        refused.append({"argv": sys.argv[1:], "err": err.getvalue(), "code": code})
    print(json.dumps({"helped": helped, "refused": refused,
                      "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")}))
""")


def test_help_and_option_refusals_do_not_import_torch():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    paths = [h["path"] for h in seen["helped"]]
    # the whole tree: the app, its groups and their commands
    assert [] in paths and ["cluster"] in paths and ["cluster", "up"] in paths, paths
    assert ["bench"] in paths and ["simulate"] in paths and len(paths) > 10, paths
    for h in seen["helped"]:
        assert h["code"] == 0, h
        assert "Usage: gradwire" in h["out"] and " ".join(h["path"]) in h["out"], h
    assert len(seen["refused"]) > 5, seen["refused"]
    for r in seen["refused"]:
        lines = r["err"].splitlines()
        assert r["code"] == 2 and len(lines) == 1, r
        assert lines[0].startswith("gradwire: error: ") and "'1_0'" in lines[0], r
    assert seen["torch"] == [], seen["torch"]
