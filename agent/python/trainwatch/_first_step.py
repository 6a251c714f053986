"""What `trainwatch run` learns from the first step of a job whose code it
cannot read (trainwatch.attach): the root modules the trainer calls (names
for a NaN's tensor, DDP/FSDP/DeepSpeed wrappers) and the module whose output
is the logits. Global module hooks see it; they take every module call off
torch's fast path, so they are removed at the first verdict (stop())."""

from __future__ import annotations

from typing import Any, Optional

import torch


class FirstStep:
    """Records module calls between start() and stop(), from the training
    thread only."""

    def __init__(self) -> None:
        # Modules called from outside any module, with gradients enabled.
        self.roots: list[torch.nn.Module] = []
        # (name, module, vocabulary) of the logits' module, once found.
        self.logits: Optional[tuple[str, torch.nn.Module, int]] = None
        self.depth = 0  # module calls in progress (reset by a backward)
        self._called: list[tuple[torch.nn.Module, torch.Size]] = []  # the root's, in order
        self._hooks: list[Any] = []

    def start(self) -> None:
        import torch.nn.modules.module as module_mod
        self._hooks = [module_mod.register_module_forward_pre_hook(self._entered),
                       module_mod.register_module_forward_hook(self._left)]

    def stop(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._called = []

    def parameter_names(self) -> dict[int, str]:
        """id(parameter) -> its name in the root module that holds it."""
        names: dict[int, str] = {}
        for root in self.roots:
            inner = getattr(root, "module", root)  # DDP's, and torch.compile's _orig_mod
            inner = getattr(inner, "_orig_mod", inner)
            for n, p in inner.named_parameters():
                names.setdefault(id(p), n)
        return names

    def _entered(self, module: torch.nn.Module, inputs: Any) -> None:
        if self.depth == 0:
            if torch.is_grad_enabled() and all(module is not r for r in self.roots):
                self.roots.append(module)
            self._called = []
        self.depth += 1

    def _left(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if isinstance(output, torch.Tensor):
            self._called.append((module, output.shape))
        if self.depth == 0 and self.logits is None and torch.is_grad_enabled():
            self._find_logits(module, output)

    def _find_logits(self, root: torch.nn.Module, output: Any) -> None:
        """The module whose output reaches the model's output as a
        [..., vocab] tensor: Hugging Face's get_output_embeddings(), else the
        last module called whose output has that tensor's shape."""
        inner = getattr(root, "module", root)
        shapes = {t.shape for t in _tensors(output)
                  if t.is_floating_point() and t.dim() >= 2 and t.shape[-1] >= 2}
        if not shapes:
            return
        found: Optional[torch.nn.Module] = None
        get = getattr(inner, "get_output_embeddings", None)
        if callable(get):
            try:
                found = get()
            except Exception:
                found = None
        if found is None:
            # A projection to the vocabulary: its weight's rows are the last
            # dimension (a norm's output may have the logits' shape too, and
            # a chunked loss returns the hidden states, never the logits).
            for module, shape in reversed(self._called):
                weight = getattr(module, "weight", None)
                if module is not root and module is not inner and shape in shapes and \
                        isinstance(weight, torch.Tensor) and weight.dim() == 2 and \
                        weight.shape[0] == shape[-1]:
                    found = module
                    break
        if found is None:
            return
        name = next((n for n, m in inner.named_modules() if m is found), type(found).__name__)
        vocab = next(s[-1] for s in shapes)
        self.logits = (name, found, int(vocab))


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in _tensors(v)]
    return []
