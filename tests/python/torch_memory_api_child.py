"""Child process for test_torch_memory_api.py: real PyTorch code under use_torch_allocator()
(run as a script: PyTorch's allocator can only be chosen before its first CUDA
allocation). Prints one JSON line; each mode exercises one promise."""

from __future__ import annotations

import json
import math
import os
import pickle
import sys
import tempfile
import traceback

import torch
from torch.cuda import memory_stats as memory_stats_imported_early

import gpukeeper
from gpukeeper import _core
from gpukeeper.integrations import torch_allocator

MiB = 1 << 20
# The route into PyTorch (use_torch_allocator(route=)): the tests run the pluggable one too.
ROUTE = os.environ.get("GPUKEEPER_TORCH_ROUTE", "auto")


def api() -> dict:
    out: dict = {}
    torch_allocator.use_torch_allocator(route=ROUTE)
    keep = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    gone = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del gone
    s = torch_allocator.stats(0)
    out["allocated"] = torch.cuda.memory_allocated()
    out["pool_allocated"] = s.allocated_bytes
    out["reserved"] = torch.cuda.memory_reserved(0)
    out["pool_reserved"] = s.reserved_bytes
    out["stats_allocated"] = torch.cuda.memory_stats()["allocated_bytes.all.current"]
    out["peak_before_reset"] = torch.cuda.max_memory_allocated(torch.device("cuda:0"))
    torch.cuda.reset_peak_memory_stats()
    out["max_after_reset"] = torch.cuda.max_memory_allocated("cuda")
    torch.cuda.reset_accumulated_memory_stats()
    out["accumulated_after_reset"] = torch.cuda.memory_stats()["allocated_bytes.all.allocated"]
    out["summary_ok"] = "PyTorch CUDA memory summary" in torch.cuda.memory_summary()
    segments = torch.cuda.memory_snapshot()
    full = torch.cuda.memory._snapshot()
    out["snapshot_ok"] = (sum(seg["allocated_size"] for seg in segments) == out["allocated"]
                          and len(full["device_traces"]) >= 1)
    from torch.cuda import _memory_viz

    _memory_viz.segsum(full)
    _memory_viz.segment_plot(full)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            out["viz_ok"] = len(pickle.load(f)["segments"]) == len(full["segments"])
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    out["empty_cache_released"] = before - torch.cuda.memory_reserved()
    out["mem_get_info"] = list(torch.cuda.mem_get_info())
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5)
    out["fraction"] = torch.cuda.get_per_process_memory_fraction()
    try:
        torch.empty(int(0.6 * total), dtype=torch.uint8, device="cuda")
        out["fraction_oom"] = None
    except torch.cuda.OutOfMemoryError:
        out["fraction_oom"] = "OutOfMemoryError"
    torch.cuda.set_per_process_memory_fraction(1.0)
    out["early_import_ok"] = (memory_stats_imported_early()["allocated_bytes.all.current"]
                              == torch.cuda.memory_allocated())
    torch_allocator.restore_memory_api()
    # PyTorch's own function: it raises on the pluggable route, and answers through the
    # allocator component's device stats (the same books) on the component's.
    out["route"] = torch_allocator.route()
    try:
        out["restored_allocated"] = torch.cuda.memory_allocated()
        out["restored_raises"] = False
    except RuntimeError:
        out["restored_raises"] = True
    torch_allocator.install_memory_api()
    del keep
    return out


def oom() -> dict:
    out: dict = {}
    torch_allocator.use_torch_allocator(route=ROUTE)
    out["oom_status"] = torch_allocator.oom_error_status()
    total = torch.cuda.get_device_properties(0).total_memory
    out["total"] = total
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        out["plain_except"] = None
    except torch.cuda.OutOfMemoryError as exc:
        out["plain_except"] = type(exc).__name__
        out["message"] = str(exc)[:3000]

    def step(n: int) -> str:
        torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
        return "fn"

    out["retry_on_oom"] = gpukeeper.retry_on_oom(step, 2 * total, fallback=lambda n: "fallback")
    try:
        from accelerate.utils import find_executable_batch_size

        @find_executable_batch_size(starting_batch_size=2 * total)
        def run(batch_size: int) -> int:
            torch.empty(batch_size, dtype=torch.uint8, device="cuda").fill_(1)
            return batch_size

        out["accelerate_batch_size"] = run()
    except ImportError:
        out["accelerate_batch_size"] = None
    out["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
    x = torch.ones(1000, device="cuda")
    out["usable_after"] = float(x.sum().item()) == 1000.0
    out["validate"] = _core._torch_pool_validate(0)
    return out


def train() -> dict:
    out: dict = {}
    torch_allocator.use_torch_allocator(route=ROUTE)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    peaks, match, losses = [], [], []
    for step in range(8):
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, 1000, (8, 64), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        peak = torch.cuda.max_memory_allocated()
        peaks.append(peak)
        match.append(peak == torch_allocator.stats(0).peak_allocated_bytes)
        print(f"step {step} loss {losses[-1]:.3f} max_memory_allocated {peak}", file=sys.stderr)
    out["steps"] = len(peaks)
    out["peaks"] = peaks
    out["peaks_match_pool"] = all(match)
    out["loss_finite"] = all(math.isfinite(v) for v in losses)
    # Hugging Face's Trainer tracks memory with torch.cuda's API (skip_memory_metrics=False).
    try:
        from transformers import Trainer, TrainingArguments

        class Data(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return 64

            def __getitem__(self, i: int) -> dict:
                ids = torch.randint(0, 1000, (64,))
                return {"input_ids": ids, "labels": ids}

        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(output_dir=tmp, max_steps=5, per_device_train_batch_size=8,
                                     report_to="none", skip_memory_metrics=False,
                                     save_strategy="no", logging_steps=1)
            metrics = Trainer(model=model, args=args, train_dataset=Data()).train().metrics
        out["trainer_memory_metrics"] = {k: v for k, v in metrics.items() if "mem" in k}
    except Exception:
        out["trainer_error"] = traceback.format_exc()[-2000:]
    # Lightning's DeviceStatsMonitor reads torch.cuda.memory_stats() every batch.
    try:
        import lightning as L
        from lightning.pytorch.callbacks import DeviceStatsMonitor

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                               torch.nn.Linear(64, 1))

            def training_step(self, batch: tuple, i: int) -> torch.Tensor:
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
        seen = []

        class Catch(L.Callback):
            def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
                seen.extend(k for k in trainer.callback_metrics)

        with tempfile.TemporaryDirectory() as tmp:
            logger = L.pytorch.loggers.CSVLogger(tmp)
            trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=4, logger=logger,
                                callbacks=[DeviceStatsMonitor()], enable_progress_bar=False,
                                enable_checkpointing=False, log_every_n_steps=1)
            trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=32))
            logged = open(os.path.join(logger.log_dir, "metrics.csv")).readline()
        out["lightning_memory_columns"] = sum("allocated_bytes.all.current" in c for c in logged.split(","))
    except Exception:
        out["lightning_error"] = traceback.format_exc()[-2000:]
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    result = {"api": api, "oom": oom, "train": train}[mode]()
    print(json.dumps(result))
