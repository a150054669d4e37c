"""The environment variables tfdet defines, every one stated here.

TensorFlow's and Python's own variables that decide the bits (`TF_*`,
`ONEDNN_MAX_CPU_ISA`, `XLA_FLAGS`, `PYTHONHASHSEED`, ...) are listed in
`tfdet._pin._environment`; these are tfdet's, read by its own processes.
"""

# "1": show TensorFlow's C++ start-up notices (`tfdet --verbose`), which
# tfdet hides by default; set for the script `tfdet --verbose run` starts.
VERBOSE = "TFDET_VERBOSE"

# In a run started on an emulated CPU (`--perturb emulated_cpu`): the CPU
# model QEMU was given.
EMULATED_CPU = "TFDET_EMULATED_CPU"

# In a run of the `caches` perturbation: the JSON of the cache geometry the
# run imitates in Eigen's and oneDNN's CPUID results.
IMITATE_CACHES = "TFDET_IMITATE_CACHES"

# The `batch` perturbation: how a TARGET run predicts its inputs after
# training ("whole": one batch, in order; "split": another order, batches of
# 1, 5 and 32 in turn).
PREDICT = "TFDET_PREDICT"

# The `interrupt` perturbation: the steps after which the first process is
# killed, and, in the process that resumes it, the steps it had done.
INTERRUPT_AFTER = "TFDET_INTERRUPT_AFTER"
RESUMED_AFTER = "TFDET_RESUMED_AFTER"
