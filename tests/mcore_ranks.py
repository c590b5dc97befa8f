"""megatron-core in fresh processes (it keeps global state): one per rank, forked from a server that imported torch,
megatron-core and the test's module once (3-5 s each), with a deadline."""
import time
import torch
from nxpretrain.testing.spawn import free_port


def run_ranks(worker, args: tuple, world: int, preload: list[str], timeout: float, what: str) -> None:
    "`worker(rank, world, port, *args)` on `world` fresh processes; all killed and a TimeoutError after `timeout` s."
    torch.multiprocessing.get_context('forkserver').set_forkserver_preload(['torch', *preload, worker.__module__])
    ranks = torch.multiprocessing.start_processes(worker, (world, free_port(), *args), nprocs=world, join=False,
                                                  start_method='forkserver')
    deadline = time.monotonic() + timeout
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ranks.processes: p.kill()
            raise TimeoutError(f"{what} took over {timeout} s")
