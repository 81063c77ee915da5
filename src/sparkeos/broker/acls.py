"""ACLs and the authorizer (Kafka's StandardAuthorizer, simplified): who may do what to which resource.

An ACL binds a resource pattern (a type; a name, literal or a prefix; `*` for every name) to an entry (a
principal such as `User:alice` or `User:*`, a host or `*`, an operation, ALLOW or DENY). A request is allowed when
the authorizer is off (the default, as a Kafka without `authorizer.class.name`), when its principal is a super user,
or when an ACL allows it and none denies it: with no ACL that allows, it is denied (Kafka's
`allow.everyone.if.no.acl.found=false`; with it true, a resource no ACL names is open to all). Kafka's implied
operations hold: DESCRIBE is allowed by READ, WRITE, DELETE or ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS; ALL allows
every operation.

Stored in the data directory (`acls.json`, replaced atomically), so they survive restarts. Filters (DescribeAcls,
DeleteAcls) match as Kafka's: ANY matches every value of a field, a MATCH pattern every pattern that applies to the
name.

Left out: host names (hosts are matched as the IP addresses clients connect from), and the DNS and `User:*` quirks
of Kafka's older AclAuthorizer.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .storage.files import fsync_directory

ACLS_FILE = "acls.json"

# Resource types, pattern types, operations and permission types: the protocol's numbers.
ANY = 1
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
RESOURCE_TYPES = {TOPIC: "TOPIC", GROUP: "GROUP", CLUSTER: "CLUSTER", TRANSACTIONAL_ID: "TRANSACTIONAL_ID",
                  DELEGATION_TOKEN: "DELEGATION_TOKEN", USER: "USER"}
MATCH, LITERAL, PREFIXED = 2, 3, 4
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS = (
    9, 10, 11, 12, 13, 14)
OPERATIONS = range(ALL, DESCRIBE_TOKENS + 1)
DENY, ALLOW = 2, 3
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
# The operations Kafka defines on each resource type: what a principal may do is reported among them (KIP-430).
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DELETE, DESCRIBE),
    CLUSTER: (CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE),
}
# An operation and the operations whose ALLOW implies it.
IMPLIED_BY = {DESCRIBE: (READ, WRITE, DELETE, ALTER), DESCRIBE_CONFIGS: (ALTER_CONFIGS,)}


class AclError(ValueError):
    """An ACL or filter Kafka refuses (INVALID_REQUEST); the message names the field."""


@dataclass(frozen=True, slots=True)
class Acl:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def validate(self) -> None:
        if self.resource_type not in RESOURCE_TYPES:
            raise AclError(f"Invalid resource type {self.resource_type}")
        if self.pattern_type not in (LITERAL, PREFIXED):
            raise AclError(f"Invalid pattern type {self.pattern_type}: an ACL's is LITERAL or PREFIXED")
        if not self.resource_name:
            raise AclError("Resource name must not be empty")
        if self.resource_type == CLUSTER and (self.resource_name != CLUSTER_NAME or self.pattern_type != LITERAL):
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        if ":" not in self.principal:
            raise AclError(f"Could not parse principal from `{self.principal}` (no colon is present separating the "
                           "principal type from the principal name)")
        if self.operation not in OPERATIONS:
            raise AclError(f"Invalid operation {self.operation}")
        if self.permission_type not in (DENY, ALLOW):
            raise AclError(f"Invalid permission type {self.permission_type}")

    def binds(self, principal: str | None, host: str) -> bool:
        """Whether the entry is about this principal connecting from this host."""
        return self.principal in (principal, "User:*") and self.host in (host, WILDCARD)

    def allows(self, operation: int) -> bool:
        return self.permission_type == ALLOW and self.operation in (operation, ALL, *IMPLIED_BY.get(operation, ()))

    def denies(self, operation: int) -> bool:
        return self.permission_type == DENY and self.operation in (operation, ALL)

    def covers(self, other: Acl) -> bool:
        """Whether every resource `other`'s pattern names is one this pattern names."""
        if self.resource_name == WILDCARD and self.pattern_type == LITERAL:
            return True
        if self.pattern_type == PREFIXED:
            return other.resource_name.startswith(self.resource_name)
        return other.pattern_type == LITERAL and other.resource_name == self.resource_name

    def applies_to(self, resource_type: int, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclFilter:
    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int

    def validate(self) -> None:
        """AclError for a filter Kafka refuses: an UNKNOWN (0) or unknown value in any field."""
        if self.resource_type != ANY and self.resource_type not in RESOURCE_TYPES:
            raise AclError(f"Invalid resource type filter {self.resource_type}")
        if self.pattern_type not in (ANY, MATCH, LITERAL, PREFIXED):
            raise AclError(f"Invalid pattern type filter {self.pattern_type}")
        if self.operation != ANY and self.operation not in OPERATIONS:
            raise AclError(f"Invalid operation filter {self.operation}")
        if self.permission_type not in (ANY, DENY, ALLOW):
            raise AclError(f"Invalid permission type filter {self.permission_type}")

    def matches(self, acl: Acl) -> bool:
        if self.resource_type != ANY and acl.resource_type != self.resource_type:
            return False
        if not self._pattern_matches(acl):
            return False
        return ((self.principal is None or acl.principal == self.principal)
                and (self.host is None or acl.host == self.host)
                and self.operation in (ANY, acl.operation)
                and self.permission_type in (ANY, acl.permission_type))

    def _pattern_matches(self, acl: Acl) -> bool:
        if self.pattern_type == MATCH:
            if self.resource_name is None:
                return True
            return acl.applies_to(acl.resource_type, self.resource_name)
        if self.pattern_type not in (ANY, acl.pattern_type):
            return False
        return self.resource_name is None or acl.resource_name == self.resource_name


class Authorizer:
    def __init__(self, data_dir: Path, enabled: bool, super_users: tuple[str, ...] = (),
                 allow_if_no_acl: bool = False) -> None:
        self.enabled = enabled
        self.allow_if_no_acl = allow_if_no_acl
        self.super_users = frozenset(super_users)
        self.path = Path(data_dir) / ACLS_FILE
        self.acls: list[Acl] = []
        if self.path.exists():
            self.acls = [Acl(**entry) for entry in json.loads(self.path.read_text())["acls"]]

    def authorize(self, principal: str | None, host: str, operation: int, resource_type: int, name: str) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        on_resource = [acl for acl in self.acls if acl.applies_to(resource_type, name)]
        if not on_resource and self.allow_if_no_acl:
            return True
        relevant = [acl for acl in on_resource if acl.binds(principal, host)]
        return not any(acl.denies(operation) for acl in relevant) and any(acl.allows(operation) for acl in relevant)

    def allowed_on_any(self, principal: str | None, host: str, operation: int, resource_type: int) -> bool:
        """Whether an ACL allows `operation` on some resource of the type (Kafka's authorizeByResourceType, as for
        an idempotent producer's WRITE on any topic)."""
        if not self.enabled or principal in self.super_users:
            return True
        entries = [acl for acl in self.acls if acl.resource_type == resource_type and acl.binds(principal, host)]
        denies = [acl for acl in entries if acl.denies(operation)]
        # An ALLOW counts unless a DENY covers the resources it names (Kafka's authorizeByResourceType).
        return any(acl.allows(operation) and not any(deny.covers(acl) for deny in denies) for acl in entries)

    def add(self, acls: list[Acl]) -> None:
        for acl in acls:
            if acl not in self.acls:
                self.acls.append(acl)
        self._save()

    def remove(self, matching: AclFilter) -> list[Acl]:
        removed = [acl for acl in self.acls if matching.matches(acl)]
        if removed:
            self.acls = [acl for acl in self.acls if acl not in removed]
            self._save()
        return removed

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump({"acls": [asdict(acl) for acl in self.acls]}, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
