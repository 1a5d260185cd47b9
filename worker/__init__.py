"""The Celery worker: takes a job id, runs the job's stages with the ML library (`trainer/`) and reports
through the stage-runner API (`domain/runs.py`). The database holds the truth about a job; object
storage holds its files; this package holds no state of its own beyond a local cache."""
