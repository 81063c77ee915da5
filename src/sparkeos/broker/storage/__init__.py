"""Storage: partition logs, segments, producer state and topic metadata; no networking here."""
