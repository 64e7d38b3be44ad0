import sys

from hydra_hf.cli import main

sys.exit(main())
