"""List the ops of TARGET's training step that raise, fall back to the host,
or are nondeterministic on GPU under op determinism.

Traces TARGET's real training step (forward, loss, gradients, optimizer
update, metric updates) on this machine (no GPU needed), walks every op
including nested and gradient functions, and lists each GPU determinism
hazard with the Keras layer, metric or optimizer it comes from and whether a
tfdet patch covers it. By default the trace runs under tfdet.enable(), so it
shows what remains with tfdet's patches. The scan runs on the CPU only: any
GPU is hidden from TensorFlow in the scan process before it starts, so a
refused op is listed rather than raised.

Exit codes: 0 no hazard remains, 1 a hazard remains, 2 bad input, 3 the
training step itself fails or building the TARGET times out.
"""

from __future__ import annotations

import argparse
import os
import warnings

from tfdet._cli import _output, usage_errors, write_json
from tfdet._cli._training_flags import TARGET_HELP
from tfdet._commands import _options
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, RunFailedError, TargetError
from tfdet._runner import _preflight
from tfdet._target import _feeding, _load

_BEHAVIOUR = {
    "raises": "raises on GPU",
    "host_fallback": "falls back to the host on GPU",
    "nondeterministic": "nondeterministic on GPU",
    "xla_compile_error": "fails to compile under XLA",
    "machine_dependent": "bits depend on the CPU model",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", nargs="?", default=None, metavar="TARGET", help=TARGET_HELP
    )
    parser.add_argument(
        "--no-enable",
        action="store_true",
        help="Trace with plain TensorFlow (op determinism on, no tfdet patches).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seed for enable() and data, in [0, 2**32 - 1] (default 0).",
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the report as JSON.")


def _source(finding) -> str:
    kind = finding.kind
    label = f"{kind} {finding.source}"
    if finding.source_type:
        label += f" ({finding.source_type})"
    return label + (", backward pass" if finding.gradient else "")


def _patch_note(finding, enabled: bool) -> str:
    if finding.patch is None:
        return "no tfdet patch"
    if finding.patch_installed:
        return f"tfdet patch {finding.patch} is installed but does not cover this entry point"
    if enabled:
        return (
            f"tfdet patch {finding.patch} exists but tfdet.enable() did not install it: "
            "the hazard table says these versions do not need it (tf_keras patches need "
            "tf_keras installed)"
        )
    return f"covered by tfdet patch {finding.patch} (tfdet.enable() installs it)"


def format_report(report) -> str:
    """Human-readable lines for a `ScanReport`."""
    mode = (
        f"with tfdet.enable() (patches: {', '.join(report.patches) or 'none'})"
        if report.enabled
        else "with plain TensorFlow (--no-enable: op determinism on, no tfdet patches)"
    )
    lines = [
        f"tfdet scan {report.target}: {report.keras}, TensorFlow {report.tensorflow_version}, traced {mode}",
        f"checked {report.ops_checked} ops of {len(report.op_types)} types in the training "
        f"step graph and {report.functions} nested/gradient functions",
        f"op types checked: {', '.join(report.op_types)}",
    ]
    if report.xla_dropped:
        lines.append(
            "XLA: the model asked for jit_compile=True and Keras turned it off "
            "under op determinism; traced for XLA anyway, so the hazards below "
            "marked 'fails to compile under XLA' are why"
        )
    if report.deterministic_ops:
        lines.append(
            "known deterministic on GPU under determinism: "
            + ", ".join(report.deterministic_ops)
        )
    if report.covered:
        lines.append(f"covered by tfdet patches ({len(report.covered)}):")
        for finding in report.covered:
            lines.append(
                f"  {finding.op_type:<28} {_source(finding)}: {_BEHAVIOUR[finding.behaviour]} "
                f"without patch {finding.patch}"
            )
    if report.findings:
        lines.append(f"GPU hazards under op determinism ({len(report.findings)}):")
        for finding in report.findings:
            where = "" if finding.device == "GPU" else f" (on {finding.device} device)"
            lines.append(
                f"  {finding.op_type:<28} {_source(finding)}: "
                f"{_BEHAVIOUR[finding.behaviour]}{where}; {_patch_note(finding, report.enabled)}"
            )
            lines.append(
                f"    {finding.detail} ({finding.upstream}); nodes: {', '.join(finding.nodes)}"
            )
    else:
        lines.append("GPU hazards under op determinism: none")
    return "\n".join(lines)


def _check_seed(seed: int) -> None:
    from tfdet._pin import _settings

    with usage_errors():
        _settings.check_int("seed", seed, 0, _settings.MAX_SEED)


def execute(args: argparse.Namespace) -> int:
    _check_seed(args.seed)  # Before TF starts, with or without --no-enable.
    spec = _load.parse(args.target)  # TargetError (exit 2) before TF starts.
    if not spec.text.startswith("builtin:"):
        # Built once in a child first: a TARGET that calls os._exit or hangs
        # cannot end this process with its own status, or stall it.
        _preflight.preflight(spec, _options.DEFAULT_TIMEOUT)
    if spec.legacy_keras:
        # The CLI process is fresh: tf.keras must resolve to tf_keras before
        # TensorFlow is imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from tfdet._graph import _scan
    from tfdet._pin import _devices

    if not args.no_enable:
        from tfdet._patching import _registry
        from tfdet._setup._enable import enable

        # The patches a GPU run gets: "auto" leaves the CPU-only ones out
        # there (tfdet's kernels would move its products to the CPU).
        on_a_gpu = [
            _registry.AUTO,
            *(_registry.WITHOUT + name for name in _registry.cpu_only_names()),
        ]

        with warnings.catch_warnings():
            # The hash seed orders sets and dicts in training scripts; a
            # trace's op list does not depend on it.
            warnings.filterwarnings(
                "ignore", message="PYTHONHASHSEED", category=UserWarning
            )
            with usage_errors():
                enable(seed=args.seed, patches=on_a_gpu)
    else:
        import tensorflow as tf

        # Plain TensorFlow under determinism: what users see when they turn
        # it on themselves.
        tf.config.experimental.enable_op_determinism()
        tf.random.set_seed(args.seed)
    # On the CPU only: on a GPU the warm-up step would raise at the first op
    # refused under determinism instead of listing it. After enable(), which
    # must come before `import tensorflow` (oneDNN).
    try:
        _devices.hide_gpus()
    except RuntimeError as error:
        raise RunFailedError(str(error)) from error

    from tfdet._child import _xla

    _xla.install()
    with warnings.catch_warnings():
        # The scan says itself what XLA was asked for and what blocks it.
        warnings.filterwarnings("ignore", message=_xla.NOTICE_START)
        warnings.filterwarnings("ignore", message="Model doesn't support `jit_compile")
        built = _load.build(spec.text, seed=args.seed)
    xla_dropped = _xla.facts()["dropped_by_determinism"]
    # Its warm-up step gives a model's own train_step the batch as `fit`
    # would, as `check` does.
    _feeding.feed_as_fit(built.model, spec.text)
    try:
        report = _scan.scan(built, spec.text, xla_dropped=xla_dropped)
    except TargetError:  # Its own train_step cannot take the batch: exit 2.
        raise
    except Exception as error:  # The target's own training step failed.
        raise RunFailedError(
            f"Tracing the training step of TARGET {spec.text!r} failed: {error!r}"
        ) from error
    _output.out(format_report(report))
    write_json(args.json, report.to_dict())
    return EXIT_DIVERGED if report.findings else EXIT_OK
