"""The run report: what a run built, found cached or failed and why, where the time went, how accurate each precision
is and which engine each GPU of the fleet gets; as one self-contained HTML file and a Markdown job summary.

`record.run_record` turns a finished run into plain JSON (`artifacts/run.json`); `html.render` and `markdown.render`
are pure functions of that JSON, so `trtflow report --from run.json` redraws any earlier run.
"""

from __future__ import annotations

RUN_FILE = "run.json"
REPORT_FILE = "report.html"
FORMAT = 1
