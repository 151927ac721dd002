"""Models built on the encoder: pretrained checkpoints (``attnlab.models.pretrained``)."""
