"""The chunked cross-entropy (`parallel.loss_chunk`) equals the plain loss, gradients included, without ever holding the
whole sequence's logits; its equality under TP, SP, PP and FSDP is in test_parallel.py."""
import pytest, torch, torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from nxpretrain.parallel.loss import ChunkedHead, token_loss_sum, IGNORE_INDEX
from nxpretrain.testing.spawn import run_distributed


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


def _vocab_parallel_against_plain(V, chunk, dtype):
    "On this TP rank: the vocab-parallel fused loss of a sharded head against the plain loss of the whole head."
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    torch.manual_seed(0)
    B, S, H = 2, 75, 16
    head = nn.Linear(H, V, bias=True)
    h = torch.randn(B, S, H, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    labels[:, ::7] = IGNORE_INDEX
    labels[0, :3] = V - 1   # the last row of the last (shorter) slice
    with torch.autocast('cpu', dtype, enabled=dtype != torch.float32):
        plain = token_loss_sum(head(h), labels)
    ref = torch.autograd.grad(plain, (h, head.weight, head.bias))
    mesh = init_device_mesh('cpu', (dist.get_world_size(),))
    sharded = nn.Linear(H, V, bias=True)
    sharded.weight = nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [Shard(0)]))
    sharded.bias = nn.Parameter(distribute_tensor(head.bias.detach(), mesh, [Shard(0)]))
    hd = h.detach().clone().requires_grad_()
    with torch.autocast('cpu', dtype, enabled=dtype != torch.float32):
        loss = ChunkedHead(sharded, chunk).loss_sum(hd, labels)
    loss.backward()
    grads = (hd.grad, sharded.weight.grad.full_tensor(), sharded.bias.grad.full_tensor())
    errors = [((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
    return abs(loss.item() - plain.item()) / abs(plain.item()), errors


@pytest.mark.parametrize('world,V', [(2, 1001), (3, 1000)], ids=['tp2_uneven_vocab', 'tp3'])
def test_vocab_parallel_fused_loss_equals_plain(world, V):
    "Each TP rank's slice of the head, fused with the loss: the whole vocabulary's loss and gradients, in fp32 ≤ 1e-6."
    for loss_err, grad_errs in run_distributed(_vocab_parallel_against_plain, world, V, 32, torch.float32, timeout=120):
        assert loss_err <= 1e-6
        assert max(grad_errs) <= 1e-6


def test_vocab_parallel_fused_loss_under_bf16_autocast():
    "In bf16 the matmuls run in bf16, the softmax in fp32: the plain loss's numbers to bf16 rounding."
    for loss_err, grad_errs in run_distributed(_vocab_parallel_against_plain, 2, 1001, 32, torch.bfloat16, timeout=120):
        assert loss_err <= 1e-2
        assert max(grad_errs) <= 2e-2
