"""The ML library: targets, the DFlash drafter, data generation, training, speculative decoding,
validation and export. Usable without the service; never imports FastAPI, Celery or SQLAlchemy."""
