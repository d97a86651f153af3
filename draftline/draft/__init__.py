"""The EAGLE-3 draft itself: its model, checkpoints, fine-tuning an existing draft, its metrics,
its static preflight and its SGLang export."""
