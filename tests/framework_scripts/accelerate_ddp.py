"""One DDP step under Hugging Face accelerate on the shmcomm backend: the group is made first
(accelerate's CPU path names gloo or mpi itself, and keeps a default group that exists), then
the Accelerator. Checked against the same step on one process over the whole batch.

Run by tests/test_frameworks.py under shmrun, torchrun and ``accelerate launch`` (its torchrun,
and its mpirun: there with ``INIT_METHOD=shmcomm://``, as torch's env:// finds no RANK)."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("shmcomm", init_method=os.environ.get("INIT_METHOD"))

from accelerate import Accelerator  # noqa: E402

acc = Accelerator(cpu=True)
assert acc.distributed_type.name == "MULTI_CPU", acc.distributed_type
assert dist.get_backend() == "shmcomm", dist.get_backend()
n, rank = acc.num_processes, acc.process_index
assert n == dist.get_world_size() == 2, n

torch.manual_seed(0)
model = torch.nn.Linear(4, 1, bias=False)
x = torch.arange(8 * n * 4, dtype=torch.float32).reshape(8 * n, 4) / 100
y = x.sum(1, keepdim=True)
# the reference: one process, the whole batch, the same start
reference = torch.nn.Linear(4, 1, bias=False)
reference.load_state_dict(model.state_dict())
((reference(x) - y) ** 2).mean().backward()
torch.optim.SGD(reference.parameters(), lr=0.1).step()

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = acc.prepare(model, optimizer)
mine = slice(rank * 8, (rank + 1) * 8)
acc.backward(((model(x[mine]) - y[mine]) ** 2).mean())
optimizer.step()
weight = acc.unwrap_model(model).weight.detach()
assert torch.allclose(weight, reference.weight.detach(), atol=1e-6), (weight, reference.weight)
total = acc.reduce(torch.full((3,), float(rank + 1)), "sum")
assert total.tolist() == [3.0, 3.0, 3.0], total
print(f"accelerate ok rank {rank} of {n} on {dist.get_backend()}", flush=True)
acc.end_training()
