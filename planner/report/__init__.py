"""`moeplan report`: one self-contained HTML page of a config's verdict, layout, memory,
communication and step time (page.py assembles it, charts.py draws it with matplotlib)."""
