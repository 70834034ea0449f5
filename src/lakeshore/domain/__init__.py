"""Pure types and rules: no I/O, no clock reads. Everything above this layer acts on them."""
