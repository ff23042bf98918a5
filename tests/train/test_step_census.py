"""The record's census of a steady step (``step_census``), counted from the profiler's own tree
of ops, gives what torch's event list (``profile.events()``, ~20x slower to build) gives."""

import torch
from torch.profiler import ProfilerActivity, profile

from reproduce.config import ModelConfig
from reproduce.paper.model import Transformer
from reproduce.paper.optim import output_loss
from reproduce.train.step_census import ASKING, NO_KERNEL, READS, census, costs, is_cuda_wait


def _from_event_list(events) -> dict[str, int]:
    """The census as torch's event list nests the ops (by time, on each thread)."""
    aten = [e for e in events if e.name.startswith("aten::")]

    def above(e) -> set[str]:
        names, parent = set(), e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                names.add(parent.name)
            parent = parent.cpu_parent
        return names

    ancestors = {id(e): above(e) for e in aten}
    return {"ops": sum(not ancestors[id(e)] for e in aten),
            "kernels": sum(e.name not in NO_KERNEL
                           and not any(c.name.startswith("aten::") for c in e.cpu_children)
                           for e in aten),
            "host_waits": sum(e.name in READS and ancestors[id(e)] <= ASKING
                              and not READS & ancestors[id(e)] for e in aten)}


def test_the_census_from_the_profilers_tree_equals_the_event_lists():
    """A training step of a small model with the reads the census tells apart: ``int()`` of a
    count, a boolean mask's indexing, Adam's own reads of its step counts (inside its ops)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=200, N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8,
                                    max_positions=64))
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    src, tgt = torch.randint(1, 200, (8, 12)), torch.randint(1, 200, (8, 13))

    def step() -> None:
        hidden = model.features(src, tgt[:, :-1])
        loss, _ = output_loss(hidden, model.embed.weight, tgt[:, 1:], 0.1, 0)
        n = int((tgt[:, 1:] != 0).sum())
        chosen = hidden[tgt[:, :-1] > 100]
        (loss / n + 0 * chosen.sum()).backward()
        adam.step()
        adam.zero_grad()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as running:
        step()
    counted = census(running.profiler.kineto_results.experimental_event_tree())
    assert counted == _from_event_list(running.events())
    assert counted["host_waits"] >= 2 and counted["kernels"] > 100, counted
    # where the time went: each of the costliest ops' own time and calls as the event list has
    # them, in falling order, within the step's span
    spent = costs(running.profiler.kineto_results.experimental_event_tree(), top=5)
    assert len(spent["top"]) == 5 and spent["device_ms"] is None
    assert [ms for _, ms, _ in spent["top"]] == sorted((ms for _, ms, _ in spent["top"]),
                                                       reverse=True)
    for name, ms, calls in spent["top"]:
        same = [e for e in running.events() if e.name == name]
        assert calls == len(same), name
        assert abs(ms - sum(e.self_cpu_time_total for e in same) / 1e3) <= 0.02 * ms + 0.01, name
    assert spent["top"][0][1] < spent["host_ms"] < 60_000


def test_on_a_gpu_only_synchronizations_count_as_waits_not_asynchronous_copies():
    """A pinned batch copied up (cudaMemcpyAsync) leaves the host free; a value read back is a
    copy and the synchronization after it, one wait."""
    waits = ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"]
    assert all(map(is_cuda_wait, waits))
    assert not any(map(is_cuda_wait, ["cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaLaunchKernel",
                                       "cudaStreamWaitEvent"]))
