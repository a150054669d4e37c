"""Recording and comparing bits: value bits and weight fingerprints, trace
files, the comparison of two traces (`_diff`) and of a check's runs
(`_compare`: traces, final weights, predictions), and the Keras callback
that records and compares live.
"""
