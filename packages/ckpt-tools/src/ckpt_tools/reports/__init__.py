"""Read-only reports on a checkpoint: describe (inspect), verify, diff."""
