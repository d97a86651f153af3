"""Stages `tokenize` and `vocab`: conversations rendered with the target's chat template into
token ids and loss masks; the draft vocabulary from their frequencies."""
