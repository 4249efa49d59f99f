"""How a task runs and a blob moves: the Runner protocol, Ray, and a pool of this machine's processes."""
