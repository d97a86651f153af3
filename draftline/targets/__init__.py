"""Stage `target`: the target model resolved (the tiny built-in, an embedded GGUF, a hub id or a
local directory), loaded, and described by its card."""
