import sys

from atlaslab.cli import main

sys.exit(main())
