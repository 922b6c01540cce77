"""One construct per component; the stacks wire them together and grant access."""
