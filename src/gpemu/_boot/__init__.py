"""Start-up hook directory for `gpemu run` (put on PYTHONPATH; a package only so that wheels ship it)."""
