"""portachat: train and serve your own small ChatGPT on any accelerator."""

__version__ = "0.1.0"
