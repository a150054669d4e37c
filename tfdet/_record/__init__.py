"""Recording and comparing bits: value bits and weight fingerprints, trace
files, the comparison of two traces, and the Keras callback that records and
compares live.
"""
