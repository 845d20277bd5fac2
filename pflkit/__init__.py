"""pflkit: a thin PyTorch toolkit for personalized federated learning research and teaching."""

__version__ = "0.1.0"
