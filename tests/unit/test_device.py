"""halluc_lab.device: device choice with its reason, the override, scales and seeding."""

import unittest.mock

import pytest
import torch

from halluc_lab import device as dev


def test_auto_scale_is_full_on_cuda_and_smoke_elsewhere():
    assert dev.resolve_scale("auto", torch.device("cuda")) == "full"
    assert dev.resolve_scale("auto", torch.device("cpu")) == "smoke"
    assert dev.resolve_scale("full", torch.device("cpu")) == "full"


def test_environment_overrides_automatic_choice(monkeypatch):
    monkeypatch.setenv(dev.ENV_DEVICE, "cpu")
    device, reason = dev.choose_device("auto")
    assert device.type == "cpu" and dev.ENV_DEVICE in reason


def test_explicit_device_wins_over_environment(monkeypatch):
    monkeypatch.setenv(dev.ENV_DEVICE, "mps")
    device, reason = dev.choose_device("cpu")
    assert device.type == "cpu" and reason == "asked for"


def test_setup_prints_device_and_reason(capsys):
    rt = dev.setup(scale="smoke", device="cpu", seed=3)
    out = capsys.readouterr().out
    assert "device: cpu" in out and "asked for" in out and "scale smoke" in out and "seed 3" in out
    assert rt.dtype == torch.float32 and rt.pick(smoke="s", full="f") == "s"


def test_same_seed_gives_same_numbers():
    dev.setup(device="cpu", seed=7, verbose=False)
    a = torch.randn(5)
    dev.setup(device="cpu", seed=7, verbose=False)
    assert torch.equal(a, torch.randn(5))


def test_runtime_generator_is_seeded_by_offset():
    rt = dev.setup(device="cpu", seed=1, verbose=False)
    x = torch.rand(3, generator=rt.generator(5))
    assert torch.equal(x, torch.rand(3, generator=rt.generator(5)))
    assert not torch.equal(x, torch.rand(3, generator=rt.generator(6)))


@pytest.mark.parametrize("kwargs, name", [({"scale": "huge"}, "scale"), ({"device": "tpu"}, "device"),
                                           ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed")])
def test_bad_parameters_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dev.setup(verbose=False, **kwargs)


def test_unavailable_cuda_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="cuda"):
        dev.choose_device("cuda")


def test_autocast_is_a_no_op_on_cpu():
    rt = dev.setup(device="cpu", verbose=False)
    with rt.autocast():
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.float32


def test_cpu_setup_uses_one_thread_unless_told_otherwise(monkeypatch):
    before = torch.get_num_threads()
    try:
        dev.setup(device="cpu", verbose=False)
        assert torch.get_num_threads() == 1
        monkeypatch.setenv(dev.ENV_THREADS, "2")
        dev.setup(device="cpu", verbose=False)
        assert torch.get_num_threads() == 2
        monkeypatch.setenv(dev.ENV_THREADS, "zero")
        with pytest.raises(ValueError, match=dev.ENV_THREADS):
            dev.setup(device="cpu", verbose=False)
    finally:
        torch.set_num_threads(before)


def test_deterministic_context_turns_the_kernels_on_and_restores_the_setting():
    from halluc_lab.device import deterministic

    before = torch.are_deterministic_algorithms_enabled()
    with deterministic(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled() == before
    with deterministic(False):
        assert not torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before


@pytest.mark.parametrize("enabled", [False, True])
def test_deterministic_context_restores_the_warn_only_flag_too(enabled):
    from halluc_lab.device import deterministic

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with deterministic(enabled):
            pass
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("warn_only", [False, True])
def test_distinct_indices_turns_deterministic_kernels_off_and_restores_both_flags(warn_only):
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        with pytest.raises(KeyError), dev.distinct_indices():
            assert not torch.are_deterministic_algorithms_enabled()
            raise KeyError("the flags come back on an error too")
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _write_one_column_per_row(target, index, src):
    with dev.distinct_indices():
        return target.scatter_(1, index, src)


def test_distinct_indices_does_not_break_a_traced_graph():
    """Under torch.compile the context does nothing (fullgraph raises on a graph break)."""
    torch._dynamo.reset()
    traced = torch.compile(_write_one_column_per_row, backend="eager", fullgraph=True)
    index = torch.tensor([[2], [0]])
    with dev.deterministic(True):
        out = traced(torch.zeros(2, 3), index, torch.ones(2, 1))
        assert torch.are_deterministic_algorithms_enabled()
    assert out.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


def test_compiled_calls_for_capture_run_with_deterministic_kernels_off_and_restore_them():
    seen = []
    with dev.deterministic(True):
        with unittest.mock.patch.object(torch, "compile", lambda fn, **kw: fn):  # the wrapper, not Inductor
            compiled = dev.compile_for_capture(lambda: seen.append(torch.are_deterministic_algorithms_enabled()))
        compiled()
        assert torch.are_deterministic_algorithms_enabled()
    assert seen == [False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_writes_to_distinct_indices_give_the_deterministic_kernels_bits():
    g = torch.Generator("cuda").manual_seed(0)
    rows, cols = 512, 64
    target = torch.randn(rows, cols, 8, device="cuda", generator=g)
    index = torch.randint(cols, (rows, 1), device="cuda", generator=g)  # one column per row: distinct
    src = torch.randn(rows, 1, 8, device="cuda", generator=g)
    with dev.deterministic(True):
        sorted_scatter = target.clone().scatter_(1, index[..., None].expand(-1, -1, 8), src)
        sorted_put = target.clone().index_put_((torch.arange(rows, device="cuda")[:, None], index), src)
        with dev.distinct_indices():
            plain_scatter = target.clone().scatter_(1, index[..., None].expand(-1, -1, 8), src)
            plain_put = target.clone().index_put_((torch.arange(rows, device="cuda")[:, None], index), src)
    assert torch.equal(sorted_scatter, plain_scatter) and torch.equal(sorted_put, plain_put)
    assert torch.equal(sorted_scatter, sorted_put)


def test_uploads_and_host_copies_give_the_values_on_the_cpu():
    assert torch.equal(dev.to_device([1, 2, 3], "cpu", torch.long), torch.tensor([1, 2, 3]))
    assert dev.to_device(torch.tensor([1.5]), "cpu", torch.float64).dtype == torch.float64
    a, b = torch.arange(6).view(2, 3), torch.tensor([True, False])
    got = dev.host_copies([a, b])()
    assert torch.equal(got[0], a) and torch.equal(got[1], b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_uploads_and_host_copies_do_not_wait_for_the_work_queued_on_the_device():
    """With the device busy (a spin kernel queued), a plain upload makes the host wait for it; to_device does not,
    and a host copy's wait() waits for the copy, not for the kernel queued after it."""
    stream, cycles = torch.cuda.current_stream(), 2_000_000_000  # a second or so of spinning
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    plain = torch.tensor([1, 2, 3]).to("cuda")
    assert stream.query(), "a plain upload is expected to wait for the queued work"
    torch.cuda._sleep(cycles)
    queued = dev.to_device([1, 2, 3], "cuda", torch.long)
    assert not stream.query(), "to_device waited for the device"
    assert torch.equal(queued, plain)  # reading it waits, as any read does
    source = torch.arange(1000, device="cuda")
    wait = dev.host_copies([source])
    torch.cuda._sleep(cycles)
    (copy,) = wait()
    assert not stream.query(), "host_copies' wait() waited for the work queued after the copy"
    assert torch.equal(copy, torch.arange(1000))
    torch.cuda.synchronize()


def test_cublas_gets_a_fixed_workspace_before_any_gpu_work():
    import os

    import halluc_lab.device  # noqa: F401

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
