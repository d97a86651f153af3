"""Tools for working on draftline, not installed with it (pyproject packages only draftline):
the docs' figures from the JSON reports, a recipe run's record, the overhead scripts' A/B timing.
Run from the repository root: `python -m devtools.<name>`."""
