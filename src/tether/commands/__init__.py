"""CLI plugins: each module exposes `register(app: typer.Typer)` and adds its commands."""
