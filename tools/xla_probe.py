"""What of the parallel engine works on torch-xla's device: the evidence behind nxpretrain.train.xla's own step
(nbs/api/47_xla.ipynb). Each piece the native trainer relies on, tried on the XLA device of two processes; one line
each, `ok` or the error's first line.

    torchrun=$(dirname "$(bash tools/xla_env.sh)")/torchrun
    PJRT_DEVICE=CPU PYTHONPATH=. OMP_NUM_THREADS=1 $torchrun --nproc_per_node 2 tools/xla_probe.py
    PJRT_DEVICE=CPU PYTHONPATH=. OMP_NUM_THREADS=1 $torchrun --nproc_per_node 2 tools/xla_probe.py --xla-backend

(the second: torch-xla's own process-group backend, which must be the default group of fresh processes).

Measured with torch 2.9 + torch-xla 2.9 on XLA:CPU: the device of rank 1 as `xla:<LOCAL_RANK>` fails (each process
sees `xla:0`); building the model on the device fails (`torch.Generator(device='xla')`); gloo's all_reduce of an XLA
tensor, and torch-xla's own `xla` backend, return without summing; so `ParallelModel.forward_backward` leaves the ranks
with different gradients; DTensor on an 'xla' mesh and FSDP2 on an XLA module fail; DCP saves of XLA tensors work."""
import datetime, os, sys, tempfile, traceback
import torch, torch.distributed as dist

RANK = int(os.environ.get('RANK', 0))


def stage(name, fn):
    "Run `fn`; print one line: ok (and what it returned), or the error's first line. The result, or None."
    try:
        out = fn()
        print(f"[rank {RANK}] {name}: ok{'' if out is None or not isinstance(out, (list, str)) else f' {out}'}",
              flush=True)
        return out
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        first = (str(e).strip().splitlines() or [''])[0][:200]
        print(f"[rank {RANK}] {name}: FAIL {type(e).__name__}: {first} ({os.path.basename(where.filename)}:"
              f"{where.lineno})", flush=True)
        return None


def check_sum(values: list):
    "`values` of an all-reduce of `(rank + 1)` ones over two ranks, or an AssertionError naming what came back."
    assert values == [3.0, 3.0], f"returned without summing: {values}"
    return values


def summed(dev):
    "An all-reduce of `(rank + 1)` ones on `dev`."
    t = torch.ones(2, device=dev) * (RANK + 1)
    dist.all_reduce(t)
    return check_sum(t.cpu().tolist())


def engine(dev):
    "The native trainer's pieces on the XLA device, under a gloo process group."
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    from torch.distributed.fsdp import fully_shard
    from nxpretrain.recipes import get_recipe
    from nxpretrain.parallel.state import ParallelState, MESH_DIMS
    from nxpretrain.parallel.parallelize import build_parallel_model
    import nxpretrain.train.step  # noqa: F401 – the step methods of ParallelModel
    from nxpretrain.train.checkpoint import Checkpointer, TrainingStateDict
    from nxpretrain.train.trainer import build_datasets, micro_batches, concat, model_inputs
    r = get_recipe('bert_tiny', 'model.hidden=64', 'model.seq_len=64', 'data.micro_batch=2', 'data.global_batch=8',
                   'parallel.precision=fp32', "trainer.loggers=''")
    stage(f"tensor on xla:{os.environ.get('LOCAL_RANK')} (the engine's device of this rank)",
          lambda: torch.ones(1, device=f"xla:{os.environ.get('LOCAL_RANK')}").cpu().tolist())
    xla_mesh = stage("init_device_mesh('xla', (1, 2, 1, 1))", lambda: init_device_mesh('xla', (1, 2, 1, 1),
                                                                                          mesh_dim_names=MESH_DIMS))
    if xla_mesh is not None:
        stage("DTensor on the 'xla' mesh", lambda: distribute_tensor(torch.ones(4, 4, device=dev), xla_mesh['dp'],
                                                                       [Shard(0)]).full_tensor().cpu().tolist())
    mesh = init_device_mesh('cpu', (1, 2, 1, 1), mesh_dim_names=MESH_DIMS)
    st = ParallelState(mesh, 'cpu', 1, 2, 1, 1)
    stage("build_parallel_model(device=xla)", lambda: build_parallel_model(r, st, device=dev, seed=0))
    stage("gloo all_reduce of an XLA tensor", lambda: summed(dev))
    pm = build_parallel_model(r, st, device='cpu', seed=0)
    for part in pm.parts:
        part.to(dev)
        part.tie_weights()
    ds = build_datasets(r, 64, os.environ.get('NXP_DATA_ROOT', 'runs/data'))[0]
    tokens, labels, targets, inputs = model_inputs(concat(micro_batches(ds, 0, 8, 2, RANK, 2)), pm.objective, dev)
    stage("ParallelModel.forward_backward", lambda: pm.forward_backward(tokens, labels, targets, **inputs).item())
    g = torch.stack([p.grad.float().sum() for p in pm.parameters() if p.grad is not None]).cpu()
    both = [torch.zeros_like(g), torch.zeros_like(g)]
    dist.all_gather(both, g)
    print(f"[rank {RANK}] DP-summed gradients equal on both ranks: {torch.equal(*both)} (largest difference "
          f"{(both[0] - both[1]).abs().max().item():.3g})", flush=True)
    stage("FSDP2 fully_shard of an XLA module", lambda: fully_shard(torch.nn.Linear(4, 4).to(dev), mesh=mesh['dp']))
    o = torch.optim.AdamW(pm.parameters(), foreach=False)
    root = tempfile.mkdtemp() if RANK == 0 else None
    box = [root]
    dist.broadcast_object_list(box)
    stage("TrainingStateDict + Checkpointer.save of XLA tensors (DCP, gloo)", lambda: Checkpointer(
        box[0], log=lambda m: None).save(1, TrainingStateDict(pm.module, o).state_dict(saving=True), {'step': 1}))


def xla_backend(dev):
    "torch-xla's own process-group backend, and its all-reduce."
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_backend  # noqa: F401 (registers 'xla')
    dist.init_process_group('xla', init_method='xla://')
    stage("all_reduce over torch-xla's 'xla' backend", lambda: summed(dev))
    def xm_sum():
        t = torch.ones(2, device=dev) * (RANK + 1)
        xm.all_reduce(xm.REDUCE_SUM, [t])
        return check_sum(t.cpu().tolist())
    stage("xm.all_reduce", xm_sum)


if __name__ == '__main__':
    import torch_xla
    dev = torch_xla.device()
    if sys.argv[1:] == ['--xla-backend']: xla_backend(dev)
    else:
        dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=120))
        engine(dev)
        dist.barrier()
        dist.destroy_process_group()
