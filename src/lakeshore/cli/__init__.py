"""The ``lakeshore`` command line (typer + rich)."""
