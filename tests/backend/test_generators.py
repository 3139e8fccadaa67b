"""`torch.Generator(device="tpu")`: seeded, independent streams with get_state/set_state, usable by every random
op that takes `generator=`, in every eager mode; CPU generators stay torch's own."""

import copy
import pickle

import pytest
import torch

MODES = list(torch.tpu.EagerMode)


def _x():
    return torch.zeros(2, 5, device="tpu")


def _probs():
    return torch.softmax(torch.arange(10.0, device="tpu").reshape(2, 5) / 3, -1)


DRAWS = {  # every random op that takes generator=, on tpu
    "randn": lambda g: torch.randn(2, 5, generator=g, device="tpu"),
    "rand": lambda g: torch.rand(2, 5, generator=g, device="tpu"),
    "randint": lambda g: torch.randint(0, 100, (2, 5), generator=g, device="tpu"),
    "randint_high": lambda g: torch.randint(100, (2, 5), generator=g, device="tpu"),
    "randperm": lambda g: torch.randperm(10, generator=g, device="tpu"),
    "randn_like": lambda g: torch.randn_like(_x(), generator=g),
    "rand_like": lambda g: torch.rand_like(_x(), generator=g),
    "randint_like": lambda g: torch.randint_like(_x(), 100, generator=g),
    "normal_": lambda g: _x().normal_(1.0, 2.0, generator=g),
    "uniform_": lambda g: _x().uniform_(-1, 1, generator=g),
    "normal_tensor": lambda g: torch.normal(_x(), 1.0, generator=g),
    "normal_sized": lambda g: torch.normal(0.0, 1.0, (2, 5), generator=g, device="tpu"),
    "bernoulli": lambda g: torch.bernoulli(_x() + 0.5, generator=g),
    "bernoulli_p": lambda g: _x().bernoulli_(0.3, generator=g),
    "exponential_": lambda g: _x().exponential_(generator=g),
    "random_": lambda g: _x().random_(0, 50, generator=g),
    "cauchy_": lambda g: _x().cauchy_(generator=g),
    "log_normal_": lambda g: _x().log_normal_(generator=g),
    "geometric_": lambda g: _x().geometric_(0.3, generator=g),
    "multinomial": lambda g: torch.multinomial(_probs(), 3, generator=g),
    "multinomial_replacement": lambda g: torch.multinomial(_probs(), 8, replacement=True, generator=g),
    "poisson": lambda g: torch.poisson(_x() + 3.0, generator=g),
}


def _draw(name: str, g) -> torch.Tensor:
    out = DRAWS[name](g)
    assert out.device.type == "tpu"
    return out.cpu()


def test_a_tpu_generator_is_a_torch_generator_on_tpu():
    g = torch.Generator(device="tpu")
    assert isinstance(g, torch.Generator) and g.device == torch.device("tpu", 0)
    assert torch.Generator("tpu:0").device == torch.device("tpu", 0)
    assert g.manual_seed(11) is g and g.initial_seed() == 11
    assert g.manual_seed(-1).initial_seed() == 2**64 - 1  # (as torch's generators keep seeds: uint64)
    s = g.seed()
    assert g.initial_seed() == s
    cpu = torch.Generator()
    assert type(cpu) is torch._C.Generator and cpu.device.type == "cpu"
    assert isinstance(torch.default_generator, torch.Generator)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", sorted(DRAWS))
def test_every_random_op_draws_from_the_generator(mode, name):
    with torch.tpu.eager_mode(mode):
        torch.tpu.manual_seed(123)
        a = _draw(name, torch.Generator("tpu").manual_seed(5))
        after_a = torch.tpu.get_rng_state()
        b = _draw(name, torch.Generator("tpu").manual_seed(5))
        c = _draw(name, torch.Generator("tpu").manual_seed(6))
        g = torch.Generator("tpu").manual_seed(5)
        first, second = _draw(name, g), _draw(name, g)
        torch.tpu.manual_seed(5)
        default = _draw(name, None)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same seed: the same values
    assert not torch.equal(a, c)  # another seed: other values
    assert not torch.equal(first, second)  # the stream moves on
    torch.testing.assert_close(first, a, rtol=0, atol=0)
    torch.testing.assert_close(default, a, rtol=0, atol=0)  # the default stream with that seed: the same values
    torch.tpu.manual_seed(123)
    assert torch.equal(after_a, torch.tpu.get_rng_state())  # drawing from a generator left the default alone


def test_generators_are_independent_of_each_other_and_of_the_default():
    torch.tpu.manual_seed(0)
    alone = [torch.rand(4, device="tpu").cpu() for _ in range(3)]
    torch.tpu.manual_seed(0)
    g1, g2 = torch.Generator("tpu").manual_seed(1), torch.Generator("tpu").manual_seed(1)
    mixed, from_g1, from_g2 = [], [], []
    for _ in range(3):
        from_g1.append(torch.rand(4, device="tpu", generator=g1).cpu())
        mixed.append(torch.rand(4, device="tpu").cpu())
        from_g2.append(torch.rand(4, device="tpu", generator=g2).cpu())
    for a, b in zip(alone, mixed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(from_g1, from_g2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_state_restores_exactly():
    g = torch.Generator("tpu").manual_seed(9)
    torch.randn(3, device="tpu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    want = [torch.randn(3, device="tpu", generator=g).cpu() for _ in range(2)]
    assert g.set_state(state) is g
    torch.testing.assert_close([torch.randn(3, device="tpu", generator=g).cpu() for _ in range(2)], want,
                               rtol=0, atol=0)
    for copied in (g.set_state(state).clone_state(), copy.deepcopy(g.set_state(state)),
                   pickle.loads(pickle.dumps(g.set_state(state)))):
        assert copied is not g and copied.device.type == "tpu"
        torch.testing.assert_close(torch.randn(3, device="tpu", generator=copied).cpu(), want[0], rtol=0, atol=0)
    with pytest.raises(ValueError):
        g.set_state(torch.zeros(3, dtype=torch.uint8))


def test_text_generation_with_a_device_generator_is_reproducible():
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(20, 8).to("tpu"), torch.nn.Linear(8, 20).to("tpu")

    def generate(seed: int) -> list[int]:
        g = torch.Generator(device="tpu").manual_seed(seed)
        ids = torch.tensor([[1]], device="tpu")
        for _ in range(6):
            probs = torch.softmax(head(emb(ids[:, -1])) / 0.8, -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
        return ids[0].tolist()

    assert generate(3) == generate(3)
    assert len({tuple(generate(s)) for s in range(4)}) > 1


def test_default_generators_share_the_default_stream():
    g = torch.tpu.default_generators[0]
    g.manual_seed(4)
    assert torch.tpu.initial_seed() == 4
    a = torch.rand(3, device="tpu", generator=g).cpu()
    torch.manual_seed(4)
    torch.testing.assert_close(torch.rand(3, device="tpu").cpu(), a, rtol=0, atol=0)


def test_graph_mode_methods_for_cuda_graphs_are_refused():
    with pytest.raises(RuntimeError, match="CUDA graphs"):
        torch.Generator("tpu").graphsafe_get_state()


_HOST_DRAWS = """
import sys, warnings
import torch
warnings.simplefilter("error")  # (no 'runs on CPU' warning: drawing on the host is what was asked)
dev = sys.argv[1]
torch.manual_seed(0)
x = torch.ones(6, device=dev)
draws = [torch.nn.functional.dropout(x, 0.5), torch.randn(3, device=dev), torch.empty(3, device=dev).uniform_(),
         torch.randint(0, 100, (4,), device=dev), torch.rand(2), torch.randn_like(x), torch.bernoulli(x * 0.5)]
print([t.cpu().tolist() for t in draws])
"""


def test_with_random_on_the_host_tpu_draws_what_cpu_draws() -> None:
    """TPUTOOL_RANDOM=host (parity's tpu run): random ops on tpu draw from the CPU default generator, in order,
    interleaved with the script's own CPU draws."""
    import os
    import subprocess
    import sys

    def run(dev: str, **env: str) -> str:
        out = subprocess.run([sys.executable, "-c", _HOST_DRAWS, dev], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    cpu = run("cpu")
    assert run("tpu", TPUTOOL_RANDOM="host") == cpu
    assert run("tpu") != cpu  # (the tpu's own stream otherwise)
