"""The servers the stages launch or reach: command lines of every engine, process lifecycle,
preflight of live endpoints, and the built-in batched chat server."""
