"""ModelOpt NVFP4 quantization of Hugging Face checkpoints (``launcher quantize``)."""
