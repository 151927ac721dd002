"""Task models built on the encoder."""
