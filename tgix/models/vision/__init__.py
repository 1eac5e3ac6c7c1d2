"""Vision towers of multimodal checkpoints, one module per family: images (tiles) -> features
in the text model's width, one per image token of the prompt."""
