"""The Python API behind `tether` (re-exported by `tether/__init__.py`, which the README documents):
`run.py` (open_run, Run, load_run_config), `training.py` (load_config, sft, train), `evaluate.py`,
`export.py`, `show.py` and `doctor.py` (`tether show` and `tether doctor` on every kind of run), `report.py`
(report and compare)."""
