"""The Python API behind `tether` (re-exported by `tether/__init__.py`, which the README documents):
`run.py` (open_run, Run, load_run_config), `training.py` (load_config, sft, train), `evaluate.py`,
`export.py`, `inspect.py` (show and doctor on every kind of run)."""
