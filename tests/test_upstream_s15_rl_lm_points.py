"""Session 15 upstream runs: rl-baselines3-zoo (Stable-Baselines3 PPO / SAC / DQN), lucidrains/x-transformers'
train_enwik8.py and fxia22/pointnet.pytorch's train_classification.py, each idiom reproduced in a few lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributions import Categorical

import gpemu.torch_backend as gt


class _ActorCritic(torch.nn.Module):
    """Stable-Baselines3's ActorCriticPolicy.forward for CartPole: (actions, values, log_prob), actions sampled."""

    def __init__(self) -> None:
        super().__init__()
        self.pi = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
        self.vf = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dist = Categorical(logits=self.pi(obs))
        actions = dist.sample()
        return actions, self.vf(obs), dist.log_prob(actions)


def test_sampled_actions_returned_by_a_module_are_drawn_on_every_call(emu_a100: gt.Emulation) -> None:
    # Note [Known draws in forward]: SB3's collect_rollouts calls `self.policy(obs_tensor)` under no_grad and reads
    # `actions.cpu().numpy()` every environment step. Before the fix calls 1-3 recorded and drew, and calls 4-8
    # replayed with unknown actions: all zeros (the zoo's CartPole episodes lasted ~9.3 steps, ~22 after)
    policy = _ActorCritic().cuda()
    torch.manual_seed(0)
    dev = emu_a100.devices[0]
    sums, busy = [], []
    for _ in range(8):
        torch.cuda.synchronize()
        before = dev.busy_s()
        with torch.no_grad():
            actions, _values, _log_prob = policy(torch.randn(64, 4).cuda())
        got = actions.cpu()
        torch.cuda.synchronize()
        busy.append(dev.busy_s() - before)
        assert got.shape == (64,) and set(got.tolist()) <= {0, 1}
        sums.append(int(got.sum()))
    # the logits are not computed: each action is 1 with probability 1/2. One call of 64 draws is all zeros with
    # probability 2^-64; over 8 calls the 512 draws sum to 256 +- 11.3 (sd sqrt(512 / 4)): +-60 is over 5 sd
    assert all(s > 0 for s in sums[3:])
    assert 256 - 60 < sum(sums) < 256 + 60
    # never replayed: all 8 calls run per op. Note [Forwards that never replay]: two count as recording before
    # replay: call 1 under the plain key, call 2 first under the key with the inputs' ranges (the sampled output
    # has a known value, hence a range: Note [Ranges through replay]); calls 3-8 follow a recording that could not
    # replay, so the run report keeps their iterations (the zoo's 78 rollout iterations had been left out as
    # "recorded per op (a new input shape or mode)")
    assert (emu_a100.replay.replayed, emu_a100.replay.recorded, emu_a100.replay.warming) == (0, 8, 2)
    assert busy[7] == pytest.approx(busy[1], rel=1e-9) and busy[7] > 0  # per op: the same cost every call


class _Shuffle(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), torch.randperm(8, device=x.device)


def test_a_permutation_returned_by_a_module_stays_a_permutation(emu_a100: gt.Emulation) -> None:
    # randperm's value is known too (drawn from the emulated generator): replayed, it read [0] * 8 from call 4 on
    model = _Shuffle().cuda()
    perms = []
    with torch.no_grad():
        for _ in range(6):
            _y, perm = model(torch.randn(2, 8, device="cuda"))
            perms.append(perm.cpu().tolist())
    assert all(sorted(p) == list(range(8)) for p in perms)
    assert len({tuple(p) for p in perms}) > 1  # new draws each call (6 equal ones: probability (1/8!)^5)
    assert emu_a100.replay.replayed == 0


def test_deterministic_forward_still_replays(emu_a100: gt.Emulation) -> None:
    # the rule is only for draws the host knows: the same actor's logits read through argmax (SB3's deterministic
    # predict) under no_grad record two calls (the second matches the first) and replay the other four, as before
    policy = _ActorCritic().cuda()
    with torch.no_grad():
        for _ in range(6):
            policy.pi(torch.randn(64, 4, device="cuda")).argmax(-1).cpu()
    assert (emu_a100.replay.recorded, emu_a100.replay.replayed) == (2, 4)


_TERM_CHILD = """
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    with open(out + ".term", "w") as f:
        f.write("TERM")
    sys.exit(3)
signal.signal(signal.SIGTERM, on_term)
with open(out + ".pid", "w") as f:
    f.write(str(os.getpid()))
for _ in range(1200):
    time.sleep(0.05)
"""


def test_sigterm_to_gpemu_run_reaches_the_script(gpemu_run_started: Any) -> None:
    # Note [Signals to the child]: x-transformers' train_enwik8.py runs 100,000 batches (fixed in the file), so a
    # short run is one stopped by a signal. A SIGTERM to `gpemu run` alone killed only it: the script ran on as an
    # orphan (for up to 60 s here) and its report stayed incomplete. Now the script gets the signal, and its exit
    # status (3, from its handler) is gpemu run's
    proc, out = gpemu_run_started(["--gpu", "a100"], _TERM_CHILD)
    proc.terminate()  # SIGTERM to gpemu run only, as a launcher's Popen.terminate() sends it
    assert proc.wait(timeout=30) == 3
    assert Path(out + ".term").read_text() == "TERM"


class _Dist:
    """SB3's SquashedDiagGaussianDistribution: a plain object that keeps the last distribution and actions."""

    def __init__(self) -> None:
        self.distribution: torch.distributions.Normal | None = None
        self.gaussian_actions: torch.Tensor | None = None

    def actions(self, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        self.distribution = torch.distributions.Normal(mean, log_std.exp(), validate_args=False)
        self.gaussian_actions = self.distribution.rsample()  # frees the previous call's tensors
        return torch.tanh(self.gaussian_actions)


class _SacActor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.latent = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU())
        self.mu, self.log_std = torch.nn.Linear(256, 1), torch.nn.Linear(256, 1)
        self.action_dist = _Dist()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.latent(obs)
        return self.action_dist.actions(self.mu(h), self.log_std(h))


def test_forward_that_frees_state_of_the_previous_call_counts_as_steady_per_op(emu_a100: gt.Emulation) -> None:
    # Note [Forwards that never replay]: SB3 SAC's gradient step (`actor.action_log_prob(obs)`, batch 256) leaves its
    # distribution on `action_dist`, and the next environment step's `actor(obs)` (batch 1) replaces it: the
    # forward frees 3 x 1 KiB blocks (256 floats) and keeps 3 x 512 B, a net -1,536 B, so it never replays (a replay
    # would not update `action_dist` either). Call 1 counts as recording before replay (no predecessor), call 2 too
    # (call 1 found nothing to free: it could replay); calls 3-6 follow a recording that could not. Before, all 6
    # counted and the zoo's SAC report left out 2,899 of 8,700 iterations
    actor = _SacActor().cuda()
    batch = torch.zeros(256, 1, device="cuda")
    with torch.no_grad():
        for _ in range(6):
            actor(torch.randn(1, 3, device="cuda")).cpu()
            actor.action_dist.actions(batch, batch)  # the gradient step's own draw, outside any module call
    assert (emu_a100.replay.recorded, emu_a100.replay.replayed, emu_a100.replay.warming) == (6, 0, 2)
