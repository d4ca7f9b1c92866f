"""The `gpemu` command-line interface."""
