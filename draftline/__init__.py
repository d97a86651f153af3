"""Draftline: a reproducible DVC pipeline that trains EAGLE-3 draft models."""
