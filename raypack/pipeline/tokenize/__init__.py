"""The tokenize stage: every work unit a task that writes its token file and returns its summary."""
