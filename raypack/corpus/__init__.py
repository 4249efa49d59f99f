"""What goes in: the input files listed, cut into work units, each read as documents (a reader a format)."""
