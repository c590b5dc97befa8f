"""The chunked cross-entropy (`parallel.loss_chunk`) equals the plain loss, gradients included, without ever holding the
whole sequence's logits; its equality under TP, SP, PP and FSDP is in test_parallel.py."""
import torch, torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from nxpretrain.parallel.loss import ChunkedHead, token_loss_sum, IGNORE_INDEX


class LargestOutput(TorchDispatchMode):
    "The most elements of any tensor an op returns while the mode is on."
    def __init__(self):
        super().__init__()
        self.numel = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor): self.numel = max(self.numel, t.numel())
        return out


def test_chunked_loss_equals_plain_and_never_holds_whole_logits():
    torch.manual_seed(0)
    B, S, H, V, chunk = 2, 150, 32, 1000, 64          # 300 tokens: four full chunks and a short one
    head = nn.Linear(H, V, bias=True)
    h = torch.randn(B, S, H, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    labels[:, ::7] = IGNORE_INDEX
    plain = token_loss_sum(head(h), labels)
    ref = torch.autograd.grad(plain, (h, head.weight, head.bias))
    with LargestOutput() as seen:
        loss = ChunkedHead(head, chunk).loss_sum(h, labels)
        grads = torch.autograd.grad(loss, (h, head.weight, head.bias))
    assert abs(loss.item() - plain.item()) <= 1e-6 * abs(plain.item())
    for g, r in zip(grads, ref):
        assert ((g - r).abs().max() / r.abs().max()).item() <= 1e-6
    assert seen.numel <= chunk * V < B * S * V   # one chunk's logits at most
