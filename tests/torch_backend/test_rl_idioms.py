"""Reinforcement-learning idioms (CleanRL's ppo.py, dqn.py, sac_continuous_action.py): actions sampled on the device
and read back every environment step, action selection with grad on in training mode."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.distributions import Categorical

import gpemu.torch_backend as gt


def _actor(obs: int = 4, actions: int = 2) -> torch.nn.Module:
    """CleanRL ppo.py's actor: 64-64 tanh MLP to the action logits."""
    return torch.nn.Sequential(torch.nn.Linear(obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, actions))


def test_categorical_actions_read_back_as_in_range_draws(emu: gt.Emulation) -> None:
    # Note [Sampled categories]: ppo.py's `envs.step(action.cpu().numpy())` read all zeros (every action 0)
    actor = _actor(actions=3).cuda()
    obs = torch.randn(4096, 4, device="cuda")
    torch.manual_seed(1)
    host_rng = torch.get_rng_state()
    with torch.no_grad():
        first = Categorical(logits=actor(obs)).sample().cpu()
    assert torch.equal(torch.get_rng_state(), host_rng)  # the host's own generator is not drawn from
    torch.manual_seed(1)
    with torch.no_grad():
        again = Categorical(logits=actor(obs)).sample().cpu()
    assert first.dtype == torch.int64 and first.shape == (4096,)
    assert torch.equal(first, again)  # drawn from the emulated CUDA generator, which torch.manual_seed seeds
    # the logits are not computed: uniform over 3 categories, 4096 / 3 = 1365.3 each (binomial sd sqrt(4096 * 2/9)
    # = 30.2; +-150 is 5 sd)
    counts = torch.bincount(first, minlength=3)
    assert int(counts.sum()) == 4096 and int(counts.min()) > 1365 - 150 and int(counts.max()) < 1365 + 150


def test_multinomial_uses_known_probabilities_and_respects_replacement(emu: gt.Emulation) -> None:
    # probabilities copied from the host are known: a one-hot row draws its category every time
    onehot = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]).cuda()
    assert torch.multinomial(onehot, 5, replacement=True).cpu().tolist() == [[1] * 5, [2] * 5]
    # without replacement each row's draws are distinct: 6 of 6 categories is a permutation of 0..5
    perm = torch.multinomial(torch.nn.Linear(3, 6).cuda()(torch.randn(2, 3, device="cuda")).softmax(-1), 6).cpu()
    assert [sorted(row) for row in perm.tolist()] == [list(range(6))] * 2
    # `probs.multinomial(1)` on a 1-D tensor: one index in [0, 4)
    one = torch.randn(4, device="cuda").softmax(0).multinomial(1).cpu()
    assert one.shape == (1,) and 0 <= int(one) < 4
    # a draw above 64 KiB (8,192 int64 indices) stays unknown: it reads zeros and costs no host sampling
    big = torch.multinomial(torch.ones(3, 4, device="cuda"), 4000, replacement=True)
    assert int(big.cpu().abs().sum()) == 0


def _select(module: torch.nn.Module, obs: torch.Tensor, calls: int, emu: gt.Emulation) -> list[float]:
    """Call `module(obs)` `calls` times with grad on, read the first output back each time; return GPU busy s each."""
    dev = emu.devices[0]
    busy = []
    for _ in range(calls):
        torch.cuda.synchronize()
        before = dev.busy_s()
        out = module(obs)  # the previous call's graph dies when `out` is rebound (after this call)
        first = out[0] if isinstance(out, tuple) else out
        first.argmax(1).cpu()
        torch.cuda.synchronize()
        busy.append(dev.busy_s() - before)
    return busy


class _GaussianActor(torch.nn.Module):
    """sac_continuous_action.py's actor: (mean, log_std) from a 256-256 ReLU MLP, action scale in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                        torch.nn.ReLU())
        self.mean, self.logstd = torch.nn.Linear(256, 1), torch.nn.Linear(256, 1)
        self.register_buffer("action_scale", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.mean(h) * self.action_scale, torch.tanh(self.logstd(h))


def _q_network() -> torch.nn.Module:
    """dqn.py's QNetwork: 120-84 ReLU MLP from CartPole's 4 observations to 2 action values."""
    return torch.nn.Sequential(torch.nn.Linear(4, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU(),
                               torch.nn.Linear(84, 2))


@pytest.mark.parametrize(("make", "obs_dim"), [(_q_network, 4), (_GaussianActor, 3)],
                         ids=["dqn-q-network", "sac-actor-two-outputs"])
def test_action_selection_in_training_mode_with_grad_replays(emu: gt.Emulation, make: Callable[[], torch.nn.Module],
                                                             obs_dim: int) -> None:
    # Note [Forwards without backward]: dqn.py's `q_network(obs)` and SAC's actor run in training mode with grad on
    # and their graphs die unused; every call recorded per op: (recorded, replayed) was (6, 0). Call N's output lives
    # until call N+1 replaces it, so calls 1-3 record, call 2's finish during call 3 makes the key ready, and calls
    # 4-6 replay what the recorded calls charged
    module = make().cuda()
    assert module.training
    busy = _select(module, torch.randn(1, obs_dim, device="cuda"), 6, emu)
    assert (emu.replay.recorded, emu.replay.replayed) == (3, 3)
    assert busy[5] == pytest.approx(busy[1], rel=1e-6) and busy[5] > 0


def test_training_forward_that_updates_buffers_is_not_taken_as_forward_only(emu: gt.Emulation) -> None:
    # a training-mode batch norm bumps num_batches_tracked: a replay would not, so the key never replays without a
    # backward (6 recorded, 0 replayed), as before the fix
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).cuda()
    _select(model, torch.randn(16, 4, device="cuda"), 6, emu)
    assert (emu.replay.recorded, emu.replay.replayed) == (6, 0)
