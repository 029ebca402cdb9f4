"""The `ckpt` command line: `app.py` registers one module per command."""
