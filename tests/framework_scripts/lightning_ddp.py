"""One DDP step under PyTorch Lightning with ``DDPStrategy(process_group_backend="shmcomm")``,
checked against the same step on one process over the whole batch.

Run by tests/test_frameworks.py by Lightning itself (``python lightning_ddp.py``: it starts the
other rank), under shmrun and under torchrun (Lightning takes the ranks they started)."""
import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

N = 2
torch.manual_seed(0)
start = torch.nn.Linear(4, 1, bias=False).state_dict()
x = torch.arange(8 * N * 4, dtype=torch.float32).reshape(8 * N, 4) / 100
y = x.sum(1, keepdim=True)


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1, bias=False)
        self.linear.load_state_dict(start)
        self.backend = None

    def training_step(self, batch, _):
        self.backend = dist.get_backend()
        features, target = batch
        return ((self.linear(features) - target) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    reference = torch.nn.Linear(4, 1, bias=False)
    reference.load_state_dict(start)
    ((reference(x) - y) ** 2).mean().backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()

    model = Regression()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=N, strategy=DDPStrategy(process_group_backend="shmcomm"),
                        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    assert model.backend == "shmcomm", model.backend
    weight = model.linear.weight.detach()
    assert torch.allclose(weight, reference.weight.detach(), atol=1e-6), (weight, reference.weight)
    print(f"lightning ok rank {trainer.global_rank} of {trainer.world_size} on {model.backend}", flush=True)
