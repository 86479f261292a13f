"""Hugging Face model families on ``neuron`` against the same model on CPU.

Each family (``zoo.FAMILIES``) is built twice from the same seed; the CPU copy
is the reference. Models run in eval mode so that dropout is off and both
devices compute the same function (gradients flow in eval mode as well);
training with dropout on is covered by the Trainer test.
"""

import pytest
import torch

from tests.models.zoo import FAMILIES, to_device

DEV = "neuron"
RTOL, ATOL = 1e-4, 1e-5
# The diffusion UNet's convolutions reduce in another order on neuron.
GRAD_TOL = {"unet2d": dict(rtol=1e-3, atol=1e-4)}

families = pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())
causal_lms = pytest.mark.parametrize("family", [f for f in FAMILIES.values() if f.causal_lm],
                                     ids=[n for n, f in FAMILIES.items() if f.causal_lm])


def _pair(family):
    return family.build().eval(), family.build().to(DEV).eval()


def _tensors(output, prefix=""):
    """The tensors of a model output by name (nested outputs flattened)."""
    items = output.items() if hasattr(output, "items") else enumerate(output)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            yield name, value
        elif hasattr(value, "items") or isinstance(value, (tuple, list)):
            yield from _tensors(value, name + ".")


def _forward(model, family, batch):
    if family.loss is not None:                  # the diffusion UNet: noise prediction
        from tests.models.zoo import ddpm_scheduler
        noisy = ddpm_scheduler().add_noise(batch["clean"], batch["noise"], batch["timesteps"])
        return model(noisy, batch["timesteps"])
    return model(**batch)


@families
@pytest.mark.coverage("forward")
def test_forward_matches_cpu(family):
    cpu, dev = _pair(family)
    batch = family.batch()
    with torch.no_grad():
        want = dict(_tensors(_forward(cpu, family, batch)))
        got = dict(_tensors(_forward(dev, family, to_device(batch, DEV))))
    assert got.keys() == want.keys() and want
    for name, tensor in got.items():
        assert tensor.device.type == DEV, name
        torch.testing.assert_close(tensor.cpu(), want[name], rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


@families
@pytest.mark.coverage("backward")
def test_gradients_match_cpu(family):
    cpu, dev = _pair(family)
    batch = family.batch()
    family.training_loss(cpu, batch).backward()
    family.training_loss(dev, to_device(batch, DEV)).backward()
    tol = GRAD_TOL.get(family.name, dict(rtol=RTOL, atol=ATOL))
    checked = 0
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        assert (p_cpu.grad is None) == (p_dev.grad is None), name
        if p_cpu.grad is not None:
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, **tol, msg=lambda m: f"{name}.grad: {m}")
            checked += 1
    assert checked > 0


@families
@pytest.mark.coverage("train")
def test_three_adamw_steps_match_cpu(family):
    torch.manual_seed(1)
    batches = [family.batch() for _ in range(3)]
    losses, params = {}, {}
    for device, model in zip(("cpu", DEV), _pair(family)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[device] = []
        for batch in batches:
            loss = family.training_loss(model, to_device(batch, device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[device].append(loss.detach())     # no .item(): the coverage counts the model's reads
        losses[device] = torch.stack(losses[device]).cpu()
        params[device] = [p.detach().cpu() for p in model.parameters()]
    tol = GRAD_TOL.get(family.name, dict(rtol=RTOL, atol=ATOL))
    torch.testing.assert_close(losses[DEV], losses["cpu"], **tol)
    assert losses["cpu"][2] != losses["cpu"][0]           # the steps changed the model
    for got, want in zip(params[DEV], params["cpu"]):
        torch.testing.assert_close(got, want, **tol)


@causal_lms
@pytest.mark.coverage("generate")
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_gives_cpu_tokens(family, cache):
    cpu, dev = _pair(family)
    prompt = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    if cache == "static":
        # On a neuron device generate() would compile the step by itself; the
        # compiled tier covers that, this checks the static cache eagerly.
        kwargs.update(cache_implementation="static", disable_compile=True)
    want = cpu.generate(prompt, **kwargs)
    got = dev.generate(prompt.to(DEV), **kwargs)
    assert got.device.type == DEV
    assert torch.equal(got.cpu(), want), (got.cpu(), want)


encoder_decoders = [FAMILIES["t5"], FAMILIES["whisper"]]


@pytest.mark.parametrize("family", encoder_decoders, ids=[f.name for f in encoder_decoders])
@pytest.mark.coverage("generate")
def test_encoder_decoder_generation_gives_cpu_tokens(family):
    cpu, dev = _pair(family)
    inputs = {k: v for k, v in family.batch().items() if k != "labels"}
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    want = cpu.generate(**inputs, **kwargs)
    got = dev.generate(**to_device(inputs, DEV), **kwargs)
    assert torch.equal(got.cpu(), want), (got.cpu(), want)


@pytest.mark.parametrize("family", [FAMILIES["unet2d"]], ids=["unet2d"])
@pytest.mark.coverage("generate")
def test_diffusion_sampling_loop_matches_cpu(family):
    """Three DDIM denoising steps (the model, then the scheduler's step) from
    the same starting noise end at CPU's image."""
    from diffusers import DDIMScheduler

    samples = {}
    for device, model in zip(("cpu", DEV), _pair(family)):
        scheduler = DDIMScheduler(num_train_timesteps=1000)
        scheduler.set_timesteps(3)
        sample = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(7)).to(device)
        with torch.no_grad():
            for t in scheduler.timesteps:
                sample = scheduler.step(model(sample, t).sample, t, sample).prev_sample
        samples[device] = sample
    assert samples[DEV].device.type == DEV
    torch.testing.assert_close(samples[DEV].cpu(), samples["cpu"], rtol=1e-4, atol=1e-4)
