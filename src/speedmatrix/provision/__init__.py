"""What a run serves: models made, trained, copied or downloaded and pinned (``models``, ``training``), a
container image's digest read from its registry (``registry``), and the offline bundle of the wheels an install
needs, for a host with no package index (``bundle``)."""
