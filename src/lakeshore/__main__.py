"""``python -m lakeshore``: the ``lakeshore`` command (what a launched machine runs)."""

from lakeshore.cli.main import main

main()
