"""Writing the packs: items moved to the task that writes their output file (or a group packed
alone), then the files written."""
