"""Pure detectors over training series (loss, loss scale, step time, progress heartbeats) and
the parser of the numbers training jobs print: one implementation shared by the training SDK
(denpex.sdk) and the log scanner (denpex.lite).

It never imports torch or numpy, never reads a clock it was not given, never does I/O beyond
its own thresholds file: callers feed numbers and receive Findings or Evidence.
"""
