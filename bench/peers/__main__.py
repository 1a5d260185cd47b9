"""`python -m bench.peers`: the peers' comparison (bench/peers/compare.py)."""

import sys

from bench.peers.compare import main

sys.exit(main())
