"""The decoder LMs and ViT under ``torch.compile(backend="neuron")``: forward
and backward equal eager on neuron, a second batch reuses the graph, and the
graph breaks and recompiles are listed in the coverage report.

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
    for step in range(2):                     # the second batch must reuse the graph
        batch = to_device(family.batch(), DEV)
        for m in (eager, model):
            m.zero_grad()
        want = family.training_loss(eager, batch)
        want.backward()
        got = family.training_loss(compiled, batch)
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for (name, p_eager), p in zip(eager.named_parameters(), model.parameters()):
            if p_eager.grad is not None:
                torch.testing.assert_close(p.grad, p_eager.grad, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"step {step}, {name}.grad: {m}")
    metrics = torchneuron.get_dynamo_metrics()
    breaks = ", ".join(f"{reason} ×{n}" for reason, n in metrics["graph_break_reasons"].items()) or "none"
    recompiles = "; ".join(str(r) for r in metrics["recompile_reasons"]) or "none"
    coverage_report.note(family.name, "compiled",
                         f"{metrics['compiled_graphs']} graph(s); graph breaks: {breaks}; recompiles: {recompiles}")
    assert metrics["compiled_graphs"] >= 1 and metrics["fallbacks"] == 0, metrics["fallback_reasons"]
    assert metrics["recompiles"] == 0, metrics["recompile_reasons"]


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
