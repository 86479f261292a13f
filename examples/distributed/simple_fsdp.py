"""SimpleFSDP-style compiled data parallelism: FSDP written with DTensor alone and
captured by torch.compile.

Every parameter is stored as a DTensor sharded on a 1-D mesh (Shard(0)), so each
rank keeps and updates half of it. Reading `module.weight` goes through a
parametrization that all-gathers it (redistribute Shard(0) -> Replicate) and hands
the layer a plain tensor whose gradient is declared Partial("avg"). In the backward,
DTensor turns that Partial gradient back into the Shard(0) placement of the
parameter: a reduce-scatter that averages over ranks. The loss function (forward and,
through AOTAutograd, backward, collectives included) runs under
torch.compile(backend=BACKEND); the optimizer step on the sharded parameters is eager.

    torchrun --nproc-per-node 2 examples/distributed/simple_fsdp.py [--device cpu] [--steps N]
        [--backend neuron|inductor|aot_eager]
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from common import (
    Parity, batches, log, mean_over_ranks, mlp, parse_args, reference_step, setup, shard, teardown,
)

BATCH = 16
# The torch.compile backend per device; --backend overrides. aot_eager on CPU traces
# the same joint forward/backward graph as inductor without its C++ compile time.
BACKENDS = {"neuron": "neuron", "cpu": "aot_eager"}


def replicate_compute(p):
    """All-gather a sharded parameter for compute; its gradient is reduce-scattered."""
    return p.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial("avg")])


def simple_fsdp(model: nn.Module, mesh) -> nn.Module:
    for module in model.modules():
        params = dict(module.named_parameters(recurse=False))
        if not params:
            continue
        for name, p in params.items():
            sharded = distribute_tensor(p.data, mesh, [Shard(0)])
            module.register_parameter(name, nn.Parameter(sharded))
        # Parametrize by subclassing: a class property shadows the entry in
        # module._parameters, so `self.weight` in forward() returns the all-gathered
        # tensor while model.parameters() still yields the sharded DTensors. (Cheaper
        # for dynamo to trace than torch.nn.utils.parametrize; this is what SimpleFSDP
        # does.)
        props = {n: property(lambda self, n=n: replicate_compute(self._parameters[n]))
                 for n in params}
        module.__class__ = type(f"SimpleFSDP{type(module).__name__}", (type(module),), props)
    return model


def main():
    args = parse_args(__doc__, backend=dict(default=None, help="torch.compile backend"))
    device = setup(args)
    backend = args.backend or BACKENDS[device.type]
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    model = mlp()
    ref = copy.deepcopy(model)
    simple_fsdp(model.to(device), mesh)

    def loss_fn(x, y):
        return F.mse_loss(model(x), y)

    compiled_loss = torch.compile(loss_fn, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    parity = Parity()
    for step, (x, y) in enumerate(batches(args.steps, BATCH)):
        opt.zero_grad()
        loss = compiled_loss(shard(x).to(device), shard(y).to(device))
        loss.backward()
        opt.step()
        loss = mean_over_ranks(loss)

        ref_loss = reference_step(ref, ref_opt, x, y)
        parity.check(f"loss step {step}", loss, ref_loss)

    full = {k: p.full_tensor() for k, p in model.named_parameters()}
    parity.check_all("param", full, dict(ref.named_parameters()))

    # Honesty check: the compiled path ran (dynamo captured at least one graph).
    stats = torch._dynamo.utils.counters
    graphs, breaks = stats["stats"]["unique_graphs"], sum(stats["graph_break"].values())
    if graphs < 1:
        raise SystemExit("simple_fsdp: torch.compile captured no graph")
    log(f"simple_fsdp: backend {backend}: {graphs} compiled graph(s), {breaks} graph break(s)")
    parity.report("simple_fsdp", device)
    teardown()


if __name__ == "__main__":
    main()
