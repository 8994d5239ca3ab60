"""Training the learned drafters' heads on the target itself (self-distillation).

``data``: the target answers training prompts; its features are recorded.  ``heads``: the EAGLE and
Medusa head modules (shared with the drafters).  ``trainer``: the training loop, checkpoints,
validation acceptance and the loss curve.  Training uses the model and the head modules, never the
engine.
"""
