"""Launch the inference server (lab stand-in): ``python -m sglang.launch_server --model-path M ...``."""

import sys

from sglang._atlas_standin.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
