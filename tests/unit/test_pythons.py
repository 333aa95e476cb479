"""Which Pythons a payload's TensorFlow runs on (deploy/plan/pythons.py), and the words for a
host whose Python does not fit. Pure: no host, no index."""
from __future__ import annotations

import pytest

from deploy.plan.checks import HostCheck, judge_probe
from deploy.plan.pythons import (
    PythonNeed, TENSORFLOW_PYTHONS, install_hint, payload_need, pin_need, python_problem,
    python_version, requires_python_need, tensorflow_pin
)
from deploy.host.protocol import Probe
from deploy.inventory.model import Host


@pytest.mark.parametrize("text, pin", [
    ("tensorflow>=2.16\ntf-keras>=2.16\n", "tensorflow>=2.16"),
    ("# runtime\nnumpy\ntensorflow-cpu==2.13.* # the lab's\n", "tensorflow-cpu==2.13.*"),
    ("tensorflow[and-cuda]>=2.17,<2.19 ; sys_platform == 'linux'\n", "tensorflow<2.19,>=2.17"),
    ("-r base.txt\n--index-url https://example.invalid/simple\ntensorflow\n", None),
    ("tf_keras>=2.16\n", None),
    ("this is not a requirement\n", None),
])
def test_the_pin_is_read_as_pip_reads_requirements(text, pin):
    assert tensorflow_pin(text) == pin


@pytest.mark.parametrize("pin, oldest, newest", [
    ("tensorflow>=2.16", (3, 9), None),                   # later releases: no newest known
    ("tensorflow==2.13.1", (3, 8), (3, 11)),
    ("tensorflow==2.16.*", (3, 9), (3, 12)),
    ("tensorflow~=2.12.0", (3, 8), (3, 11)),
    ("tensorflow>=2.14,<2.17", (3, 9), (3, 12)),
    ("tensorflow==2.21.0", (3, 10), (3, 13)),
    ("tensorflow>=2.30", TENSORFLOW_PYTHONS[max(TENSORFLOW_PYTHONS)][0], None),
    ("tensorflow==2.16.0rc0", (3, 9), (3, 12)),
])
def test_a_pin_needs_the_pythons_of_every_release_it_admits(pin, oldest, newest):
    need = pin_need(pin)
    assert (need.oldest, need.newest, need.what) == (oldest, newest, pin)


def test_a_pin_of_tensorflow_1_is_not_judged():
    assert pin_need("tensorflow==1.15.5") is None


@pytest.mark.parametrize("requires, oldest, newest", [
    (">=3.10", (3, 10), None), (">=3.9,<3.13", (3, 9), (3, 12)), ("<2.8", None, None),
])
def test_requires_python(requires, oldest, newest):
    need = requires_python_need("tensorflow 2.21.0", requires)
    assert (need.oldest, need.newest) == (oldest, newest) if oldest else need is None


def test_a_payload_without_a_pin_needs_what_the_controllers_tensorflow_needs(tmp_path):
    from importlib import metadata
    (tmp_path / "requirements.txt").write_text("numpy\ntensorflow\n")
    need = payload_need(tmp_path)
    requires = metadata.metadata("tensorflow")["Requires-Python"]
    assert need.what == f"tensorflow {metadata.version('tensorflow')} (as on this machine)"
    assert not need.pinned and need.oldest == requires_python_need("", requires).oldest
    (tmp_path / "requirements.txt").write_text("tensorflow==2.13.*\n")
    assert payload_need(tmp_path).what == "tensorflow==2.13.*"


@pytest.mark.parametrize("text, version", [
    ("3.8.18", (3, 8)), ("3.13.0rc1", (3, 13)), ("3.11.2+", (3, 11)), ("pypy", None),
])
def test_python_version(text, version):
    assert python_version(text) == version


def test_the_words_for_a_python_too_old_or_too_new():
    need = PythonNeed("tensorflow>=2.16", (3, 9))
    assert python_problem("3.8.18", need) == (
        "Python 3.8.18 is too old for tensorflow>=2.16 (needs 3.9+): set python: to a newer "
        "interpreter, or inv setup with one")
    assert python_problem("3.9.0", need) is None and python_problem("3.14.1", need) is None
    narrow = PythonNeed("tensorflow==2.16.*", (3, 9), (3, 12))
    assert python_problem("3.13.0", narrow) == (
        "Python 3.13.0 is too new for tensorflow==2.16.* (supports 3.9 to 3.12): set python: "
        "to an older interpreter, or inv setup with one")


def test_a_host_with_tensorflow_is_judged_only_by_a_pin():
    """The controller's TensorFlow speaks for a host without one (what it would install);
    a host whose own TensorFlow is installed for its Python runs it."""
    controllers = PythonNeed("tensorflow 2.21.0 (as on this machine)", (3, 10), pinned=False)
    assert python_problem("3.9.18", controllers, has_tensorflow=True) is None
    assert python_problem("3.9.18", controllers, has_tensorflow=False).startswith(
        "Python 3.9.18 is too old for tensorflow 2.21.0 (as on this machine)")
    pinned = PythonNeed("tensorflow>=2.16", (3, 9))
    assert python_problem("3.8.18", pinned, has_tensorflow=True) is not None


def test_install_hint_fits_the_python():
    assert install_hint(["tensorflow", "tf_keras"], False) == "pip install tensorflow tf-keras"
    assert "inv setup" in install_hint(["tensorflow"], True)
    assert "pip install" not in install_hint(["tensorflow"], True).replace(
        "pip install is refused", "")


def probe(python: str, versions: dict, managed: bool = False) -> Probe:
    return Probe(python=python, executable="/usr/bin/python3", versions=versions,
                 disk_path="/", disk_free=10 * 2 ** 30, writable=True, ports=(2222,), ipv6=True,
                 externally_managed=managed)


def test_the_check_names_the_python_instead_of_packages_it_could_not_install():
    host = Host(name="h0", address="10.1.2.3")
    none = {"tensorflow": None, "tf_keras": None, "numpy": None}
    old = HostCheck(host)
    judge_probe(old, probe("3.8.18", none), need=PythonNeed("tensorflow>=2.16", (3, 9)))
    assert old.problems == ["h0 (10.1.2.3): Python 3.8.18 is too old for tensorflow>=2.16 "
                            "(needs 3.9+): set python: to a newer interpreter, or inv setup "
                            "with one"]
    managed = HostCheck(host)
    judge_probe(managed, probe("3.11.2", none, managed=True),
                need=PythonNeed("tensorflow>=2.16", (3, 9)))
    assert managed.problems == [
        "h0 (10.1.2.3): tensorflow, tf_keras and numpy are not installed for /usr/bin/python3 "
        "(an externally managed Python, where pip install is refused: inv setup builds an "
        "environment from the payload's requirements.txt)"]
