"""``nki.simulator``: the simulator's functional entry point, ``simulate_kernel(kernel, args,
kwargs, lnc)`` (the form integrations such as vLLM's call), the same as
``nki.simulate(kernel)[lnc](*args, **kwargs)``."""


def simulate_kernel(kernel, args=(), kwargs=None, lnc=1):
    from torchneuron.nki import simulate

    runner = simulate(kernel)
    return (runner[lnc] if lnc and lnc > 1 else runner)(*args, **(kwargs or {}))
