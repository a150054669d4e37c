"""What a process does to itself: `enable()` (pin, seed, patch) and `tfdet run`'s launch."""
