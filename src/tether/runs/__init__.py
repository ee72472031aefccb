"""The run model (docs/design.md, "The run model"): what a run directory is and what it produced.

    record.py     run.json: kind, status, result model, parents, members, references
    result.py     resolve_result: which model is a run's result (the one place that decides)
    refs.py       re-rootable references: a run works from any folder and after it is moved
    lifecycle.py  writing the record as a run opens and ends; a run's config read back, re-rooted
    resume.py     opening a run directory: never clobbered, resumed only with allowed changes
    engine.py     the multi-run engine of pipelines, sweeps, faultbench and context comparisons
    commands.py   what each command (eval, export, show, doctor, ...) does with each kind
"""
