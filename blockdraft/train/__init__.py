"""Training DFlash drafters: target-regenerated data, features, anchored blocks, the loop."""
