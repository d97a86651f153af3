"""Stage `evaluate`: the draft's acceptance, with the built-in chain speculative decoder or
vLLM's engine, checked lossless against greedy decoding."""
