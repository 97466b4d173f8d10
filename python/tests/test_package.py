"""The package as installed: the README's worked example, the version, and that importing
maskattn pulls in nothing but NumPy."""

import subprocess
import sys

import numpy as np

import maskattn


def test_worked_example_prints_the_seed_weights_and_output():
    # "I love dog": Q = K = V = X, d = 4, causal (docs/cli.md, `maskattn example`).
    x = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], np.float32)[None, None]
    mask = maskattn.Mask().causal()
    weights = maskattn.attention_weights(x, x, mask)[0, 0]
    output = maskattn.attention(x, x, x, mask)[0, 0]
    np.testing.assert_allclose(
        weights.round(3), [[1, 0, 0], [0.269, 0.731, 0], [0.274, 0.274, 0.452]], atol=1e-12
    )
    np.testing.assert_allclose(
        output.round(3),
        [[1, 0, 1, 0], [0.269, 0.731, 0.269, 0.731], [0.726, 0.726, 0.274, 0.274]],
        atol=1e-12,
    )


def test_version_is_the_cmake_project_version():
    import pathlib
    import re

    cmake = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"
    if not cmake.exists():
        return  # installed elsewhere than this checkout: nothing to compare with
    expected = re.search(r"project\(maskattn VERSION ([0-9.]+)", cmake.read_text()).group(1)
    assert maskattn.__version__ == expected


def test_importing_maskattn_needs_only_numpy():
    code = (
        "import sys, maskattn; "
        "heavy = [m for m in ('torch', 'transformers', 'ml_dtypes') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_error_is_a_value_error():
    assert issubclass(maskattn.Error, ValueError)
