"""The single broker leads every partition at epoch 0, forever."""

from __future__ import annotations

from .errors import FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH

LEADER_EPOCH = 0


def leader_epoch_error(current_leader_epoch: int | None) -> int:
    """The error for a client's view of the leader epoch (-1 means it does not know one)."""
    if current_leader_epoch is None or current_leader_epoch < 0 or current_leader_epoch == LEADER_EPOCH:
        return 0
    return UNKNOWN_LEADER_EPOCH if current_leader_epoch > LEADER_EPOCH else FENCED_LEADER_EPOCH
