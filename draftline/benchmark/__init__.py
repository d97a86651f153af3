"""Stage `benchmark`: baseline against speculative decoding, built in or on vLLM / SGLang
servers, with the engines' own counters."""
