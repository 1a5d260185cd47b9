"""The validation report's renderers and chart assets, read by the trainer's export and the API's dashboard.

- `report.html`: report.html (`render_report_html`), the page `draftsmith export` writes beside report.json;
- `report.engine_figures`: the serving-engine tables of the model card, report.html and bench/engines.py;
- `report/static/`: the chart code (`DraftsmithCharts`), vendored uPlot and the report's JSON Schema
  (validation_report.schema.json), which the dashboard serves under `/assets/shared/` and report.html inlines.

A leaf: it imports only `schemas` (the typed report, schemas/validation_report.py), never torch, the trainer or the
API (tests/test_layout.py), so the API image serves the same charts without the ML stack.
"""
