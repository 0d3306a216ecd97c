"""The folder a vLLM server puts on its ``PYTHONPATH`` (``policy/vllm_cpu.py``, ``vllm_server_env``):
standalone modules the server's own interpreter imports, which import only vLLM and torch."""
