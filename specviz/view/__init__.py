"""What a front end shows, computed without any front end: token HTML (``tokens``), plotly
figures (``charts``), summaries and status lines (``text``), and the stream of named frames a
page renders while a run goes on (``frames``). Nothing here imports gradio."""
