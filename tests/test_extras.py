"""asrkit/extras.py: a missing optional package is one line naming the pip extra that installs it, at the place each
command that needs one first asks for it (simulated by hiding the package: sys.modules[name] = None)."""
from __future__ import annotations

import sys
import types

import pytest

import asrkit.cli as cli
from asrkit.extras import EXTRA_OF, MissingExtraError, require


def test_an_installed_package_is_returned():
    import scipy.signal

    assert require("scipy.signal", "x") is scipy.signal


@pytest.mark.parametrize("package", sorted(EXTRA_OF))
def test_a_missing_package_names_its_extra(not_installed, package):
    not_installed(package)
    with pytest.raises(MissingExtraError) as exc:
        require(f"{package}.sub", "doing this")
    assert str(exc.value) == (f"doing this needs {package}, which is not installed: "
                              f"pip install -e '.[{EXTRA_OF[package]}]' (in the asrkit checkout)")


def test_a_broken_install_is_not_called_missing(monkeypatch, not_installed, tmp_path):
    """An installed package whose own dependency is missing raises the real error, not 'pip install ...'."""
    (tmp_path / "webdataset").mkdir()
    (tmp_path / "webdataset" / "__init__.py").write_text("import a_dependency_nobody_installed\n")
    not_installed("webdataset")
    monkeypatch.delitem(sys.modules, "webdataset")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as exc:
        require("webdataset", "x")
    assert not isinstance(exc.value, MissingExtraError) and exc.value.name == "a_dependency_nobody_installed"


def test_the_cli_prints_a_missing_extra_as_one_line(monkeypatch, not_installed, capsys):
    def main(argv):
        return require("onnx", "asrkit fake") and 0

    monkeypatch.setitem(sys.modules, "asrkit_fake_cmd", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", ("asrkit_fake_cmd", "a subcommand that needs onnx"))
    not_installed("onnx")
    assert cli.main(["fake"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["asrkit: asrkit fake needs onnx, which is not installed: pip install -e '.[export]' (in the asrkit checkout)"]
