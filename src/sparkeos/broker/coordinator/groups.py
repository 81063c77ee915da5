"""Group coordinator (Kafka's classic consumer-group protocol) and committed offsets.

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable and back to
PreparingRebalance whenever membership or subscriptions change. JoinGroup and SyncGroup
requests are parked on futures until the rebalance step they wait for completes. Session
and rebalance deadlines run on event-loop timers. Nothing here knows about sockets: the API
modules translate requests into these calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NON_EMPTY_GROUP,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNSTABLE_OFFSET_COMMIT,
)
from .offsets import CommittedOffset, OffsetStore, TopicPartition

log = logging.getLogger("sparkeos.broker.groups")

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)

OFFSET_METADATA_MAX_BYTES = 4096  # offset.metadata.max.bytes
OFFSETS_FILE = "offsets.log"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class JoinResult:
    error: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    # (member id, group instance id, metadata) for the leader; empty for everyone else
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class MemberSummary:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberSummary]


@dataclass(slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = ""
    error: int = NONE


@dataclass(eq=False)
class Member:
    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    deadline: float = 0.0  # event-loop time after which the session has expired
    timer: asyncio.TimerHandle | None = None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def awaiting(self) -> bool:
        return (self.join_future is not None and not self.join_future.done()) or (
            self.sync_future is not None and not self.sync_future.done())


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    state_since_ms: int | None = None  # wall clock; None when loaded at startup (commit times rule)
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, asyncio.TimerHandle | None] = field(default_factory=dict)  # ids handed out by MEMBER_ID_REQUIRED
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    join_timer: asyncio.TimerHandle | None = None
    sync_timer: asyncio.TimerHandle | None = None
    initial_delay: bool = False  # the first rebalance after Empty is held for late joiners
    initial_remaining_ms: int = 0
    new_member_added: bool = False

    def transition(self, state: str) -> None:
        self.state = state
        self.state_since_ms = _now_ms()

    def is_static_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        known = self.static_members.get(instance_id)
        return known is not None and known != member_id

    def supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        common = self.candidate_protocols()
        return any(name in common for name in names)

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        common = set(members[0].protocol_names) if members else set()
        for member in members[1:]:
            common &= set(member.protocol_names)
        return common

    def select_protocol(self) -> str | None:
        """Each member votes for its most preferred protocol that every member supports."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next((name for name in member.protocol_names if name in candidates), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            return None
        return max(votes, key=lambda name: votes[name])

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)


class GroupCoordinator:
    """Every consumer group of this broker and their committed offsets."""

    def __init__(self, directory: Path, config: Any) -> None:
        self.directory = directory
        self.config = config
        directory.mkdir(parents=True, exist_ok=True)
        sync_on_commit = getattr(config, "fsync", "always") == "always"
        self.offsets = OffsetStore(directory / OFFSETS_FILE, sync_on_commit=sync_on_commit)
        self.groups: dict[str, Group] = {}
        for group_id in set(self.offsets.offsets) | set(self.offsets.protocol_types) | set(self.offsets.staged):
            self.groups[group_id] = Group(group_id, protocol_type=self.offsets.protocol_types.get(group_id))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_retention_check_ms = 0

    # -- configuration -----------------------------------------------------------------------

    @property
    def offsets_retention_ms(self) -> int:
        override = getattr(self.config, "offsets_retention_ms", None)
        if override is not None:
            return override
        return self.config.offsets_retention_minutes * 60_000

    @property
    def retention_check_interval_ms(self) -> int:
        return getattr(self.config, "offsets_retention_check_interval_ms", 600_000)

    def _loop_now(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    # -- JoinGroup ---------------------------------------------------------------------------

    async def join_group(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
                         client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int,
                         protocol_type: str, protocols: list[tuple[str, bytes]],
                         require_known_member_id: bool) -> JoinResult:
        self._loop_now()
        if not group_id:
            return JoinResult(INVALID_GROUP_ID, member_id)
        if not (self.config.group_min_session_timeout_ms <= session_timeout_ms
                <= self.config.group_max_session_timeout_ms):
            return JoinResult(INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id, state_since_ms=_now_ms())
        if group.state == DEAD:
            return JoinResult(COORDINATOR_NOT_AVAILABLE, member_id)
        names = [name for name, _ in protocols]
        if not group.supports_protocols(protocol_type, names):
            return JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)
        spec = (client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols)

        if not member_id:
            new_id = f"{instance_id or client_id or 'member'}-{uuid.uuid4()}"
            if instance_id is not None:
                previous = group.static_members.get(instance_id)
                if previous is not None and previous in group.members:
                    # A restarted static member takes over its instance id; the old one is fenced.
                    self._remove_member(group, group.members[previous], FENCED_INSTANCE_ID)
                return await self._add_member_and_rebalance(group, new_id, instance_id, spec)
            if require_known_member_id:
                self._add_pending_member(group, new_id, session_timeout_ms)
                return JoinResult(MEMBER_ID_REQUIRED, new_id)
            return await self._add_member_and_rebalance(group, new_id, None, spec)

        if member_id in group.pending:
            return await self._add_member_and_rebalance(group, member_id, instance_id, spec)
        member = group.members.get(member_id)
        if member is None:
            return JoinResult(UNKNOWN_MEMBER_ID, member_id)
        if group.is_static_fenced(member_id, instance_id):
            return JoinResult(FENCED_INSTANCE_ID, member_id)
        if group.state == PREPARING_REBALANCE:
            return await self._update_member_and_rebalance(group, member, spec)
        if group.state == COMPLETING_REBALANCE:
            if member.protocols == list(protocols):
                # A lost JoinGroup response: answer again with the generation that completed.
                return self._join_result(group, member)
            return await self._update_member_and_rebalance(group, member, spec)
        if group.state == STABLE:
            if member.member_id == group.leader_id or member.protocols != list(protocols):
                # The leader rejoining means it wants a new assignment (e.g. metadata changed).
                return await self._update_member_and_rebalance(group, member, spec)
            self._touch(member)
            return self._join_result(group, member, include_members=False)
        return JoinResult(UNKNOWN_MEMBER_ID, member_id)

    def _join_result(self, group: Group, member: Member, include_members: bool = True) -> JoinResult:
        members = []
        if include_members and member.member_id == group.leader_id:
            members = [(m.member_id, m.instance_id, m.metadata_for(group.protocol_name))
                       for m in group.members.values()]
        return JoinResult(NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name,
                          group.leader_id or "", members)

    def _add_pending_member(self, group: Group, member_id: str, session_timeout_ms: int) -> None:
        assert self._loop is not None
        group.pending[member_id] = self._loop.call_later(
            session_timeout_ms / 1000, self._expire_pending_member, group, member_id)

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if group.pending.pop(member_id, "absent") != "absent":
            log.info("group %s: pending member %s never joined", group.group_id, member_id)
            if group.state == PREPARING_REBALANCE:
                self._try_complete_join(group)

    async def _add_member_and_rebalance(self, group: Group, member_id: str, instance_id: str | None,
                                        spec: tuple) -> JoinResult:
        client_id, client_host, session_ms, rebalance_ms, protocol_type, protocols = spec
        assert self._loop is not None
        timer = group.pending.pop(member_id, None)
        if timer is not None:
            timer.cancel()
        member = Member(group.group_id, member_id, instance_id, client_id, client_host, session_ms, rebalance_ms,
                        protocol_type, list(protocols))
        member.join_future = self._loop.create_future()
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = member
        if instance_id is not None:
            group.static_members[instance_id] = member_id
        if group.leader_id is None:
            group.leader_id = member_id
        if group.state == PREPARING_REBALANCE and group.initial_delay:
            group.new_member_added = True
        self._touch(member)
        future = member.join_future
        self._rebalance_for(group, f"member {member_id} joined")
        return await asyncio.shield(future)

    async def _update_member_and_rebalance(self, group: Group, member: Member, spec: tuple) -> JoinResult:
        _client_id, _host, session_ms, rebalance_ms, _type, protocols = spec
        assert self._loop is not None
        member.protocols = list(protocols)
        member.session_timeout_ms = session_ms
        member.rebalance_timeout_ms = rebalance_ms
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(JoinResult(REBALANCE_IN_PROGRESS, member.member_id))
        member.join_future = self._loop.create_future()
        self._touch(member)
        future = member.join_future
        self._rebalance_for(group, f"member {member.member_id} rejoined")
        return await asyncio.shield(future)

    def _rebalance_for(self, group: Group, reason: str) -> None:
        if group.state in (EMPTY, STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        elif group.state == PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        assert self._loop is not None
        log.info("group %s: preparing rebalance (generation %d): %s", group.group_id, group.generation_id, reason)
        if group.state == COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                if member.sync_future is not None and not member.sync_future.done():
                    member.sync_future.set_result(SyncResult(REBALANCE_IN_PROGRESS))
                member.sync_future = None
        self._cancel_timer(group, "sync_timer")
        self._cancel_timer(group, "join_timer")
        was_empty = group.state == EMPTY
        group.transition(PREPARING_REBALANCE)
        rebalance_ms = group.rebalance_timeout_ms()
        delay_ms = self.config.group_initial_rebalance_delay_ms
        if was_empty and delay_ms > 0:
            group.initial_delay = True
            group.new_member_added = False
            group.initial_remaining_ms = max(rebalance_ms - delay_ms, 0)
            group.join_timer = self._loop.call_later(delay_ms / 1000, self._on_initial_delay, group)
        else:
            group.initial_delay = False
            group.join_timer = self._loop.call_later(rebalance_ms / 1000, self._complete_join, group)
            self._try_complete_join(group)

    def _on_initial_delay(self, group: Group) -> None:
        assert self._loop is not None
        group.join_timer = None
        if group.state != PREPARING_REBALANCE:
            return
        delay_ms = self.config.group_initial_rebalance_delay_ms
        if group.new_member_added and group.initial_remaining_ms > 0:
            # Members are still arriving: wait another delay, bounded by the rebalance timeout.
            group.new_member_added = False
            wait_ms = min(delay_ms, group.initial_remaining_ms)
            group.initial_remaining_ms = max(group.initial_remaining_ms - delay_ms, 0)
            group.join_timer = self._loop.call_later(wait_ms / 1000, self._on_initial_delay, group)
            return
        group.initial_delay = False
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE or group.initial_delay:
            return
        if group.pending:
            return
        if all(m.join_future is not None and not m.join_future.done() for m in group.members.values()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE:
            return
        self._cancel_timer(group, "join_timer")
        group.initial_delay = False
        for member in list(group.members.values()):
            if member.join_future is None or member.join_future.done():
                log.info("group %s: member %s did not rejoin in time", group.group_id, member.member_id)
                self._remove_member(group, member, UNKNOWN_MEMBER_ID)
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.transition(EMPTY)
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(COMPLETING_REBALANCE)
        log.info("group %s: generation %d with %d members, protocol %s", group.group_id, group.generation_id,
                 len(group.members), group.protocol_name)
        for member in group.members.values():
            future = member.join_future
            member.join_future = None
            self._touch(member)
            if future is not None and not future.done():
                future.set_result(self._join_result(group, member))
        assert self._loop is not None
        # Members that never send SyncGroup (a crashed leader above all) must not stall the group.
        group.sync_timer = self._loop.call_later(group.rebalance_timeout_ms() / 1000, self._expire_pending_sync,
                                                 group, group.generation_id)

    def _expire_pending_sync(self, group: Group, generation_id: int) -> None:
        group.sync_timer = None
        if group.state != COMPLETING_REBALANCE or group.generation_id != generation_id:
            return
        for member in list(group.members.values()):
            if member.sync_future is None:
                log.info("group %s: member %s did not sync in time", group.group_id, member.member_id)
                self._remove_member(group, member, UNKNOWN_MEMBER_ID)
        self._prepare_rebalance(group, "members did not sync in time")

    # -- sessions ----------------------------------------------------------------------------

    def _touch(self, member: Member) -> None:
        """Restart the member's session; one timer per member is re-armed lazily when it fires."""
        assert self._loop is not None
        member.deadline = self._loop.time() + member.session_timeout_ms / 1000
        if member.timer is None:
            member.timer = self._loop.call_at(member.deadline, self._check_session, member)

    def _check_session(self, member: Member) -> None:
        assert self._loop is not None
        member.timer = None
        group = self._group_of(member)
        if group is None:
            return
        now = self._loop.time()
        if member.awaiting():
            # Parked in JoinGroup/SyncGroup: the rebalance deadlines govern, not the session.
            member.deadline = now + member.session_timeout_ms / 1000
        if now < member.deadline:
            member.timer = self._loop.call_at(member.deadline, self._check_session, member)
            return
        log.info("group %s: session of member %s expired", group.group_id, member.member_id)
        self._remove_member_and_rebalance(group, member, f"session of {member.member_id} expired")

    def _group_of(self, member: Member) -> Group | None:
        group = self.groups.get(member.group_id)
        if group is not None and group.members.get(member.member_id) is member:
            return group
        return None

    def _remove_member(self, group: Group, member: Member, error: int) -> None:
        group.members.pop(member.member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        if member.timer is not None:
            member.timer.cancel()
            member.timer = None
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(JoinResult(error, member.member_id))
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result(SyncResult(error))
        member.join_future = member.sync_future = None
        if group.leader_id == member.member_id:
            rejoined = [m for m in group.members.values() if m.join_future is not None]
            group.leader_id = (rejoined[0].member_id if rejoined
                               else next(iter(group.members), None))

    def _remove_member_and_rebalance(self, group: Group, member: Member, reason: str) -> None:
        self._remove_member(group, member, UNKNOWN_MEMBER_ID)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        elif group.state == PREPARING_REBALANCE:
            self._try_complete_join(group)

    @staticmethod
    def _cancel_timer(group: Group, name: str) -> None:
        timer = getattr(group, name)
        if timer is not None:
            timer.cancel()
            setattr(group, name, None)

    # -- SyncGroup / Heartbeat / LeaveGroup --------------------------------------------------

    async def sync_group(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                         protocol_type: str | None, protocol_name: str | None,
                         assignments: dict[str, bytes]) -> SyncResult:
        self._loop_now()
        if not group_id:
            return SyncResult(INVALID_GROUP_ID)
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(UNKNOWN_MEMBER_ID)
        if group.state == DEAD:
            return SyncResult(COORDINATOR_NOT_AVAILABLE)
        if group.is_static_fenced(member_id, instance_id):
            return SyncResult(FENCED_INSTANCE_ID)
        member = group.members.get(member_id)
        if member is None:
            return SyncResult(UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return SyncResult(ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return SyncResult(INCONSISTENT_GROUP_PROTOCOL)
        if group.state == PREPARING_REBALANCE:
            return SyncResult(REBALANCE_IN_PROGRESS)
        self._touch(member)
        if group.state == STABLE:
            return SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment)
        # CompletingRebalance: park until the leader's assignment arrives.
        assert self._loop is not None
        if member.sync_future is not None and not member.sync_future.done():
            member.sync_future.set_result(SyncResult(REBALANCE_IN_PROGRESS))
        future = member.sync_future = self._loop.create_future()
        if member_id == group.leader_id:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            self._cancel_timer(group, "sync_timer")
            group.transition(STABLE)
            log.info("group %s: generation %d is stable", group.group_id, group.generation_id)
            for other in group.members.values():
                waiting = other.sync_future
                other.sync_future = None
                if waiting is not None and not waiting.done():
                    waiting.set_result(SyncResult(NONE, group.protocol_type, group.protocol_name, other.assignment))
        return await asyncio.shield(future)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> int:
        self._loop_now()
        if not group_id:
            return INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if group.is_static_fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        self._touch(member)
        if group.state == PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """Remove members; returns a group-level error and one error per leaving member."""
        self._loop_now()
        if not group_id:
            return INVALID_GROUP_ID, [INVALID_GROUP_ID] * len(leaving)
        group = self.groups.get(group_id)
        if group is None:
            return NONE, [UNKNOWN_MEMBER_ID] * len(leaving)
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE, []
        errors = []
        for member_id, instance_id in leaving:
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    errors.append(UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    errors.append(FENCED_INSTANCE_ID)
                    continue
                member_id = known
            if member_id in group.pending:
                timer = group.pending.pop(member_id)
                if timer is not None:
                    timer.cancel()
                errors.append(NONE)
                self._try_complete_join(group)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(UNKNOWN_MEMBER_ID)
                continue
            log.info("group %s: member %s left", group.group_id, member_id)
            self._remove_member_and_rebalance(group, member, f"member {member_id} left")
            errors.append(NONE)
        return NONE, errors

    # -- offsets -----------------------------------------------------------------------------

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               instance_id: str | None) -> int:
        group = self.groups.get(group_id)
        if group is None:
            # Unknown group: a standalone consumer (generation -1) may commit; a member of an
            # older incarnation of the group may not.
            return NONE if generation_id < 0 else ILLEGAL_GENERATION
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation_id >= 0 or member_id or instance_id is not None:
            if group.is_static_fenced(member_id, instance_id):
                return FENCED_INSTANCE_ID
            if member_id not in group.members:
                return UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return ILLEGAL_GENERATION
            if group.state == COMPLETING_REBALANCE:
                return REBALANCE_IN_PROGRESS
            return NONE
        if group.members:
            # Standalone commits would race with the group's own members.
            return UNKNOWN_MEMBER_ID
        return NONE

    async def commit_member_offsets(self, group_id: str, generation_id: int, member_id: str,
                                    instance_id: str | None,
                                    offsets: dict[TopicPartition, tuple[int, str | None, int]]) -> int:
        """OffsetCommit: validate the committer against the group, then commit durably."""
        if self._loop is None:
            self._loop_now()
        error = self.validate_offset_commit(group_id, generation_id, member_id, instance_id)
        if error:
            return error
        group = self.groups.get(group_id)
        if group is not None and member_id in group.members:
            self._touch(group.members[member_id])
        if offsets:
            await self.commit_offsets(group_id, offsets)
        return NONE

    async def commit_offsets(self, group_id: str, offsets: dict[TopicPartition, tuple[int, str | None, int]]) -> None:
        """Make offsets ({(topic, partition): (offset, metadata, leader_epoch)}) visible and durable.

        The one path by which offsets become committed; transactional offsets are published
        through it when their transaction commits.
        """
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, state_since_ms=_now_ms())
        await self.offsets.commit(group_id, offsets, _now_ms(), group.protocol_type)

    def has_pending_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        """Whether an open transaction has staged an offset for this group-partition."""
        return self.offsets.has_staged(group_id, topic, partition)

    # -- transactional offsets ---------------------------------------------------------------

    def validate_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                                   instance_id: str | None) -> int:
        """TxnOffsetCommit v3+ group checks; older versions send no member and pass."""
        group = self.groups.get(group_id)
        if group is None:
            return NONE
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if group.is_static_fenced(member_id, instance_id):
            return FENCED_INSTANCE_ID
        if member_id and member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation_id >= 0 and generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        return NONE

    async def stage_transactional_offsets(self, group_id: str, producer_id: int,
                                          offsets: dict[TopicPartition, tuple[int, str | None, int]]) -> None:
        """TxnOffsetCommit: stage durably; published by `complete_transaction(..., commit=True)`."""
        if group_id not in self.groups:
            self.groups[group_id] = Group(group_id, state_since_ms=_now_ms())
        await self.offsets.stage(group_id, producer_id, offsets, _now_ms())

    def complete_transaction(self, group_id: str, producer_id: int, commit: bool) -> None:
        """The transaction of `producer_id` ended: publish or drop its staged offsets (durably)."""
        self.offsets.complete(group_id, producer_id, commit)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False) -> list[FetchedOffset]:
        """Committed offsets; every committed partition of the group when `partitions` is None."""
        committed = self.offsets.group_offsets(group_id)
        wanted = sorted(committed) if partitions is None else partitions
        result = []
        for topic, partition in wanted:
            if require_stable and self.has_pending_offsets(group_id, topic, partition):
                result.append(FetchedOffset(topic, partition, error=UNSTABLE_OFFSET_COMMIT))
                continue
            found: CommittedOffset | None = committed.get((topic, partition))
            if found is None:
                result.append(FetchedOffset(topic, partition))
            else:
                result.append(FetchedOffset(topic, partition, found.offset, found.leader_epoch, found.metadata))
        return result

    # -- DescribeGroups / ListGroups ---------------------------------------------------------

    def describe_group(self, group_id: str) -> GroupSummary:
        group = self.groups.get(group_id)
        if group is None:
            return GroupSummary(group_id, DEAD, "", "", [])
        stable = group.state == STABLE
        members = [
            MemberSummary(m.member_id, m.instance_id, m.client_id, m.client_host,
                          m.metadata_for(group.protocol_name) if stable else b"",
                          m.assignment if stable else b"")
            for m in group.members.values()
        ]
        return GroupSummary(group_id, group.state, group.protocol_type or "",
                            (group.protocol_name or "") if stable else "", members)

    def list_groups(self, states: list[str] | None = None) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every live group, optionally filtered by state."""
        wanted = {s.lower() for s in states} if states else None
        return [(g.group_id, g.protocol_type or "", g.state) for g in self.groups.values()
                if g.state != DEAD and (wanted is None or g.state.lower() in wanted)]

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups: forget an empty group and its committed offsets; Kafka's error code otherwise."""
        group = self.groups.get(group_id)
        has_offsets = bool(self.offsets.group_offsets(group_id))
        if (group is None or group.state == DEAD) and not has_offsets:
            return GROUP_ID_NOT_FOUND
        if group is not None and (group.members or group.state not in (EMPTY, DEAD)):
            return NON_EMPTY_GROUP
        if group is not None:
            group.state = DEAD
            del self.groups[group_id]
        self.offsets.delete(group_id, None)
        self.offsets.sync_now()
        log.info("group %s deleted", group_id)
        return 0

    # -- housekeeping ------------------------------------------------------------------------

    def expire(self, now_ms: int) -> None:
        """Called about once a second: offsets retention, compaction, interval-mode fsync."""
        if now_ms >= self._next_retention_check_ms:
            self._next_retention_check_ms = now_ms + self.retention_check_interval_ms
            self.expire_offsets(now_ms)
        self.offsets.maybe_compact()
        if not self.offsets.sync_on_commit:
            self.offsets.sync_now()

    def expire_offsets(self, now_ms: int) -> None:
        """Kafka 2.1+ retention: offsets go once their group has been Empty for the retention
        period counted from the later of the last commit and the moment the group emptied."""
        retention_ms = self.offsets_retention_ms
        for group_id, group in list(self.groups.items()):
            if group.state != EMPTY or group.members:
                continue
            committed = self.offsets.group_offsets(group_id)
            expired = [
                tp for tp, c in committed.items()
                if now_ms - max(c.commit_timestamp_ms, group.state_since_ms or 0) >= retention_ms
                and not self.has_pending_offsets(group_id, *tp)
            ]
            if expired and len(expired) == len(committed):
                log.info("group %s: all %d committed offsets expired", group_id, len(expired))
                self.offsets.delete(group_id, None)
            elif expired:
                log.info("group %s: %d committed offsets expired", group_id, len(expired))
                self.offsets.delete(group_id, expired)
            if not self.offsets.group_offsets(group_id) and not group.pending and group_id not in self.offsets.staged:
                group.state = DEAD
                del self.groups[group_id]
                if self.offsets.protocol_types.get(group_id) is not None:
                    self.offsets.delete(group_id, None)

    def close(self) -> None:
        for group in self.groups.values():
            self._cancel_timer(group, "join_timer")
            self._cancel_timer(group, "sync_timer")
            for member in group.members.values():
                if member.timer is not None:
                    member.timer.cancel()
                    member.timer = None
        self.offsets.close()
