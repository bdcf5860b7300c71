"""``python -m outbox_cli ...``: the ``outbox`` command without its console script."""

from outbox_cli.main import main

main()
