"""The tools beside the stages (`draftline COMMAND`): the hidden-state plan, the acceptance
forecast, the serving verdict again, superseded conversations."""
