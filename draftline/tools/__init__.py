"""The tools beside the stages (`draftline COMMAND`): forecast, recipe records, the docs'
figures, the overhead benchmarks' A/B timing."""
