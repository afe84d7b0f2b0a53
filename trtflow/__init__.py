"""trtflow: a declarative, content-hashed build pipeline for NVIDIA TensorRT engines."""

__version__ = "0.2.0"
