"""Stage `regenerate`: every assistant turn answered again by the target through an
OpenAI-compatible server, one flushed line per conversation, resumable."""
