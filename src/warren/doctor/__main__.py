import sys

from .probe_main import main

sys.exit(main())
