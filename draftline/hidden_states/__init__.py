"""Stage `hidden_states`: the target's aux and last hidden states captured for every tokenized
row (offline to files, or online beside the trainer, in-process or from a vLLM extraction
server), their formats and the disk plan."""
