"""The draft itself: the drafters train.method names (methods/: EAGLE-3, P-EAGLE, DFlash), its
model, checkpoints, fine-tuning an existing draft, its metrics, its static preflight and its SGLang
export."""
