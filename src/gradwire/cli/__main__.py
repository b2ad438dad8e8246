"""``python -m gradwire.cli``: the ``gradwire`` command, as the benchmarks and tests run it."""
from gradwire.cli import main

main()
