"""Stage `train`: the builtin training loop and the speculators hand-off, their data, resume
state and progress."""
