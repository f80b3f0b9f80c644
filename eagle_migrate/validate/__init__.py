"""Acceptance-length validation: vLLM engine (subprocess worker), reference engine (pure torch), reports."""
