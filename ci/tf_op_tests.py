"""TensorFlow's own op tests, run without tfdet and with `tfdet.enable()`.

    python ci/tf_op_tests.py [--tests-dir DIR] [--module NAME[=EXPR]]...
                             [--one-process] [--json FILE] [--timeout S]

runs each chosen module of TensorFlow's op tests
(`tensorflow/python/kernel_tests/`, `tf.test.TestCase` classes) under pytest
twice, each in a fresh process: once plain, once with `tfdet.enable()` (its
default patches, tfdet's fixed-order kernels among them) called at pytest's
configure time, before TensorFlow runs an op. It prints, per module, the
passed/failed/skipped counts of both runs, the kernels the tfdet run had
(`tfdet.profile().kernels`), and every test that passes without tfdet and
fails with it; the last line is the same as JSON. Exit status: 0 when no such
test is left outside `KNOWN_DIFFERENCES`, 1 otherwise, 2 when a run did not
complete (its pytest crashed or timed out) or the tfdet run lacked a kernel
that `EXPECTED_KERNELS` names.

`NAME=EXPR` runs only the tests of NAME that pytest's `-k EXPR` selects
(`--module einsum=Broadcasting`); without `--module`, every module in
`MODULES` runs whole (about 10 minutes on 2 busy cores; matmul is ~3,900
generated tests, conv ~340).

Where the tests come from: TensorFlow's pip wheel ships only a few of them
(the bases in `nn_ops/`): the modules `depthwise_conv`, `bias_add` and
`xent` here run a base's tests as they are (upstream's
depthwise_conv_op_test.py is that alias; its bias and xent test files add
tests of their own, not run here), and need nothing else. The others are read from `--tests-dir` (default
`$TFDET_TF_OP_TESTS`, else `~/.cache/tfdet/tf_op_tests`), laid out as
TensorFlow's `tensorflow/python/kernel_tests/` (`math_ops/matmul_op_test.py`,
...): copy them there from a TensorFlow checkout of the installed release.
They are not kept in this repository (their code is TensorFlow's). A module
whose file is missing is reported as missing and does not fail the run.

Each file is copied into a temporary directory and its
`if __name__ == "__main__":` block (where matmul, batch_matmul and conv add
their generated tests) runs at import, with `tf.test.main()` a no-op. GPU-only
tests skip themselves on a CPU machine; benchmark classes
(`tf.test.Benchmark`) are not test cases and are not collected.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
TESTS_DIR_VARIABLE = "TFDET_TF_OP_TESTS"
DEFAULT_TESTS_DIR = Path.home() / ".cache" / "tfdet" / "tf_op_tests"


class Module(NamedTuple):
    """One TensorFlow test module.

    Attributes:
        path: Its file under `kernel_tests/` (the tests directory), or None
            where `source` is written here.
        source: The module's text, where it is a wrapper of a base that the
            wheel ships (as upstream's own `depthwise_conv_op_test.py` is).
        keyword: A pytest `-k` expression that every run of it applies (the
            part of the module this harness is about).
    """

    path: str | None = None
    source: str | None = None
    keyword: str | None = None


MODULES = {
    "matmul": Module("math_ops/matmul_op_test.py"),
    "batch_matmul": Module("math_ops/batch_matmul_op_test.py"),
    "einsum": Module("linalg/einsum_op_test.py"),
    "add_n": Module("math_ops/aggregate_ops_test.py"),
    "conv": Module("nn_ops/conv_ops_test.py"),
    # Upstream's depthwise_conv_op_test.py is this alias of the base class,
    # which the wheel ships: it runs wherever TensorFlow is installed.
    "depthwise_conv": Module(
        source=(
            "from tensorflow.python.kernel_tests.nn_ops import "
            "depthwise_conv_op_base\n\n"
            "DepthwiseConv2DTest = depthwise_conv_op_base.DepthwiseConv2DBase\n"
        )
    ),
    # The wheel's other bases, as upstream's bias_op_test.py and
    # xent_op_test.py run them: BiasAddGrad (pool_size_free_products) and
    # the softmax cross-entropy beside the portable softmax.
    "bias_add": Module(
        source=(
            "from tensorflow.python.kernel_tests.nn_ops import bias_op_base\n\n"
            "BiasAddTest = bias_op_base.BiasAddTestBase\n"
        )
    ),
    "xent": Module(
        source=(
            "from tensorflow.python.kernel_tests.nn_ops import xent_op_test_base\n\n"
            "XentOpTest = xent_op_test_base.XentOpTestBase\n"
        )
    ),
    # The float unary functions (the portable kernels' ops): testFloat*,
    # and testBFloat16Basic, which -k's substring match takes too.
    "unary": Module("math_ops/cwise_ops_unary_test.py", keyword="Float"),
    # The sums (fixed_order_sums: Sum and Mean, their axes and keepdims).
    "reduction": Module(
        "math_ops/reduction_ops_test.py",
        keyword="SumReduction or MeanReduction or UnknownShape or InvalidKeepdims",
    ),
    # Softmax and log-softmax (portable_softmax, portable_log_softmax).
    "softmax": Module("nn_ops/softmax_op_test.py"),
    # Pow (portable_math) and the float binary functions beside it.
    "binary": Module(
        "math_ops/cwise_ops_binary_test.py", keyword="BinaryOpTest and (Float or Pow)"
    ),
}

# The kernels a tfdet run must have loaded (`tfdet.profile().kernels`): a
# run whose kernels fell back to the compositions would test those instead.
EXPECTED_KERNELS = (
    "fixed_order_products",
    "fixed_order_convolutions",
    "fixed_order_sums",
    "portable_math",
)

# Tests that pass without tfdet and fail with it, accepted: "module::Class::
# test" -> why. The patches' differences were fixed; these two are
# TensorFlow's own op determinism, which enable() turns on.
_DETERMINISTIC_XENT = (
    "enable() turns on TensorFlow's op determinism, under which TensorFlow "
    "computes the softmax cross-entropy by its deterministic composition, "
    "whose gradient differs where the labels are no probability distribution; "
    "TensorFlow's own xent_op_deterministic_test.py overrides this test with "
    "that gradient"
)
KNOWN_DIFFERENCES: dict[str, str] = {
    "xent::XentOpTest::testSingleClass": _DETERMINISTIC_XENT,
    "xent::XentOpTest::testLabelsBroadcast": _DETERMINISTIC_XENT,
}

# pytest's plugin for both runs (`-p tf_op_tests_plugin`), written beside
# the copied module. It runs before the module is imported.
PLUGIN = textwrap.dedent(
    """
    import json
    import os


    def pytest_configure(config):
        if os.environ.get("TF_OP_TESTS_TFDET") == "1":
            import tfdet

            tfdet.enable()
            profile = tfdet.profile()
            record = {"kernels": list(profile.kernels),
                      "patches": list(profile.patches)}
            with open(os.environ["TF_OP_TESTS_PROFILE"], "w") as out:
                json.dump(record, out)
        # tf.test.TestCase reads absl flags (its temporary directory);
        # pytest parses no absl command line.
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        # The modules' `__main__` blocks run at import and end in
        # tf.test.main(), which would run the tests itself.
        from tensorflow.python.platform import googletest, test

        test.main = googletest.main = lambda *args, **kwargs: None
    """
)


def _module_text(module: Module, tests_dir: Path) -> str | None:
    """The module's source with its `__main__` block run at import, or None
    where its file is not there."""
    if module.source is not None:
        return module.source
    assert module.path is not None
    for root in (_wheel_kernel_tests(), tests_dir):
        if root is not None and (root / module.path).is_file():
            text = (root / module.path).read_text()
            break
    else:
        return None
    return text.replace(
        'if __name__ == "__main__":',
        "if True:  # tf_op_tests: the generated tests are added at import",
    )


def _wheel_kernel_tests() -> Path | None:
    """The installed TensorFlow's `python/kernel_tests/` (a few files only)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "python" / "kernel_tests"


def _outcomes(junit: Path, stems: dict[str, str]) -> dict[str, dict[str, str]]:
    """Module name -> 'Class::test' -> passed, failed or skipped, from
    pytest's JUnit XML (`stems`: each copied file's stem -> its module)."""
    outcomes: dict[str, dict[str, str]] = {name: {} for name in stems.values()}
    for case in ElementTree.parse(junit).iter("testcase"):
        stem, _, test_class = case.get("classname", "").rpartition(".")
        if stem not in stems:  # A collection error: the file's own name.
            stem, test_class = test_class, "(collection)"
        module = outcomes.setdefault(stems.get(stem, stem), {})
        name = f"{test_class}::{case.get('name')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test listed twice (a subtest's failure, a teardown's error): the
        # worse outcome stays.
        if module.get(name) != "failed":
            module[name] = outcome
    return outcomes


def _stem(name: str) -> str:
    """The copied file's stem for module `name`: one no other stem contains,
    so that pytest's -k selects by it (`tf_matmul_test`, `tf_batch_matmul_test`)."""
    return f"tf_{name}_test"


def run_modules(
    texts: dict[str, str], keywords: dict[str, str | None], tfdet: bool, timeout: float
) -> dict:
    """One pytest run of the modules' texts, in a fresh process; their
    outcomes (and, with tfdet, its profile's kernels and patches)."""
    with tempfile.TemporaryDirectory(prefix="tf-op-tests-") as scratch:
        work = Path(scratch)
        for name, text in texts.items():
            (work / f"{_stem(name)}.py").write_text(text)
        (work / "tf_op_tests_plugin.py").write_text(PLUGIN)
        (work / "pytest.ini").write_text("[pytest]\naddopts =\n")
        junit, profile = work / "junit.xml", work / "profile.json"
        env = {
            **os.environ,
            "TF_OP_TESTS_TFDET": "1" if tfdet else "0",
            "TF_OP_TESTS_PROFILE": str(profile),
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(work), str(REPO), os.environ.get("PYTHONPATH")])
            ),
        }
        command = [
            sys.executable, "-m", "pytest", *(f"{_stem(n)}.py" for n in texts),
            "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p",
            "tf_op_tests_plugin", "-c", "pytest.ini", "--rootdir", str(work),
            "--junitxml", str(junit), "-o", "junit_family=xunit1",
        ]  # fmt: skip
        selections = []
        for name in texts:
            parts = [_stem(name), MODULES[name].keyword, keywords.get(name)]
            selections.append(" and ".join(f"({part})" for part in parts if part))
        command += ["-k", " or ".join(f"({s})" for s in selections)]
        try:
            done = subprocess.run(
                command,
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"complete": False, "why": f"timed out after {timeout:.0f} s"}
        # 0: all passed, 1: some failed, 5: none selected.
        if done.returncode not in (0, 1, 5) or (
            done.returncode != 5 and not junit.exists()
        ):
            tail = (done.stdout + done.stderr)[-3000:]
            return {
                "complete": False,
                "why": f"pytest exited {done.returncode}: {tail}",
            }
        stems = {_stem(name): name for name in texts}
        outcomes = _outcomes(junit, stems) if junit.exists() else {}
        result = {"complete": True, "outcomes": outcomes}
        if tfdet:
            result["profile"] = (
                json.loads(profile.read_text()) if profile.exists() else None
            )
        return result


def _counts(outcomes: dict[str, str]) -> dict[str, int]:
    return {
        kind: sum(outcome == kind for outcome in outcomes.values())
        for kind in ("passed", "failed", "skipped")
    }


def compare(name: str, plain: dict, patched: dict) -> dict:
    """A module's two runs side by side: counts and the tests tfdet broke."""
    before = plain.get("outcomes", {}).get(name, {})
    after = patched.get("outcomes", {}).get(name, {})
    broken = sorted(
        test
        for test, outcome in before.items()
        if outcome == "passed" and after.get(test, "failed") == "failed"
    )
    fixed = sorted(
        test
        for test, outcome in after.items()
        if outcome == "passed" and before.get(test) == "failed"
    )
    return {
        "complete": plain["complete"] and patched["complete"],
        "why": plain.get("why") or patched.get("why"),
        "without_tfdet": _counts(before),
        "with_tfdet": _counts(after),
        "kernels": (patched.get("profile") or {}).get("kernels"),
        "broken_by_tfdet": [f"{name}::{test}" for test in broken],
        "passing_only_with_tfdet": [f"{name}::{test}" for test in fixed],
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--tests-dir",
        type=Path,
        default=Path(os.environ.get(TESTS_DIR_VARIABLE, DEFAULT_TESTS_DIR)),
        help="TensorFlow's kernel_tests/ (math_ops/, linalg/, nn_ops/)",
    )
    parser.add_argument(
        "--module",
        action="append",
        metavar="NAME[=EXPR]",
        help=f"a module to run ({', '.join(MODULES)}), optionally only the "
        "tests that pytest's -k EXPR selects; repeatable (default: all, whole)",
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="all modules in one pytest process per run (default: one each)",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds per pytest run"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    chosen: dict[str, str | None] = {}
    for entry in args.module or list(MODULES):
        name, _, keyword = entry.partition("=")
        if name not in MODULES:
            raise SystemExit(
                f"Expected a module of {sorted(MODULES)}. Received: {name}"
            )
        chosen[name] = keyword or None
    report: dict = {"modules": {}, "missing": []}
    texts = {}
    for name in chosen:
        text = _module_text(MODULES[name], args.tests_dir)
        if text is None:
            print(f"{name}: missing ({MODULES[name].path} not in {args.tests_dir})")
            report["missing"].append(name)
        else:
            texts[name] = text
    # One process per module and run (a crash or a timeout costs one
    # module), or, with --one-process, one for all (a TensorFlow start
    # and tfdet's enable() less per module: the short runs' time).
    groups = [texts] if args.one_process else [{n: t} for n, t in texts.items()]
    for group in groups:
        plain = run_modules(group, chosen, tfdet=False, timeout=args.timeout)
        patched = run_modules(group, chosen, tfdet=True, timeout=args.timeout)
        for name in group:
            result = compare(name, plain, patched)
            report["modules"][name] = result
            print(_describe(name, result), flush=True)
    broken = [
        test
        for result in report["modules"].values()
        for test in result["broken_by_tfdet"]
    ]
    report["broken_by_tfdet"] = [t for t in broken if t not in KNOWN_DIFFERENCES]
    report["known_differences"] = {
        t: KNOWN_DIFFERENCES[t] for t in broken if t in KNOWN_DIFFERENCES
    }
    incomplete = [
        name
        for name, result in report["modules"].items()
        if not result["complete"]
        or not set(EXPECTED_KERNELS) <= set(result["kernels"] or ())
    ]
    report["incomplete"] = incomplete
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    if incomplete:
        return 2
    return 1 if report["broken_by_tfdet"] else 0


def _describe(name: str, result: dict) -> str:
    def counts(c: dict[str, int]) -> str:
        return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"

    lines = [
        f"{name}:",
        f"  without tfdet: {counts(result['without_tfdet'])}",
        f"  with tfdet:    {counts(result['with_tfdet'])}",
        f"  tfdet kernels: {', '.join(result['kernels'] or ['(none)'])}",
    ]
    if not result["complete"]:
        lines.append(f"  INCOMPLETE: {result['why']}")
    for test in result["broken_by_tfdet"]:
        why = KNOWN_DIFFERENCES.get(test)
        lines.append(f"  passes without tfdet, fails with it: {test}")
        if why:
            lines.append(f"    known: {why}")
    for test in result["passing_only_with_tfdet"]:
        lines.append(f"  fails without tfdet, passes with it: {test}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
