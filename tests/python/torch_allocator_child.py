"""Child process for test_integrations.py: trains a small model on the chosen allocator
and prints one JSON line (run as a script: PyTorch's allocator can only be chosen before
its first CUDA allocation, so each allocator needs a fresh process)."""

import json
import sys

import torch

import gpukeeper
from gpukeeper import frameworks
from gpukeeper.integrations import torch_allocator


def main(mode: str) -> None:
    out = {"mode": mode}
    if mode == "gpukeeper":
        torch_allocator.use_torch_allocator()
        # Plain tensors first, before any library workspace exists: the pool's books must
        # equal the sum of the live tensors.
        tensors = [torch.empty(n, device="cuda", dtype=torch.float32) for n in (1, 1000, 1 << 20)]
        s = torch_allocator.stats(0)
        out["requested"] = s.requested_bytes
        out["tensor_bytes"] = sum(t.untyped_storage().nbytes() for t in tensors)
        out["torch_view"] = frameworks.memory_by_framework(0)["torch"].allocated
        out["pool_allocated"] = s.allocated_bytes
        del tensors
        out["requested_after_del"] = torch_allocator.stats(0).requested_bytes
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for step in range(20):
        x = torch.randn(128, 64, device="cuda", generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["losses"] = losses
    if mode == "gpukeeper":
        s = torch_allocator.stats(0)
        out["allocated_after_training"] = s.allocated_bytes
        out["validate"] = gpukeeper._core._torch_pool_validate(0)
        del model, opt, x, y, loss
        reserved_before = torch_allocator.stats(0).reserved_bytes
        frameworks.release_all_caches(0)  # the path GPUContext and cleanup_cuda take
        s = torch_allocator.stats(0)
        out["released"] = reserved_before - s.reserved_bytes
        out["reserved_after_release"] = s.reserved_bytes
        out["allocated_after_release"] = s.allocated_bytes
    if mode == "late":
        torch.empty(1, device="cuda")
        try:
            torch_allocator.use_torch_allocator()
            out["error"] = None
        except gpukeeper.GpuError as exc:
            out["error"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
