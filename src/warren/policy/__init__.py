"""What a sandbox may see and do: the spec a user writes (``spec``), config files
(``config``), tool presets (``presets``), and the validated ``Policy`` resolved for
one caller (``resolve.build``)."""

from .model import Policy, Root
from .resolve import build
from .spec import PolicySpec

__all__ = ["Policy", "PolicySpec", "Root", "build"]
