"""`moeplan search`: the space of layouts and knobs, how each is judged, the branch and bound, and
the run that ties them together."""
