"""Stages `prepare` and `mix`: dataset sources read and every row normalized into one prepared
record; the prepared sets mixed into train, dev and eval prompts."""
