import sys

from asrkit.cli import main

sys.exit(main())
