"""Our drafters against the open-source trainers that ship DFlash (SpecForge, vLLM `speculators`, NeMo Automodel,
NVIDIA ModelOpt): `python -m bench.peers ...` runs `compare.py` (the rows and the tables, docs/PEERS.md).

- `compare.py`: the rows, the budgets, the tables; `peer_run.py`: what every peer is given and gives back
  (`PeerRow`, `OUR_SCHEDULE`, the measured process); `reference_decode.py`: a drafter judged by the reference
  `dflash` package's own decoder.
- `<peer>_peer.py`: one peer driven from our side (its data format, its config, its run), imported by compare.py.
- `<peer>_launch.py`, `<peer>_parent.py`: executed by path with the peer venv's python (`bash bench/setup/<peer>.sh`),
  never imported by the project: a launcher runs the peer's own entry point with CPU overrides (tests/bench/
  test_launch_overrides.py holds each override to the function it replaces), a parent script writes drafters with
  the peer's own code for trainer/drafter/formats.py to read.
"""
