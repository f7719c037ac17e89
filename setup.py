"""Package discovery for the flat layout: the repository root *is* the `hybrid_serve` package
(pyproject.toml's `package-dir`), so every folder with an `__init__.py` below it is a
subpackage, found here rather than listed by hand (a hand list once left kernels/linear out
of the wheel). This file is the build's, not the package's: it stays out of the wheel.
Everything else lives in pyproject.toml."""
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PACKAGE = "hybrid_serve"
NOT_SHIPPED = ["tests", "tests.*", "benchmarks", "benchmarks.*", "build", "build.*"]


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == PACKAGE and m[1] == "setup")]


setup(packages=[PACKAGE] + [f"{PACKAGE}.{name}" for name in find_packages(where=".", exclude=NOT_SHIPPED)],
      cmdclass={"build_py": BuildPy})
