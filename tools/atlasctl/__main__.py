import sys

from atlasctl.cli import main

sys.exit(main())
