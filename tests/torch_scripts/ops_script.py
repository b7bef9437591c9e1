"""torch.ops.shmcomm checked on every rank, for any launcher: torchrun, shmrun, or ranks started
by hand with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Prints one line per rank:
``rank R compared N native=B``.
"""
import torch
import torch.distributed as dist

import op_checks
from shmcomm.torch_ops import native

torch.set_num_threads(1)
dist.init_process_group("shmcomm")
compared = op_checks.run_all()
print(f"rank {dist.get_rank()} compared {compared} native={native.load()}", flush=True)
dist.destroy_process_group()
