"""``python -m gradwire``: the ``gradwire`` command, for checkouts run without installing."""
from gradwire.cli import main

main()
