"""What a run serves: models made, trained, copied or downloaded and pinned (``models``, ``training``), and a
container image's digest read from its registry (``registry``)."""
