"""Coordinators (groups, producer ids): broker state machines that know nothing of sockets."""
