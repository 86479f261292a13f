"""Kernels written for the current NKI SDK, run unmodified: the import alias, the simulate forms
NKI's tools use, configuration objects, in-place outputs, NumPy dtypes, and logical NeuronCores."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture
def alias():
    """`import nki` served by torchneuron for the test, then removed."""
    served = nki.install_alias()
    for name in [n for n in sys.modules if n.startswith("tests.nki.current_api.")]:
        del sys.modules[name]
    yield served
    nki.uninstall_alias()


def test_an_unmodified_kernel_file_runs_through_the_module_entry_point():
    run = subprocess.run([sys.executable, "-m", "torchneuron.nki", "run", str(HERE / "current_api" / "rmsnorm_lnc.py")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "rmsnorm ok" in run.stdout


def test_the_alias_serves_nki_and_neuronxcc_names(alias):
    assert set(alias) == {"nki", "neuronxcc"}
    import neuronxcc.nki.language as old_nl
    import nki.isa.constants
    import nki.language
    import nki.typing

    import nki.dtype
    import nki.simulator

    assert nki.language is nl and old_nl is nl and nki.typing is nt
    assert nki.isa.constants.oob_mode is nisa.oob_mode
    assert nki.dtype.bfloat16 is nl.bfloat16
    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(nki.simulator.simulate_kernel(exchange, (a,), {}, 2), a)


def test_a_real_nki_package_wins(tmp_path, monkeypatch):
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "nki" not in nki.install_alias()
        import nki as real

        assert real.REAL
    finally:
        nki.uninstall_alias()
        sys.modules.pop("nki", None)


def test_the_kernel_file_on_numpy_cpu_and_neuron_tensors(alias):
    from tests.nki.current_api import rmsnorm_lnc as k

    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 32)).astype(np.float32)
    w = rng.standard_normal((32,)).astype(np.float32)
    want = k.reference(x, w)
    for grid in (1, 2):
        out = np.zeros_like(x)
        nki.simulate(k.rmsnorm[grid])(x, out, w)              # the documented form: grid first
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    out = np.zeros_like(x)
    nki.simulate(k.rmsnorm)[2](x=x, out=out)                  # NKI-lib's harness form, keywords, no weight
    np.testing.assert_allclose(out, k.reference(x), rtol=1e-4, atol=1e-4)
    dev_out = torch.zeros(200, 32, device="neuron")
    k.rmsnorm[2](torch.from_numpy(x).to("neuron"), dev_out, torch.from_numpy(w).to("neuron"))
    np.testing.assert_allclose(dev_out.cpu().numpy(), want, rtol=1e-4, atol=1e-4)


def test_nkiobject_class_attributes_are_constructor_keywords():
    class Config(nl.NKIObject):
        tile: int = 128
        scale: float = 1.0
        name = "cfg"

    c = Config(scale=2.0)
    assert (c.tile, c.scale, c.name) == (128, 2.0, "cfg")
    assert Config(64).tile == 64
    c.extra = [1, 2]  # a mutable object, as kernels use them
    assert c.extra == [1, 2]
    with pytest.raises(TypeError, match="unexpected keyword"):
        Config(nope=1)


def test_plain_functions_simulate_and_bfloat16_numpy_round_trips():
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def double(a):  # not decorated: nki.simulate wraps it
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.arange(256, dtype=np.float32).reshape(2, 128).astype(ml_dtypes.bfloat16)
    out = nki.simulate(double)(a)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), a.astype(np.float32) * 2)


def test_language_constants_are_plain_python():
    @nki.jit
    def probe(a):
        assert isinstance(nl.tile_size.pmax, int) and nl.tile_size.pmax == 128
        assert nl.program_ndim() == 0 and nl.num_programs(axes=0) == 1 and nl.program_id(axis=0) == 0
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(nki.simulate(probe)(a), a)
    assert getattr(nl, str(np.dtype(np.float32))) == nl.float32
    assert nl.bool is nl.bool_


# -- logical NeuronCores -----------------------------------------------------------------------------

@nki.jit
def exchange(a):
    """Each of two programs loads its half, swaps it with the other through sendrecv, and writes
    the other's half: out = the halves of a, swapped."""
    half = a.shape[0] // 2
    me = nl.program_id(0)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((half, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((half, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=a[me * half:(me + 1) * half, :])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    nisa.dma_copy(dst=out[me * half:(me + 1) * half, :], src=theirs)
    return out


def test_sendrecv_between_the_two_cores():
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(nki.simulate(exchange[2])(a), np.concatenate([a[2:], a[:2]]))
    dev = exchange[2](torch.from_numpy(a).to("neuron"))
    np.testing.assert_array_equal(dev.cpu().numpy(), np.concatenate([a[2:], a[:2]]))


def _reverse_halves(barrier):
    @nki.jit
    def kernel(a):
        """Program p writes its half of a scratch tensor in shared HBM, then reads the other's."""
        half = a.shape[0] // 2
        me = nl.program_id(0)
        scratch = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm, name="scratch")
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((half, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[me * half:(me + 1) * half, :])
        nisa.dma_copy(dst=scratch[me * half:(me + 1) * half, :], src=t)
        if barrier:
            nisa.core_barrier(scratch, (0, 1))
        u = nl.ndarray((half, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        other = 1 - me
        nisa.dma_copy(dst=u, src=scratch[other * half:(other + 1) * half, :])
        nisa.dma_copy(dst=out[me * half:(me + 1) * half, :], src=u)
        return out, scratch

    return kernel


def test_core_barrier_orders_the_cores_and_a_missing_one_is_a_race():
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    out, _ = nki.simulate(_reverse_halves(True)[2])(a)
    np.testing.assert_array_equal(out, np.concatenate([a[2:], a[:2]]))
    # Program 0 runs first and reads the half program 1 has not written yet: the conflict is
    # reported at program 1's write.
    with pytest.raises(nki.NKIError, match=r"lnc-race.*program 1 writes .*program 0 read it"):
        nki.simulate(_reverse_halves(False)[2])(a)


def test_a_core_waiting_for_a_finished_one_is_a_deadlock_not_a_hang():
    @nki.jit
    def lonely(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(nki.NKIError, match=r"lnc-deadlock.*program 0 waits at core_barrier"):
        nki.simulate(lonely[2])(np.zeros((2, 2), np.float32))


def test_current_api_kernels_as_operators_in_compiled_code(alias):
    """The unmodified kernel file's kernel (it writes its `out` argument and runs on two cores) and
    an exchanging grid kernel, as operators inside torch.compile, eager and compiled alike."""
    import torchneuron
    from tests.nki.current_api import rmsnorm_lnc as k

    # The configuration object is not an operator argument: the schema leaves it at its default.
    norm = torchneuron.nki_op("nki_current_test::rmsnorm", mutates_args=("out",),
                              schema="(Tensor x, Tensor(a!) out, Tensor? weight=None) -> ()")(k.rmsnorm[2])
    swap = torchneuron.wrap_nki(exchange[2])

    def f(x, w):
        out = torch.empty_like(x)
        norm(x, out, w)
        return swap(out) * 2

    torch._dynamo.reset()
    x, w = torch.randn(256, 64), torch.randn(64)
    want = torch.from_numpy(k.reference(x.numpy(), w.numpy()))
    want = torch.cat([want[128:], want[:128]]) * 2
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    for fn in (f, compiled):
        torch.testing.assert_close(fn(x.to("neuron"), w.to("neuron")).cpu(), want, rtol=1e-4, atol=1e-4)


def test_an_operator_schema_follows_nt_annotations():
    import torchneuron

    def scale_into(x, out: nt.mutable_tensor):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=t)

    torchneuron.nki_op("nki_current_test::scale_into")(scale_into)
    schema = str(torch.ops.nki_current_test.scale_into.default._schema)
    assert "Tensor(a!) out" in schema and schema.endswith("-> ()"), schema
    x, out = torch.randn(4, 8, device="neuron"), torch.zeros(4, 8, device="neuron")
    torch.ops.nki_current_test.scale_into(x, out)
    torch.testing.assert_close(out.cpu(), x.cpu() * 3)


def test_language_helpers_constants_buffers_and_dynamic_loops():
    """shared_constant, shared_identity_matrix, the buffer predicates, no_reorder, and loops whose
    bound is a register loaded from a tile (dynamic_range, fori_loop), against NumPy."""
    table = np.arange(8, dtype=np.float32).reshape(2, 4)

    @nki.jit
    def kernel(a, count):
        assert nl.is_hbm(a.buffer) and not nl.is_on_chip(a.buffer)
        const = nl.shared_constant(table)
        t = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
        assert nl.is_sbuf(t.buffer) and nl.is_on_chip(t.buffer) and not nl.is_psum(t.buffer)
        with nl.no_reorder():
            nisa.dma_copy(dst=t, src=a)
        c = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=c, src=const)
        n_tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=n_tile, src=count)
        n = nisa.register_alloc()
        nisa.register_load(n, n_tile)
        for _ in nl.dynamic_range(0, n):                     # t += const, count times
            nisa.tensor_tensor(dst=t, data1=t, data2=c, op=nl.add)
        nl.fori_loop(0, n, lambda i: nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0))
        eye = nl.shared_identity_matrix(2, dtype=nl.float32)
        ps = nl.ndarray((4, 2), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=t, moving=eye)       # t.T @ I: the transpose of t
        out = nl.ndarray((4, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((4, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    a = np.ones((2, 4), np.float32)
    for times in (0, 3):
        want = ((a + times * table) * 2 ** times).T
        np.testing.assert_array_equal(nki.simulate(kernel)(a, np.array([[times]], np.int32)), want)
    assert nl.spmd_dim(2, nl.nc(2)) == 4
