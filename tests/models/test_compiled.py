"""The decoder LMs and ViT under ``torch.compile(backend="neuron")``: forward
and backward equal eager on neuron, later batches reuse the graphs, and the
graph breaks and recompiles are listed in the coverage report. (A recompile
on the second batch can be the model's own doing: a classification loss sets
``config.problem_type`` on its first call, which a guard sees.)

Slow tier (``make test-slow``): each model compiles for 30–60 s on 2 cores.
"""

import pytest
import torch
import torch._dynamo

import torchneuron
from tests.models import coverage_report
from tests.models.zoo import FAMILIES, to_device

pytestmark = pytest.mark.slow

DEV = "neuron"
compiled_families = [f for f in FAMILIES.values() if f.compiled]


@pytest.mark.parametrize("family", compiled_families, ids=[f.name for f in compiled_families])
@pytest.mark.coverage("compiled")
def test_compiled_forward_and_backward_match_eager(family):
    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()
    eager, model = family.build().to(DEV).eval(), family.build().to(DEV).eval()
    compiled = torch.compile(model, backend="neuron")
    torch.manual_seed(1)
    for step in range(3):
        if step == 2:                          # the third batch must reuse what is compiled
            settled = torchneuron.get_dynamo_metrics()["recompiles"]
        batch = to_device(family.batch(), DEV)
        for m in (eager, model):
            m.zero_grad()
        want = family.training_loss(eager, batch)
        want.backward()
        got = family.training_loss(compiled, batch)
        got.backward()
        # Compared on the host: reads on the device would count as the model's round trips.
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-4, atol=1e-5)
        for (name, p_eager), p in zip(eager.named_parameters(), model.parameters()):
            if p_eager.grad is not None:
                torch.testing.assert_close(p.grad.cpu(), p_eager.grad.cpu(), rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"step {step}, {name}.grad: {m}")
    metrics = torchneuron.get_dynamo_metrics()
    breaks = ", ".join(f"{reason.strip().splitlines()[0]} ×{n}"
                       for reason, n in metrics["graph_break_reasons"].items()) or "none"
    recompiles = "; ".join(f"{r['reason'].strip().splitlines()[-1].strip()}" for r in metrics["recompile_reasons"])
    coverage_report.note(family.name, "compiled",
                         f"{metrics['compiled_graphs']} graph(s); graph breaks: {breaks}; "
                         f"recompiles: {metrics['recompiles']}{' (' + recompiles + ')' if recompiles else ''}")
    assert metrics["compiled_graphs"] >= 1 and metrics["fallbacks"] == 0, metrics["fallback_reasons"]
    assert metrics["recompiles"] == settled, metrics["recompile_reasons"]


@pytest.mark.parametrize("family", [FAMILIES["llama"]], ids=["llama"])
@pytest.mark.coverage("generate")
def test_static_cache_generation_compiles_by_itself_and_gives_cpu_tokens(family):
    """On a neuron device, generate() with a static cache compiles the decoding
    step by itself (as on CUDA); the tokens must still be CPU's."""
    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()
    cpu, dev = family.build().eval(), family.build().to(DEV).eval()
    prompt = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="static")
    want = cpu.generate(prompt, **kwargs)
    got = dev.generate(prompt.to(DEV), **kwargs)
    assert torch.equal(got.cpu(), want), (got.cpu(), want)
    assert torchneuron.get_dynamo_metrics()["compiled_graphs"] >= 1
