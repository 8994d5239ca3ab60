"""Training the learned drafters' heads on the target itself (self-distillation).

``data``: the target answers training prompts; its features are recorded.  ``objectives``: what
each head kind trains on (one objective per kind).  ``trainer``: the training loop, checkpoints,
validation acceptance and the loss curve.  The head modules are the drafters'
(``specserve.drafters.heads``; ``heads`` here is their old path, kept for callers not moved yet).
Training uses the model and the head modules, never the engine.
"""
