"""Images: root filesystems a sandbox can run on instead of the host's own root.

``ref`` is the contract between the image store (which builds, imports and keeps
images) and the sandbox side (which mounts one as a copy-on-write root): an image
is a stack of unpacked layer directories plus the runtime settings of its config.
"""
