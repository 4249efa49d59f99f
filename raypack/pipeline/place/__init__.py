"""Placing documents into packs: the length histogram, the mixture's selection, the plan, and
every item's pack."""
