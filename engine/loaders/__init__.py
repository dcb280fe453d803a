"""Readers that turn model files into a `LoadedModel` with Hugging Face tensor names."""
