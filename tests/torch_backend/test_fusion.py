"""The fusion rule of Note [Compiled regions] as a pure function, and FusionGroups charging by it."""

from __future__ import annotations

import pytest

from gpemu.torch_backend.fusion import FusionGroups, fuse_step, fused_seconds


def test_fused_seconds_charges_each_op_what_it_adds_to_its_groups_maximum() -> None:
    # ops (seconds, fusible): conv 10 | add 2, relu 1, mul 3 | gemm 5 | norm 4, add 4
    # conv: not fusible, 10. add: opens a group, 2 - 0 = 2. relu: 1 < 2, 0. mul: 3 - 2 = 1 (group max 3).
    # gemm: closes the group, 5. norm: new group, 4. add: 4 - 4 = 0.  Sum 10 + 2 + 0 + 1 + 5 + 4 + 0 = 22 of 29.
    per_op = [10.0, 2.0, 1.0, 3.0, 5.0, 4.0, 4.0]
    fusible = [False, True, True, True, False, True, True]
    assert fused_seconds(per_op, fusible) == [10.0, 2.0, 0.0, 1.0, 5.0, 4.0, 0.0]
    assert sum(fused_seconds(per_op, fusible)) == 22.0


def test_fuse_step_reports_what_the_group_saved() -> None:
    # group max 2: an op of 1 is charged 0 and saves 1; an op of 3 is charged 1, saves 2 (the old max), max -> 3
    assert fuse_step(2.0, 1.0, True) == (0.0, 1.0, 2.0)
    assert fuse_step(2.0, 3.0, True) == (1.0, 2.0, 3.0)
    assert fuse_step(2.0, 3.0, False) == (3.0, 0.0, 0.0)


def test_fusion_groups_charge_a_forward_as_fused_seconds_does() -> None:
    per_op = [10.0, 2.0, 1.0, 3.0, 5.0, 4.0, 4.0]
    fusible = [False, True, True, True, False, True, True]
    groups = FusionGroups()
    groups.start(True)
    charged = [groups.adjust(s, f) for s, f in zip(per_op, fusible, strict=True)]
    assert charged == fused_seconds(per_op, fusible)
    # saved: relu 1 + mul 2 (old max) + add 4 = 7 = 29 - 22; fused ops: relu, mul, add (a group was open) = 3
    assert groups.saved_s == pytest.approx(7.0)
    assert groups.fused_ops == 3
