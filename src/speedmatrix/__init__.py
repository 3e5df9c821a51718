"""speedmatrix: reproducible LLM-serving benchmark matrices on vLLM."""

__version__ = "0.1.0"
