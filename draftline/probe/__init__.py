"""Stage `probe`: what would fail only after regeneration, tried before it starts."""
