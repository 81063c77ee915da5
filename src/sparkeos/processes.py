"""Processes killed as a crash kills them.

A Spark driver is a process tree: the Python driver, its JVM (a child of the Python process), and Python daemons and
workers that the JVM forks; pyspark's daemon moves itself into a process group of its own. A crash kills all of them
at once, so :func:`kill_tree` lists the tree first and then SIGKILLs every process group in it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name in parentheses may contain spaces: the fields after it are fixed.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def command_line(pid: int) -> list[str]:
    """The arguments `pid` was started with ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    table = process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _group, _state) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_tree(pid: int) -> tuple[list[int], set[int]]:
    """`pid` and its descendants, and their process groups (never the caller's own group)."""
    table = process_table()
    pids = [pid, *descendants(pid)]
    return pids, {table[p][1] for p in pids if p in table} - {os.getpgrp()}


def kill_processes(pids: list[int], groups: set[int]) -> None:
    """SIGKILL whole process groups (members forked since they were listed included), then the listed pids."""
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for target in pids:  # processes that share the caller's own group are killed one by one
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and every descendant, all process groups among them included; return the pids."""
    pids, groups = process_tree(pid)
    kill_processes(pids, groups)
    return pids


def live_processes(pids: list[int]) -> list[int]:
    """Those of `pids` that are still alive (zombies count as dead)."""
    table = process_table()
    return [pid for pid in pids if pid in table and table[pid][2] not in ("Z", "X")]
