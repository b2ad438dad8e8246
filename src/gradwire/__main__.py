"""``python -m gradwire``: the ``gradwire`` command, for checkouts run without installing."""
from gradwire.entry import main

main()
