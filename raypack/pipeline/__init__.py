"""The distributed job, stage by stage: read → tokenize → histogram → plan → assign → materialize →
write. Only job.py wires Ray Data together; the other modules are plain functions and callable classes
that work on one shard or one output file."""
